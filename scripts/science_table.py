"""Tables for docs/results/embedded-default.md from a `capo demo` output folder: training-time held-out evals per
algorithm and seed, rollout AUC-mean early vs late, and the final held-out evaluation (mean and sd over seeds).

    python scripts/science_table.py runs/science
"""

import json
import statistics as st
import sys
from pathlib import Path


def rows(p):
    return [json.loads(ln) for ln in (p / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def ms(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{st.mean(xs):.3f}" + (f" ± {st.stdev(xs):.3f}" if len(xs) > 1 else "")


def main(root: Path) -> None:
    runs = sorted(d for d in root.iterdir() if (d / "metrics.jsonl").exists())
    algos = sorted({d.name.split("-seed")[0] for d in runs})
    print("| algorithm | seeds | eval/accuracy by step | eval/auc_mean by step | rollout calib/auc_mean, first 10 -> last 10 steps |")
    print("|---|---|---|---|---|")
    for a in algos:
        rs = [rows(d) for d in runs if d.name.startswith(a + "-seed")]
        steps = sorted({r["step"] for x in rs for r in x if r.get("eval/accuracy") is not None})
        acc = " / ".join(ms([next((r["eval/accuracy"] for r in x if r["step"] == s), None) for x in rs]) for s in steps)
        auc = " / ".join(ms([next((r["eval/auc_mean"] for r in x if r["step"] == s), None) for x in rs]) for s in steps)
        early = ms([st.mean([r["calib/auc_mean"] for r in x[:10] if r.get("calib/auc_mean") is not None]) for x in rs])
        late = ms([st.mean([r["calib/auc_mean"] for r in x[-10:] if r.get("calib/auc_mean") is not None]) for x in rs])
        print(f"| {a} | {len(rs)} | steps {steps}: {acc} | {auc} | {early} -> {late} |")
    summ = root / "summary.json"
    if summ.exists():
        s = json.loads(summ.read_text())
        keys = ["accuracy", "auc_mean", "auroc", "ece", "brier", "verbal_ece", "verbal_brier"]
        print("\n| model | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for a, row in s["mean_sd_over_seeds"].items():
            print(f"| {a} | " + " | ".join("-" if v[0] is None else f"{v[0]:.3f}" + (f" ± {v[1]:.3f}" if v[1] else "")
                                          for v in (row[k] for k in keys)) + " |")
        print("\n| run | paired AUC-mean diff vs base | 95% CI | prompts |")
        print("|---|---|---|---|")
        for n, d in s["paired_auc_vs_base"].items():
            print(f"| {n} | {d['diff']:.3f} | [{d['low']:.3f}, {d['high']:.3f}] | {d['n_prompts']} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
