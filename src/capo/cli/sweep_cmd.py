"""``capo sweep run | status | prune | report``: seed-powered comparisons of training methods (:mod:`capo.sweep`).

Paths are relative to the current directory: run folders go to ``runs/sweeps/NAME`` and records to
``sweeps/records/NAME`` (``--runs-root``, ``--records-root``), the report to ``docs/figures/sweeps/NAME``
(``--out``); run from a repository's root, that is the repository's ``sweeps/`` and ``docs/`` folders.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from capo.cli.flags import add_settings, given_flags
from capo.errors import ConfigError
from capo.settings import from_namespace, opt
from capo.sweep.report import DEFAULT_EFFECT, DEFAULT_REFERENCE
from capo.sweep.runner import DEFAULT_KEEP, KEEP, KEEP_HELP, train_seconds
from capo.sweep.spec import EVAL_DEFAULTS, REQUIRED_KEYS, SPEC_KEYS

SPEC_HELP = ("the sweep spec (YAML), a mapping of: " + ", ".join(REQUIRED_KEYS) + " (required); "
             + ", ".join(f"eval ({', '.join(EVAL_DEFAULTS)})" if k == "eval" else k
                         for k in SPEC_KEYS if k not in REQUIRED_KEYS)
             + " (docs/how-to/compare-seeds.md; the repository's are sweeps/*.yaml)")


@dataclass
class SweepStatusSettings:
    """Everything ``capo sweep status`` takes (its ``--help`` is built from these fields)."""

    spec: str = opt("", SPEC_HELP, flag="spec", metavar="SPEC.yaml")
    runs_root: str = opt("runs/sweeps", "where the run folders go, relative to the current directory: "
                         "RUNS_ROOT/NAME/METHOD-seedS")
    records_root: str = opt("sweeps/records", "where the records go, relative to the current directory: "
                            "RECORDS_ROOT/NAME/METHOD-seedS.json; a job whose record has its settings hash is done")


@dataclass
class SweepRunSettings(SweepStatusSettings):
    """Everything ``capo sweep run`` takes (its ``--help`` is built from these fields)."""

    jobs: int | None = opt(None, "jobs at a time, each a `capo train` then `capo eval` subprocess on one thread "
                           "(default: one per CPU core)")
    commit: bool = opt(False, "git-commit each record as it lands, in the git repository that holds the records, so "
                       "that a fresh clone continues a cut-off sweep")
    max_runs: int | None = opt(None, "run at most this many of the jobs not done yet, then stop")
    keep: str = opt(DEFAULT_KEEP, KEEP_HELP, choices=KEEP)


@dataclass
class SweepPruneSettings(SweepStatusSettings):
    """Everything ``capo sweep prune`` takes (its ``--help`` is built from these fields)."""

    keep: str = opt(DEFAULT_KEEP, KEEP_HELP, choices=KEEP)


@dataclass
class SweepReportSettings:
    """Everything ``capo sweep report`` takes (its ``--help`` is built from these fields)."""

    records: list = opt([], "a sweep's records folder (sweeps/records/NAME), or several whose records share preset, "
                        "evaluation and training settings (one comparison); with --compare-summary one "
                        "`capo report --figures` PREFIX-summary.json", flag="records", nargs="+", metavar="RECORDS")
    reference: str = opt(DEFAULT_REFERENCE, "the method every other is paired against, by training seed")
    effect: float = opt(DEFAULT_EFFECT, "the difference the power analysis is for: the seeds a paired t-test needs to "
                        "detect it at 80%% power and the 5%% level")  # %% : argparse formats help strings
    out: str | None = opt(None, "output folder of summary.md, summary.json and the figures (default: "
                          "docs/figures/sweeps/NAME relative to the current directory, the records folders' names "
                          "joined by + for several)")
    base_draws: int | None = opt(None, "use only the first N draws of the base evaluation, by sampling seed "
                                 "(default: all)", metavar="N")
    curve_tables: bool = opt(False, "also print each run's held-out curve as a table")
    compare_summary: bool = opt(False, "read a `capo report --figures` summary JSON instead of records folders and "
                                "print its seed-paired table (writes nothing: --out, --base-draws and --curve-tables "
                                "are refused)")


ACTIONS = {  # name -> (settings, help, description)
    "run": (SweepRunSettings, "run a sweep's jobs not done yet (resumable; one job per core)",
            "Train each (method, seed) job of SPEC with `capo train` (resuming from its last checkpoint), evaluate "
            "the final checkpoint with `capo eval` on the held-out split and write one small record per run. Jobs "
            "whose record has their settings are skipped, so running it again continues a cut-off sweep; a job "
            "another live process holds (RUN_DIR/sweep.lock) is skipped too. Before any job starts, every job's "
            "settings are checked as `capo train` and `capo eval` check them, with the seeds, the records, the run "
            "folders (one trained with other settings is never resumed or evaluated as the job's) and the output "
            "folders: any problem, all listed, exit 2 and nothing run. Exit 1 when a job failed."),
    "status": (SweepStatusSettings, "list each job of a sweep as done, running, todo, stale or corrupt",
               "One line per job of SPEC: done (its record has the job's settings; knobs that cannot change a result, "
               "such as run.save_every or run.threads, may differ), running (no record yet, a live sweep process "
               "holds it), todo (no record), stale (a record from other settings: the spec was edited; delete it to "
               "rerun) or corrupt (a file that is no record: restore or delete it), with how far a job not done has "
               "come (step S of T, or its final evaluation); the jobs left and roughly what they cost; a note when "
               "the records folder does not exist here; then, exit 2, what would stop `capo sweep run` (the checks "
               "it makes before any job starts)."),
    "prune": (SweepPruneSettings, "free the disk that finished jobs' checkpoints hold (--keep)",
              "For every job of SPEC whose record is done and that no live process holds, reduce its run folder's "
              "checkpoints to what --keep names (a job without its record, or running, is never touched): what "
              "`capo sweep run --keep` does to each job it finishes, for folders finished before it or with "
              "another --keep. Prints the space freed per job and in all."),
    "report": (SweepReportSettings, "tables, power analysis and figures from a sweep's records",
               "Pair every method with --reference by training seed: mean difference, 95% t-interval over seeds, "
               "paired t-test p, Holm-adjusted p over the methods, the seeds needed for --effect at 80% power, the "
               "change from the start (base records) and along the periodic curve. Prints the tables and writes "
               "summary.md, summary.json, curves.png, plane.png, forest.png and reliability.png to --out."),
}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sweep",
        help="run, resume and report seed-powered comparisons of methods (sweep specs)",
        description="A sweep spec (YAML) names a preset, the methods (config overrides each), the training seeds and "
        "the held-out evaluation; `capo sweep run` trains and evaluates every (method, seed) resumably, `capo sweep "
        "status` lists what is done, `capo sweep report` pairs the methods with a reference by seed. Paths are "
        "relative to the current directory.",
    )
    actions = p.add_subparsers(dest="sweep_command", metavar="ACTION", required=True)
    for name, (cls, help_, description) in ACTIONS.items():
        a = actions.add_parser(name, help=help_, description=description, allow_abbrev=False)
        add_settings(a, cls)
        a.set_defaults(_parser=a)
    return p


def run(ns) -> int:
    cls = ACTIONS[ns.sweep_command][0]
    args = from_namespace(cls, ns)
    if ns.sweep_command == "report":
        return _report(args, given_flags(ns._parser, ns.argv[ns.argv.index("report") + 1:]))
    from capo.sweep.spec import jobs, load_spec

    spec = load_spec(Path(args.spec))
    all_jobs = jobs(spec, Path(args.runs_root), Path(args.records_root))
    if ns.sweep_command == "status":
        return _status(spec, all_jobs, args)
    if ns.sweep_command == "prune":
        from capo.sweep.runner import prune_sweep

        return prune_sweep(all_jobs, args.keep)
    return _run(spec, all_jobs, args)


def _status(spec: dict, all_jobs: list, args: SweepStatusSettings) -> int:
    """One line per job (a job without its record that a live sweep process holds is "running", with the process;
    one not done says how far its run folder has come, or that the folder keeps its record), what is left and
    roughly what it costs, a note when the records folder does not exist here, then what would stop `run` (exit
    2)."""
    import os

    from capo.sweep import preflight
    from capo.sweep.runner import RUN_RECORD, holder, kept_record, progress
    from capo.sweep.spec import state

    states, trained = {}, {}
    for j in all_jobs:
        st = state(j)
        who = holder(j) if st == "todo" else None
        states[j.name] = "running" if who else st
        got = progress(j) if st == "todo" else None
        trained[j.name] = min(1.0, got[0] / got[1]) if got else 0.0
        where = None if got is None else "final evaluation" if got[2] else f"step {got[0]} of {got[1]}"
        if st == "todo" and kept_record(j):
            where = f"finished: run copies {RUN_RECORD} from its run folder"
        notes = [x for x in (who, where) if x]
        print(f"{states[j.name]:7} {j.name}" + (f"  ({'; '.join(notes)})" if notes else ""))
    print(_left(all_jobs, states, trained))
    folder = Path(args.records_root) / spec["name"]
    if not folder.exists():
        print(f"note: no records folder {folder} in {os.getcwd()}: no job has a record here; run from the folder "
              "that holds the sweep's records (a repository's root) or pass --records-root")
    preflight.check(Path(args.spec), spec, all_jobs, Path(args.runs_root), Path(args.records_root))
    return 0


def _left(all_jobs: list, states: dict[str, str], trained: dict[str, float]) -> str:
    """One line: jobs done, running and waiting, and the cost of those left at the median training time of the done
    training jobs (:func:`_trained_for`: every process that trained a resumed job), less the share of its steps each
    has trained."""
    import json
    import statistics
    from collections import Counter

    from capo.sweep.spec import BASE

    n = Counter(states.values())
    line = f"{n['done']} of {len(all_jobs)} done, {n['running']} running, {n['todo']} waiting" + "".join(
        f", {n[k]} {k}" for k in ("stale", "corrupt") if n[k])
    costs = [_trained_for(json.loads(j.record.read_text())) for j in all_jobs
             if states[j.name] == "done" and j.method != BASE]
    costs = [c for c in costs if c > 0]
    left = n["running"] + n["todo"]
    if costs and left:
        med = statistics.median(costs)
        share = sum(1 - trained[j.name] for j in all_jobs if states[j.name] in ("running", "todo"))
        line += (f"; a training job trained for {med / 60:.0f} min (median of {len(costs)}, every process "
                 f"counted): the {left} left are ~{share * med / 3600:.1f} job-hours of training")
    return line


def _trained_for(rec: dict) -> float:
    """A finished training job's training time over every process: its record's ``train_s``, or for a record from
    before that field the sum of its curves' ``time/step`` (the same rows); 0 when neither says."""
    if isinstance(rec.get("train_s"), (int, float)):
        return float(rec["train_s"])
    return train_seconds((rec.get("curves") or {}).get("train") or [])


