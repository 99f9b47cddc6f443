"""The parent side of the verifier's workers: fresh interpreters running ``capo.verify._worker.main`` (:data:`LAUNCH`).

Why not ``multiprocessing``: its ``spawn`` and ``forkserver`` children re-import the parent's main script. In a
user's training script that means torch (and CUDA) in every worker -- 3.8 GB of address space on a GPU machine
before math-verify loads, against the worker's memory bound -- and, without an ``if __name__ == '__main__':``
guard, the whole script running again inside the worker. Here a worker is a new interpreter that imports only
capo's worker module (JSON lines over pipes; protocol in ``_worker``), so nothing of the parent's enters it.
The parent waits on the pipes with ``select``: POSIX systems only (Linux, macOS; on Windows, use WSL).

Failures, each with its own rule:

* a worker past the hard per-item timeout is killed and replaced; the item's verdict is the batch's
  ``on_timeout`` value (a timeout is a verdict, not an error);
* a worker that dies while judging an item (killed from outside, a crash) is replaced and the item is retried in
  the new worker, up to ``max_retries`` times; an item that kills a worker on every try gets ``on_timeout`` too
  (the input itself breaks the sandbox's bounds), and the workers' own exit status and stderr are kept in
  :attr:`Pool.failures`;
* a worker that cannot start (it reports its exception, dies, or is not ready within ``startup_timeout_s``) is
  replaced; after ``max_start_failures`` failed starts in a row the pool raises :class:`WorkerError` carrying the
  last worker's own exception and traceback tail;
* a task that raises inside a healthy worker is a bug in capo: :class:`WorkerError` with its traceback.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import capo

TAIL_CHARS = 2000  # how much of a failed worker's stderr an error message carries


class WorkerError(RuntimeError):
    """A verifier worker could not start, or a task failed inside one; the message carries the worker's own
    exception and the tail of its traceback / stderr."""


LAUNCH = "import sys; from capo.verify._worker import main; sys.exit(main())"  # a worker's program (argv[1]: headroom)


def _command(memory_headroom_mb: int | None) -> tuple[list[str], dict]:
    """The worker's command line and environment: this interpreter, ``-P`` (no script or working directory on the
    path, Python >= 3.11), and the folder holding the parent's ``capo`` first on PYTHONPATH so the worker runs the
    same capo as the parent, installed or not."""
    flags = ["-P"] if sys.version_info >= (3, 11) else []
    root = str(Path(capo.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    headroom = "none" if not memory_headroom_mb else str(int(memory_headroom_mb))
    # `-m capo.verify._worker` would run the module a second time as __main__ after the package's own import of it
    # (runpy's RuntimeWarning, in every worker's stderr and so in every error report): call its main() instead
    return [sys.executable, *flags, "-c", LAUNCH, headroom], env


class _Worker:
    """One worker interpreter: its process, its reply buffer and what it is doing (starting, idle or busy)."""

    def __init__(self, memory_headroom_mb: int | None):
        cmd, env = _command(memory_headroom_mb)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env,
                                     close_fds=True)
        self.t_start = time.monotonic()
        self.ready = False
        self.item: int | None = None  # index of the task in flight
        self.t_item = 0.0  # when it was sent
        self._buf = b""

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, fn_name: str, args: tuple) -> None:
        """Send one request; raises OSError (BrokenPipeError) when the worker is gone."""
        self.proc.stdin.write((json.dumps({"fn": fn_name, "args": list(args)}) + "\n").encode())
        self.proc.stdin.flush()

    def replies(self) -> list[dict] | None:
        """The complete reply lines available now (call when readable); None once the worker has died."""
        chunk = os.read(self.fileno(), 1 << 16)
        if not chunk:
            return None
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return [json.loads(ln) for ln in lines if ln.strip()]

    def failure(self, what: str, reply: dict | None = None) -> str:
        """A report of why this worker failed: ``what``, its own exception and traceback, or its exit status and
        the tail of its stderr."""
        if reply is not None and "error" in reply:
            return f"{what}: {reply['error']}\n{reply.get('traceback', '')[-TAIL_CHARS:]}"
        if self.proc.poll() is None:  # alive but useless (not ready in time): stop it before reading its stderr
            self.proc.kill()
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            code = None
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace")[-TAIL_CHARS:]
        return f"{what} (exit status {code}); its stderr ends with:\n{tail or '(nothing)'}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                f.close()
            except OSError:
                pass


@dataclass
class _Batch:
    """State of one :meth:`Pool.run` call."""

    tasks: list[tuple]
    on_timeout: str
    results: list = field(default_factory=list)
    pending: deque = field(default_factory=deque)
    tries: list = field(default_factory=list)  # worker deaths so far per task
    elapsed: list = field(default_factory=list)

    def __post_init__(self):
        n = len(self.tasks)
        self.results, self.pending, self.tries, self.elapsed = [None] * n, deque(range(n)), [0] * n, [0.0] * n


class Pool:
    """``workers`` worker interpreters, started lazily and kept warm between calls; one item in flight each, so
    every item's wall time from dispatch is known exactly and bounded by ``timeout_s``. Not thread-safe: the
    :class:`~capo.verify.Verifier` serialises calls."""

    def __init__(self, workers: int, timeout_s: float, memory_headroom_mb: int | None, startup_timeout_s: float,
                 max_retries: int = 2, max_start_failures: int = 3):
        self.n, self.timeout_s, self.startup_timeout_s = workers, timeout_s, startup_timeout_s
        self.memory_headroom_mb = memory_headroom_mb
        self.max_retries, self.max_start_failures = max_retries, max_start_failures
        self.workers: list[_Worker] = []
        self.n_started = 0  # worker processes started, replacements included
        self.n_killed = 0  # workers killed after a hard timeout or found dead
        self.failures: list[str] = []  # reports of workers that died while judging an item
        self._start_failures = 0  # failed starts in a row

    def close(self) -> None:
        for w in self.workers:
            w.kill()
        self.workers = []

    def run(self, tasks: list[tuple], on_timeout: str) -> tuple[list[str], list[float]]:
        """Run ``(fn, *args)`` tasks (``fn`` one of ``_worker.TASKS``); returns each task's result string and its
        wall time from dispatch to a warm worker until its result (or its worker's kill)."""
        b = _Batch(tasks, on_timeout)
        self._fill()
        try:
            while b.pending or any(w.item is not None for w in self.workers):
                self._dispatch(b)
                self._collect(b, self._wait())
                self._enforce_deadlines(b)
        except BaseException:  # an error, or Ctrl-C: no worker may carry this batch's item into the next call
            for w in [w for w in self.workers if w.item is not None or not w.ready]:
                w.kill()
                self.workers.remove(w)
            raise
        return b.results, b.elapsed

    # ------------------------------------------------------------------ workers
    def _start(self) -> _Worker:
        self.n_started += 1
        return _Worker(self.memory_headroom_mb)

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self.workers[self.workers.index(w)] = self._start()

    def _fill(self) -> None:
        """Start missing workers; replace warm ones that died since the last call (killed from outside)."""
        for w in list(self.workers):
            if w.ready and w.item is None and w.proc.poll() is not None:
                self.failures.append(w.failure("a verifier worker died while idle"))
                self.n_killed += 1
                self._replace(w)
        while len(self.workers) < self.n:
            self.workers.append(self._start())

    def _start_failed(self, w: _Worker, report: str) -> None:
        """Replace a worker that could not start; raise with its own report after too many failures in a row."""
        self._start_failures += 1
        if self._start_failures >= self.max_start_failures:
            self._start_failures = 0
            w.kill()
            self.workers.remove(w)
            raise WorkerError(f"{report}\n({self.max_start_failures} verifier worker starts failed in a row)")
        self._replace(w)

    # ------------------------------------------------------------------ one batch
    def _dispatch(self, b: _Batch) -> None:
        """Give pending tasks to idle warm workers; a worker found gone is replaced and its task requeued."""
        for w in list(self.workers):
            if not b.pending:
                return
            if not w.ready or w.item is not None:
                continue
            i = b.pending.popleft()
            fn, *args = b.tasks[i]
            try:
                w.send(fn.__name__, args)
            except OSError:
                b.pending.appendleft(i)
                self.failures.append(w.failure("a verifier worker was gone when given a task"))
                self.n_killed += 1
                self._replace(w)
                continue
            w.item, w.t_item = i, time.monotonic()

    def _deadline(self, w: _Worker) -> float:
        return w.t_item + self.timeout_s if w.item is not None else w.t_start + self.startup_timeout_s

    def _wait(self) -> list[_Worker]:
        """The starting or busy workers that have something to read, waiting at most until the nearest deadline."""
        watched = [w for w in self.workers if not w.ready or w.item is not None]
        if not watched:
            return []
        timeout = max(0.0, min(self._deadline(w) for w in watched) - time.monotonic())
        return select.select(watched, [], [], timeout)[0]

    def _collect(self, b: _Batch, readable: list[_Worker]) -> None:
        for w in readable:
            replies = w.replies()
            if replies is None:
                self._died(b, w)
                continue
            for msg in replies:
                self._handle(b, w, msg)

    def _handle(self, b: _Batch, w: _Worker, msg: dict) -> None:
        """A worker's reply: its readiness (or why it cannot start), or the result of its item."""
        if not w.ready:
            if msg.get("ready"):
                w.ready, self._start_failures = True, 0
            else:
                self._start_failed(w, w.failure("a verifier worker could not start", msg))
            return
        i = w.item
        if "error" in msg:
            raise WorkerError(w.failure(f"verifier task {b.tasks[i][0].__name__} failed", msg))
        b.results[i], b.elapsed[i], w.item = msg["result"], time.monotonic() - w.t_item, None

    def _died(self, b: _Batch, w: _Worker) -> None:
        """A worker's output ended: a failed start, or a death mid-item (retried in a new worker, bounded)."""
        if not w.ready:
            self._start_failed(w, w.failure("a verifier worker died while starting"))
            return
        i = w.item
        self.failures.append(w.failure(f"a verifier worker died while judging {b.tasks[i][0].__name__}"))
        self.n_killed += 1
        self._replace(w)
        b.tries[i] += 1
        if b.tries[i] > self.max_retries:
            b.results[i] = b.on_timeout
        else:
            b.pending.appendleft(i)

    def _enforce_deadlines(self, b: _Batch) -> None:
        """Items past the hard timeout get ``on_timeout`` and their workers are killed and replaced; a worker not
        ready within ``startup_timeout_s`` is a failed start."""
        now = time.monotonic()
        for w in list(self.workers):
            if w.item is not None and now - w.t_item >= self.timeout_s:
                b.results[w.item], b.elapsed[w.item] = b.on_timeout, now - w.t_item
                self.n_killed += 1
                self._replace(w)
            elif not w.ready and now - w.t_start > self.startup_timeout_s:
                self._start_failed(w, w.failure(f"a verifier worker was not ready within {self.startup_timeout_s:g} s"))
