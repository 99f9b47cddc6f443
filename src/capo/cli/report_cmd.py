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
    n_boot: int = opt(200, "bootstrap draws of every paired interval over prompts")
    tables: bool = opt(False, "also print the comparison as Markdown: each measure's mean (sd over seeds) per "
                       "model, each model minus the reference with its paired interval, the conclusion (needs "
                       "--reference)")
    figures: str | None = opt(None, "also write PREFIX-summary.json (each model's per-seed values, what `capo sweep "
                              "report --compare-summary` reads), then PREFIX-acc_vs_auc.png and "
                              "PREFIX-paired_vs_REFERENCE.png into this folder (needs --reference)", metavar="DIR")
    prefix: str = opt("compare", "file-name prefix of --figures' files")
    split_on: str | None = opt(None, "also print each eval run's accuracy, AUC-mean and paired AUC-mean difference "
                               "vs the --reference run on all prompts, on the prompts containing TEXT and on the "
                               "others (e.g. '?': coin_sum's hidden-coin prompts)",
                               metavar="TEXT")


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
    if args.reference is None and (args.tables or args.figures is not None or args.split_on is not None):
        raise ConfigError("--tables, --figures and --split-on need --reference: they show the comparison against it")
    if args.n_boot < 0:
        raise ConfigError(f"--n-boot must be >= 0, got {args.n_boot}")
    if args.examples < 0:
        raise ConfigError(f"--examples must be >= 0, got {args.examples}")
    _check_outputs(args)
    runs = []
    seen = set()
    for i, d in enumerate(args.runs):
        name = names[i] if names else run_label(Path(d))
        if name in seen:
            name = f"{name} ({i})"
        seen.add(name)
        runs.append(load_run(Path(d), name=name, n_examples=args.examples))
    cmp = None
    evals = [r for r in runs if r.kind == "eval"]
    if args.reference is not None and not evals:
        raise ConfigError("--reference needs at least one eval run (a folder with metrics.json)")
    if evals:  # the page's paired intervals take --n-boot with or without --reference
        from capo.evaluation.compare import compare

        cmp = compare(evals, n_boot=args.n_boot, reference=args.reference)
    out = write_report(runs, Path(args.out), title=args.title, comparison=cmp)
    _comparison_outputs(cmp, runs, args)
    print(f"capo report: {len(runs)} run(s) -> {out}")
    return 0


def _check_outputs(args: ReportSettings) -> None:
    """Refuse an output path that cannot be written before anything is (an existing report was replaced, then the
    figures' folder refused)."""
    out = Path(args.out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the report's file path, e.g. {out / 'report.html'}")
    if out.exists() and out.suffix.lower() not in (".html", ".htm"):  # a run's metrics.json was replaced by a page
        raise ConfigError(f"--out {out} exists and is not an HTML report; nothing was written")
    if not args.prefix or any(sep in args.prefix for sep in ("/", "\\")):
        raise ConfigError(f"--prefix {args.prefix!r} must be a non-empty file-name prefix without a folder; nothing "
                          "was written")
    if args.figures is not None:
        fig = Path(args.figures)
        block = next((p for p in (fig, *fig.parents) if p.exists() and not p.is_dir()), None)
        if block is not None:
            raise ConfigError(f"--figures {fig}: {block} is a file, not a folder; nothing was written")


def _comparison_outputs(cmp, runs: list, args: ReportSettings) -> None:
    """``--tables`` and ``--split-on`` (Markdown on stdout), ``--figures`` (summary JSON, then the two figures)."""
    from capo.evaluation.report import markdown_tables, write_comparison_files

    if cmp is None:
        return
    if args.tables:
        print(markdown_tables(cmp))
    if args.split_on is not None:
        from capo.evaluation.compare import split_table

        evals = [r for r in runs if r.kind == "eval"]
        print(split_table(evals, args.reference, args.split_on, n_boot=args.n_boot))
    if args.figures is not None:
        for path in write_comparison_files(cmp, Path(args.figures), args.prefix):
            print(f"capo report: {path}")
