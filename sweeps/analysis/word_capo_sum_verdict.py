"""The registered claims of `word_capo_sum` (sweeps/README.md): the price of the fixed-point variant `capo_sum` on the
reasoning testbed, read from the records of three folders (`word_grpo_capo`: GRPO and CAPO seeds 0-10 and the base's
8 draws; `word_capo_sum_refs`: GRPO and CAPO seeds 11-19; `word_capo_sum`: capo_sum seeds 0-19), with the statistics
`capo sweep report` uses (:func:`capo.sweep.analysis.paired`: the seed-paired t-interval and p). Until every
registered seed of every method is in it prints what is there and which seeds are missing, with no verdict.

How each registered sentence is read (written down on 2026-11-28, before any record of `word_capo_sum` or
`word_capo_sum_refs` landed; the sentences were registered on 2026-11-27):

- "capo_sum - CAPO, paired by seed over seeds 0-19, 95% t-intervals, Holm over the two": P1's and P2's paired
  p-values are Holm-adjusted together (a family of two).
- P1 (accuracy), "A loss of 0.02 is 'told' when the interval lies below 0; 'ruled out' when its lower end is above
  -0.02": told when the interval's top < 0 and P1's Holm p < 0.05; ruled out when the interval's bottom > -0.02
  (an equivalence-type reading: the interval alone); both when both hold (a loss told, smaller than 0.02; printed
  as both since 2026-11-28, before any record of the two new folders, where it printed only "told"); otherwise
  neither, reported as under-powered for 0.02. Whether the mean lies in the predicted -0.05 to -0.02 is printed
  beside it.
- P2 (AUC-mean), "no loss larger than 0.02": holds when the interval's bottom > -0.02; fails when the interval's top
  < -0.02 (a loss larger than 0.02 told); otherwise neither (under-powered). Whether the mean lies in the predicted
  [-0.01, +0.03] is printed beside it.
- Secondary, no verdict: mean response length (`mean_tokens`) capo_sum - CAPO (predicted longer) and capo_sum - GRPO
  in accuracy, AUC-mean and length; the seeds a paired t-test needs for 0.02 at 80% power at the observed sd. Each
  method's change from the start (the 8 base draws of `word_grpo_capo`) is `capo sweep report` over the three
  folders (the registration's command), not repeated here.
- Added on 2026-12-03, after every record was in: a seed whose model could not be scored on a measure (capo_sum seed
  14 had no correct answer among its 800 final samples, so it has no AUC-mean) is shown "n/a" in the table and named
  beside the interval it is left out of (:func:`capo.sweep.analysis.paired`). That is a choice made after the
  records: the reading above had no rule for an undefined value, and the script crashed on it. Scored at chance
  (0.5) instead, P2 reads the same (docs/results/fixed-point.md).

    python sweeps/analysis/word_capo_sum_verdict.py [RECORDS_FOLDER ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from capo.sweep.analysis import paired

SEEDS = tuple(range(20))  # the registered seeds
METHODS = ("grpo", "capo", "capo_sum")
FOLDERS = tuple(Path("sweeps/records") / n for n in ("word_grpo_capo", "word_capo_sum_refs", "word_capo_sum"))
SIZE = 0.02  # the loss the registration names for both claims
P1_PREDICTED, P2_PREDICTED = (-0.05, -0.02), (-0.01, 0.03)


def fmt(d: dict | None) -> str:
    if not d or d.get("low") is None:
        return "n/a"
    p = f", Holm p {d['p_holm']:.3f}" if d.get("p_holm") is not None else f", p {d['p']:.3f}"
    need = d.get("seeds_needed")
    need = "" if need is None else f"; {need:.0f} seeds for {SIZE} at 80% power"
    out = f" (seed{'s' * (len(d['left_out']) > 1)} {', '.join(map(str, d['left_out']))} left out: no value)" \
        if d.get("left_out") else ""
    return f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}] over {d['n_seeds']} seeds{out}{p}{need}"


def _holm_two(p1: dict, p2: dict) -> None:
    from statsmodels.stats.multitest import multipletests

    adjusted = multipletests([p1["p"], p2["p"]], method="holm")[1]
    p1["p_holm"], p2["p_holm"] = float(adjusted[0]), float(adjusted[1])


def p1_reading(d: dict) -> str:
    """'told', 'ruled out', both (a loss told that is smaller than 0.02) or 'neither (under-powered)' for a loss of
    0.02 in accuracy."""
    told, ruled_out = d["high"] < 0 and d["p_holm"] < 0.05, d["low"] > -SIZE
    if told and ruled_out:
        return f"a loss told, and a loss of {SIZE} ruled out (the loss is smaller)"
    if told:
        return "a loss told"
    if ruled_out:
        return f"a loss of {SIZE} ruled out"
    return f"neither told nor ruled out (under-powered for {SIZE})"


def p2_reading(d: dict) -> str:
    """'holds', 'does not hold' or 'neither (under-powered)' for "no AUC-mean loss larger than 0.02"."""
    if d["low"] > -SIZE:
        return "holds"
    if d["high"] < -SIZE:
        return "does not hold (a loss larger than 0.02 told)"
    return f"neither (under-powered for {SIZE})"


def _inside(mean: float, span: tuple[float, float]) -> str:
    return f"mean {'inside' if span[0] <= mean <= span[1] else 'outside'} the predicted [{span[0]:+}, {span[1]:+}]"


def claims(records: dict) -> list[str]:
    """The registered claims' lines, read over the seeds both methods have (all 20 once :func:`missing` is empty)."""
    p1 = paired(records, "capo_sum", "capo", "accuracy", SIZE)
    p2 = paired(records, "capo_sum", "capo", "auc_mean", SIZE)
    if p1.get("low") is None or p2.get("low") is None:
        return ["no interval can be formed"]
    _holm_two(p1, p2)
    return [f"P1 (accuracy, capo_sum - CAPO): {p1_reading(p1)} -- {fmt(p1)}; {_inside(p1['mean'], P1_PREDICTED)}",
            f"P2 (AUC-mean, capo_sum - CAPO): {p2_reading(p2)} -- {fmt(p2)}; {_inside(p2['mean'], P2_PREDICTED)}"]


