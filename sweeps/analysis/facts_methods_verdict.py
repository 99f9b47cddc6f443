"""The registered claims of `facts_methods` (sweeps/README.md), read from its records with the statistics `capo sweep
report` uses (:func:`capo.sweep.analysis.summary`: Welch's interval for a change from the base's draws, the seed-paired
t-interval and Holm's adjustment over the methods compared with GRPO). Until every registered seed of every method is
in it prints the per-seed table and says which seeds are missing, with no verdict.

How each registered sentence is read (written down on 2026-11-27, with 11 of the 24 method records landed and no
claim read; the sentences themselves were registered before any run):

1. "GRPO's pooled AUROC of lpm falls from the base by at least 0.05 and its ECE of exp(lpm) rises by at least 0.05,
   both intervals excluding 0; its accuracy rises by at least 0.15": three parts, each its change from the base's
   draws (GRPO's 6 seeds against the draws, Welch). AUROC: mean <= -0.05 and the interval's top < 0. ECE: mean >=
   +0.05 and the interval's bottom > 0. Accuracy: mean >= +0.15 and the interval's bottom > 0. The claim holds when
   all three do. AUC-mean's change is printed, not claimed.
2. "CAPO - GRPO in pooled AUROC and in AUC-mean of lpm, paired by seed, is positive with an interval excluding 0"
   (Holm over the three methods compared with GRPO): each measure holds when the paired interval's bottom > 0 and
   the Holm-adjusted p < 0.05; the claim holds when both do (2a and 2b are printed each, so a half is visible).
   CAPO's accuracy change is printed beside it.
3. Dr. GRPO - GRPO on ECE of exp(lpm) and on pooled AUROC, direction not predicted: a difference is found when the
   paired interval excludes 0 and the Holm-adjusted p < 0.05; its sign is then the reading.
4. capo_sum - CAPO: exploratory, printed with no verdict.

    python sweeps/analysis/facts_methods_verdict.py [sweeps/records/facts_methods]
"""

from __future__ import annotations

import sys
from pathlib import Path

from capo.sweep.analysis import paired, summary

SEEDS = (1, 2, 3, 4, 5, 6)  # the registered seeds
METHODS = ("grpo", "dr_grpo", "capo", "capo_sum")
COLUMNS = ("accuracy", "auc_mean", "auroc", "ece", "brier", "majority_vote")
EFFECT = 0.05  # the size the registration names for AUROC and ECE (only used for the seeds-needed column)


def fmt(d: dict | None) -> str:
    if not d or d.get("low") is None:
        return "n/a"
    p = f", Holm p {d['p_holm']:.3f}" if d.get("p_holm") is not None else (f", p {d['p']:.3f}" if "p" in d else "")
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]{p}"


def _part(d: dict | None, sign: int, size: float) -> bool | None:
    """A change at least ``size`` in the direction ``sign`` with its interval excluding 0; None without an interval."""
    if not d or d.get("low") is None:
        return None
    return sign * d["mean"] >= size and (d["low"] > 0 if sign > 0 else d["high"] < 0)


def _found(d: dict | None) -> bool | None:
    """A paired difference whose interval excludes 0 and whose Holm-adjusted p is under 0.05."""
    if not d or d.get("low") is None or d.get("p_holm") is None:
        return None
    return (d["low"] > 0 or d["high"] < 0) and d["p_holm"] < 0.05


def _positive(d: dict | None) -> bool | None:
    """:func:`_found` with the difference positive."""
    f = _found(d)
    return f if f is None else f and d["mean"] > 0


def _all(parts: list[bool | None]) -> bool | None:
    return None if None in parts else all(parts)


