"""The reading of `facts_methods`' registered claims: sizes against the base with intervals excluding 0 (claim 1),
paired differences with GRPO, Holm-adjusted (claims 2-3), and no verdict before every registered seed is in."""

import importlib.util
from pathlib import Path

import pytest

from capo.sweep.analysis import summary

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("facts_methods_verdict",
                                              ROOT / "sweeps/analysis/facts_methods_verdict.py")
verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdict)

WOBBLE = (0.0, 0.01, -0.01, 0.02, -0.02, 0.0)  # seed-to-seed spread, mean 0
ORDER = {"grpo": (0, 1, 2, 3, 4, 5), "capo": (1, 0, 3, 2, 5, 4), "dr_grpo": (2, 3, 0, 5, 4, 1),
         "capo_sum": (5, 4, 3, 0, 1, 2)}  # each method's own order of the spread (no two differences constant)


def _rec(acc, auroc, ece, auc_mean):
    return {"final": {"accuracy": acc, "auroc": auroc, "ece": ece, "auc_mean": auc_mean, "brier": 0.2 + acc / 10},
            "curves": {}}


def _records(grpo_auroc, capo_auroc, dr_ece):
    """Six seeds per method, each the given value plus a small spread; capo's AUC-mean moves with its AUROC."""
    out = {}
    for m, (auroc, ece) in {"grpo": (grpo_auroc, 0.30), "capo": (capo_auroc, 0.20), "dr_grpo": (grpo_auroc, dr_ece),
                            "capo_sum": (0.8, 0.1)}.items():
        wobble = [WOBBLE[i] for i in ORDER[m]]
        out[m] = {s: _rec(0.5 + w, auroc + w, ece + w / 2, auroc - 0.05 + 0.5 * w) for s, w in zip(range(1, 7), wobble)}
    return out


BASES = [{"final": {"accuracy": 0.03, "auroc": 0.89, "ece": 0.185, "auc_mean": 0.82, "brier": 0.08}},
         {"final": {"accuracy": 0.025, "auroc": 0.90, "ece": 0.19, "auc_mean": 0.83, "brier": 0.081}}]


def _held(records):
    return {c.split(" ")[0]: h for c, h, _ in verdict.claims(summary(records, "grpo", 0.05, BASES))}


def test_claims_as_registered():
    # GRPO: AUROC -0.095, ECE +0.11, accuracy +0.47; CAPO +0.08 over GRPO in both rankings; Dr. GRPO's ECE +0.1
    held = _held(_records(grpo_auroc=0.80, capo_auroc=0.88, dr_ece=0.40))
    assert held == {"1a.": True, "1b.": True, "1c.": True, "1.": True, "2a.": True, "2b.": True, "2.": True,
                    "3a.": True, "3b.": False}


def test_a_fall_smaller_than_registered_fails_claim_1_however_clear():
    # AUROC falls 0.035 with a tight interval: excluding 0 is not enough, the registered size is 0.05
    held = _held(_records(grpo_auroc=0.86, capo_auroc=0.86, dr_ece=0.30))
    assert held["1a."] is False and held["1."] is False and held["1b."] is True
    # CAPO equal to GRPO: no difference found, and claim 2 fails rather than passing on a zero
    assert held["2a."] is False and held["2."] is False and held["3a."] is False


def test_capo_below_grpo_is_not_claim_2():
    held = _held(_records(grpo_auroc=0.80, capo_auroc=0.72, dr_ece=0.30))
    assert held["2a."] is False and held["2b."] is False


def test_no_verdict_before_every_seed(tmp_path, monkeypatch, capsys):
    records = _records(0.8, 0.88, 0.4)
    del records["capo_sum"][6]
    assert verdict.missing(records, BASES) == ["capo_sum seed 6"]
    assert verdict.missing(records, BASES[:1])[-1] == "a second base draw"
    monkeypatch.setattr("capo.sweep.records.load_records", lambda folder: records)
    monkeypatch.setattr("capo.sweep.records.load_base", lambda folder: BASES)
    assert verdict.main(tmp_path) == 0
    out = capsys.readouterr().out
    assert "not in yet (1): capo_sum seed 6: no verdict" in out and "holds" not in out
    assert "| base, draw 1 | 0.025 | 0.830 | 0.900 | 0.190 | 0.081 | -- |" in out


@pytest.mark.parametrize("key", ["auroc", "auc_mean"])
def test_a_missing_measure_gives_no_verdict_not_a_pass(key):
    records = _records(0.8, 0.88, 0.4)
    for by_seed in records.values():
        for r in by_seed.values():
            del r["final"][key]
    held = _held(records)
    assert held["2."] is None and held["2a." if key == "auroc" else "2b."] is None


def test_an_interval_excluding_0_is_not_enough_after_holm():
    d = {"mean": 0.05, "low": 0.01, "high": 0.09, "p": 0.03}
    assert verdict._found({**d, "p_holm": 0.03}) is True
    assert verdict._found({**d, "p_holm": 0.09}) is False  # one of three comparisons: 0.03 x 3 under Holm
    assert verdict._positive({**d, "mean": -0.05, "low": -0.09, "high": -0.01, "p_holm": 0.01}) is False
