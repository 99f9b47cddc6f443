"""Benchmark: the cost of recording per-token statistics during sampling (target <= 5% over plain
sampling).

``record_stats=True`` adds, at every decoding step, the entropy, self-certainty (KL from uniform) and DeepConf top-20
confidence of the step's distribution (one top-k and three reductions over the vocabulary). Measured in one process,
the two variants interleaved, same prompts and seeds, EOS unreachable so every response has exactly T tokens; the
ratio of median CPU seconds (this process, all threads) per sampling call.

    python benchmarks/token_stats_cost.py --size tiny
    python benchmarks/token_stats_cost.py --size smollm2 --tokens 64
    .venv-vllm/bin/python benchmarks/token_stats_cost.py --engine vllm --size tiny     # the vLLM engine

``--engine vllm``: the colocated vLLM engine (run in .venv-vllm), which records DeepConf's top-20 confidence only
(``SamplingParams.logprobs=20`` instead of 0, read from vLLM's flat top-k output); one engine, ``record_stats``
switched between the interleaved calls (everything else identical), fp32, after one untimed warm-up call of each
variant (vLLM's first calls compile). The tiny model's 104-token vocabulary makes this the worst case for the
ratio: the extra work is per token (vLLM's top-k gather and the 21 Python floats per position), not per vocabulary
entry, while the forward it is compared with is a 4M-parameter one.
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
from trl_vs_capo import bench_prompts, build_assets  # noqa: E402

from capo.rollout import HFEngine, load_model  # noqa: E402


def vllm_folder(assets: Path, model, tok) -> Path:
    """The benchmark model for vLLM, which refuses a stop id outside the model's vocabulary (the HF variant's
    unreachable EOS): the vocabulary grows by that one id, whose (tied) embedding row points against the mean final
    hidden state, so its logit is strongly negative and it is practically never sampled. Both variants sample the
    same tokens anyway (same seed, same engine), so a response that does stop early stops in both."""
    out = assets / "model_vllm"
    if (out / "config.json").exists():
        return out
    model.resize_token_embeddings(len(tok))
    with torch.no_grad():
        ids = torch.tensor([tok(t, add_special_tokens=False)["input_ids"][:32] for t in ["1 + 2 = 3, " * 8] * 4])
        m = model.model(input_ids=ids).last_hidden_state.reshape(-1, model.config.hidden_size).mean(0)
        model.get_output_embeddings().weight[tok.eos_token_id] = -20.0 * m / m.norm() ** 2
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_engines(engine: str, assets: Path, model, tok) -> dict:
    """{record_stats: engine} for ``engine``; the vLLM variant is one engine whose ``record_stats`` is switched."""
    if engine == "hf":
        return {False: HFEngine(model, tok), True: HFEngine(model, tok, record_stats=True)}
    from capo.rollout.vllm_engine import VLLMEngine

    eng = VLLMEngine(str(vllm_folder(assets, model, tok)), tokenizer=tok, dtype="float32", seed=0)

    class Switched:  # the same engine with record_stats set for the call
        def __init__(self, on: bool):
            self.on = on

        def sample(self, *args, **kw):
            eng.record_stats = self.on
            return eng.sample(*args, **kw)

    return {False: Switched(False), True: Switched(True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--prompts", choices=("gsm8k", "arith"), default="gsm8k")
    ap.add_argument("--k", type=int, default=8, help="samples per prompt (8 prompts)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per response")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="vllm: run in .venv-vllm")
    add_quick(ap, size="tiny", prompts="arith", k=2, tokens=16, reps=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    assets = build_assets(a.size)
    model, tok = load_model(str(assets / "model"))
    _, texts = bench_prompts(assets, "fp32", a.prompts, tok)
    engines = make_engines(a.engine, assets, model, tok)
    if a.engine == "hf":
        engines[True].sample(texts[:1], k=1, max_new_tokens=2, seed=0)  # warm-up
    else:
        for stats in (False, True):  # warm-up: vLLM compiles its first shapes
            engines[stats].sample(texts, k=a.k, max_new_tokens=a.tokens, seed=0)
    cpu: dict[bool, list[float]] = {False: [], True: []}
    wall: dict[bool, list[float]] = {False: [], True: []}
    tokens: dict[bool, list[int]] = {False: [], True: []}
    for rep in range(a.reps):
        for stats in (False, True) if rep % 2 == 0 else (True, False):
            t0, w0 = time.process_time(), time.perf_counter()
            ro = engines[stats].sample(texts, k=a.k, max_new_tokens=a.tokens, seed=rep)
            cpu[stats].append(time.process_time() - t0)
            wall[stats].append(time.perf_counter() - w0)
            tokens[stats].append(int(ro.response_mask.sum()))
            assert a.engine == "vllm" or tokens[stats][-1] == len(texts) * a.k * a.tokens
            assert (ro.token_stats is not None) == stats
    assert tokens[False] == tokens[True], tokens  # the same work in both variants
    plain, rec = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(f"engine={a.engine} size={a.size} prompts={a.prompts} 8 x {a.k} x {a.tokens} tokens, threads={a.threads}, "
          f"reps={a.reps}, vocab={model.config.vocab_size if a.engine == 'hf' else len(tok)}, "
          f"tokens per call {tokens[False]}")
    print(f"  plain sampling      median CPU {plain:.3f} s  {cpu[False]}  (wall {wall[False]})")
    print(f"  with token stats    median CPU {rec:.3f} s  {cpu[True]}  (wall {wall[True]})")
    print(f"  overhead ratio      {rec / plain:.3f}x CPU, {statistics.median(wall[True]) / statistics.median(wall[False]):.3f}x "
          "wall  (target <= 1.05)")


if __name__ == "__main__":
    main()
