"""The methods-comparison tables and figures for docs/results/methods-compared.md ("Seventeen methods compared, 3
seeds") from a `capo demo` output folder.

Reads OUT/eval/<model>-seed<N>/ (and OUT/eval/base), groups seeds into models with the report's own comparison
(:func:`capo.evaluation.compare.compare`: paired bootstrap over the shared held-out prompts, mean over seeds) and
prints two markdown tables: every measure's mean (sd over seeds) per model, and each model minus the reference
model with its 95% paired interval. With --plots-dir it writes the report's accuracy-vs-AUC figure and the
paired-difference forest plot as PNGs.

    python scripts/compare_table.py runs/compare-default --reference grpo --plots-dir docs/figures/compare --prefix default
    python scripts/compare_table.py runs/demo-a runs/demo-b --reference grpo    # two demos with the same base and task
"""

from __future__ import annotations

import argparse
import json
import statistics as st
from pathlib import Path

from capo.evaluation import compare as cmp_mod
from capo.evaluation import plots
from capo.evaluation.report import _acc_auc_points, load_run, paired_panels

# (metrics.json key, column header) of the first table; test-time scaling at k = the eval's samples per prompt
TABLE = (("accuracy", "accuracy"), ("auc_mean", "AUC-mean"), ("auroc", "pooled AUROC"), ("ece", "ECE"),
         ("brier", "Brier"), ("verbal_ece", "verbal ECE"), ("verbal_brier", "verbal Brier"), ("aurc", "AURC"),
         ("majority_vote", "maj. vote"), ("perplexity_consistency", "ppl. consistency"),
         ("max_confidence_lpm", "max-lpm pick"), ("confidence_weighted_vote", "verbal-weighted vote"),
         ("pass_at_8", "pass@8"))


def _ms(xs: list) -> str:
    xs = [x for x in xs if isinstance(x, (int, float)) and x == x]
    if not xs:
        return "-"
    return f"{st.mean(xs):.3f}" + (f" ({st.stdev(xs):.3f})" if len(xs) > 1 else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="+",
                    help="`capo demo` output folder(s); a model evaluated in several (e.g. base) is read from the first")
    ap.add_argument("--reference", default="grpo", help="model the paired differences are taken against")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--plots-dir", type=Path, default=None)
    ap.add_argument("--prefix", default="compare", help="file-name prefix of the PNGs")
    a = ap.parse_args(argv)
    found: dict[str, Path] = {}
    for folder in a.out:
        for d in sorted((folder / "eval").iterdir()):
            if (d / "metrics.json").is_file():
                found.setdefault(d.name, d)
    runs = [load_run(d, name=n) for n, d in sorted(found.items())]
    c = cmp_mod.compare(runs, n_boot=a.n_boot, seed=0, reference=a.reference)
    print(f"{len(c.models)} models, {c.prompts} shared held-out prompts; mean (sd over seeds)\n")
    print("| model | seeds | " + " | ".join(h for _, h in TABLE) + " |")
    print("|---|---|" + "---|" * len(TABLE))
    for m in c.models:
        print(f"| {m.name} | {len(m.runs)} | " + " | ".join(_ms([r.metrics.get(k) for r in m.runs]) for k, _ in TABLE) + " |")
    others = [m.name for m in c.models if m.name != c.reference]
    print(f"\nPaired difference vs {c.reference} (model - {c.reference}; 95% bootstrap interval over the {c.prompts} "
          f"prompts, {c.n_boot} draws, mean over seeds; **bold**: the interval excludes 0)\n")
    print("| model | " + " | ".join(lbl for _, lbl, _ in cmp_mod.MEASURES) + " |")
    print("|---|" + "---|" * len(cmp_mod.MEASURES))
    for name in others:
        cells = []
        for key, _, _ in cmp_mod.MEASURES:
            d = c.diff(name, c.reference, key)
            if d is None:
                cells.append("-")
                continue
            excl = d[1] > 0 or d[2] < 0
            s = f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
            cells.append(f"**{s}**" if excl else s)
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n" + cmp_mod.headline(c)[0])
    if a.plots_dir:
        a.plots_dir.mkdir(parents=True, exist_ok=True)
        plots.plot_acc_vs_auc(_acc_auc_points(c), a.plots_dir / f"{a.prefix}-acc_vs_auc.png")
        plots.plot_paired(paired_panels(c), c.reference, a.plots_dir / f"{a.prefix}-paired_vs_{c.reference}.png")
        (a.plots_dir / f"{a.prefix}-summary.json").write_text(json.dumps(
            {m.name: {k: [r.metrics.get(k) for r in m.runs] for k, _ in TABLE} for m in c.models}, indent=1))


if __name__ == "__main__":
    main()
