"""Benchmark: the CAPO advantage is linear in N (responses) for a fixed group size G.

Prints seconds per million responses for several N at G = 8 and G = 64, measured in one run (compare the
ratios, not absolute times across runs). The cost is O(N * G): one [B, G, G] pair-weight tensor.

    python benchmarks/capo_advantage.py [--max-n 1048576] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402

from capo.core import capo_advantage, grpo_advantage  # noqa: E402


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up (allocator, thread pool)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-n", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    add_quick(ap, max_n=1 << 16, repeats=2)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'G':>4} {'N':>9} {'capo s':>9} {'s/1M resp':>10} {'grpo s/1M':>10} {'capo/grpo':>9}")
    for g in (8, 64):
        n = 1 << 14
        per_m = []
        while n <= args.max_n:
            n_eff = (n // g) * g
            r = torch.randint(0, 2, (n_eff,), generator=gen).float()
            s = -torch.rand(n_eff, generator=gen) * 3
            t_capo = best_time(lambda: capo_advantage(r, g, scores=s, tau=0.6), args.repeats)
            t_grpo = best_time(lambda: grpo_advantage(r, g), args.repeats)
            per_m.append(t_capo / n_eff * 1e6)
            print(f"{g:>4} {n_eff:>9} {t_capo:>9.4f} {per_m[-1]:>10.4f} {t_grpo / n_eff * 1e6:>10.4f} "
                  f"{t_capo / t_grpo:>9.1f}")
            n *= 4
        print(f"G={g}: time per 1M responses, largest N / smallest N = {per_m[-1] / per_m[0]:.2f} "
              "(~1 means linear in N)")


if __name__ == "__main__":
    main()
