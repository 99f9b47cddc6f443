"""``capo report``: one HTML page comparing several eval and/or training run directories side by side."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from capo.cli.flags import add_settings
from capo.errors import ConfigError
from capo.settings import from_namespace, opt


@dataclass
class ReportSettings:
    """Everything ``capo report`` takes; each field is its one definition (``capo report --help`` is built from it)."""

    runs: list = opt([], "run directories", flag="runs", nargs="+", metavar="RUN_DIR")
    out: str = opt("report.html", "output HTML file")
    names: str | None = opt(None, "comma-separated display names, one per RUN_DIR (default: each run's method and "
                            "seed from its config, e.g. grpo-seed0; the folder name when it names none)")
    title: str = opt("capo report", "page title")
    examples: int = opt(0, "example responses shown per eval run")
    reference: str | None = opt(None, "the model the paired differences are taken against: a run name without its "
                                "-seedN suffix, e.g. grpo (default: base when there is one, else the first model)",
                                metavar="MODEL")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="compare eval/train run directories in one self-contained HTML page",
        description="Tables of every metric and overlaid reliability / precision-coverage plots for finished "
        "`capo eval` runs (metrics.json) and training curves for `capo train` runs (metrics.jsonl). Every option "
        "is a field of capo.cli.report_cmd.ReportSettings.",
    )
    add_settings(p, ReportSettings)
    return p


def run(ns) -> int:
    from capo.evaluation.report import load_run, run_label, write_report

    args = from_namespace(ReportSettings, ns)
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(args.runs):
        raise ConfigError(f"--names has {len(names)} names but {len(args.runs)} run directories were given")
    if args.examples < 0:
        raise ConfigError(f"--examples must be >= 0, got {args.examples}")
    runs = []
    seen = set()
    for i, d in enumerate(args.runs):
        name = names[i] if names else run_label(Path(d))
        if name in seen:
            name = f"{name} ({i})"
        seen.add(name)
        runs.append(load_run(Path(d), name=name, n_examples=args.examples))
    cmp = None
    if args.reference is not None:
        from capo.evaluation.compare import compare

        evals = [r for r in runs if r.kind == "eval"]
        if not evals:
            raise ConfigError("--reference needs at least one eval run (a folder with metrics.json)")
        cmp = compare(evals, reference=args.reference)
    out = write_report(runs, Path(args.out), title=args.title, comparison=cmp)
    print(f"capo report: {len(runs)} run(s) -> {out}")
    return 0
