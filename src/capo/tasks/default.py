"""The embedded default: a tiny causal LM and a verifiable reasoning-gym task that need nothing beyond pip.

Task: reasoning-gym ``chain_sum`` (additions/subtractions of 2-5 one-digit non-negative integers; the answer is
a plain integer, possibly negative). Problems are generated reproducibly from fixed seeds; the train / eval split is
decided by a hash of the expression, so the splits are disjoint whatever seeds and sizes are asked for.

Model string (raw text, no chat template)::

    prompt   = "<s>5+8-9+7="                      (format_prompt(problem), BOS added by the tokenizer)
    response = "5+8=13 13-9=4 4+7=11<answer>11</answer><confidence>0.4</confidence></s>"

The response is RLCR's format (arXiv 2507.16806) with a short step-by-step trace in place of ``<think>``; the four
tags are single tokens of a character-level tokenizer. The shipped model (``DEFAULT_MODEL_DIR``) is a ~0.37M-parameter
Llama built by supervised warm-up that is deliberately stopped early, so sampled accuracy leaves RL room to work.
``build_default_model`` rebuilds it deterministically on CPU (``capo build-default``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from capo.tasks.problem import SPLITS, Problem, check_split

__all__ = [
    "DEFAULT_MODEL_DIR",
    "TASK_NAME",
    "TASK_CONFIG",
    "SPLITS",
    "ANSWER_OPEN",
    "ANSWER_CLOSE",
    "CONF_OPEN",
    "CONF_CLOSE",
    "default_problems",
    "format_prompt",
    "format_response",
    "solution_trace",
    "build_tokenizer",
    "build_default_model",
    "load_default",
]

DEFAULT_MODEL_DIR: Path = Path(str(resources.files("capo") / "assets" / "default_model"))

TASK_NAME = "chain_sum"
# reasoning-gym ChainSumConfig fields (besides seed/size). Difficulty varies from "4-1" to "5+8-9+7-6".
TASK_CONFIG: dict[str, Any] = {"min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 1}
# One expression in EVAL_BUCKETS goes to "eval", the rest to "train" (by sha256 of the expression).
EVAL_BUCKETS = 8
# reasoning-gym item i of seed s uses random.Random(s + i): keep the streams of different (split, seed) far apart.
_SEED_STRIDE = 10_000_019
_SPLIT_OFFSET = {"train": 0, "eval": 5_000_011}

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
CONF_OPEN, CONF_CLOSE = "<confidence>", "</confidence>"
TAGS = (ANSWER_OPEN, ANSWER_CLOSE, CONF_OPEN, CONF_CLOSE)
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
# Confidence values the warm-up data carries: one decimal, uniform, independent of correctness.
CONFIDENCE_GRID = tuple(f"{k / 10:.1f}" for k in range(11))


# ----------------------------------------------------------------------------------------------------- problems


def _split_of(expression: str) -> str:
    h = int.from_bytes(hashlib.sha256(expression.encode()).digest()[:8], "big")
    return "eval" if h % EVAL_BUCKETS == 0 else "train"


def check_options(options: dict | None) -> dict:
    """The chain-sum task has no options: ConfigError for any."""
    if options:
        from capo.errors import ConfigError

        raise ConfigError(f"data.task_options: the 'default' task takes no options, got {sorted(options)}")
    return {}


def default_problems(split: str, n: int, seed: int = 0, options: dict | None = None) -> list[Problem]:
    """``n`` chain-sum problems of ``split`` ("train" or "eval"), reproducible for a given ``seed``.

    Train and eval are disjoint by construction (hash of the expression). Eval problems are unique within a call;
    train problems follow the generator's distribution (easy expressions, of which there are few, may repeat).
    ``Problem.prompt`` is the compact expression without spaces (``"5+8-9+7"``); ``answer`` is a plain integer
    string; ``meta`` keeps reasoning-gym's question, expression, num_terms and num_digits.
    """
    check_options(options)
    check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    import reasoning_gym

    base = seed * _SEED_STRIDE + _SPLIT_OFFSET[split]
    ds = reasoning_gym.create_dataset(TASK_NAME, size=max(1, 1 << 30), seed=base, **TASK_CONFIG)
    out: list[Problem] = []
    seen: set[str] = set()
    idx = 0
    max_tries = 200 * n + 1000
    while len(out) < n:
        if idx >= max_tries:
            raise RuntimeError(f"could not generate {n} unique {split} problems")
        item = ds[idx]
        idx += 1
        expr = item["metadata"]["expression"]
        compact = expr.replace(" ", "")
        if _split_of(compact) != split:
            continue
        if split == "eval":
            if compact in seen:
                continue
            seen.add(compact)
        answer = str(int(item["answer"]))
        out.append(
            Problem(
                id=f"{TASK_NAME}-{split}-s{seed}-{idx - 1}",
                prompt=compact,
                answer=answer,
                meta={
                    "question": item["question"],
                    "expression": expr,
                    "num_terms": item["metadata"]["num_terms"],
                    "num_digits": item["metadata"]["num_digits"],
                    "source": f"reasoning_gym:{TASK_NAME}",
                },
            )
        )
    return out


def format_prompt(problem: Problem) -> str:
    """The raw text prompt the model sees (no chat template; the tokenizer adds BOS): ``"5+8-9+7="``."""
    return f"{problem.prompt}="


def solution_trace(expression: str) -> str:
    """Left-to-right partial sums: ``"55+98-93"`` -> ``"55+98=153 153-93=60"``."""
    import re

    toks = re.findall(r"\d+|[+-]", expression.replace(" ", ""))
    acc = int(toks[0])
    steps = []
    for op, num in zip(toks[1::2], toks[2::2]):
        new = acc + int(num) if op == "+" else acc - int(num)
        steps.append(f"{acc}{op}{num}={new}")
        acc = new
    return " ".join(steps)


def format_response(problem: Problem, confidence: str) -> str:
    """The warm-up target: trace, ``<answer>``, ``<confidence>`` (EOS is appended by the caller)."""
    return f"{solution_trace(problem.prompt)}{ANSWER_OPEN}{problem.answer}{ANSWER_CLOSE}{CONF_OPEN}{confidence}{CONF_CLOSE}"


# ---------------------------------------------------------------------------------------------------- tokenizer


def build_tokenizer(model_max_length: int = 256):
    """Character-level ``PreTrainedTokenizerFast``: printable ASCII + newline, the four RLCR tags as single tokens,
    ``<s>`` (BOS, added in front of every encoded text), ``</s>`` (EOS), ``<pad>``, ``<unk>``. Decoding is exact."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, BOS, EOS, UNK]
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {t: i for i, t in enumerate(specials + list(TAGS) + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    tok.add_tokens(list(TAGS))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    return fast


# -------------------------------------------------------------------------------------------------------- model


def _model_config(tokenizer, hidden: int, layers: int, heads: int, intermediate: int, max_positions: int = 256):
    """The architecture trained: Qwen2 (q/k/v biases, RMSNorm, SwiGLU, RoPE), tied embeddings."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _export_llama(qwen):
    """The same network in the Llama layout (q/k/v biases kept, a zero o_proj bias added): bit-identical outputs.

    Why: transformers 5's AutoTokenizer forces ``Qwen2Tokenizer`` (byte-level BPE) on every ``qwen2`` checkpoint and
    would silently rebuild the character tokenizer (dropping spaces); for ``llama`` it loads tokenizer.json as saved.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    qc = qwen.config
    cfg = LlamaConfig(
        vocab_size=qc.vocab_size,
        hidden_size=qc.hidden_size,
        intermediate_size=qc.intermediate_size,
        num_hidden_layers=qc.num_hidden_layers,
        num_attention_heads=qc.num_attention_heads,
        num_key_value_heads=qc.num_key_value_heads,
        max_position_embeddings=qc.max_position_embeddings,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=False,
        rms_norm_eps=qc.rms_norm_eps,
        rope_parameters=dict(qc.rope_parameters),
        hidden_act=qc.hidden_act,
        bos_token_id=qc.bos_token_id,
        eos_token_id=qc.eos_token_id,
        pad_token_id=qc.pad_token_id,
    )
    llama = LlamaForCausalLM(cfg).float()
    sd = {k: v.clone() for k, v in qwen.state_dict().items()}
    for i in range(qc.num_hidden_layers):
        sd[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.zeros(qc.hidden_size)
    missing, unexpected = llama.load_state_dict(sd, strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"Qwen2 -> Llama export mismatch: missing {missing}, unexpected {unexpected}")
    llama.tie_weights()
    llama.eval()
    return llama


def _sft_batch(problems: list[Problem], rng: random.Random, tokenizer,
               respond=None, prompt_fn=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels); labels are -100 on the prompt and padding.
    ``respond(problem, rng) -> text`` writes the target (default: :func:`format_response` with a uniform confidence)."""
    respond = respond or (lambda p, r: format_response(p, r.choice(CONFIDENCE_GRID)))
    seqs, labs = [], []
    for p in problems:
        pr = tokenizer((prompt_fn or format_prompt)(p))["input_ids"]
        resp = tokenizer(respond(p, rng), add_special_tokens=False)["input_ids"]
        resp = resp + [tokenizer.eos_token_id]
        seqs.append(pr + resp)
        labs.append([-100] * len(pr) + resp)
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros((len(seqs), T), dtype=torch.long)
    lab = torch.full((len(seqs), T), -100, dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labs)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        lab[i, : len(l)] = torch.tensor(l)
    return ids, att, lab


def _warmup(model, train: list[Problem], tokenizer, rng: random.Random, *, steps: int, batch_size: int, lr: float,
            warmup_steps: int, log_every: int, log, respond=None, prompt_fn=None, on_step=None,
            resume=None, save_every: int = 0) -> list[float]:
    """Supervised warm-up (AdamW, linear LR warm-up then constant, grad-norm clip 1); returns the per-step losses.
    The first k steps of a run do not depend on ``steps`` (so a longer run's step k is the shorter run).
    ``on_step(step, model)`` (optional) runs after each optimizer step (checkpoints, measurements). ``resume``: a
    state file (model, optimizer, schedule, random states, losses) written every ``save_every`` steps after
    ``on_step`` and read at the start when it exists, so that a killed build continues bit-identically."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup_steps)))
    losses: list[float] = []
    if resume is not None and Path(resume).exists():
        losses = _load_warmup_state(resume, model, opt, sched, rng)
        if log is not None:
            log(f"resumed at step {len(losses)} from {resume}")
    model.train()
    for step in range(len(losses), steps):
        ids, att, lab = _sft_batch(train[step * batch_size : (step + 1) * batch_size], rng, tokenizer, respond,
                                   prompt_fn)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log is not None and (step + 1) % log_every == 0:
            log(f"step {step + 1}/{steps} loss {sum(losses[-log_every:]) / len(losses[-log_every:]):.4f}")
        if on_step is not None:
            on_step(step + 1, model)
            model.train()
        if resume is not None and save_every and (step + 1) % save_every == 0:
            _save_warmup_state(resume, model, opt, sched, rng, losses)
    model.eval()
    return losses


def _save_warmup_state(path, model, opt, sched, rng: random.Random, losses: list[float]) -> None:
    """Everything the next step depends on, written atomically (a kill mid-write keeps the previous state)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "losses": list(losses)}, tmp)
    os.replace(tmp, path)


def _load_warmup_state(path, model, opt, sched, rng: random.Random) -> list[float]:
    st = torch.load(path, weights_only=False)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    sched.load_state_dict(st["sched"])
    rng.setstate(st["rng"])
    torch.set_rng_state(st["torch_rng"])
    return list(st["losses"])


def build_default_model(
    out_dir: str | Path,
    seed: int = 0,
    *,
    steps: int = 500,
    batch_size: int = 64,
    lr: float = 4e-3,
    warmup_steps: int = 50,
    hidden: int = 96,
    layers: int = 3,
    heads: int = 4,
    intermediate: int = 288,
    log_every: int = 100,
    log=None,
) -> dict:
    """Build tokenizer + Llama model by supervised warm-up on ``chain_sum`` train problems and save both to
    ``out_dir`` (safetensors, fp32). Deterministic on CPU for a fixed ``seed`` (and thread count).

    The warm-up is stopped after ``steps`` (default chosen so sampled accuracy at temperature 1 is in the 20-70%
    band); the confidence in the targets is uniform over {0.0, 0.1, ..., 1.0}, independent of correctness. Returns
    stats, also written to ``out_dir/capo_default.json`` (``capo build-default`` adds the built model's held-out
    measurement, :func:`capo.evaluation.default_task.evaluate_default`).
    """
    from transformers import Qwen2ForCausalLM

    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer()
    model = Qwen2ForCausalLM(_model_config(tokenizer, hidden, layers, heads, intermediate)).float()
    n_params = sum(p.numel() for p in model.parameters())
    train = default_problems("train", steps * batch_size, seed=seed)
    losses = _warmup(model, train, tokenizer, rng, steps=steps, batch_size=batch_size, lr=lr,
                     warmup_steps=warmup_steps, log_every=log_every, log=log)
    train_s = time.perf_counter() - t0
    save_model(_export_llama(model), tokenizer, out_dir)
    stats: dict[str, Any] = {
        "task": f"reasoning_gym:{TASK_NAME}", "task_config": TASK_CONFIG, "seed": seed, "steps": steps,
        "batch_size": batch_size, "lr": lr, "warmup_steps": warmup_steps,
        "architecture": {"type": "llama (trained as qwen2, exported)", "hidden": hidden, "layers": layers, "heads": heads,
                         "intermediate": intermediate, "vocab": len(tokenizer)},
        "params": n_params, "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "train_seconds": round(train_s, 1), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "total_seconds": round(time.perf_counter() - t0, 1),
    }
    (out_dir / "capo_default.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def save_model(model, tokenizer, out_dir: Path) -> None:
    """Save a task model + tokenizer as a plain Hugging Face folder (safetensors, portable tokenizer config)."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _portable_tokenizer_config(out_dir)


def _portable_tokenizer_config(out_dir: Path) -> None:
    """transformers 5 writes ``tokenizer_class: TokenizersBackend``, unknown to transformers 4.x (and so to most
    vLLM installs); ``PreTrainedTokenizerFast`` names the same tokenizer for both."""
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_default(dtype: torch.dtype = torch.float32, model_dir: str | Path | None = None):
    """(model, tokenizer) of the shipped default (plain ``transformers`` loaders; model in eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
    if not (d / "config.json").exists():
        from capo.errors import DataError

        raise DataError(f"no default model at {d}; build one with `capo build-default --out {d}`")
    tok = AutoTokenizer.from_pretrained(str(d))
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=dtype)
    model.eval()
    return model, tok
