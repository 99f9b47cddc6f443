"""Benchmark: starting the verifier's workers from a training script, capo's design against the one it replaced.

A training script imports torch before it creates a Verifier. The design before 2026-11-26 (a ProcessPoolExecutor
per worker, forkserver context, math-verify loaded by the initializer) re-imported that script -- torch included --
in its workers; today each worker is a fresh `python -m capo.verify._worker`. This script imports torch as a user's
would, then, in one run and alternating the two designs, measures for `--workers` workers: the wall time from
creating the pool to every worker's first answer (cold start), and one worker's address space (VmSize), which the
memory bound of the old design was an absolute limit on. Prints the medians and their ratios.

    python benchmarks/verifier_start.py [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch  # noqa: F401  - what a training script has loaded before it verifies anything

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402

from capo.verify import Verifier, _worker  # noqa: E402


def _old_init() -> None:
    """The replaced design's worker initializer: warm math-verify imports (the memory bound left out: it is the
    quantity measured)."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    _worker.ping()


def old_design(workers: int) -> tuple[float, int]:
    """Cold start of the replaced design: (seconds until every worker answered, one worker's address space)."""
    t0 = time.perf_counter()
    ex = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"), initializer=_old_init)
    sizes = [f.result() for f in [ex.submit(_worker.address_space_bytes) for _ in range(workers)]]
    took = time.perf_counter() - t0
    ex.shutdown()
    return took, max(sizes)


def new_design(workers: int) -> tuple[float, int]:
    """Cold start of capo's workers: (seconds until every worker answered, one worker's address space)."""
    t0 = time.perf_counter()
    with Verifier(workers=workers) as v:
        sizes = v._run_tasks([(_worker.address_space_task,)] * workers, on_timeout="timeout")
        took = time.perf_counter() - t0
    return took, max(int(s) for s in sizes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="worker processes per pool")
    ap.add_argument("--repeats", type=int, default=3, help="cold starts of each design (alternating)")
    add_quick(ap, repeats=1)
    a = ap.parse_args(argv)
    runs = {"old (forkserver, re-imports the script)": [], "new (python -m capo.verify._worker)": []}
    for _ in range(a.repeats):
        for name, fn in zip(runs, (old_design, new_design)):
            runs[name].append(fn(a.workers))
    print(f"{a.workers} workers, parent has torch {torch.__version__} imported; median of {a.repeats} cold starts")
    print(f"{'design':42} {'cold start s':>12} {'worker VmSize GB':>17}")
    med = {}
    for name, rs in runs.items():
        med[name] = (statistics.median(t for t, _ in rs), statistics.median(s for _, s in rs) / 2**30)
        print(f"{name:42} {med[name][0]:12.2f} {med[name][1]:17.2f}")
    (t_old, s_old), (t_new, s_new) = med.values()
    print(f"ratio old/new: cold start {t_old / t_new:.2f}x, address space {s_old / s_new:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
