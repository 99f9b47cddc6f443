"""Benchmark: `capo eval --generations` at scale (target: 100,000 rows in <= 60 s on one core).

Writes a synthetic generations file (schema: docs/generations-schema.md; GSM8K-like: k responses per question, a
`\\boxed{}` answer right about 60% of the time, per-token log-probs of 50-250 tokens), runs the whole
`capo eval --generations` on it in this process (one torch thread) and prints rows per second. Then the check: on
the first ``--check-rows`` rows of that run, every metric and curve of ``compute_metrics`` with the intervals'
bootstrap from per-question sums (``capo.evaluation.bootstrap.QuestionBootstrap``, the shipped path) against the
replicate-by-replicate path (``capo.core.calibration.bootstrap_ci`` re-running each metric on each replicate, what
``capo eval`` ran before), same seed: the largest absolute difference (must be <= 1e-9) and the speed ratio of the two,
measured in this run.

With ``--against SRC`` (the ``src`` folder of another capo checkout, e.g. the commit before a change) the command line
``capo eval --generations`` of this checkout and of SRC run back to back on the same file, each in a fresh process at
one thread (OMP_NUM_THREADS=1): both times, their ratio, and the largest difference between their metrics.json (every
metric and curve; must be <= 1e-9) and whether their generations.jsonl rows hold the same values. On a shared machine
the ratio of two runs taken together says more than either time.

    python benchmarks/eval_generations.py                      # 100,000 rows (~1 min), check on 5,000 rows
    python benchmarks/eval_generations.py --token-stats        # the three per-token statistics too (4 lists a row)
    git archive 817fa95 src | tar -x -C /tmp/capo-before       # the code before the speed-up of --generations
    python benchmarks/eval_generations.py --token-stats --against /tmp/capo-before/src --check-rows 0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402

from capo.core import calibration as cal  # noqa: E402
from capo.evaluation import estimators, metrics  # noqa: E402
from capo.evaluation.run import EvalSettings, run_eval  # noqa: E402
from capo.rundir import read_jsonl_rows  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"


def write_generations(path: Path, rows: int, k: int, tokens: int, token_stats: bool, seed: int = 0) -> None:
    """``rows`` synthetic rows, ``k`` per question, in the schema of docs/generations-schema.md."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(rows):
            q, j = divmod(i, k)
            gold = (q * 37) % 1000
            ans = gold if rng.random() < 0.6 else gold + rng.randint(1, 3)
            n = rng.randint(tokens // 3, 2 * tokens - tokens // 3)
            row = {"prompt_id": f"q{q}", "sample_idx": j, "prompt": f"Question {q}?", "gold": str(gold),
                   "text": f"Step one. Step two gives {ans}. The answer is \\boxed{{{ans}}}.",
                   "token_logprobs": [round(-rng.expovariate(3.0), 6) for _ in range(n)]}
            if token_stats:
                for name in ("token_entropy", "token_kl_uniform", "token_topk_conf"):
                    row[name] = [round(rng.expovariate(1.0), 6) for _ in range(n)]
            f.write(json.dumps(row) + "\n")


class ReplicateBootstrap:
    """The replicate-by-replicate reference with QuestionBootstrap's interface: each interval re-runs the metric on
    every replicate's rows (``capo.core.calibration.bootstrap_ci``)."""

    def __init__(self, group_ids: torch.Tensor, n_boot: int, seed: int):
        self.g, self.n_boot, self.seed = group_ids, n_boot, seed

    def _ci(self, fn, *arrays, grouped: bool = False):
        return cal.bootstrap_ci(fn, *arrays, group_ids=self.g, n_boot=self.n_boot, seed=self.seed,
                                pass_group_ids=grouped)

    def mean_ci(self, x):
        return self._ci(lambda y: float(y.to(torch.float64).mean()), x)

    def auc_mean_ci(self, s, c):
        return self._ci(lambda a, b, g: cal.auc_mean(a, b, g).value, s, c, grouped=True)

    def auroc_ci(self, s, c):
        return self._ci(lambda a, b: cal.auroc(a, b), s, c)


def max_difference(a, b, path: str = "") -> float:
    """The largest absolute difference between two nested metric structures (timings left out); a structural
    difference is an error."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (path, a.keys() ^ b.keys())
        return max((max_difference(a[k], b[k], f"{path}/{k}") for k in a if not k.startswith("time_")), default=0.0)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        return max((max_difference(x, y, path) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return 0.0
    if isinstance(a, (int, float)) and not isinstance(a, bool) and a is not None and b is not None:
        return abs(a - b)
    assert a == b, (path, a, b)
    return 0.0


def check(rows: list[dict], n_boot: int) -> tuple[float, float, float]:
    """(max |difference|, seconds of the shipped path, seconds of the replicate-by-replicate one) of compute_metrics."""
    t0 = time.perf_counter()
    new = metrics.compute_metrics(rows, n_boot=n_boot, seed=0)
    t_new = time.perf_counter() - t0
    shipped = metrics.QuestionBootstrap
    metrics.QuestionBootstrap = estimators.QuestionBootstrap = ReplicateBootstrap
    try:
        t0 = time.perf_counter()
        ref = metrics.compute_metrics(rows, n_boot=n_boot, seed=0)
        t_ref = time.perf_counter() - t0
    finally:
        metrics.QuestionBootstrap = estimators.QuestionBootstrap = shipped
    return max_difference(new, ref), t_new, t_ref


def run_cli(src: Path, gen: Path, out: Path, n_boot: int) -> tuple[float, float]:
    """(wall s, CPU s) of ``capo eval --generations gen --out out`` with capo from ``src``, in a fresh process at one
    thread."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "capo.cli", "eval", "--generations", str(gen), "--out", str(out), "--n-boot", str(n_boot),
           "--verify-workers", "1"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def against(gen: Path, out: Path, other: Path, rows: int, n_boot: int) -> float:
    """Both command lines back to back (this checkout's into out/this first, then SRC's into out/against); prints the
    times and the ratio; returns the largest difference between the two metrics.json (timings and config left out)."""
    times, payloads = [], []
    for name, src in (("this", SRC), ("against", other)):
        times.append(run_cli(src, gen, out / name, n_boot))
        payloads.append(json.loads((out / name / "metrics.json").read_text()))
        payloads[-1].pop("config")
        print(f"capo eval --generations with capo from {src}: {rows} rows in {times[-1][0]:.1f} s wall, "
              f"{times[-1][1]:.1f} s CPU, {rows / times[-1][0]:,.0f} rows/s")
    (new_wall, new_cpu), (old_wall, old_cpu) = times
    print(f"ratio ({other} / this checkout): {old_wall / new_wall:.2f}x wall, {old_cpu / new_cpu:.2f}x CPU")
    same_rows = read_jsonl_rows(out / "this" / "generations.jsonl") == read_jsonl_rows(out / "against" / "generations.jsonl")
    diff = max_difference(*payloads)
    print(f"metrics.json: max |difference| of every metric and curve {diff:.2e} (must be <= 1e-9); generations.jsonl "
          f"rows hold the same values: {same_rows}")
    assert same_rows
    return diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=8, help="responses per question")
    ap.add_argument("--tokens", type=int, default=150, help="mean response length in tokens")
    ap.add_argument("--token-stats", action="store_true", help="add token_entropy, token_kl_uniform, token_topk_conf")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates of the timed run (capo eval's)")
    ap.add_argument("--check-rows", type=int, default=5000, help="rows of the check (0: no check)")
    ap.add_argument("--check-boot", type=int, default=1000, help="replicates of the check (capo eval's default)")
    ap.add_argument("--against", type=Path, default=None, metavar="SRC",
                    help="time the command line of this checkout and of capo from SRC back to back (module docstring)")
    ap.add_argument("--out", default=None, help="folder for the file and the run (default: a temporary one)")
    add_quick(ap, rows=4000, check_rows=800, check_boot=50)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out or tempfile.mkdtemp(prefix="capo_eval_generations_"))
    out.mkdir(parents=True, exist_ok=True)
    gen = out / "generations_in.jsonl"
    t0 = time.perf_counter()
    write_generations(gen, a.rows, a.k, a.tokens, a.token_stats)
    print(f"wrote {a.rows} rows ({gen.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s -> {gen}")
    if a.against is not None:
        diff = against(gen, out, a.against.resolve(), a.rows, a.n_boot)
    else:
        s = EvalSettings(generations=str(gen), n_boot=a.n_boot, verify_workers=1)
        t0, c0 = time.perf_counter(), time.process_time()
        run_eval(s, out / "run", progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"capo eval --generations: {a.rows} rows in {wall:.1f} s wall ({cpu:.1f} s CPU of this process), "
              f"{a.rows / wall:,.0f} rows/s (target: 100,000 rows in <= 60 s)")
        diff = 0.0
    if a.check_rows > 0:
        rows = read_jsonl_rows(out / ("this" if a.against is not None else "run") / "generations.jsonl")[: a.check_rows]
        d, t_new, t_ref = check(rows, a.check_boot)
        print(f"check on {len(rows)} rows, {a.check_boot} replicates: max |difference| of every metric and curve "
              f"{d:.2e} (must be <= 1e-9); compute_metrics {t_new:.2f} s vs {t_ref:.2f} s replicate by replicate "
              f"({t_ref / t_new:.1f}x)")
        diff = max(diff, d)
    if a.out is None:
        shutil.rmtree(out)
    assert diff <= 1e-9, diff


if __name__ == "__main__":
    main()