def secondary(records: dict) -> list[str]:
    out = []
    for ref, measures in (("capo", ("mean_tokens",)), ("grpo", ("accuracy", "auc_mean", "mean_tokens"))):
        out += [f"capo_sum - {ref} {k} (secondary): {fmt(paired(records, 'capo_sum', ref, k, SIZE))}"
                for k in measures if ref in records]
    return out


def table(records: dict) -> list[str]:
    cols = ("accuracy", "auc_mean", "mean_tokens")
    lines = ["| seed | " + " | ".join(f"{m} {c}" for m in METHODS for c in cols) + " |",
             "|---:|" + "---:|" * (len(METHODS) * len(cols))]
    for s in SEEDS:
        cells = [_cell(records.get(m, {}).get(s), c) for m in METHODS for c in cols]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def _cell(rec: dict | None, col: str) -> str:
    """A record's value, "--" for a seed not in yet, "n/a" for a value its evaluation could not compute."""
    if rec is None:
        return "--"
    return "n/a" if rec["final"].get(col) is None else f"{rec['final'][col]:.3f}"


def missing(records: dict) -> list[str]:
    return [f"{m} seed {s}" for m in METHODS for s in SEEDS if s not in records.get(m, {})]


def main(folders: list[Path]) -> int:
    from capo.sweep.records import load_records

    records = load_records(*[f for f in folders if f.is_dir()])
    print("\n".join(table(records)))
    left = missing(records)
    if left:
        print(f"\nnot in yet ({len(left)}): {', '.join(left)}: no verdict (the claims are read only over all 20 seeds)")
        return 0
    print("\n" + "\n".join(claims(records) + secondary(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main([Path(a) for a in sys.argv[1:]] or list(FOLDERS)))
