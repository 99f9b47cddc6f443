"""``capo report``: one HTML page comparing several eval and/or training run directories side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from capo.errors import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="compare eval/train run directories in one self-contained HTML page",
        description="Tables of every metric and overlaid reliability / precision-coverage plots for finished "
        "`capo eval` runs (metrics.json) and training curves for `capo train` runs (metrics.jsonl).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories")
    p.add_argument("--out", default="report.html", help="output HTML file (default: report.html)")
    p.add_argument("--names", default=None, help="comma-separated display names, one per RUN_DIR")
    p.add_argument("--title", default="capo report", help="page title")
    p.add_argument("--examples", type=int, default=0, help="example responses shown per eval run (default: 0)")
    p.add_argument("--reference", default=None, metavar="MODEL",
                   help="the model the paired differences are taken against: a run name without its -seedN suffix, "
                        "e.g. grpo (default: base when there is one, else the first model)")
    return p


def run(args) -> int:
    from capo.evaluation.report import load_run, write_report

    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(args.runs):
        raise ConfigError(f"--names has {len(names)} names but {len(args.runs)} run directories were given")
    if args.examples < 0:
        raise ConfigError(f"--examples must be >= 0, got {args.examples}")
    runs = []
    seen = set()
    for i, d in enumerate(args.runs):
        name = names[i] if names else Path(d).name or str(d)
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
