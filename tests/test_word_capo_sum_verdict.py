"""The reading of `word_capo_sum`'s registered claims (capo_sum - CAPO over 20 paired seeds): P1 on accuracy told,
ruled out or neither; P2 on AUC-mean held, failed or neither; Holm over the two; no verdict before every registered
seed of the three methods is in, read across the three folders the registration names."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("word_capo_sum_verdict", ROOT / "sweeps/analysis/word_capo_sum_verdict.py")
verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdict)

# a seed-to-seed spread with mean 0 and sd 0.0103 (no two seeds alike, so a paired difference is never constant)
_RAW = [((7 * s) % 11 - 5) / 300 for s in range(20)]
SPREAD = [x - sum(_RAW) / 20 for x in _RAW]


def _records(acc_diff, auc_diff, scale=1.0):
    """CAPO at accuracy 0.45, AUC-mean 0.80; capo_sum differs by the given means plus ``scale`` x the spread."""
    out = {"grpo": {}, "capo": {}, "capo_sum": {}}
    for s in range(20):
        w = scale * SPREAD[s]
        out["grpo"][s] = {"final": {"accuracy": 0.44, "auc_mean": 0.79, "mean_tokens": 90.0 + s % 3}}
        out["capo"][s] = {"final": {"accuracy": 0.45, "auc_mean": 0.80, "mean_tokens": 91.0}}
        out["capo_sum"][s] = {"final": {"accuracy": 0.45 + acc_diff + w, "auc_mean": 0.80 + auc_diff - w,
                                        "mean_tokens": 93.0 + w}}
    return out


def _readings(records):
    return {line[:2]: line for line in verdict.claims(records)}


def test_a_clear_loss_is_told_and_a_small_auc_change_holds():
    r = _readings(_records(acc_diff=-0.03, auc_diff=0.005))
    assert r["P1"].startswith("P1 (accuracy, capo_sum - CAPO): a loss told -- -0.0300 [")
    assert "inside the predicted [-0.05, -0.02]" in r["P1"] and "Holm p" in r["P1"]
    assert r["P2"].startswith("P2 (AUC-mean, capo_sum - CAPO): holds -- +0.0050 [")
    assert "inside the predicted [-0.01, +0.03]" in r["P2"]


def test_no_difference_rules_the_loss_out_and_a_large_auc_loss_fails():
    r = _readings(_records(acc_diff=0.0, auc_diff=-0.05))
    assert ": a loss of 0.02 ruled out --" in r["P1"] and "outside the predicted" in r["P1"]
    assert ": does not hold (a loss larger than 0.02 told) --" in r["P2"]


def test_a_small_loss_is_told_and_a_loss_of_002_ruled_out_at_once():
    # an interval of about [-0.015, -0.005]: below 0 (a loss told) and above -0.02 (0.02 ruled out); both are said
    r = _readings(_records(acc_diff=-0.01, auc_diff=0.0))
    assert ": a loss told, and a loss of 0.02 ruled out (the loss is smaller) --" in r["P1"], r["P1"]


def test_a_wide_interval_is_neither():
    # the same means with a spread ~12x wider: the interval straddles both 0 and -0.02
    r = _readings(_records(acc_diff=-0.01, auc_diff=-0.02, scale=12))
    assert "neither told nor ruled out (under-powered for 0.02)" in r["P1"]
    assert ": neither (under-powered for 0.02) --" in r["P2"]


def test_a_loss_below_zero_needs_the_holm_adjusted_p():
    # an interval just under 0 whose raw p is under 0.05 but whose Holm p (x2 against a null P2) is not
    recs = _records(acc_diff=-0.0055, auc_diff=0.0)
    p1 = verdict.paired(recs, "capo_sum", "capo", "accuracy", 0.02)
    p2 = verdict.paired(recs, "capo_sum", "capo", "auc_mean", 0.02)
    assert p1["high"] < 0 and 0.025 < p1["p"] < 0.05, p1
    verdict._holm_two(p1, p2)
    assert p1["p_holm"] == pytest.approx(min(1.0, 2 * p1["p"]) if p1["p"] < p2["p"] else p1["p"])
    assert verdict.p1_reading(p1) != "a loss told"


def _write(folder: Path, method: str, seeds, acc=0.45):
    folder.mkdir(parents=True, exist_ok=True)
    for s in seeds:
        rec = {"sweep": folder.name, "method": method, "seed": s, "settings": {"preset": "word_problems", "eval": {}},
               "config": {}, "final": {"accuracy": acc + SPREAD[s], "auc_mean": 0.8, "mean_tokens": 90.0}}
        (folder / f"{method}-seed{s}.json").write_text(json.dumps(rec))


def test_no_verdict_until_every_seed_of_the_three_folders(tmp_path, capsys):
    old, refs, new = tmp_path / "word_grpo_capo", tmp_path / "word_capo_sum_refs", tmp_path / "word_capo_sum"
    for m in ("grpo", "capo"):
        _write(old, m, range(11))
        _write(refs, m, range(11, 20))
    _write(new, "capo_sum", range(19), acc=0.43)
    assert verdict.main([old, refs, new]) == 0
    out = capsys.readouterr().out
    assert "not in yet (1): capo_sum seed 19: no verdict" in out and "P1" not in out
    _write(new, "capo_sum", [19], acc=0.43)
    verdict.main([old, refs, new])
    out = capsys.readouterr().out
    assert "not in yet" not in out and "P1 (accuracy, capo_sum - CAPO): a loss told -- -0.0200" in out
    assert "capo_sum - grpo mean_tokens (secondary): +0.0000" in out


def test_a_seed_with_no_auc_mean_is_shown_na_and_named_where_it_is_left_out(tmp_path, capsys):
    """A capo_sum seed whose answers were all wrong has no AUC-mean (None in its record): the table shows "n/a" and
    P2 is read over the other 19 seeds, naming the seed (the script raised TypeError on it)."""
    old, refs, new = tmp_path / "word_grpo_capo", tmp_path / "word_capo_sum_refs", tmp_path / "word_capo_sum"
    for m in ("grpo", "capo"):
        _write(old, m, range(11))
        _write(refs, m, range(11, 20))
    _write(new, "capo_sum", range(20), acc=0.43)
    rec = json.loads((new / "capo_sum-seed14.json").read_text())
    rec["final"] |= {"accuracy": 0.0, "auc_mean": None}
    (new / "capo_sum-seed14.json").write_text(json.dumps(rec))
    assert verdict.main([old, refs, new]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 14 |"))
    assert row.endswith("| 0.800 | 90.000 | 0.000 | n/a | 90.000 |"), row
    assert "over 19 seeds (seed 14 left out: no value)" in out.split("P2 (AUC-mean")[1].splitlines()[0]
    assert "left out" not in out.split("P1 (accuracy")[1].splitlines()[0]
