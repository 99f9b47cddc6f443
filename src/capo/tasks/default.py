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
import random
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from capo.tasks import model_builder as mb
from capo.tasks.model_builder import (ANSWER_CLOSE, ANSWER_OPEN, CONF_CLOSE, CONF_OPEN, CONFIDENCE_GRID,
                                      build_tokenizer)
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

# ANSWER_OPEN ... CONF_CLOSE, TAGS (the RLCR tags, single tokens), CONFIDENCE_GRID (the warm-up's confidences) and
# build_tokenizer are the model builder's (capo.tasks.model_builder), named here too: this task's format uses them.


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


def _respond(problem: Problem, rng: random.Random) -> str:
    """The warm-up target: the solution trace and answer with a confidence drawn uniformly from CONFIDENCE_GRID."""
    return format_response(problem, rng.choice(CONFIDENCE_GRID))


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
    ``out_dir`` (safetensors, fp32): :func:`capo.tasks.model_builder.build_model` with this task's settings.
    Deterministic on CPU for a fixed ``seed`` (and thread count).

    The warm-up is stopped after ``steps`` (default chosen so sampled accuracy at temperature 1 is in the 20-70%
    band); the confidence in the targets is uniform over {0.0, 0.1, ..., 1.0}, independent of correctness. Returns
    stats, also written to ``out_dir/capo_default.json`` (``capo build-default`` adds the built model's held-out
    measurement, :func:`capo.evaluation.default_task.evaluate_default`).
    """
    t0 = time.perf_counter()
    recipe = mb.ModelRecipe(
        problems=lambda n: default_problems("train", n, seed=seed), respond=_respond, prompt=format_prompt,
        steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, seed=seed,
        arch=mb.Architecture(hidden, layers, heads, intermediate), hooks=mb.WarmupHooks(log=log, log_every=log_every))
    built = mb.build_model(recipe, out_dir)
    stats: dict[str, Any] = {
        "task": f"reasoning_gym:{TASK_NAME}", "task_config": TASK_CONFIG, "seed": seed, "steps": steps,
        "batch_size": batch_size, "lr": lr, "warmup_steps": warmup_steps,
        "architecture": {"type": "llama (trained as qwen2, exported)", "hidden": hidden, "layers": layers, "heads": heads,
                         "intermediate": intermediate, "vocab": len(built.tokenizer)},
        "params": built.params, "final_loss": mb.mean_loss(built.losses),
        "train_seconds": round(built.train_seconds, 1), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "total_seconds": round(time.perf_counter() - t0, 1),
    }
    mb.write_record(out_dir, stats)
    return stats


def load_default(dtype: torch.dtype = torch.float32, model_dir: str | Path | None = None):
    """(model, tokenizer) of the shipped default (plain ``transformers`` loaders; model in eval mode)."""
    d = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
    if not (d / "config.json").exists():
        from capo.errors import DataError

        raise DataError(f"no default model at {d}; build one with `capo build-default --out {d}`")
    return mb.load_model(d, dtype)
