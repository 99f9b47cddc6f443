"""``coin_sum``: the chain-sum task with a hidden coin -- a testbed where outcomes are genuinely stochastic.

A fraction ``coin_frac`` of the problems ends in ``+?``: a hidden coin c in {0, 1} with P(c = 1) = ``p_one`` is added
to the chain sum, and the gold answer is ``sum + c``. The coin is drawn once per problem instance from a seeded
stream and never shown, so no response can know it: the best any policy can do on a coin problem is to be right with
probability max(p_one, 1 - p_one), and a calibrated policy puts probability p_one on the ``+1`` continuation. The
other problems are the default's deterministic chain sums, so accuracy still has room to rise through arithmetic.

Model string (raw text, as the default; the coin step is written like any other partial sum)::

    prompt   = "<s>5+8-9+?="
    response = "5+8=13 13-9=4 4+?=5<answer>5</answer><confidence>0.3</confidence></s>"

Why (docs/results/collapse-testbed.md, "The calibration-collapse testbed"): Bereket & Leskovec (arXiv 2508.11800) report
that GRPO's per-group std normalisation makes policies overconfident when outcomes are stochastic, while RLOO and GRPO
without the std stay calibrated. With ``p_one = 0.5`` every guess of the coin has the same expected reward, so any
sharpening of the guess is driven by noise alone, and a policy that becomes confident about the coin ranks its own
samples by a coin it cannot see: per-prompt perplexity AUC falls towards 0.5 on coin problems.

The coin of problem i is drawn from ``random.Random`` seeded by (split, seed, i), independent of the chain-sum
stream, so the same seed always gives the same problems and golds. The warm-up model (:func:`build_coin_model`)
starts from the shipped default and is fine-tuned on targets whose coin step is drawn with ``WARMUP_P_ONE`` (0.5):
its prior over the coin is uninformative, as it should be.
"""

from __future__ import annotations

import random
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from capo.errors import ConfigError, DataError, is_real
from capo.tasks import default as d
from capo.tasks import model_builder as mb
from capo.tasks.problem import Problem, fill_options, question_rng

__all__ = ["COIN_MODEL_DIR", "TASK_NAME", "DEFAULT_OPTIONS", "WARMUP_P_ONE", "check_options", "coin_problems",
           "format_prompt",
           "coin_trace", "format_response", "build_coin_model"]

TASK_NAME = "coin_sum"
COIN_MODEL_DIR: Path = Path(str(resources.files("capo") / "assets" / "coin_sum_model"))
COIN = "+?"
# p_one: P(hidden coin = 1); coin_frac: fraction of problems that carry a coin.
DEFAULT_OPTIONS: dict[str, float] = {"p_one": 0.5, "coin_frac": 0.5}
WARMUP_P_ONE = 0.5
format_prompt = d.format_prompt  # the chain-sum prompt; the coin is part of the problem text ("5+8-9+?=")


def check_options(options: dict | None) -> dict[str, float]:
    """The task options with defaults filled in; ConfigError naming an unknown key or a value outside [0, 1]."""
    def value(key, val):
        if not is_real(val) or not 0.0 <= float(val) <= 1.0:
            raise ConfigError(f"data.task_options.{key} must be a number in [0, 1], got {val!r}")
        return float(val)

    return fill_options(TASK_NAME, DEFAULT_OPTIONS, options, value)


def coin_problems(split: str, n: int, seed: int = 0, options: dict | None = None) -> list[Problem]:
    """``n`` problems of ``split`` ("train"/"eval"): the default's chain sums (same splits, disjoint by expression),
    each given a hidden coin with probability ``coin_frac``. ``meta``: ``coin`` (0/1, or None without a coin),
    ``base_answer`` (the chain sum), ``p_one``."""
    opts = check_options(options)
    out = []
    for i, p in enumerate(d.default_problems(split, n, seed=seed)):
        rng = question_rng(TASK_NAME, split, seed, i)
        has_coin = rng.random() < opts["coin_frac"]
        coin = int(rng.random() < opts["p_one"]) if has_coin else None
        answer = str(int(p.answer) + (coin or 0))
        out.append(Problem(id=p.id.replace(d.TASK_NAME, TASK_NAME, 1), prompt=p.prompt + (COIN if has_coin else ""),
                           answer=answer, meta={"coin": coin, "base_answer": p.answer, "p_one": opts["p_one"],
                                                "num_terms": p.meta["num_terms"]}))
    return out


