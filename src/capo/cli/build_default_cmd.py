"""``capo build-default``: rebuild the embedded default model (tokenizer + tiny Llama) from scratch on CPU."""

from __future__ import annotations

import argparse
import json
import sys
import time

from capo.tasks.datasets import GENERATED_TASKS as BUILD_TASKS  # each generated task ships a model built here


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "build-default",
        help="rebuild the embedded default model (tiny Llama + char tokenizer, chain_sum warm-up) on CPU",
        description=(
            "Build the embedded default: a character-level tokenizer and a ~0.37M-parameter Llama trained by a short "
            "supervised warm-up on reasoning-gym chain_sum problems in RLCR's <answer>/<confidence> format, "
            "stopped early so sampled accuracy leaves room for RL. Deterministic on CPU for a fixed seed and thread "
            "count. The folder loads with transformers' AutoModelForCausalLM / AutoTokenizer."
        ),
    )
    p.add_argument("--task", default="default", choices=BUILD_TASKS,
                   help="which task model: 'default' (chain_sum, from scratch), 'coin_sum' (the default fine-tuned "
                        "on chain sums with a hidden coin; the calibration-collapse testbed) or 'word_problems' (a "
                        "5M Qwen2-shaped model pre-trained from scratch on multi-step word-problem traces; the "
                        "reasoning testbed, ~1 hour on 2 threads)")
    p.add_argument("--out", required=True, help="output folder (created; existing model files are overwritten)")
    p.add_argument("--seed", type=int, default=0, help="seed for initialisation, data order and confidences (default 0)")
    p.add_argument("--steps", type=int, default=None, help="warm-up steps (default: the shipped model's)")
    p.add_argument("--batch-size", type=int, default=None, help="warm-up batch size (default 64)")
    p.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default: the shipped model's)")
    p.add_argument("--eval-prompts", type=int, default=None,
                   help="held-out prompts to measure the built model on, 8 samples each (0 to skip; default 256, "
                        "word_problems 128)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: the tiny model gains little from more, and results are "
                        "bit-identical only for the same thread count)")
    return p


def run(args) -> int:
    import torch

    from capo.errors import ConfigError

    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.lr is not None and not args.lr > 0:
        raise ConfigError(f"--lr must be > 0, got {args.lr}")
    if args.eval_prompts is None:
        args.eval_prompts = 128 if args.task == "word_problems" else 256
    if args.eval_prompts < 0:
        raise ConfigError(f"--eval-prompts must be >= 0, got {args.eval_prompts}")
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    kwargs = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size), ("lr", args.lr))
              if v is not None}
    t0 = time.perf_counter()
    print(f"building the default model into {args.out} (seed {args.seed}, {torch.get_num_threads()} threads)",
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
    from capo.tasks import coin_sum, word_problems
    from capo.tasks.default import build_default_model, load_default
    from capo.tasks.generated import generated_task

    t0 = time.perf_counter()
    build = {"coin_sum": coin_sum.build_coin_model, "word_problems": word_problems.build_word_model}.get(
        task, build_default_model)
    stats = build(out, seed=seed, log=lambda s: print(s, file=sys.stderr, flush=True), **kwargs)
    if eval_prompts > 0:
        model, tok = load_default(model_dir=out)
        spec = generated_task(task)
        ev = evaluate_default(model, tok, spec.problems("eval", eval_prompts, seed=0), group_size=8, seed=seed,
                              max_new_tokens=spec.max_new_tokens, dataset=task)
        stats["eval"] = {k: v for k, v in ev.items() if k != "samples"}
        stats["total_seconds"] = round(time.perf_counter() - t0, 1)
        (Path(out) / "capo_default.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
