"""Benchmark: each rollout.py optimisation before/after, measured side by side in one process (interleaved, medians).

1. token_logprobs fwd+bwd: the previous full-logits version (kept below as ``token_logprobs_full``) vs the tiled
   vocabulary projection (``capo.rollout.token_logprobs``), fp32 and bf16 autocast; peak RSS of each in its
   own subprocess (``--mem``).
2. Trimming padded response columns: a batch whose longest response is half of T.
3. bf16 autocast for generation and for fwd+bwd.
4. Threads: 1 vs 2 (set per measurement; on a shared 2-core machine OpenMP oversubscription dominates).

Times are CPU seconds of this process (time.process_time, all threads) and wall seconds; with other jobs on the
cores, CPU time is the steadier measure of work.

    python benchmarks/rollout_opts.py --size tiny
    python benchmarks/rollout_opts.py --size smollm2 --reps 2
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402
from trl_vs_capo import PROMPTS, build_assets  # noqa: E402

from capo.rollout import HFEngine, token_logprobs  # noqa: E402


def token_logprobs_full(model, prompt_ids, prompt_mask, response_ids, response_mask, *, autocast_bf16=False,
                        with_entropy=False):
    """The version before the optimisation: full [N, T+1, V] logits, float32 copy, logsumexp, softmax entropy."""
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, response_mask], dim=1)
    t = response_ids.shape[1]
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, logits_to_keep=t + 1).logits
    logits = logits[:, :-1].float()
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, response_ids[..., None]).squeeze(-1) - logz
    if not with_entropy:
        return logp
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = logz - (probs * logits).sum(-1)
    return logp, entropy


def load(size: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = build_assets(size) / "model"
    return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32), AutoTokenizer.from_pretrained(str(d))


def measure(fn, threads: int) -> tuple[float, float]:
    torch.set_num_threads(threads)
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def fwd_bwd(model, fn, batch, bf16):
    def run():
        model.zero_grad(set_to_none=True)
        lp, ent = fn(model, *batch, autocast_bf16=bf16, with_entropy=True)
        (lp * batch[3]).sum().backward()

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--reps", type=int, default=3)
    add_quick(ap, size="tiny", reps=1)
    ap.add_argument("--mem", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    model, tok = load(args.size)
    model.train()
    torch.manual_seed(0)
    ro = HFEngine(model, tok).sample([f"What is {p}?" for p in PROMPTS], k=8, max_new_tokens=64)
    batch = (ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask)
    if args.mem:  # child: one fwd+bwd of one variant, report peak RSS
        torch.set_num_threads(1)
        fn = token_logprobs if args.mem.startswith("tiled") else token_logprobs_full
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        fwd_bwd(model, fn, batch, args.mem.endswith("bf16"))()
        print("RESULT " + json.dumps({"before_gib": before,
                                      "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
        return
    half = ro.response_mask.clone()
    half[:, 32:] = 0  # the longest real response is 32 of T = 64 tokens
    half_batch = (ro.prompt_ids, ro.prompt_mask, ro.response_ids, half)
    cases = {
        "lp fp32 full-logits": fwd_bwd(model, token_logprobs_full, batch, False),
        "lp fp32 tiled": fwd_bwd(model, token_logprobs, batch, False),
        "lp bf16 full-logits": fwd_bwd(model, token_logprobs_full, batch, True),
        "lp bf16 tiled": fwd_bwd(model, token_logprobs, batch, True),
        "lp half-length untrimmed (full-logits)": fwd_bwd(model, token_logprobs_full, half_batch, False),
        "lp half-length trimmed (tiled)": fwd_bwd(model, token_logprobs, half_batch, False),
    }
    model.eval()
    prompts = [f"What is {p}?" for p in PROMPTS]
    cases["generate fp32"] = lambda: HFEngine(model, tok).sample(prompts, k=8, max_new_tokens=64)
    cases["generate bf16"] = lambda: HFEngine(model, tok, autocast="on").sample(prompts, k=8, max_new_tokens=64)
    res: dict[str, dict[str, list]] = {k: {"cpu": [], "wall": []} for k in cases}
    res |= {"generate fp32 2 threads": {"cpu": [], "wall": []}, "lp bf16 tiled 2 threads": {"cpu": [], "wall": []}}
    for _ in range(args.reps):
        for k, f in cases.items():
            model.train(k.startswith("lp"))
            c, w = measure(f, 1)
            res[k]["cpu"].append(c)
            res[k]["wall"].append(w)
        for k, base in (("generate fp32 2 threads", "generate fp32"), ("lp bf16 tiled 2 threads", "lp bf16 tiled")):
            model.train(k.startswith("lp"))
            c, w = measure(cases[base], 2)
            res[k]["cpu"].append(c)
            res[k]["wall"].append(w)
    print(f"size {args.size}, torch {torch.__version__}, N=64, T=64, P={ro.prompt_ids.shape[1]}, reps {args.reps} "
          "(medians; 1 thread unless stated)")
    for k, v in res.items():
        print(f"  {k:42s} CPU {statistics.median(v['cpu']):7.2f}s  wall {statistics.median(v['wall']):7.2f}s")
    m = {k: statistics.median(v["wall"]) for k, v in res.items()}
    print(f"RATIO tiled/full fp32 {m['lp fp32 tiled'] / m['lp fp32 full-logits']:.2f}, bf16 "
          f"{m['lp bf16 tiled'] / m['lp bf16 full-logits']:.2f}; trimmed/untrimmed half-length "
          f"{m['lp half-length trimmed (tiled)'] / m['lp half-length untrimmed (full-logits)']:.2f}; bf16/fp32 "
          f"generate {m['generate bf16'] / m['generate fp32']:.2f}, fwd+bwd "
          f"{m['lp bf16 tiled'] / m['lp fp32 tiled']:.2f}; 2/1 threads generate "
          f"{m['generate fp32 2 threads'] / m['generate fp32']:.2f}, fwd+bwd "
          f"{m['lp bf16 tiled 2 threads'] / m['lp bf16 tiled']:.2f} (wall)")
    for variant in ("full-fp32", "tiled-fp32", "full-bf16", "tiled-bf16"):
        p = subprocess.run([sys.executable, __file__, "--size", args.size, "--mem", variant], capture_output=True,
                           text=True)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        r = json.loads(line[0][7:]) if line else {}
        print(f"  peak RSS fwd+bwd {variant:11s} {r.get('peak_gib', float('nan')):.2f} GiB (after model load and "
              f"rollout {r.get('before_gib', float('nan')):.2f} GiB)")


if __name__ == "__main__":
    main()