def _run(spec: dict, all_jobs: list, args: SweepRunSettings) -> int:
    import os

    from capo.sweep import preflight
    from capo.sweep.runner import commit_problem, run_sweep

    n_jobs = args.jobs if args.jobs is not None else os.cpu_count() or 1
    if n_jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {n_jobs}")
    if args.max_runs is not None and args.max_runs < 0:
        raise ConfigError(f"--max-runs must be >= 0, got {args.max_runs}")
    preflight.check(Path(args.spec), spec, all_jobs, Path(args.runs_root), Path(args.records_root))
    if args.commit and (problem := commit_problem(Path(args.records_root))):
        raise ConfigError(problem)
    return run_sweep(spec["name"], all_jobs, n_jobs, args.commit, args.max_runs, args.keep)


# the flags that shape a records report only: --compare-summary prints one table from a summary file and reads none
RECORDS_ONLY = ("out", "base_draws", "curve_tables")


def _report(args: SweepReportSettings, given: set[str]) -> int:
    import math

    from capo.sweep.report import compare_summary_report, write_report

    if not (math.isfinite(args.effect) and args.effect > 0):
        raise ConfigError(f"--effect must be a difference > 0 (e.g. 0.03), got {args.effect}")
    if args.compare_summary:
        if len(args.records) != 1:
            raise ConfigError(f"--compare-summary reads one summary JSON, got {len(args.records)} paths")
        if ignored := ["--" + d.replace("_", "-") for d in RECORDS_ONLY if d in given]:
            raise ConfigError(f"{', '.join(ignored)} shape{'s' if len(ignored) == 1 else ''} a report from records "
                              "folders; --compare-summary prints one table from its summary file and writes nothing: "
                              "drop those flags")
        print(compare_summary_report(Path(args.records[0]), args.reference, args.effect))
        return 0
    write_report([Path(r) for r in args.records], args.reference, args.effect,
                 None if args.out is None else Path(args.out), args.base_draws, args.curve_tables)
    return 0
