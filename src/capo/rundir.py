"""Run-directory helpers shared by ``capo train``, ``capo eval`` and ``capo demo``: an exclusive lock that names
the command holding the folder, atomic writes, JSONL reading that survives a torn last line, and the progress bar.

A leaf utility like :mod:`capo.errors`: any layer may import it; it imports nothing of capo but the errors.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import sys
import time
from pathlib import Path

from capo.errors import ConfigError

__all__ = ["Progress", "atomic_write_text", "read_jsonl_rows", "run_lock"]


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same folder + fsync + os.replace: readers see the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl_rows(path: Path, repair: bool = False) -> list:
    """The rows of an append-only JSONL file, up to the first torn line (no newline, or invalid JSON: what a crash
    mid-write leaves). With ``repair`` the file is truncated to its last complete row so appending continues
    cleanly. A missing file has no rows."""
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
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
        pos = nl + 1
        good_end = pos
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return rows


@contextlib.contextmanager
def run_lock(out_dir: Path, command: str):
    """Exclusive lock on DIR/.lock for the duration of ``capo <command>`` (train, eval, demo), so that two runs
    never write to the same folder; the refusal names the command that holds it."""
    out_dir = Path(out_dir)
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
    try:
        f.seek(0)
        f.truncate()
        f.write(f"capo {command} (pid {os.getpid()})\n")
        f.flush()
        yield
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


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
