"""Where does a collapsed policy land on `stochastic_lm`? Reads the sweep's records and, for each (method, seed), sets
the policy's final mean stated probability beside the outcome rate of the 256 training questions that seed trained
on (the value a constant statement maximising the expected log score converges to) and the held-out questions'
outcome rate (what the final `stochastic_ece` of a constant statement measures against).

    python sweeps/analysis/stochastic_lm_landing.py [sweeps/records/stochastic_lm]
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
from scipy import stats


@cache
def outcome_rate(split: str, n: int, seed: int, options: str) -> float:
    """The outcome rate of the first ``n`` questions of ``split`` (``options``: the task options as JSON)."""
    from capo.tasks.stochastic import stochastic_problems

    problems = stochastic_problems(split, n, seed=seed, options=json.loads(options))
    return float(np.mean([int(p.answer) for p in problems]))


def rows(folder: Path) -> list[dict]:
    out = []
    for f in sorted(folder.glob("*-seed*.json")):
        rec = json.loads(f.read_text())
        data, fin = rec["config"]["data"], rec["final"]
        opts = json.dumps(data["task_options"], sort_keys=True)
        out.append({"method": rec["method"], "seed": rec["seed"], "stated": fin["stochastic_mean_stated"],
                    "ece": fin["stochastic_ece"], "auroc": fin["stochastic_auroc"],
                    "train_rate": outcome_rate("train", data["n_train"], rec["seed"], opts),
                    "eval_rate": outcome_rate("eval", data["n_eval"], 0, opts)})
    return out


def main(folder: Path) -> None:
    table = rows(folder)
    print(f"{'method':8} {'seed':>4} {'stated':>7} {'train rate':>10} {'eval rate':>9} {'stated-train':>12} {'ECE':>6}")
    for r in sorted(table, key=lambda r: (r["method"], r["seed"])):
        print(f"{r['method']:8} {r['seed']:4d} {r['stated']:7.3f} {r['train_rate']:10.3f} {r['eval_rate']:9.3f} "
              f"{r['stated'] - r['train_rate']:+12.3f} {r['ece']:6.3f}")
    for m in sorted({r["method"] for r in table}):
        sub = [r for r in table if r["method"] == m]
        gap = np.array([r["stated"] - r["train_rate"] for r in sub])
        rho = stats.pearsonr([r["train_rate"] for r in sub], [r["stated"] for r in sub]) if len(sub) > 2 else None
        print(f"{m}: {len(sub)} seeds; stated - train rate mean {gap.mean():+.3f} (sd {gap.std(ddof=1):.3f}), "
              f"max |gap| {np.abs(gap).max():.3f}; Pearson r(train rate, stated) "
              + (f"{rho.statistic:.2f} (p {rho.pvalue:.3f})" if rho else "n/a"))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "sweeps/records/stochastic_lm"))
