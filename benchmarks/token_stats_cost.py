"""Benchmark: the cost of recording per-token statistics during sampling (issue 15; target <= 5% over plain
sampling).

``record_stats=True`` adds, at every decoding step, the entropy, self-certainty (KL from uniform) and DeepConf top-20
confidence of the step's distribution (one top-k and three reductions over the vocabulary). Measured in one process,
the two variants interleaved, same prompts and seeds, EOS unreachable so every response has exactly T tokens; the
ratio of median CPU seconds (this process, all threads) per sampling call.

    python benchmarks/token_stats_cost.py --size tiny
    python benchmarks/token_stats_cost.py --size smollm2 --tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from trl_vs_capo import bench_prompts, build_assets  # noqa: E402

from capo.rollout import HFEngine, load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--prompts", choices=("gsm8k", "arith"), default="gsm8k")
    ap.add_argument("--k", type=int, default=8, help="samples per prompt (8 prompts)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per response")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    assets = build_assets(a.size)
    model, tok = load_model(str(assets / "model"))
    _, texts = bench_prompts(assets, "fp32", a.prompts, tok)
    engines = {False: HFEngine(model, tok), True: HFEngine(model, tok, record_stats=True)}
    engines[True].sample(texts[:1], k=1, max_new_tokens=2, seed=0)  # warm-up
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(a.reps):
        for stats in (False, True) if rep % 2 == 0 else (True, False):
            t0 = time.process_time()
            ro = engines[stats].sample(texts, k=a.k, max_new_tokens=a.tokens, seed=rep)
            cpu[stats].append(time.process_time() - t0)
            assert int(ro.response_mask.sum()) == len(texts) * a.k * a.tokens
    plain, rec = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(f"size={a.size} prompts={a.prompts} 8 x {a.k} x {a.tokens} tokens, threads={a.threads}, reps={a.reps}, "
          f"vocab={model.config.vocab_size}")
    print(f"  plain sampling      median CPU {plain:.3f} s  {cpu[False]}")
    print(f"  with token stats    median CPU {rec:.3f} s  {cpu[True]}")
    print(f"  overhead ratio      {rec / plain:.3f}x  (target <= 1.05)")


if __name__ == "__main__":
    main()
