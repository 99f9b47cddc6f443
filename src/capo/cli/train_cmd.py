"""`capo train`: RL-train a model with any algorithm of the core. Every config field is a flag."""

from __future__ import annotations

import argparse
import json
import sys

from capo.trainer.config import dump_yaml, fields_help, load_config, preset_names


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        help="train a model with any of capo's algorithms (--algo.name: GRPO, CAPO, RLCR, ...)",
        description="Train with capo's lean trainer. Settings come from the defaults, then --config (a built-in "
        f"preset: {', '.join(preset_names()) or 'none'}; or a YAML file with the same sections), then the "
        "--SECTION.FIELD flags below. Multi-process: `accelerate launch --multi_gpu --num_processes 2 -m capo.cli "
        "train ...` (--multi_gpu on a CPU-only machine too: without it accelerate starts one process).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        usage="capo train [-h] [--config PRESET_OR_YAML] [--print-config] [--SECTION.FIELD VALUE ...]",
    )
    p.add_argument("--config", help="built-in preset name or YAML file")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    sections: dict[str, argparse._ArgumentGroup] = {}
    for name, help_text, default, tname in fields_help():
        sec = name.split(".")[0]
        grp = sections.setdefault(sec, p.add_argument_group(f"{sec} settings"))
        shown = json.dumps(default)
        grp.add_argument(f"--{name}", dest=f"cfg:{name}", metavar=tname.upper(), default=argparse.SUPPRESS,
                         help=f"[{tname}, default {shown}] {help_text}".replace("%", "%%"))
    return p


def run(args) -> int:
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg:")}
    notes: list[str] = []
    cfg = load_config(args.config, overrides, notes=notes)
    for note in notes:
        print(f"capo train: note: {note}", file=sys.stderr)
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0
    from capo.trainer.loop import train

    last = train(cfg)
    if not last:  # resumed a run whose last checkpoint is already the final step
        print(f"done: {cfg.run.out_dir} already holds the final checkpoint of {cfg.run.steps} steps")
        return 0

    def f(key):
        v = last.get(key)
        return "-" if v is None or v != v else f"{v:.3f}"

    print(f"done: {cfg.run.steps} steps in {cfg.run.out_dir}; final train/accuracy={f('train/accuracy')} "
          f"eval/accuracy={f('eval/accuracy')} eval/auc_mean={f('eval/auc_mean')}")
    return 0
