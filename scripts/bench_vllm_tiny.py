"""Quick generation-speed check, HF `generate` (capo's sampler) vs the colocated vLLM engine, on random Qwen2 models.

Run in .venv-vllm:  .venv-vllm/bin/python scripts/bench_vllm_tiny.py [--hidden 64 --layers 2] [--cold]
Prompts x k x new tokens = 8 x 8 x 64 with EOS made impossible, so every row generates exactly 64 tokens. Reports
engine start (``--cold``: with an empty vLLM compile cache), the first call, and the median of 5 timed calls (after 2 untimed) per
engine; HF is timed before and after the engine exists (the engine changes the process's thread settings).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(out: Path, hidden: int, layers: int, head_dim: int) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from capo.tasks.default import build_tokenizer

    tok = build_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // head_dim, num_key_value_heads=max(1, hidden // head_dim // 2),
                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # EOS logit ~ -50 along the common direction of the final hidden states: never sampled
        h = model.model(input_ids=torch.randint(3, len(tok), (8, 32))).last_hidden_state.reshape(-1, hidden)
        model.lm_head.weight[tok.eos_token_id] = -50.0 * h.mean(0) / h.mean(0).norm() ** 2
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def timed(fn, reps=5, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        ro = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), int(ro.response_mask.sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--cold", action="store_true", help="empty vLLM compile cache (a fresh machine's start)")
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile (enforce_eager)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    if a.cold:
        os.environ["VLLM_CACHE_ROOT"] = str(tmp / "vllm-cache")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo.rollout.sampling import sample_rollout
    from capo.rollout.vllm_engine import VLLMEngine

    path = build(tmp / "m", a.hidden, a.layers, a.head_dim)
    model, tok = AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, torch threads "
          f"{torch.get_num_threads()}", flush=True)
    prompts = [f"Question {i}: what is {i}+{2 * i}? Answer:" for i in range(8)]
    hf = lambda: sample_rollout(model, tok, prompts, k=8, max_new_tokens=64)  # noqa: E731
    t_hf, n = timed(hf)
    hf_rate = n / t_hf
    print(f"HF   before engine: {t_hf:.3f} s for {n} tokens = {hf_rate:,.0f} tok/s", flush=True)
    t = time.perf_counter()
    eng = VLLMEngine(str(path), dtype="float32", seed=0, enforce_eager=a.eager)
    print(f"vLLM engine start (incl. 1-token probe): {time.perf_counter() - t:.1f} s", flush=True)
    vl = lambda: eng.sample(prompts, k=8, max_new_tokens=64, seed=0)  # noqa: E731
    for i in range(3):
        t = time.perf_counter()
        vl()
        print(f"vLLM call {i + 1}: {time.perf_counter() - t:.2f} s", flush=True)
    t_vl, n = timed(vl)
    vl_rate = n / t_vl
    print(f"vLLM: {t_vl:.3f} s for {n} tokens = {n / t_vl:,.0f} tok/s", flush=True)
    t_hf2, n = timed(hf)
    print(f"HF   after engine:  {t_hf2:.3f} s for {n} tokens = {n / t_hf2:,.0f} tok/s (torch threads "
          f"{torch.get_num_threads()})", flush=True)
    t = time.perf_counter()
    eng.sync_weights(model)
    print(f"sync_weights: {time.perf_counter() - t:.3f} s", flush=True)
    print(f"ratio vLLM/HF tokens/s (HF before the engine): {vl_rate / hf_rate:.2f}x", flush=True)


if __name__ == "__main__":
    sys.exit(main())
