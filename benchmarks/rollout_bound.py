"""Benchmark: capo's rollout (the HF sampler every trainer step and `capo eval` use) against a bound measured on the
same machine in the same run: the model's own batched forwards alone.

Work: B prompts x G = 8 samples x T new tokens, every response exactly T tokens long (the tokenizer's EOS is a token
the model cannot emit: the assets of ``trl_vs_capo.py``). Three timings, interleaved, medians of ``--reps``:

- ``sampler``: ``capo.rollout.sampling.sample_rollout`` (shared prompt prefix, raw log-probs recorded by a forward
  hook, HF ``generate`` sampling at temperature 1);
- ``bound``: what any KV-cached decoder must run, with nothing else: each distinct prompt's prefill once (its cache
  copied to the G rows, ``capo.rollout.prefix.shared_prefix``, as the sampler does) and then T forwards of one token
  for the N = B*G rows; no sampling, no log-softmax, no bookkeeping;
- ``bound_noshare``: the same with every row's prompt prefilled separately (what a sampler without prefix sharing,
  e.g. TRL's HF path, pays at least).

Prints generated tokens/s of each and ``RATIO sampler/bound`` (CPU time of this process; 1.0 = the sampler costs
nothing beyond the forwards). Target (docs/performance.md, "The reasoning testbed's step"): at most 2.

    python benchmarks/rollout_bound.py --size testbed --batch 16 --new-tokens 128 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402
from trl_vs_capo import G, add_shape_args, bench_prompts, build_assets, set_shape  # noqa: E402

from capo.rollout import load_model  # noqa: E402
from capo.rollout.models import tune_cpu_allocator  # noqa: E402
from capo.rollout.prefix import position_ids, shared_prefix  # noqa: E402
from capo.rollout.sampling import sample_rollout  # noqa: E402


@torch.no_grad()
def forwards_only(model, ids: torch.Tensor, am: torch.Tensor, t: int, share: bool) -> None:
    """Prefill (each distinct prompt once when ``share``) then ``t`` one-token forwards of all B*G rows."""
    rows = torch.arange(ids.shape[0]).repeat_interleave(G)
    if share:
        out, cache = shared_prefix(model, ids, am, rows, logits_to_keep=1)
        am, logits = am[rows], out.logits[rows]
    else:
        ids, am = ids[rows], am[rows]
        out = model(input_ids=ids, attention_mask=am, position_ids=position_ids(am), use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits
    nxt = logits[:, -1:].argmax(-1)
    pos = position_ids(am)[:, -1:]
    for _ in range(t):
        am = torch.cat([am, torch.ones_like(am[:, :1])], dim=1)
        pos = pos + 1
        out = model(input_ids=nxt, attention_mask=am, position_ids=pos, past_key_values=cache, use_cache=True)
        cache = out.past_key_values


def measure(args) -> dict[str, list[float]]:
    if not args.system_malloc:
        tune_cpu_allocator()  # as the capo command does
    torch.set_num_threads(args.threads)
    set_shape(args)
    assets = build_assets(args.size)
    model, tok = load_model(str(assets / "model"))
    model.eval()
    _, texts = bench_prompts(assets, "fp32", args.prompts, tok)
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    t = args.new_tokens

    def sampler():
        torch.manual_seed(0)
        ro = sample_rollout(model, tok, texts, k=G, max_new_tokens=t)
        assert ro.response_mask.sum().item() == len(texts) * G * t, "a response ended early"

    fns = {"sampler": sampler,
           "bound": lambda: forwards_only(model, enc["input_ids"], enc["attention_mask"], t, True),
           "bound_noshare": lambda: forwards_only(model, enc["input_ids"], enc["attention_mask"], t, False)}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    sampler()  # warm-up
    for _ in range(args.reps):
        for k, f in fns.items():
            c0 = time.process_time()
            f()
            cpu[k].append(time.process_time() - c0)
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_args(ap, reps=3, reps_help="interleaved repetitions (medians)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--system-malloc", action="store_true", help="keep glibc's default allocation thresholds (capo "
                    "tunes them, as the capo command does; benchmarks/allocator.py compares the two)")
    add_quick(ap, batch=2, new_tokens=16, reps=1)
    args = ap.parse_args()
    args.what, args.micro = "step", 0  # set_shape's other inputs
    cpu = measure(args)
    n_tok = args.batch * G * args.new_tokens
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"torch {torch.__version__}, threads {args.threads}, size {args.size}, prompts {args.prompts}: "
          f"{args.batch} x {G} x {args.new_tokens} tokens; CPU s, median of {args.reps}; allocator "
          f"{'glibc default' if args.system_malloc else 'tuned'}")
    for k, v in med.items():
        print(f"  {k:14s} {v:7.2f} s  {n_tok / v:8.0f} tokens/s   raw {[round(x, 2) for x in cpu[k]]}")
    print(f"RATIO sampler/bound {med['sampler'] / med['bound']:.2f} (target <= 2); "
          f"bound_noshare/bound {med['bound_noshare'] / med['bound']:.2f}")


if __name__ == "__main__":
    main()
