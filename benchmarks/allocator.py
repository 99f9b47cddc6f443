"""Benchmark: glibc's default allocation thresholds vs ``capo.rollout.models.tune_cpu_allocator`` (what the ``capo``
command sets at start), on the same work in two fresh processes each, interleaved.

Work per process: capo's sampler (``sample_rollout``: B prompts x G = 8 x T tokens, every response exactly T long;
the assets of ``trl_vs_capo.py``) and one forward + backward of the training log-probs over the sampled batch
(``token_logprobs``, shared prompt prefix), as a trainer step runs them. Reports user and kernel (system) CPU seconds
and wall seconds of each part (``os.times``), ``RATIO default/tuned`` of the wall time, and each process's peak RSS
(a heap that keeps freed blocks may hold more memory).

    python benchmarks/allocator.py --size testbed --batch 16 --new-tokens 128     # the reasoning testbed's shape
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick, child_env  # noqa: E402
from trl_vs_capo import G, add_shape_args, bench_prompts, build_assets, set_shape  # noqa: E402


def child(args) -> dict:
    import torch

    from capo.rollout.models import tune_cpu_allocator

    applied = tune_cpu_allocator() if args.tuned else False
    torch.set_num_threads(1)
    from capo.rollout import load_model, token_logprobs
    from capo.rollout.sampling import sample_rollout

    set_shape(args)
    assets = build_assets(args.size)
    model, tok = load_model(str(assets / "model"))
    _, texts = bench_prompts(assets, "fp32", args.prompts, tok)
    out = {"applied": applied}

    def timed(name, fn):
        t0, w0 = os.times(), time.perf_counter()
        r = fn()
        t1 = os.times()
        out[name] = {"user": t1.user - t0.user, "sys": t1.system - t0.system, "wall": time.perf_counter() - w0}
        return r

    torch.manual_seed(0)
    ro = timed("sampler", lambda: sample_rollout(model.eval(), tok, texts, k=G, max_new_tokens=args.new_tokens))
    model.train()

    def fwd_bwd():
        lp = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask,
                            share_prefix=True)
        (lp * ro.response_mask).sum().backward()

    timed("fwd_bwd", fwd_bwd)
    import resource

    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_args(ap, reps=1, reps_help="interleaved process pairs (medians)")
    ap.add_argument("--tuned", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_quick(ap, batch=2, new_tokens=16)
    args = ap.parse_args()
    args.what, args.micro = "step", 0  # set_shape's other inputs
    if args.child:
        print("RESULT " + json.dumps(child(args)))
        return
    res: dict[str, list[dict]] = {"default": [], "tuned": []}
    for _ in range(args.reps):
        for mode in res:
            cmd = [sys.executable, __file__, "--child", "--size", args.size, "--prompts", args.prompts,
                   "--batch", str(args.batch), "--new-tokens", str(args.new_tokens)] + (["--tuned"] if mode == "tuned"
                                                                                       else [])
            p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(1))
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode or not line:
                sys.exit(f"{mode} run failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
            res[mode].append(json.loads(line[0][7:]))
    print(f"size {args.size}, prompts {args.prompts}: {args.batch} x 8 x {args.new_tokens} tokens, 1 thread; "
          f"seconds, median of {args.reps} process(es) each; tuned applied: {res['tuned'][0]['applied']}")
    for part in ("sampler", "fwd_bwd"):
        med = {m: {k: statistics.median(r[part][k] for r in rs) for k in ("user", "sys", "wall")}
               for m, rs in res.items()}
        for m, v in med.items():
            print(f"  {part:8s} {m:8s} user {v['user']:7.2f}  sys {v['sys']:7.2f}  wall {v['wall']:7.2f}")
        print(f"RATIO {part} default/tuned wall {med['default']['wall'] / med['tuned']['wall']:.2f}")
    rss = {m: max(r["peak_rss_gib"] for r in rs) for m, rs in res.items()}
    print(f"peak RSS (GiB): default {rss['default']:.2f}, tuned {rss['tuned']:.2f}")


if __name__ == "__main__":
    main()
