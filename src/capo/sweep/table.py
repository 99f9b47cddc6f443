"""The report of the stochastic-outcome table model's runs (``capo.trainer.table_model`` records): per-seed values,
seed-paired differences against a reference method with 95% t-intervals and Holm-adjusted p (the sweep report's
own statistics, ``capo.sweep.analysis.seed_paired``), and one figure: each category's stated probability against
its true rate, and the ECE along training.

    python -m capo.sweep.table sweeps/records/table_model --reference grpo [--out docs/figures/table_model]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from capo.errors import CapoError
from capo.rundir import atomic_write_text
from capo.sweep.analysis import holm, seed_paired
from capo.sweep.report import DEFAULT_REFERENCE

MEASURES = ("ece", "abs_err_rate", "auroc", "accuracy")
LABELS = {"ece": "ECE", "abs_err_rate": "mean abs(q - p_c)", "auroc": "AUROC", "accuracy": "accuracy"}


def load(folder: Path) -> dict:
    """{method: {seed: record}} from the ``METHOD-seedS.json`` records in ``folder``."""
    recs: dict = {}
    for p in sorted(Path(folder).glob("*-seed*.json")):
        r = json.loads(p.read_text())
        recs.setdefault(r["settings"]["method"], {})[r["settings"]["seed"]] = r
    if not recs:
        raise CapoError(f"no table-model records (METHOD-seedS.json) in {folder}")
    return recs


def summarize(recs: dict, reference: str, effect: float = 0.05) -> dict:
    """Per method and measure the per-seed values; per other method the seed-paired difference to ``reference``
    (mean, sd, 95% t-interval, p, Holm-adjusted p over the compared methods, seeds needed for ``effect``)."""
    if reference not in recs:
        raise CapoError(f"no records of the reference {reference!r}; methods: {', '.join(sorted(recs))}")
    out = {"reference": reference, "methods": {}, "paired": {}}
    for m, by_seed in sorted(recs.items()):
        out["methods"][m] = {"seeds": sorted(by_seed),
                             **{k: [by_seed[s]["final"][k] for s in sorted(by_seed)] for k in MEASURES}}
    for m in sorted(recs):
        if m == reference:
            continue
        seeds = sorted(set(recs[m]) & set(recs[reference]))
        out["paired"][m] = {k: {"seeds": seeds, **seed_paired(
            [recs[reference][s]["final"][k] - recs[m][s]["final"][k] for s in seeds], effect)} for k in MEASURES}
    holm(out["paired"], MEASURES)
    return out


def markdown(s: dict) -> str:
    ref = s["reference"]
    lines = ["| method | seeds | " + " | ".join(LABELS[k] for k in MEASURES) + " |",
             "|---|---|" + "---|" * len(MEASURES)]
    for m, v in s["methods"].items():
        cells = [f"{np.mean(v[k]):.3f} +- {np.std(v[k], ddof=1) if len(v[k]) > 1 else 0:.3f}" for k in MEASURES]
        lines.append(f"| {m} | {len(v['seeds'])} | " + " | ".join(cells) + " |")
    lines += ["", f"Seed-paired differences {ref} - method (95% t-interval over seeds; p; p Holm-adjusted over the "
              "methods compared):", "", "| method | " + " | ".join(LABELS[k] for k in MEASURES) + " |",
              "|---|" + "---|" * len(MEASURES)]
    for m, d in s["paired"].items():
        cells = [f"{x['mean']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]; p {x['p']:.2g}, Holm {x['p_holm']:.2g}"
                 if x.get("low") is not None else "n/a" for x in (d[k] for k in MEASURES)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    seeds = sorted({x for v in s["methods"].values() for x in v["seeds"]})  # every method's, each in its column
    lines += ["", "Per seed (ECE):", "", "| method | " + " | ".join(f"seed {x}" for x in seeds) + " |",
              "|---|" + "---|" * len(seeds)]
    for m, v in s["methods"].items():
        ece = dict(zip(v["seeds"], v["ece"]))
        lines.append(f"| {m} | " + " | ".join(f"{ece[x]:.3f}" if x in ece else "-" for x in seeds) + " |")
    return "\n".join(lines) + "\n"


def figure(recs: dict, path: Path) -> None:
    """Left: every category's final stated probability (softmax mean) against its true rate, all seeds, per method.
    Right: ECE of the per-question mean stated probability along training, mean over seeds (band: +-1 sd)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for i, (m, by_seed) in enumerate(sorted(recs.items())):
        rate = np.concatenate([r["rate"] for r in by_seed.values()])
        stated = np.concatenate([r["stated_by_category"] for r in by_seed.values()])
        left.scatter(rate, stated, s=10, alpha=0.6, color=f"C{i}", label=f"{m} ({len(by_seed)} seeds)")
        steps = np.array([c["step"] for c in next(iter(by_seed.values()))["curves"]])
        ece = np.array([[c["ece"] for c in r["curves"]] for r in by_seed.values()])
        mu, sd = ece.mean(0), ece.std(0, ddof=1) if len(ece) > 1 else np.zeros_like(ece[0])  # as every sd here
        right.plot(steps, mu, color=f"C{i}", label=m)
        right.fill_between(steps, mu - sd, mu + sd, color=f"C{i}", alpha=0.2)
    left.plot([0, 1], [0, 1], "k--", lw=0.8)
    left.set(xlabel="category's true rate p_c", ylabel="stated probability (policy mean)", xlim=(0, 1), ylim=(0, 1),
             title="Stated probability vs true rate, per category")
    right.set(xlabel="step", ylabel="ECE (10 bins) of per-question mean", title="ECE along training")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", type=Path, help="folder of table-model records (METHOD-seedS.json)")
    ap.add_argument("--reference", default=DEFAULT_REFERENCE, help="method the others are paired with")
    ap.add_argument("--out", type=Path, default=None, help="write summary.json, summary.md and table_model.png here")
    a = ap.parse_args(argv)
    try:
        recs = load(a.records)
        s = summarize(recs, a.reference)
    except CapoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    md = markdown(s)
    print(md)
    if a.out is not None:  # data files first, the figure last
        a.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(a.out / "summary.json", json.dumps(s, indent=1))
        atomic_write_text(a.out / "summary.md", md)
        figure(recs, a.out / "table_model.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
