"""The calibration-collapse sweep on the coin_sum testbed (commands and tables: docs/results/collapse-testbed.md, "The
calibration-collapse testbed (coin_sum)").

One training job at a time (the machine is small and shared), each a plain ``capo train --config collapse`` with the
setting's overrides; held-out metrics come from the trainer's own evaluations (``eval/*`` every ``run.eval_every``
steps, 128 held-out prompts x 8 samples, fixed sampling seed). The base model is measured by the same code path
(``Trainer.evaluate`` before any update), per seed, so every row is comparable with step 0.

    python scripts/collapse_sweep.py run   --out runs/collapse --settings preset,lr1e-3 --algos grpo --seeds 0
    python scripts/collapse_sweep.py table --out runs/collapse [--metrics eval/auc_mean,eval/accuracy]
    python scripts/collapse_sweep.py plots --out runs/collapse --settings preset --plots-dir docs/figures/collapse
    python scripts/collapse_sweep.py split --out runs/demo-collapse     # a `capo demo --task collapse` folder

Finished runs (a final ``step`` line in metrics.jsonl) are skipped, so the command can be re-run to extend a sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
from pathlib import Path

# name -> (overrides on top of the `collapse` preset, what the setting probes). Steps are a separate axis (--steps).
SETTINGS: dict[str, tuple[dict, str]] = {
    "preset": ({}, "the preset: lr 3e-4, 1 update per batch, eps 0.2, fair coin on half the problems"),
    "lr1e-3": ({"optim.lr": 1e-3}, "larger learning rate"),
    "epochs4": ({"optim.ppo_epochs": 4, "optim.mini_batches": 4}, "off-policy: 4 passes x 4 mini-batches"),
    "epochs4-clip0.4": ({"optim.ppo_epochs": 4, "optim.mini_batches": 4, "algo.loss_kwargs": "{eps_low: 0.4, eps_high: 0.4}"},
                        "off-policy with a wider clip range"),
    "lr1e-3-epochs4": ({"optim.lr": 1e-3, "optim.ppo_epochs": 4, "optim.mini_batches": 4},
                       "larger learning rate and off-policy"),
    "allcoin": ({"data.task_options": "{p_one: 0.5, coin_frac: 1.0}"}, "every problem has a fair hidden coin"),
    "nocoin": ({"data.task_options": "{p_one: 0.5, coin_frac: 0.0}"}, "no coin: deterministic outcomes (control)"),
    "biased-coin": ({"data.task_options": "{p_one: 0.8, coin_frac: 0.5}"}, "a biased coin: a learnable majority"),
}
EVAL_KEYS = ("eval/accuracy", "eval/auc_mean", "eval/auroc", "eval/ece", "eval/brier", "eval/verbal_ece",
             "eval/verbal_brier")
TRAIN_KEYS = ("policy/entropy", "policy/logp_adv_cov")


def _overrides(setting: str, algo: str, seed: int, steps: int, eval_every: int, out: Path) -> list[str]:
    ov = {"algo.name": algo, "run.seed": seed, "run.steps": steps, "run.eval_every": eval_every, "run.threads": 1,
          "run.progress": "false", "run.out_dir": str(out), **SETTINGS[setting][0]}
    return [x for k, v in ov.items() for x in (f"--{k}", str(v))]


def _finished(run: Path, steps: int) -> bool:
    m = run / "metrics.jsonl"
    return m.exists() and any(json.loads(ln).get("step") == steps for ln in m.read_text().splitlines() if ln.strip())


def base_eval(setting: str, seed: int, out: Path) -> dict:
    """The untrained model's ``eval/*`` by the trainer's own evaluation (same prompts, same sampling seed)."""
    path = out / f"base-seed{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    import torch

    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer

    torch.set_num_threads(1)
    ov = dict(zip(*[iter(_overrides(setting, "grpo", seed, 1, 1, out / "base-tmp"))] * 2))
    cfg = load_config("collapse", {k[2:]: v for k, v in ov.items()})
    res = Trainer(cfg).evaluate()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    return res


def run(args) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for setting in args.settings:
        for seed in args.seeds:
            base_eval(setting, seed, args.out / setting)
            for algo in args.algos:
                d = args.out / setting / f"{algo}-seed{seed}"
                if _finished(d, args.steps):
                    continue
                cmd = [sys.executable, "-m", "capo.cli", "train", "--config", "collapse",
                       *_overrides(setting, algo, seed, args.steps, args.eval_every, d)]
                print("+", " ".join(cmd[1:]), flush=True)
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def _rows(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _ms(xs) -> str:
    xs = [x for x in xs if x is not None and x == x]
    if not xs:
        return "-"
    return f"{st.mean(xs):.3f}" + (f"±{st.stdev(xs):.3f}" if len(xs) > 1 else "")


def table(args) -> None:
    """One markdown row per (setting, algorithm, eval step): eval metrics mean±sd over seeds, and the mean of the
    training diagnostics over the steps since the previous evaluation; base rows come first (step 0)."""
    keys = args.metrics
    print("| setting | algo | step | seeds | " + " | ".join(k.split("/", 1)[1] for k in keys) + " |")
    print("|---|---|---|---|" + "---|" * len(keys))
    for sdir in sorted(p for p in args.out.iterdir() if p.is_dir()):
        bases = [json.loads(p.read_text()) for p in sorted(sdir.glob("base-seed*.json"))]
        if bases:
            print(f"| {sdir.name} | base | 0 | {len(bases)} | "
                  + " | ".join(_ms([b.get(k) for b in bases]) for k in keys) + " |")
        runs = sorted(p for p in sdir.iterdir() if (p / "metrics.jsonl").exists())
        for algo in sorted({p.name.rsplit("-seed", 1)[0] for p in runs}):
            rs = [_rows(p) for p in runs if p.name.rsplit("-seed", 1)[0] == algo]
            steps = sorted({r["step"] for x in rs for r in x if "eval/accuracy" in r})
            for s in steps:
                vals = []
                for k in keys:
                    if k.startswith("eval/"):
                        vals.append(_ms([next((r.get(k) for r in x if r["step"] == s and k in r), None) for x in rs]))
                    else:  # a training diagnostic: its mean over the window ending at this evaluation
                        prev = max([t for t in steps if t < s], default=0)
                        win = [[r[k] for r in x if prev < r["step"] <= s and r.get(k) is not None] for x in rs]
                        vals.append(_ms([st.mean(w) if w else None for w in win]))
                print(f"| {sdir.name} | {algo} | {s} | {len(rs)} | " + " | ".join(vals) + " |")


def plots(args) -> None:
    """One PNG per metric and setting: the metric against the step, one line per algorithm with a min-max band over
    seeds, the base model's mean as a dashed line (eval metrics)."""
    from capo.evaluation.plots import plot_bands

    dest = args.plots_dir or args.out
    dest.mkdir(parents=True, exist_ok=True)
    for sdir in sorted(p for p in args.out.iterdir() if p.is_dir() and p.name in args.settings):
        bases = [json.loads(p.read_text()) for p in sorted(sdir.glob("base-seed*.json"))]
        runs = sorted(p for p in sdir.iterdir() if (p / "metrics.jsonl").exists())
        algos = sorted({p.name.rsplit("-seed", 1)[0] for p in runs})
        for k in args.metrics:
            series = {}
            for algo in algos:
                curves = []
                for p in runs:
                    if p.name.rsplit("-seed", 1)[0] == algo:
                        rs = [r for r in _rows(p) if r.get(k) is not None]
                        curves.append(([r["step"] for r in rs], [r[k] for r in rs]))
                series[algo] = curves
            ref = st.mean(b[k] for b in bases) if bases and k in bases[0] else None
            out = dest / f"{sdir.name}-{k.replace('/', '_')}.png"
            plot_bands(series, out, title=f"{k} ({sdir.name})", xlabel="step", ylabel=k, reference=ref)
            print(out)


