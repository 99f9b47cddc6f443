"""Benchmark: the HF sampler's decoding paths at the reasoning testbed's preset rollout: the KV cache
(``rollout.kv_cache``: static, preallocated and written in place, the default; dynamic, transformers' growing cache,
concatenated at every decoding step) and the attention over the shared prompt prefix (grouped: each group's prompt
keys/values read once per decoding step, ``capo.rollout.prefix.GroupedPrefixAttention``, the default with
``share_prefix``; sdpa: transformers' SDPA over each row's copy).

Work: a shipped model (``--model``: ``word_problems``, the 5M reasoning testbed, preset 8 x 8 x 192; ``default``, the
0.37M embedded default, preset 16 x 8 x 40), B of its task's training prompts x G samples (8; ``--group``), up to T
new tokens at temperature 1, natural response lengths, shared prompt prefix, allocator tuned as the capo command does.
The variants run interleaved with the same seed per repetition; prints CPU seconds per rollout, whether the sampled
tokens are identical to the first variant's, the largest difference of the recorded log-probs, and ``RATIO
variant/first`` (> 1: the first, capo's default, faster).

    python benchmarks/kv_cache.py --batch 8 --new-tokens 192 --reps 3
    python benchmarks/kv_cache.py --model default --batch 16 --new-tokens 40 --reps 3
    python benchmarks/kv_cache.py --variants static+sdpa dynamic+sdpa      # the two caches alone
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402

from capo.rollout import load_model  # noqa: E402
from capo.rollout.models import tune_cpu_allocator  # noqa: E402
from capo.rollout.sampling import sample_rollout  # noqa: E402
from capo.tasks.generated import GENERATED_TASKS, generated_task  # noqa: E402

G = 8
VARIANTS = {  # name -> sample_rollout's keywords; the first is capo's default
    "static+grouped": dict(kv_cache="static", prefix_attention=True),
    "static+sdpa": dict(kv_cache="static", prefix_attention=False),
    "dynamic+sdpa": dict(kv_cache="dynamic", prefix_attention=False),
    "dynamic+grouped": dict(kv_cache="dynamic", prefix_attention=True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=tuple(GENERATED_TASKS), default="word_problems",
                    help="a shipped model, sampled on its own task's training prompts")
    ap.add_argument("--batch", type=int, default=8, help="B: prompts")
    ap.add_argument("--group", type=int, default=G, help="G: samples per prompt (the trainer's periodic evaluation: 4)")
    ap.add_argument("--new-tokens", type=int, default=192, help="T: the generation limit")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (a new seed each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS)[:3],
                    help="decoding paths to compare; ratios and token checks are against the first")
    add_quick(ap, batch=2, new_tokens=16, reps=1)
    args = ap.parse_args()
    tune_cpu_allocator()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    model.eval()
    task = generated_task(args.model)
    prompts = [task.prompt(p) for p in task.problems("train", args.batch, seed=7)]
    sample_rollout(model, tok, prompts[:1], k=2, max_new_tokens=4)  # warm-up
    names = args.variants
    cpu: dict[str, list[float]] = {k: [] for k in names}
    same: dict[str, list[bool]] = {k: [] for k in names[1:]}
    dlogp: dict[str, list[float]] = {k: [] for k in names[1:]}
    lens = []
    for rep in range(args.reps):
        out = {}
        for name in names:
            torch.manual_seed(1000 + rep)
            c0 = time.process_time()
            out[name] = sample_rollout(model, tok, prompts, k=args.group, max_new_tokens=args.new_tokens,
                                        **VARIANTS[name])
            cpu[name].append(time.process_time() - c0)
        a = out[names[0]]
        for name in names[1:]:
            b = out[name]
            same[name].append(torch.equal(a.response_ids, b.response_ids))
            if a.response_ids.shape == b.response_ids.shape:
                dlogp[name].append((a.gen_logp - b.gen_logp).abs().max().item())
        lens.append((a.response_mask.sum(1).float().mean().item(), a.response_ids.shape[1]))
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"torch {torch.__version__}, threads {args.threads}: {args.model} model, {args.batch} x {args.group} x up to "
          f"{args.new_tokens} tokens; CPU s per rollout, median of {args.reps}")
    for k, v in med.items():
        print(f"  {k:16s} {v:7.2f} s   raw {[round(x, 2) for x in cpu[k]]}")
    print(f"  response tokens (mean, longest) per repetition: {[(round(m, 1), n) for m, n in lens]}")
    for name in names[1:]:
        print(f"  {name} vs {names[0]}: same tokens {same[name]}; max |log-prob difference| "
              f"{max(dlogp[name]) if dlogp[name] else 'n/a'}")
    for name in names[1:]:
        print(f"RATIO {name}/{names[0]} {med[name] / med[names[0]]:.2f} (> 1: {names[0]} is faster)")


if __name__ == "__main__":
    main()
