"""``capo build-default``: rebuild the embedded default model (tokenizer + tiny Llama) from scratch on CPU."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from capo.cli.flags import add_settings
from capo.settings import from_namespace, opt
from capo.tasks.datasets import GENERATED_TASKS as BUILD_TASKS  # each generated task ships a model built here


@dataclass
class BuildSettings:
    """Everything ``capo build-default`` takes; each field is its one definition (``--help`` is built from it)."""

    task: str = opt("default", "which task model: 'default' (chain_sum, from scratch), 'coin_sum' (the default "
                    "fine-tuned on chain sums with a hidden coin; the calibration-collapse testbed) or "
                    "'word_problems' (a 5M Qwen2-shaped model pre-trained from scratch on multi-step word-problem "
                    "traces; the reasoning testbed) or 'stochastic' (an 89k-parameter model stating every probability 01-99 "
                    "with equal probability; the positive control) or 'stochastic_binary' (the same size, predicting the outcome 0/1 "
                    "and a confidence 01-99 uniformly and independently)", choices=BUILD_TASKS)
    out: str | None = opt(None, "output folder (created; existing model files are overwritten)", required=True)
    seed: int = opt(0, "seed for initialisation, data order and confidences")
    steps: int | None = opt(None, "warm-up steps (default: the shipped model's)")
    batch_size: int | None = opt(None, "warm-up batch size (default: the shipped model's)")
    lr: float | None = opt(None, "AdamW learning rate (default: the shipped model's)")
    eval_prompts: int | None = opt(None, "held-out prompts to measure the built model on, 8 samples each (0 to skip; "
                                   "default 256, word_problems 128)")
    threads: int = opt(1, "torch CPU threads (the tiny model gains little from more, and results are bit-identical "
                       "only for the same thread count)")

    def check(self) -> None:
        """Raise ConfigError naming the first bad flag; fills in ``eval_prompts``' task default."""
        from capo.core.checks import seed_problem
        from capo.errors import ConfigError

        if not self.out:
            raise ConfigError("--out is required: the folder to write the model to")
        if problem := seed_problem("--seed", self.seed):
            raise ConfigError(problem)
        for flag, v, low in (("--steps", self.steps, 1), ("--batch-size", self.batch_size, 1),
                             ("--threads", self.threads, 1), ("--eval-prompts", self.eval_prompts, 0)):
            if v is not None and v < low:
                raise ConfigError(f"{flag} must be >= {low}, got {v}")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if self.eval_prompts is None:
            self.eval_prompts = 128 if self.task == "word_problems" else 256


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "build-default",
        help="rebuild the embedded default model (tiny Llama + char tokenizer, chain_sum warm-up) on CPU",
        description=(
            "Build the embedded default: a character-level tokenizer and a ~0.37M-parameter Llama trained by a short "
            "supervised warm-up on reasoning-gym chain_sum problems in RLCR's <answer>/<confidence> format, "
            "stopped early so sampled accuracy leaves room for RL (or, with --task, another generated task's model). "
            "Deterministic on CPU for a fixed seed and thread count. The folder loads with transformers' "
            "AutoModelForCausalLM / AutoTokenizer. Every option is a field of capo.cli.build_default_cmd.BuildSettings."
        ),
    )
    add_settings(p, BuildSettings)
    return p


def run(ns) -> int:
    import torch

    args = from_namespace(BuildSettings, ns)
    args.check()
    torch.set_num_threads(args.threads)
    kwargs = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size), ("lr", args.lr))
              if v is not None}
    t0 = time.perf_counter()
    print(f"building the {args.task} model into {args.out} (seed {args.seed}, {torch.get_num_threads()} threads)",
          file=sys.stderr)
    stats = build_and_measure(args.out, args.seed, args.eval_prompts, task=args.task, **kwargs)
    print(json.dumps(stats, indent=2))
    print(f"done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def build_and_measure(out: str, seed: int, eval_prompts: int, task: str = "default", **kwargs) -> dict:
    """Build the ``task`` model into ``out``, then (``eval_prompts`` > 0) measure it on held-out problems, 8 samples
    each, and add the measurement to ``out/capo_default.json``."""
    import time
    from pathlib import Path

    from capo.evaluation.default_task import evaluate_default
    from capo.tasks import coin_sum, stochastic, word_problems
    from capo.tasks.default import build_default_model, load_default
    from capo.tasks.generated import generated_task

    t0 = time.perf_counter()
    build = {"coin_sum": coin_sum.build_coin_model, "word_problems": word_problems.build_word_model,
             "stochastic": stochastic.build_stochastic_model,
             "stochastic_binary": stochastic.build_binary_model}.get(task, build_default_model)
    stats = build(out, seed=seed, log=lambda s: print(s, file=sys.stderr, flush=True), **kwargs)
    if eval_prompts > 0:
        model, tok = load_default(model_dir=out)
        spec = generated_task(task)
        ev = evaluate_default(model, tok, spec.problems("eval", eval_prompts, seed=0), group_size=8, seed=seed,
                              max_new_tokens=spec.max_new_tokens, dataset=task,
                              answer_format=spec.answer_format or "rlcr")
        stats["eval"] = {k: v for k, v in ev.items() if k != "samples"}
        stats["total_seconds"] = round(time.perf_counter() - t0, 1)
        (Path(out) / "capo_default.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
