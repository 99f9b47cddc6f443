"""Run-directory helpers shared by ``capo train``, ``capo eval`` and ``capo demo``: an exclusive lock that names
the command holding the folder, atomic writes, JSONL reading that survives a torn last line, fast JSON lines (the
standard library's values, read and written by orjson where it gives the same), the progress bar, and a training
run's checkpoint folders (:func:`list_checkpoints`) and the settings of one that change no result
(:data:`BOOKKEEPING`).

A leaf utility like :mod:`capo.errors`: any layer may import it; it imports nothing of capo but the errors.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import re
import sys
import time
from pathlib import Path

try:
    import orjson
except ImportError:  # an environment that installed capo without its dependencies (the verl one): the same values
    orjson = None

from capo.errors import ConfigError, DataError

__all__ = ["Progress", "atomic_write_text", "json_line", "json_loads", "list_checkpoints", "read_jsonl",
           "read_jsonl_rows", "run_lock", "yaml_dumps", "yaml_loads"]

_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19  # 19 digits in a row, after _DIGITS_TO_ZERO

# A training run's knobs that change neither the method nor the sampling distribution, so no result: where a run
# writes, how often it saves, threads, the KV-cache layout and decoding loop, gradient-accumulation micro-batches, the
# extra step-0 evaluation (which leaves the training untouched: tests/trainer). A resumed run may change them
# (:func:`capo.trainer.config.resume_changes`); a sweep's record or run folder whose settings differ from a job's only
# in these is the job's (:func:`capo.sweep.spec.same_settings`). Micro-batches are bookkeeping except for a
# batch-dependent loss (:func:`capo.trainer.config.bookkeeping`).
MICRO_BATCH = "optim.micro_batch_size"
BOOKKEEPING = ("run.out_dir", "run.save_every", "run.keep_checkpoints", "run.resume", "run.progress", "run.threads",
               "run.eval_at_start", "rollout.kv_cache", "rollout.decode", MICRO_BATCH)


def _long_digit_run(text: str | bytes) -> bool:
    """Whether ``text`` has 19 digits in a row: possibly an integer beyond 64 bits, which orjson reads as a float and
    the standard library as an int (repr'd floats never have more than 17). A C translate and search: ~10x faster
    than the regular expression on number-heavy lines."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    return _LONG_RUN in raw.translate(_DIGITS_TO_ZERO)


def json_loads(text: str | bytes):
    """``json.loads(text)``, the same value (and the same error), ~2x faster on a generations file's lines.

    orjson reads a line unless it may read it differently: it refuses what only the standard library accepts (NaN /
    Infinity literals, lone surrogates, numbers beyond the float range: such a line goes to ``json.loads``) and reads
    integers beyond 64 bits as floats (a line with 19 digits in a row goes to ``json.loads``). Floats are correctly
    rounded by both (``tests/test_json_lines.py``)."""
    if orjson is not None and not _long_digit_run(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _all_finite(v) -> bool:
    """No NaN or infinite float anywhere in ``v`` (dicts, lists and tuples searched). A list of numbers is summed in
    one C loop: any NaN or infinity makes the sum non-finite (so does an overflow, which only sends the row the slow
    way)."""
    if isinstance(v, float):
        return math.isfinite(v)
    if not isinstance(v, (dict, list, tuple)):
        return True
    items = list(v.values()) if isinstance(v, dict) else v
    try:
        return math.isfinite(sum(items, 0.0))
    except (TypeError, OverflowError):  # not all numbers, or an integer beyond the float range
        return all(_all_finite(x) for x in items if isinstance(x, (float, dict, list, tuple)))


def json_line(row) -> str:
    """One JSONL line of ``row``: its values are those of ``json.dumps(row, ensure_ascii=False)`` (the text is
    compact, floats in their shortest form), ~7x faster for rows of per-token lists. orjson writes NaN and infinities
    as null and refuses what it cannot write exactly (integers beyond 64 bits, non-string keys, lone surrogates,
    types it does not know): such a row is written by the standard library (NaN / Infinity literals, as before)."""
    if orjson is not None and _all_finite(row):
        try:
            return orjson.dumps(row).decode() + "\n"
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(row, ensure_ascii=False) + "\n"


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same folder + fsync + os.replace: readers see the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list:
    """Every row of a complete JSON-lines file, split at newlines only: a JSON string may hold U+2028, U+2029, U+0085
    and other characters that ``str.splitlines()`` takes for line ends (SmolLM2 wrote U+2028 inside a facts answer).
    A line that is not valid JSON raises :class:`DataError` naming the file and the line: a file that should be whole
    is never read short. (:func:`read_jsonl_rows` reads an append-only file that a crash may have torn.)"""
    rows = []
    for i, line in enumerate(Path(path).read_bytes().split(b"\n"), 1):
        if line.strip():
            try:
                rows.append(json_loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {i}: not a JSON line ({e})") from None
    return rows


def read_jsonl_rows(path: Path, repair: bool = False) -> list:
    """The rows of an append-only JSONL file, up to a torn last line (what a crash mid-write leaves: no newline, or
    not JSON). With ``repair`` the file is truncated to its last complete row so appending continues cleanly. A
    missing file has no rows. A line that is not JSON with rows after it is no torn write but a damaged file: it
    raises :class:`DataError` naming the file and the line, rather than reading (or repairing) the file short."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    rows, good_end, pos = [], 0, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl == -1:
            break  # torn tail without newline
        line = data[pos:nl]
        if line.strip():
            try:
                rows.append(json_loads(line))
            except json.JSONDecodeError as e:
                if data[nl + 1:].strip():
                    lineno = data.count(b"\n", 0, pos) + 1
                    raise DataError(f"{path}, line {lineno}: not a JSON line ({e}), and "
                                    "rows follow it: the file is damaged, not torn by a crash; mend or remove "
                                    "that line") from None
                break
        pos = nl + 1
        good_end = pos
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return rows


# what each command writes at the top of its folder: another command's folder is never written into
FOLDER_FILES = {"training run": ("config.yaml", "metrics.jsonl", "checkpoints"),
                "evaluation": ("generations.jsonl", "metrics.json"),
                "model": ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "tokenizer.json",
                          "tokenizer_config.json")}


def check_out_folder(folder: Path, *, kind: str, flag: str) -> None:
    """Raise :class:`ConfigError` when ``folder`` (a command's output folder, given as ``flag``) is a file, or holds
    another kind of folder than ``kind`` (see :data:`FOLDER_FILES`): ``capo eval --out`` a training run's folder
    mixed an evaluation's files with the run's, ``--out`` a model's folder replaced its config.json, and
    ``capo train`` into an evaluation's folder wrote checkpoints beside its generations."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag} {folder} is a file, not a folder")
    for other, names in FOLDER_FILES.items():
        held = [n for n in names if (folder / n).exists()]
        if other != kind and held:
            raise ConfigError(f"{flag} {folder} holds {_a(other)}'s files ({', '.join(held)}): {_a(kind)} goes in "
                              f"a folder of its own; choose another {flag}")


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


@contextlib.contextmanager
def run_lock(out_dir: Path, command: str, settings: tuple[str, ...] = ()):
    """Exclusive lock on DIR/.lock for the duration of ``capo <command>`` (train, eval, demo), so that two runs
    never write to the same folder; the refusal names the command that holds it. A folder the lock made that holds
    nothing else when it ends (a command refused before writing) is removed, as is one that holds only the command's
    ``settings`` files and empty files when it ends in an error (refused before its first result, e.g. a model that
    would not load): a refusal leaves no skeleton run folder."""
    out_dir = Path(out_dir)
    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]  # the folders this lock makes, deepest first
    out_dir.mkdir(parents=True, exist_ok=True)
    f = open(out_dir / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "capo run"
        f.close()
        raise ConfigError(f"{out_dir}: another {holder} is writing to this directory; wait for it to finish or "
                          "choose another output folder") from None
    failed = True
    try:
        f.seek(0)
        f.truncate()
        f.write(f"capo {command} (pid {os.getpid()})\n")
        f.flush()
        yield
        failed = False
    finally:
        if made:  # removed while still locked
            _remove_skeleton(made, (".lock", *settings) if failed else (".lock",), empty_too=failed)
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def _remove_skeleton(made: list[Path], names: tuple[str, ...], empty_too: bool) -> None:
    """Remove the folder ``made[0]`` when it holds only files in ``names`` (and empty files, with ``empty_too``),
    then the parents it was made in (``made[1:]``) that it leaves empty."""
    with contextlib.suppress(OSError):
        entries = list(made[0].iterdir())
        if all(p.name in names or (empty_too and p.is_file() and p.stat().st_size == 0) for p in entries):
            for p in entries:
                p.unlink()
            for d in made:
                d.rmdir()  # OSError (not empty: another run's) ends the removal


class Progress:
    """Progress of ``total`` units: a rich bar (rate, elapsed, ETA, a free ``info`` text) on a terminal, otherwise
    plain lines on stderr (logs, nohup), at most one every ``every_s`` seconds plus the last."""

    def __init__(self, total: int, done: int = 0, *, label: str, unit: str, enabled: bool = True,
                 every_s: float = 0.0):
        self.total, self.done, self.label, self.unit, self.enabled = total, done, label, unit, enabled
        self.every_s, self.t0, self.start_done, self.last_print = every_s, time.perf_counter(), done, -math.inf
        self.rich = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)
            from rich.progress import Progress as RichProgress

            self.rich = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                     TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                     console=Console(stderr=True))
            self.task = self.rich.add_task(label, total=total, completed=done, rate="", info="")

    def __enter__(self):
        if self.rich:
            self.rich.__enter__()
        return self

    def __exit__(self, *exc):
        if self.rich:
            self.rich.__exit__(*exc)

    def update(self, done: int, info: str = "") -> None:
        """Set the number of units done (and the info text)."""
        if not self.enabled:
            return
        self.done = done
        el = time.perf_counter() - self.t0
        rate = (self.done - self.start_done) / el if el > 0 else 0.0
        if self.rich:
            self.rich.update(self.task, completed=self.done, rate=f"{rate:.2f} {self.unit}/s", info=info)
            return
        if el - self.last_print < self.every_s and self.done < self.total:
            return
        self.last_print = el
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta_s = "?" if math.isnan(eta) else f"{eta / 60:.1f} min"
        print(f"[{self.label}] {self.done}/{self.total} {self.unit}, {rate:.2f} {self.unit}/s, elapsed "
              f"{el / 60:.1f} min, ETA {eta_s}" + (f"  {info}" if info else ""), file=sys.stderr, flush=True)

    def advance(self, n: int, info: str = "") -> None:
        self.update(self.done + n, info)


_EXPONENT_FLOAT = r"^[-+]?(?:[0-9][0-9_]*)?\.?[0-9][0-9_]*[eE][-+]?[0-9]+$"  # 5e-4, 1E5, 1.0e5, .5e3


def yaml_loads(text: str):
    """YAML as capo reads it (configs, presets, sweep specs, run folders): PyYAML's safe loader with YAML 1.2's
    numbers and booleans. PyYAML follows YAML 1.1, which reads ``5e-4``, ``1e5`` and ``1.0e5`` as strings (its floats
    need a dot and a signed exponent) and ``off``, ``no``, ``on``, ``yes`` as booleans: ``lr: 5e-4`` inside a
    ``*_kwargs`` mapping reached the method as the string '5e-4', and ``noise_mask: off`` as False. Here a number in
    exponent form is a float and only true/false are booleans (a boolean knob still takes yes/no/on/off: the
    config's coercion reads those strings). Raises ``yaml.YAMLError``."""
    import yaml

    return yaml.load(text, Loader=_yaml_classes()[0])


@functools.cache
def _yaml_classes() -> tuple[type, type]:
    """(Loader, Dumper): PyYAML's safe ones with exponent-form numbers as floats; the Loader also takes only
    true/false as booleans, the Dumper keeps quoting what YAML 1.1 reads as one (see :func:`yaml_loads`)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):  # a key given twice is refused, not "the last one wins"
            if isinstance(node, yaml.MappingNode):  # a merged key (<<) may be overridden: only own keys count
                seen = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:
                        continue  # an unhashable key: SafeLoader's own error follows
                    if first is not key_node:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"found the key {key!r} twice (on line {first.start_mark.line + 1} and again on line "
                            f"{key_node.start_mark.line + 1}): say it once", key_node.start_mark)
            return super().construct_mapping(node, deep)

    class Dumper(yaml.SafeDumper):
        pass

    bool_tag, float_tag = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
    Loader.yaml_implicit_resolvers = {c: [r for r in rs if r[0] != bool_tag]
                                      for c, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    for cls in (Loader, Dumper):
        cls.add_implicit_resolver(float_tag, re.compile(_EXPONENT_FLOAT), list("-+.0123456789"))
    return Loader, Dumper


def yaml_dumps(obj, **kw) -> str:
    """``yaml.safe_dump`` whose output both :func:`yaml_loads` and plain PyYAML read back as written: a string that
    looks like a number in exponent form (``'5e-4'``) is quoted, as are those YAML 1.1 reads as booleans."""
    import yaml

    return yaml.dump(obj, Dumper=_yaml_classes()[1], **kw)


_STEP_DIR = re.compile(r"^step-(\d{6,})$")  # RUN/checkpoints/step-000010 (a ".tmp" one is still being written)


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """A training run's complete checkpoint folders, ``(step, path)`` in step order; [] when it has none. The
    trainer resumes from the last (:mod:`capo.trainer.checkpoint`); ``capo eval`` names it when given the run folder
    instead of a model."""
    d = Path(run_dir) / "checkpoints"
    if not d.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(out)
