"""``capo eval``: sample k responses per prompt from a causal LM, judge them, and measure calibration."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from capo.cli.flags import add_settings, given_flags
from capo.errors import ConfigError, DataError
from capo.evaluation.run import EvalSettings, has_splits
from capo.settings import from_namespace
from capo.verify import DEFAULT_ANSWER_FORMAT


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval",
        help="evaluate a model: accuracy, calibration (AUC-mean, AUROC, ECE, Brier, AURC), test-time scaling",
        description="Sample k responses per prompt, verify them with math-verify, and write generations.jsonl, "
        "metrics.json, plots and report.html to --out. Rerun the same command to resume an interrupted eval. "
        "Every setting below is a field of capo.evaluation.run.EvalSettings (its one definition).",
    )
    add_settings(p, EvalSettings, default_group="sampling")
    p.add_argument("--out", default=None,
                   help="run directory (created; an existing one is resumed; default: runs/eval/MODEL-DATASET, or "
                        "runs/eval/rescored-NAME for --generations, printed at the start). A re-scoring refuses a "
                        "folder holding another evaluation, a training run or its own input file")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress output")
    return p


def run(args) -> int:
    from capo.evaluation.run import run_eval, validate_settings

    if args.model and args.generations:
        raise ConfigError("--model and --generations are mutually exclusive: give one")
    _generation_settings(args, given_flags(args._parser, args.argv))
    _extraction_settings(args)
    s = from_namespace(EvalSettings, args)
    validate_settings(s)  # before loading anything
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out) if args.out else _default_out(args)
    if not args.out:
        print(f"capo eval: --out not given; writing to {out}", flush=True)
    t0 = time.perf_counter()
    m = run_eval(s, out, progress=args.progress)
    el = time.perf_counter() - t0

    def f(key):
        v = m.get(key)
        return "n/a" if v is None else f"{v:.4f}"

    print(f"capo eval: {int(m['n'])} responses on {int(m['n_groups'])} prompts in {el:.1f} s -> {out}")
    print(f"  accuracy {f('accuracy')}  AUC-mean {f('auc_mean')} ({int(m['auc_mean_groups'] or 0)} prompts)  "
          f"AUROC {f('auroc')}  ECE {f('ece')}  Brier {f('brier')}  AURC {f('aurc')}")
    if "stochastic_ece" in m:
        print(f"  stated probabilities, per question ({int(m['stochastic_questions'] or 0)}): ECE "
              f"{f('stochastic_ece')}  mean |p - p_c| {f('stochastic_rate_error')}  AUROC {f('stochastic_auroc')}")
    if "answer_ece" in m:
        print(f"  frequency of the predicted outcome 1, per question ({int(m['answer_questions'] or 0)}): ECE "
              f"{f('answer_ece')}  mean |f - p_c| {f('answer_rate_error')}  AUROC {f('answer_auroc')}; verbal "
              f"confidence ECE {f('verbal_ece')}")
    _print_groups(out)
    print(f"  report: {out / 'report.html'}")
    return 0


def _print_groups(out: Path) -> None:
    """One line per question category (``by_group`` of metrics.json; facts: the relation), when there are any."""
    try:
        groups = json.loads((out / "metrics.json").read_text())["curves"].get("by_group") or {}
    except (OSError, KeyError, json.JSONDecodeError):
        return
    for name, g in groups.items():
        def f(key):
            return "n/a" if g.get(key) is None else f"{g[key]:.3f}"

        print(f"  {name:16s} {int(g['n_groups'])} prompts: accuracy {f('accuracy')}  AUC-mean {f('auc_mean')} "
              f"({int(g['auc_mean_groups'] or 0)})  AUROC {f('auroc')}  ECE {f('ece')}"
              + (f"  verbal ECE {f('verbal_ece')}" if "verbal_ece" in g else ""))


# the settings that only choose what is generated and how a dataset is read: a re-scoring (--generations) reads
# neither, and a flag it would silently ignore is refused
GENERATION_ONLY = ("model", "dataset", "split", "limit", "k", "temperature", "top_p", "max_new_tokens", "batch_size",
                   "chat_template", "system_prompt", "response_prefix", "prompt_field", "answer_field", "gold_format",
                   "engine", "autocast", "decode", "device", "token_stats")


def _generation_settings(args, given: set[str]) -> None:
    """With --generations nothing is generated: a generation setting given there (--limit and -k would read as a
    selection of the file's rows that never happens; --temperature as a sampling that never happens) is refused. A
    file dataset has no splits: --split given with one is refused. -k takes its default when not given."""
    flags = {a.dest: min(a.option_strings, key=len) for a in args._parser._actions if a.option_strings}
    ignored = [flags[d] for d in GENERATION_ONLY if d in given and d in flags and d != "model"]
    if args.generations and ignored:
        raise ConfigError(f"{', '.join(ignored)} choose{'s' if len(ignored) == 1 else ''} what is generated; "
                          "--generations generates nothing and scores every row of its file: select the rows in the "
                          "file, and drop those flags")
    if "split" in given and not args.generations and not has_splits(args.dataset):
        raise ConfigError(f"--split {args.split!r} chooses a split of a built-in dataset; the file {args.dataset} "
                          "has none: drop --split")
    if args.k is None:
        args.k = EvalSettings.k  # the field's default


# how answers are extracted from a response; recorded in a run's config.json and reused when its generations are
# re-scored with `--generations RUN/generations.jsonl` (the defaults apply to files from elsewhere)
EXTRACTION_DEFAULTS = {"answer_format": DEFAULT_ANSWER_FORMAT, "fallback_last_number": False}


def _extraction_settings(args) -> None:
    """Fill --answer-format / --fallback-last-number: the flag when given; for a re-scored capo eval run, the value
    recorded in its config.json (said on stdout; a record that cannot be read is refused), so that re-scoring never
    silently judges with other settings; else the default."""
    recorded = {}
    cfg_path = Path(args.generations or ".").parent / "config.json"
    if args.generations and cfg_path.is_file() and None in (args.answer_format, args.fallback_last_number):
        recorded = _recorded_settings(cfg_path)
    for key, default in EXTRACTION_DEFAULTS.items():
        if getattr(args, key) is not None:
            continue
        if key in recorded:
            setattr(args, key, recorded[key])
            flag = "--" + key.replace("_", "-")
            print(f"capo eval: {flag} taken from {cfg_path} ({recorded[key]!r}); pass {flag}"
                  f"{' or --no-' + flag[2:] if key == 'fallback_last_number' else ''} to override", flush=True)
        else:
            setattr(args, key, _task_default(args, key, default))


def _recorded_settings(cfg_path: Path) -> dict:
    """A re-scored run's recorded settings (its config.json); a damaged one raises rather than being scored past."""
    try:
        recorded = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        problem = f"cannot be read ({e})"
    else:
        if isinstance(recorded, dict) and isinstance(recorded.get("fallback_last_number", False), bool):
            return recorded
        problem = "are not a capo eval run's (a JSON object with a true/false fallback_last_number)"
    raise DataError(f"{cfg_path}: the settings recorded beside --generations {problem}; pass --answer-format and "
                    "--fallback-last-number or --no-fallback-last-number to score without them")


def _task_default(args, key: str, default):
    """The default of an extraction setting for ``--dataset``: the first of the answer formats the dataset needs
    (``stochastic``: percent; ``facts``: short), else ``default``."""
    from capo.tasks.datasets import required_answer_formats

    needed = required_answer_formats(args.dataset) if not args.generations else None
    return needed[0] if key == "answer_format" and needed else default


def _default_out(args) -> Path:
    """runs/eval/MODEL-DATASET (names made path-safe), or runs/eval/rescored-RUN for --generations."""
    def safe(x: str) -> str:
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in x).strip("._") or "run"

    if args.generations:
        g = Path(args.generations)
        return Path("runs") / "eval" / f"rescored-{safe(g.parent.name or g.stem)}"
    model = Path(args.model.rstrip("/")).name if args.model else "model"
    return Path("runs") / "eval" / f"{safe(model)}-{safe(Path(args.dataset).stem)}"
