"""The reading of `facts_rlcr`'s registered claims: a claim holds only when its whole 95% interval over the seeds is
on the claimed side, and no verdict is given before every registered seed is in."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("facts_rlcr_verdict", ROOT / "sweeps/analysis/facts_rlcr_verdict.py")
verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdict)


def _final(acc, conf, vauc, missing, n=100):
    return {"n": n, "verbal_missing": missing, "verbal_ece": abs(conf - acc), "verbal_mean_confidence": conf,
            "verbal_auroc": vauc, "accuracy": acc, "ece": 0.3, "auroc": 0.6}


def _write(folder, finals):
    folder.mkdir()
    (folder / "base.json").write_text(json.dumps({"method": "base", "seed": 0, "final": _final(0.02, 0.9, None, 99)}))
    for seed, fin in finals.items():
        curve = [{"step": 0, "eval/n": 100, "eval/accuracy": 0.02, "eval/verbal_missing": 99,
                  "eval/verbal_mean_confidence": 0.9, "eval/verbal_auroc": None, "eval/auroc": 0.8},
                 {"step": 60, "eval/n": 100, "eval/accuracy": 0.1 * seed, "eval/verbal_missing": 0,
                  "eval/verbal_mean_confidence": 0.0, "eval/verbal_auroc": 0.5, "eval/auroc": 0.6}]
        (folder / f"rlcr-seed{seed}.json").write_text(json.dumps({"method": "rlcr", "seed": seed, "final": fin,
                                                                 "curves": {"eval": curve}}))
    return folder


def test_claims_hold_only_with_the_whole_interval_on_their_side(tmp_path, capsys):
    collapsed = {s: _final(0.1 + 0.01 * s, 0.0, 0.5, 1) for s in range(1, 7)}
    runs, bases = verdict.read(_write(tmp_path / "a", collapsed))
    assert bases[0]["format_rate"] == pytest.approx(0.01) and runs[1]["format_rate"] == pytest.approx(0.99)
    assert runs[3]["ece_minus_accuracy"] == 0.0  # a constant 0: ECE = accuracy
    assert [held for _, held, _ in verdict.claims(runs)] == [True, True, True, True]
    # one seed keeps an informative confidence: mean stated 0.075 < 0.1, but the interval reaches past it
    mixed = {**collapsed, 6: _final(0.3, 0.45, 0.8, 1)}
    runs, _ = verdict.read(_write(tmp_path / "b", mixed))
    held = dict((c[:2], h) for c, h, _ in verdict.claims(runs))
    assert held == {"1.": True, "2a": False, "2b": False, "3.": False}
    # 1 and 0.9: format rates 0.95 +- spread whose interval dips under 0.9
    low = {s: _final(0.1, 0.0, 0.5, m) for s, m in zip(range(1, 7), (1, 2, 3, 20, 30, 1))}
    runs, _ = verdict.read(_write(tmp_path / "c", low))
    assert verdict.claims(runs)[0][1] is False


def test_a_one_sided_claim_is_not_failed_by_an_interval_that_reaches_past_zero(tmp_path):
    # five seeds state exactly 0 and one 0.03: the t-interval's low end is negative, yet the whole interval lies
    # under 0.1, the one side the claim names (the registered data of facts_rlcr reads like this)
    near = {s: _final(0.1, 0.03 if s == 5 else 0.0, 0.5, 1) for s in range(1, 7)}
    runs, _ = verdict.read(_write(tmp_path / "a", near))
    (claim, held, reading), = [c for c in verdict.claims(runs) if c[0].startswith("2a")]
    assert held is True and "[-0.0" in reading
    # and the bound on the claimed side still bites: a mean of 0.12 does not hold
    high = {s: _final(0.1, 0.12, 0.5, 1) for s in range(1, 7)}
    runs, _ = verdict.read(_write(tmp_path / "b", high))
    assert [h for c, h, _ in verdict.claims(runs) if c.startswith("2a")] == [False]


def test_no_verdict_before_every_seed(tmp_path, capsys):
    folder = _write(tmp_path / "a", {1: _final(0.1, 0.0, 0.5, 1), 2: _final(0.1, 0.0, 0.5, 1)})
    assert verdict.main(folder) == 0
    out = capsys.readouterr().out
    assert "seeds not in yet: [3, 4, 5, 6]: no verdict" in out and "holds" not in out
    assert "| base, draw 0 | 0.010 | 0.900 | -- |" in out
    # the curve: seeds 1 and 2 at step 60, accuracy 0.1 and 0.2; the step-0 verbal AUROC has no value
    assert "| 0 | 0.020 (0.020-0.020) | 0.010 (0.010-0.010) | 0.900 (0.900-0.900) | -- | 0.800 (0.800-0.800) |" in out
    assert "| 60 | 0.150 (0.100-0.200) | 1.000 (1.000-1.000) | 0.000 (0.000-0.000) | 0.500 (0.500-0.500) |" in out


def test_the_base_draws_are_named_by_their_records_not_by_the_listing(tmp_path, capsys):
    """base-draw1.json lists before base.json (draw 0): the table printed them the other way round (the committed
    facts_rlcr page had the two rows swapped until 2026-12-02)."""
    folder = _write(tmp_path / "a", {1: _final(0.1, 0.0, 0.5, 1)})
    (folder / "base-draw1.json").write_text(json.dumps({"method": "base", "seed": None, "draw": 1,
                                                        "final": _final(0.05, 0.7, 0.53, 93)}))
    _, bases = verdict.read(folder)
    assert bases[0]["stated_mean"] == pytest.approx(0.9) and bases[1]["stated_mean"] == pytest.approx(0.7)
    verdict.main(folder)
    out = capsys.readouterr().out
    assert "| base, draw 0 | 0.010 | 0.900 | -- |" in out and "| base, draw 1 | 0.070 | 0.700 | 0.530 |" in out