def split(args) -> None:
    """For a `capo demo --task collapse` folder (--out): accuracy, AUC-mean and the paired per-prompt AUC-mean
    difference vs base (95% bootstrap interval) on all held-out prompts, on the coin prompts and on the others."""
    import torch

    from capo.core.calibration import auc_mean, paired_difference

    def load(d: Path, subset: str):
        rows = [json.loads(ln) for ln in (d / "generations.jsonl").read_text().splitlines() if ln.strip()]
        rows = [r for r in rows if subset == "all" or (("?" in r["prompt"]) == (subset == "coin"))]
        ids = {p: i for i, p in enumerate(sorted({str(r["prompt_id"]) for r in rows}))}
        lpm = [r["mean_logprob"] if r["mean_logprob"] is not None else float("-inf") for r in rows]
        return (torch.tensor(lpm, dtype=torch.float64), torch.tensor([r["verdict"] == "correct" for r in rows]),
                torch.tensor([ids[str(r["prompt_id"])] for r in rows]))

    ev = args.out / "eval"
    print("| model | prompts | accuracy | AUC-mean | paired AUC-mean diff vs base [95% CI] (prompts) |")
    print("|---|---|---|---|---|")
    for subset in ("all", "coin", "no coin"):
        base = load(ev / "base", subset)
        for d in sorted(ev.iterdir(), key=lambda p: (p.name != "base", p.name)):
            x = load(d, subset)
            pd = paired_difference(*x, *base, n_boot=1000, seed=0) if d.name != "base" else None
            diff = "-" if pd is None else f"{pd.value:+.3f} [{pd.low:+.3f}, {pd.high:+.3f}] ({pd.n_groups_used})"
            print(f"| {d.name} | {subset} | {float(x[1].double().mean()):.3f} | {auc_mean(*x).value:.3f} | {diff} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=("run", "table", "plots", "split"))
    p.add_argument("--out", type=Path, default=Path("runs/collapse"))
    p.add_argument("--settings", default="preset", help="comma-separated names (run: one of " + ", ".join(SETTINGS)
                   + "; plots: any setting folder under --out)")
    p.add_argument("--algos", default="grpo")
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--metrics", default=",".join(EVAL_KEYS + TRAIN_KEYS))
    p.add_argument("--plots-dir", type=Path, default=None, help="where `plots` writes its PNGs (default: --out)")
    a = p.parse_args(argv)
    a.settings = [s for s in a.settings.split(",") if s]
    unknown = [s for s in a.settings if s not in SETTINGS]
    if unknown and a.cmd == "run":  # table/plots read any folder names
        p.error(f"unknown setting(s) {unknown}; known: {', '.join(SETTINGS)}")
    a.algos = [x for x in a.algos.split(",") if x]
    a.seeds = [int(x) for x in a.seeds.split(",") if x]
    a.metrics = [m for m in a.metrics.split(",") if m]
    {"run": run, "table": table, "plots": plots, "split": split}[a.cmd](a)


if __name__ == "__main__":
    main()