def coin_trace(prompt: str, coin: int) -> tuple[str, int]:
    """(trace, final value) for ``prompt`` with the coin resolved to ``coin``: ``("5+8-9+?", 1)`` ->
    ``("5+8=13 13-9=4 4+?=5", 5)``; a prompt without ``+?`` ignores ``coin``."""
    has_coin = prompt.endswith(COIN)
    expr = prompt[: -len(COIN)] if has_coin else prompt
    trace = d.solution_trace(expr)
    value = eval_chain(expr)
    if has_coin:
        trace = f"{trace} {value}{COIN}={value + coin}" if trace else f"{value}{COIN}={value + coin}"
        value += coin
    return trace, value


def eval_chain(expr: str) -> int:
    """Value of a chain of +/- on non-negative integers, left to right: ``"5+8-9"`` -> 4."""
    import re

    toks = re.findall(r"\d+|[+-]", expr)
    acc = int(toks[0])
    for op, num in zip(toks[1::2], toks[2::2]):
        acc = acc + int(num) if op == "+" else acc - int(num)
    return acc


def format_response(problem: Problem, confidence: str, coin: int) -> str:
    """A warm-up target with the coin step resolved to ``coin`` (the answer follows that resolution)."""
    trace, value = coin_trace(problem.prompt, coin)
    return f"{trace}{d.ANSWER_OPEN}{value}{d.ANSWER_CLOSE}{d.CONF_OPEN}{confidence}{d.CONF_CLOSE}"


def _respond(p: Problem, rng: random.Random) -> str:
    coin = int(rng.random() < WARMUP_P_ONE)
    return format_response(p, rng.choice(mb.CONFIDENCE_GRID), coin)


def build_coin_model(out_dir: str | Path, seed: int = 0, *, steps: int = 150, batch_size: int = 64, lr: float = 1e-3,
                     warmup_steps: int = 10, log_every: int = 50, log=None, base_dir: str | Path | None = None) -> dict:
    """Fine-tune the shipped default (or ``base_dir``) on coin_sum train problems (coin steps resolved with
    probability ``WARMUP_P_ONE``) and save it to ``out_dir`` (:func:`capo.tasks.model_builder.build_model` with this
    task's settings). Deterministic on CPU for a fixed seed and thread count. Returns stats, also written to
    ``out_dir/capo_default.json``."""
    t0 = time.perf_counter()
    base = Path(base_dir) if base_dir is not None else d.DEFAULT_MODEL_DIR
    if not (base / "config.json").exists():
        raise DataError(f"no default model at {base}; build one with `capo build-default --out {base}`")
    recipe = mb.ModelRecipe(
        problems=lambda n: coin_problems("train", n, seed=seed, options={"p_one": WARMUP_P_ONE}), respond=_respond,
        prompt=format_prompt, steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, seed=seed,
        base_dir=base, hooks=mb.WarmupHooks(log=log, log_every=log_every))
    built = mb.build_model(recipe, out_dir)
    stats: dict[str, Any] = {
        "task": TASK_NAME, "options": {**DEFAULT_OPTIONS, "p_one": WARMUP_P_ONE}, "seed": seed, "steps": steps,
        "batch_size": batch_size, "lr": lr, "warmup_steps": warmup_steps,
        "base": str(base_dir or "default"), "final_loss": mb.mean_loss(built.losses),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "total_seconds": round(time.perf_counter() - t0, 1),
    }
    mb.write_record(out_dir, stats)
    return stats
