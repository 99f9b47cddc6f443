"""A sweep spec and its jobs: which (method, seed) runs a spec asks for, their settings hash and where their files go.

A spec (YAML) names a preset, the methods (each a dict of config overrides), the training seeds, common overrides
and the held-out evaluation. Each job's settings (preset, resolved overrides, evaluation) hash to the key a record
is recognised by: a record with the job's hash is done, one with another hash is stale (the spec was edited):
``status`` says so and ``run`` never counts it done. (``capo sweep report`` reads record folders without the spec:
records that agree among themselves are reported whatever the spec now says.) With ``base: true`` the sweep also
evaluates the preset's initial model under the same held-out evaluation; ``base: N`` draws that evaluation N times
with evaluation seeds ``eval.seed``, ``eval.seed + 1``, ... (``base.json``, ``base-draw1.json``, ...).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from capo.errors import ConfigError
from capo.rundir import yaml_loads

EVAL_DEFAULTS = {"problems": 100, "k": 8, "batch_size": 64, "seed": 0}
BASE = "base"  # the job that evaluates the preset's initial model (spec `base: true`); no training, no seed
SPEC_KEYS = ("name", "preset", "steps", "overrides", "methods", "seeds", "eval", "save_every", "description", "base")
REQUIRED_KEYS = ("name", "preset", "methods", "seeds")
# a sweep's and a method's name is a folder's and a file's name: runs/sweeps/NAME/METHOD-seedS, records/NAME/...
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Job:
    """One (method, seed) training run of a sweep and where its files go."""

    sweep: str
    method: str
    seed: int | None  # None: a base job
    preset: str
    overrides: dict
    eval: dict
    run_dir: Path
    record: Path
    settings_hash: str = field(default="")
    draw: int = 0  # a base job: which draw of the base evaluation (evaluation seed eval.seed + draw)

    @property
    def settings(self) -> dict:
        """What the settings hash is taken over (a base job's also covers ``base: true``), as a record keeps it."""
        return {"preset": self.preset, "overrides": self.overrides, "eval": self.eval}

    @property
    def name(self) -> str:
        if self.method == BASE:
            return f"{BASE}-draw{self.draw}" if self.draw else BASE
        return f"{self.method}-seed{self.seed}"


def load_spec(path: Path) -> dict:
    """Read and validate a sweep spec; raises :class:`ConfigError` naming the file and the bad key."""
    import yaml

    path = Path(path)
    if not path.is_file():  # a folder (sweeps/, a sweep's records) is named as one: "no such" sent users looking
        what = "is a folder, not a sweep spec" if path.is_dir() else "no such sweep spec"
        raise ConfigError(f"{path}: {what} (a YAML file; the repository's are in sweeps/*.yaml)")
    try:
        spec = yaml_loads(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep spec is a mapping of {', '.join(SPEC_KEYS)}")
    _check_spec(path, spec)
    return spec


def _check_spec(path: Path, spec: dict) -> None:
    unknown = set(spec) - set(SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(SPEC_KEYS)}")
    for key in REQUIRED_KEYS:
        if spec.get(key) in (None, ""):
            raise ConfigError(f"{path}: '{key}' is required")
    methods = spec["methods"]
    if not isinstance(methods, dict) or not methods or not all(isinstance(v, dict) for v in methods.values()):
        raise ConfigError(f"{path}: 'methods' maps each method name to a dict of config overrides (one or more)")
    if BASE in methods:
        raise ConfigError(f"{path}: '{BASE}' is the initial model's evaluation (`base: true`), not a method name")
    for what, name in (("the sweep's name", spec["name"]), *(("method name", m) for m in methods)):
        if not (isinstance(name, str) and NAME_PATTERN.fullmatch(name)):
            raise ConfigError(f"{path}: {what} {name!r} cannot name a run folder: use letters, digits, '_', '.' and "
                              "'-', starting with a letter or digit")
    if not isinstance(spec.get("eval") or {}, dict):
        raise ConfigError(f"{path}: 'eval' maps {', '.join(EVAL_DEFAULTS)} to values")
    bad_eval = set(spec.get("eval") or {}) - set(EVAL_DEFAULTS)
    if bad_eval:
        raise ConfigError(f"{path}: unknown eval key(s) {sorted(bad_eval)}; allowed: {sorted(EVAL_DEFAULTS)}")
    _check_ints(path, spec)
    _check_types(path, spec)
    _check_set_by_spec(path, spec)


def _as_int(v) -> int | None:
    """``v`` read as `capo train` reads an integer setting (:func:`capo.trainer.config.coerce`, the one rule: 3, 3.0
    and "3" are 3; 2.5, true and "x" are refused), or None where train refuses it."""
    from capo.trainer.config import coerce

    try:
        return coerce("", v, int)
    except ConfigError:
        return None


def _check_ints(path: Path, spec: dict) -> None:
    """The spec's integer settings (steps, save_every, seeds, eval's and base's number of draws) accept what `capo
    train` accepts for an integer and refuse what it refuses (:func:`_as_int`); each is stored as an int, so that a
    job's command line, names and settings hash are the whole number's (`steps: 1.0` was passed on as `--run.steps
    1.0`, which train's command line refuses; a seed 1.0 kept a float would name its job `grpo-seed1.0`)."""
    if spec.get("steps") is not None:
        if (n := _as_int(spec["steps"])) is None:
            raise ConfigError(f"{path}: 'steps' must be an integer (or null: the preset's), got {spec['steps']!r}")
        spec["steps"] = n
    if "save_every" in spec:
        if (n := _as_int(spec["save_every"])) is None:
            raise ConfigError(f"{path}: 'save_every' must be an integer, got {spec['save_every']!r}")
        spec["save_every"] = n
    seeds = [_as_int(s) for s in spec["seeds"]] if isinstance(spec["seeds"], list) else []
    if not seeds or None in seeds:
        raise ConfigError(f"{path}: 'seeds' must be a non-empty list of integers, got {spec['seeds']!r}")
    spec["seeds"] = seeds
    b = spec.get("base", False)
    if not isinstance(b, bool):
        if (n := _as_int(b)) is None or n < 1:
            raise ConfigError(f"{path}: 'base' must be true, false or a number of draws >= 1, got {b!r}")
        spec["base"] = n
    for key, v in (spec.get("eval") or {}).items():  # their ranges: capo eval's own check (preflight)
        if key == "problems" and v is None:
            continue
        if (n := _as_int(v)) is None:
            raise ConfigError(f"{path}: eval.{key} must be an integer"
                              f"{' (or null: the held-out part)' if key == 'problems' else ''}, got {v!r}")
        spec["eval"][key] = n


def _check_types(path: Path, spec: dict) -> None:
    """The spec's other scalar keys and mappings have the types the runner reads them as (the integers:
    :func:`_check_ints`)."""
    if not isinstance(spec["preset"], str):
        raise ConfigError(f"{path}: 'preset' is a preset's name or a YAML file's path, got {spec['preset']!r}")
    if not isinstance(spec.get("overrides") or {}, dict):
        raise ConfigError(f"{path}: 'overrides' maps config keys (section.key) to values, got {spec['overrides']!r}")
    if not isinstance(spec.get("description") or "", str):
        raise ConfigError(f"{path}: 'description' is text")


# run settings each job gets from the spec: its seed, and the spec's `steps` / `save_every` where given
SET_BY_SPEC = {"run.seed": "seeds", "run.steps": "steps", "run.save_every": "save_every"}


def _check_set_by_spec(path: Path, spec: dict) -> None:
    """An override the runner replaces (a job's seed, the spec's steps and save cadence) is refused, never dropped:
    a method's `run.seed: 3` trained every seed's job with the seed of the list."""
    for where, ov in (("overrides", spec.get("overrides") or {}),
                      *((f"method {m!r}", o) for m, o in spec["methods"].items())):
        for key, spec_key in SET_BY_SPEC.items():
            if key in ov and (spec_key != "steps" or spec.get("steps") is not None):
                raise ConfigError(f"{path}: {where} sets {key}, which each job takes from the spec's '{spec_key}'; "
                                  f"set it there")


def jobs(spec: dict, runs_root: Path, records_root: Path) -> list[Job]:
    """Every (method, seed) job of the spec, seeds outermost so that a partial sweep has whole seeds; first, with
    `base: true` or `base: N`, the base jobs: the preset's initial model under the same held-out evaluation, drawn N
    times (1 for true) with evaluation seeds eval.seed + 0, 1, ...: the start that "change from the start" is measured
    against, estimated like any other sampled evaluation."""
    ev = {**EVAL_DEFAULTS, **(spec.get("eval") or {})}

    def job(method: str, seed: int | None, ov: dict, evs: dict = ev, draw: int = 0, **extra) -> Job:
        settings = {"preset": spec["preset"], "overrides": ov, "eval": evs, **extra}
        h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        j = Job(spec["name"], method, seed, spec["preset"], ov, evs, Path(), Path(), h, draw)
        return dataclasses.replace(j, run_dir=Path(runs_root) / spec["name"] / j.name,
                                   record=Path(records_root) / spec["name"] / f"{j.name}.json")

    n_base = int(spec.get("base") or 0)  # true -> 1
    out = [job(BASE, None, dict(spec.get("overrides") or {}), {**ev, "seed": ev["seed"] + d}, d, base=True)
           for d in range(n_base)]
    for seed in spec["seeds"]:
        for method, m_over in spec["methods"].items():
            ov = {**(spec.get("overrides") or {}), **m_over, "run.seed": seed}
            if spec.get("steps") is not None:  # `steps: 0` is checked as run.steps, not the preset's silently
                ov["run.steps"] = spec["steps"]
            ov["run.save_every"] = spec.get("save_every", 10)
            out.append(job(method, seed, ov))
    return out


def same_settings(stored: dict, job: Job) -> bool:
    """Whether a record (or a run folder's settings mark) belongs to ``job``: the same settings hash, or the same
    settings once the bookkeeping overrides are left out (the hash covers them too; it is kept as it was so
    that committed records keep theirs). Which overrides are bookkeeping is read from the stored run's resolved
    config (:func:`capo.trainer.config.bookkeeping`: micro-batches count for a batch-dependent loss)."""
    from capo.trainer.config import bookkeeping

    if stored.get("settings_hash") == job.settings_hash:
        return True
    if not isinstance(stored.get("settings"), dict):
        return False
    free = bookkeeping(stored.get("config") if isinstance(stored.get("config"), dict) else None)
    return _outside(stored["settings"], free) == _outside(job.settings, free)


def _outside(settings: dict, free: tuple[str, ...]) -> dict:
    s = json.loads(json.dumps(settings))  # as a record stores it: tuples as lists
    s["overrides"] = {k: v for k, v in (s.get("overrides") or {}).items() if k not in free}
    return s


def state(job: Job) -> str:
    """'done' (a record with this job's settings, :func:`same_settings`), 'stale' (a record from other settings: the
    spec was edited), 'corrupt' (a file that is no record: torn, a merge's conflict markers) or 'todo' (none)."""
    return record_state(job)[0]


def record_state(job: Job) -> tuple[str, str]:
    """:func:`state` and, for a corrupt record, why."""
    if not job.record.exists():
        return "todo", ""
    try:
        rec = json.loads(job.record.read_text())
    except OSError as e:
        return "corrupt", f"unreadable: {e.strerror or e}"
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return "corrupt", f"not valid JSON: {e}"
    if not isinstance(rec, dict) or "settings_hash" not in rec:
        return "corrupt", "no settings_hash"
    return ("done" if same_settings(rec, job) else "stale"), ""
