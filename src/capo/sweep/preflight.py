"""Check a whole sweep before any job starts, with the validation the jobs' own commands apply: each job's training
settings as ``capo train`` resolves them (:func:`capo.trainer.config.load_config`), its final evaluation as ``capo
eval`` checks it (:func:`capo.evaluation.run.validate_settings`), its record (a corrupt one is never rewritten) and
its run folder (one trained with other settings is never resumed or evaluated as the job's,
:func:`capo.sweep.runner.run_dir_problem`); then the spec's seeds (each once) and the output folders. Every problem is
reported at once, by :func:`check` as one :class:`ConfigError`, before anything is trained or written."""

from __future__ import annotations

import os
from pathlib import Path

from capo.errors import ConfigError
from capo.sweep import runner
from capo.sweep.spec import Job, record_state


def check(spec_path: Path, spec: dict, jobs: list[Job], runs_root: Path, records_root: Path) -> None:
    """Raise :class:`ConfigError` listing every problem of the sweep (exit 2 in the CLI); nothing is written."""
    found = problems(spec, jobs, runs_root, records_root)
    if found:
        raise ConfigError(f"{spec_path}: {len(found)} problem{'s' * (len(found) > 1)}, nothing was run:\n  - "
                          + "\n  - ".join(found))


def problems(spec: dict, jobs: list[Job], runs_root: Path, records_root: Path) -> list[str]:
    """Every problem of the sweep, one line each; a problem shared by several jobs is listed once, naming them."""
    by_message: dict[str, list[str]] = {}
    for job in jobs:
        for message in job_problems(job):
            names = by_message.setdefault(message, [])
            if job.name not in names:
                names.append(job.name)
    out = [f"{', '.join(names)}: {message}" for message, names in by_message.items()]
    seeds = spec["seeds"]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        out.append(f"seeds: {', '.join(map(str, twice))} given more than once (each training seed is one run)")
    for flag, root in (("--runs-root", runs_root), ("--records-root", records_root)):
        problem = folder_problem(Path(root), spec["name"])
        if problem:
            out.append(f"{flag} {root}: {problem}")
    return out


def job_problems(job: Job) -> list[str]:
    """What would stop the job or corrupt its record: a corrupt record, settings `capo train` or `capo eval` refuses,
    a run folder started with other settings (checked only for a job still to run)."""
    from capo.evaluation.run import validate_settings

    state, why = record_state(job)
    if state == "corrupt":
        return [runner.corrupt_record(job, why)]
    try:
        cfg = runner.resolved_config(job)
    except ConfigError as e:
        return [f"capo train: {e}"]
    try:
        validate_settings(runner.eval_settings(job, cfg, runner.final_model(job, cfg)))
    except ConfigError as e:
        return [f"capo eval: {_spec_key(str(e))}"]
    problem = runner.run_dir_problem(job, cfg) if state == "todo" else None
    return [problem] if problem else []


def _spec_key(message: str) -> str:
    """`capo eval`'s message with the flag named as the spec's key too: "eval.problems (--limit): ..."."""
    for key, flag in runner.EVAL_FLAGS.items():
        if message.startswith(f"{flag}:"):
            return f"eval.{key} ({flag}){message[len(flag):]}"
    return message


def folder_problem(root: Path, name: str) -> str | None:
    """Why ``root/name`` cannot be made a writable folder (the nearest existing folder on its way is a file or is not
    writable), or None."""
    for p in (root / name, *(root / name).parents):
        if p.exists():
            if not p.is_dir():
                return "not a directory" if p == root else f"{p} is not a directory"
            if not os.access(p, os.W_OK | os.X_OK):
                return f"{p} is not writable"
            return None
    return None