def claims(s: dict) -> list[tuple[str, bool | None, str]]:
    """(claim, held?, reading) of claims 1-3 from a :func:`capo.sweep.analysis.summary` with GRPO as the reference
    and the base's draws; held is None where no interval can be formed."""
    base, pair = s["from_base"]["grpo"], s["paired"]
    auroc, ece = _part(base.get("auroc"), -1, 0.05), _part(base.get("ece"), +1, 0.05)
    acc = _part(base.get("accuracy"), +1, 0.15)
    capo = pair.get("capo", {})
    c_auroc, c_auc = _positive(capo.get("auroc")), _positive(capo.get("auc_mean"))
    dr = pair.get("dr_grpo", {})
    return [
        ("1a. GRPO's pooled AUROC falls >= 0.05 from the base", auroc, fmt(base.get("auroc"))),
        ("1b. GRPO's ECE of exp(lpm) rises >= 0.05 from the base", ece, fmt(base.get("ece"))),
        ("1c. GRPO's accuracy rises >= 0.15 from the base", acc, fmt(base.get("accuracy"))),
        ("1. GRPO makes the wrong answers confident (1a, 1b and 1c)", _all([auroc, ece, acc]), "--"),
        ("2a. CAPO - GRPO pooled AUROC > 0", c_auroc, fmt(capo.get("auroc"))),
        ("2b. CAPO - GRPO AUC-mean of lpm > 0", c_auc, fmt(capo.get("auc_mean"))),
        ("2. CAPO holds what GRPO loses (2a and 2b)", _all([c_auroc, c_auc]), "--"),
        ("3a. Dr. GRPO - GRPO ECE of exp(lpm) differs", _found(dr.get("ece")), fmt(dr.get("ece"))),
        ("3b. Dr. GRPO - GRPO pooled AUROC differs", _found(dr.get("auroc")), fmt(dr.get("auroc"))),
    ]


def readings(s: dict, records: dict) -> list[str]:
    """What is printed beside the claims, with no verdict: AUC-mean's change from the base, CAPO's accuracy against
    GRPO, and capo_sum - CAPO (exploratory)."""
    auc = s["from_base"]["grpo"].get("auc_mean")
    out = [f"GRPO's AUC-mean of lpm from the base (reported, not claimed): {fmt(auc)}",
           f"CAPO - GRPO accuracy: {fmt(s['paired'].get('capo', {}).get('accuracy'))}"]
    if "capo_sum" in records and "capo" in records:
        for k in ("accuracy", "auroc", "auc_mean", "ece"):
            out.append(f"capo_sum - CAPO {k} (exploratory): {fmt(paired(records, 'capo_sum', 'capo', k, EFFECT))}")
    return out


def table(records: dict, bases: list[dict]) -> list[str]:
    lines = ["| record | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    named = [(f"base, draw {i}", b) for i, b in enumerate(bases)]
    named += [(f"{m}, seed {seed}", records[m][seed]) for m in METHODS if m in records for seed in sorted(records[m])]
    for name, r in named:
        f = r["final"]
        lines.append(f"| {name} | " + " | ".join("--" if f.get(c) is None else f"{f[c]:.3f}" for c in COLUMNS) + " |")
    return lines


def missing(records: dict, bases: list[dict]) -> list[str]:
    out = [f"{m} seed {seed}" for m in METHODS for seed in SEEDS if seed not in records.get(m, {})]
    return out + (["a second base draw"] if len(bases) < 2 else [])


def main(folder: Path) -> int:
    from capo.sweep.records import load_base, load_records

    records, bases = load_records(folder), load_base(folder)
    print("\n".join(table(records, bases)))
    left = missing(records, bases)
    if left:
        print(f"\nnot in yet ({len(left)}): {', '.join(left)}: no verdict (the claims are read only over all seeds)")
        return 0
    s = summary(records, "grpo", EFFECT, bases)
    print()
    for claim, held, reading in claims(s):
        print(f"{claim}: {'holds' if held else 'n/a' if held is None else 'does not hold'} -- {reading}")
    print("\n" + "\n".join(readings(s, records)))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("sweeps/records/facts_methods")))
