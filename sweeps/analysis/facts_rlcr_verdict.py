"""The registered claims of `facts_rlcr` (sweeps/README.md), read from its records: per seed and per base draw the
format rate (1 - responses without a usable confidence / responses), the mean stated confidence, the stated
confidence's AUROC and ECE, the accuracy, and the ECE and pooled AUROC of exp(lpm); then each claim's 6-seed mean with
its 95% t-interval (`capo.evaluation.stats.seed_paired_interval`, the interval `capo sweep report` uses) and whether
it holds as registered. Until every seed is in it says so and gives no verdict.

    python sweeps/analysis/facts_rlcr_verdict.py [sweeps/records/facts_rlcr]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from capo.evaluation.stats import seed_paired_interval

SEEDS = (1, 2, 3, 4, 5, 6)  # the registered seeds
COLUMNS = ("format_rate", "stated_mean", "verbal_auroc", "verbal_ece", "accuracy", "ece_minus_accuracy",
           "lpm_ece", "lpm_auroc")


def row(final: dict) -> dict:
    """The claims' quantities of one record's final held-out metrics."""
    n, missing = final["n"], final.get("verbal_missing", final["n"])
    ve = final.get("verbal_ece")
    ve = None if ve is None or (isinstance(ve, float) and math.isnan(ve)) else ve
    return {"format_rate": 1 - missing / n, "stated_mean": final.get("verbal_mean_confidence"),
            "verbal_auroc": final.get("verbal_auroc"), "verbal_ece": ve, "accuracy": final["accuracy"],
            "ece_minus_accuracy": None if ve is None else ve - final["accuracy"],
            "lpm_ece": final["ece"], "lpm_auroc": final["auroc"]}


def curve(records: list[dict]) -> list[str]:
    """The periodic held-out evaluation along training, per step: the mean over the RLCR seeds (and their range) of
    accuracy, format rate, mean stated confidence, verbal AUROC and pooled AUROC of lpm (a seed enters a column at a
    step where it has a value). ``records``: the folder's records, as :func:`load` reads them."""
    cols = {"accuracy": lambda e: e["eval/accuracy"], "format rate": lambda e: 1 - e["eval/verbal_missing"] / e["eval/n"],
            "mean stated confidence": lambda e: e.get("eval/verbal_mean_confidence"),
            "verbal AUROC": lambda e: e.get("eval/verbal_auroc"), "pooled AUROC of lpm": lambda e: e["eval/auroc"]}
    by_step: dict[int, dict[str, list[float]]] = {}
    for rec in records:
        for e in [] if rec["method"] == "base" else rec["curves"]["eval"]:
            cells = by_step.setdefault(e["step"], {c: [] for c in cols})
            for c, get in cols.items():
                v = get(e)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    cells[c].append(v)
    lines = ["| step | " + " | ".join(cols) + " |", "|---:|" + "---:|" * len(cols)]
    for step, cells in sorted(by_step.items()):
        lines.append(f"| {step} | " + " | ".join(
            f"{sum(v) / len(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else "--" for v in cells.values()) + " |")
    return lines


def load(folder: Path) -> list[dict]:
    """The folder's records, in file-name order."""
    return [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]


def read(folder: Path, records: list[dict] | None = None) -> tuple[dict[int, dict], dict[int, dict]]:
    """(seed -> row of the RLCR records, draw -> row of the base draws), from ``records`` when given (already
    loaded). A base record names its draw (``base.json`` has none: draw 0); the files' order is not the draws'."""
    runs, bases = {}, {}
    for rec in load(folder) if records is None else records:
        if rec["method"] == "base":
            bases[rec.get("draw") or 0] = row(rec["final"])
        else:
            runs[rec["seed"]] = row(rec["final"])
    return runs, bases


def claims(runs: dict[int, dict]) -> list[tuple[str, bool | None, str]]:
    """(claim, held?, the reading) for claims 1-3 as registered: a claim holds when its whole 95% interval lies on
    the claimed side; held is None when no interval can be formed."""

    def iv(key):
        return seed_paired_interval([runs[s][key] for s in sorted(runs)])

    def fmt(d):
        return "n/a" if d is None else f"{d['mean']:.3f} [{d['low']:.3f}, {d['high']:.3f}] over {d['n']} seeds"

    rate, stated, vauc, gap = iv("format_rate"), iv("stated_mean"), iv("verbal_auroc"), iv("ece_minus_accuracy")
    def within(d, lo, hi):
        return None if d is None else lo <= d["low"] and d["high"] <= hi

    # one-sided claims are bounded on their claimed side only: a t-interval of a quantity that cannot be negative
    # (a mean confidence) or exceed 1 (a rate) may still reach past 0 or 1, and that says nothing against the claim
    return [
        ("1. format rate >= 0.9", within(rate, 0.9, math.inf), fmt(rate)),
        ("2a. mean stated confidence < 0.1", within(stated, -math.inf, 0.1), fmt(stated)),
        ("2b. verbal AUROC within 0.5 +- 0.1", within(vauc, 0.4, 0.6), fmt(vauc)),
        ("3. verbal ECE - accuracy within +-0.05", within(gap, -0.05, 0.05), fmt(gap)),
    ]


def table(runs: dict[int, dict], bases: dict[int, dict]) -> list[str]:
    lines = ["| record | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    named = ([(f"base, draw {d}", bases[d]) for d in sorted(bases)]
             + [(f"RLCR, seed {s}", runs[s]) for s in sorted(runs)])
    for name, r in named:
        lines.append(f"| {name} | " + " | ".join("--" if r[c] is None else f"{r[c]:.3f}" for c in COLUMNS) + " |")
    return lines


def main(folder: Path) -> int:
    records = load(folder)
    runs, bases = read(folder, records)
    print("\n".join(table(runs, bases)))
    print("\nalong training (the periodic held-out evaluation; mean over the seeds, range in brackets):\n")
    print("\n".join(curve(records)))
    missing = [s for s in SEEDS if s not in runs]
    if missing:
        print(f"\nseeds not in yet: {missing}: no verdict (the claims are read only over all six)")
        return 0
    print()
    for claim, held, reading in claims(runs):
        print(f"{claim}: {'holds' if held else 'n/a' if held is None else 'does not hold'} -- {reading}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("sweeps/records/facts_rlcr")))
