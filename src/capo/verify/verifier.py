"""Mathematical-equivalence verification with math-verify in sandboxed worker processes.

Design (why not just call ``math_verify.verify``): math-verify's own timeout uses ``signal.alarm``, which works
only in the main thread and cannot interrupt C code (sympy computing ``9**9**9**9`` as an exact integer never
returns to the interpreter). Here every judgement runs in a worker process:

* ``workers`` worker processes, each a fresh interpreter running ``capo.verify._worker.main`` (see
  ``capo.verify._pool``): a worker never imports the caller's script, torch or CUDA, so its memory bound is
  relative to its own small baseline and a user script needs no ``__main__`` guard. One item is in flight per
  worker, so the wall-clock time of each item is known exactly.
* Inside the worker a soft ``setitimer`` alarm stops Python-level work at ``timeout_s - grace``; if the worker is
  stuck in C code the parent kills the process at ``timeout_s`` and starts a fresh one. Either way the verdict is
  ``TIMEOUT``. A worker that dies mid-item (a crash, killed from outside) is replaced and the item retried
  (``max_retries``); one that kills a worker on every try is ``TIMEOUT`` too. A worker that cannot start is
  replaced, and after three failed starts in a row the call raises :class:`WorkerError` with the worker's own
  exception and traceback. Both time limits are wall-clock, so a judgement near the limit can time out on a loaded
  machine and not on an idle one:
  the one way the machine's load can change a verdict. The trainer counts TIMEOUT verdicts per step
  (``train/verify_timeouts``) so a run where it happened is visible (docs/papers.md, "Determinism").
* The parent waits on its workers' pipes with a timeout, so the hard limit holds when called from any thread.
  Calls on one Verifier are serialised by a lock.
* Model text is never evaluated: answers longer than ``max_answer_chars`` or that look like code are judged
  ``UNPARSABLE`` before reaching a worker, and the worker guards sympy's string-to-code path (see ``_worker``).
"""

from __future__ import annotations

import enum
import os
import re
import threading
from collections.abc import Sequence

from capo.errors import is_int
from capo.verify import _worker
from capo.verify._pool import Pool, WorkerError

__all__ = ["Verdict", "Verifier", "WorkerError", "looks_like_code"]


# An integer literal (sign, up to 30 digits): two of them are equivalent iff they are equal as integers, which is
# what math-verify decides too; judging them here skips a worker round trip (the embedded task's answers).
_INT = re.compile(r"[+-]?\d{1,30}")


class Verdict(str, enum.Enum):
    """Outcome of judging one answer. ``str`` valued so it serialises to JSON as its name."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    UNPARSABLE = "unparsable"  # no answer extracted, or math-verify could not parse it, or it was refused
    TIMEOUT = "timeout"  # exceeded the time (or memory) bound

    def __str__(self) -> str:  # json.dumps uses the str value anyway; f-strings print the value too
        return self.value


# Python/shell-looking content never reaches a worker. LaTeX needs none of these tokens (``\lambda`` is LaTeX, so a
# backslash before "lambda" is allowed; "$(" is refused only as a shell command with arguments, since "$(3, 4)$" is a
# tuple in LaTeX math).
_CODE_PATTERNS = re.compile(
    r"__|\bimport\b|(?<!\\)\blambda\b|\bexec\b|\beval\b|\bcompile\b|\bgetattr\b|\bsetattr\b|\bglobals\b|\blocals\b"
    r"|\bsubprocess\b|\bos\s*\.\s*[a-z]|\bsys\s*\.\s*[a-z]|\bsystem\s*\(|\bpopen\s*\(|\bopen\s*\(|\bbuiltins\b"
    r"|[A-Za-z_)\]]\s*\.\s*[A-Za-z_]\w*\s*\(|`|\$\(\s*[A-Za-z_][\w.-]*\s+[-\w./]|;\s*(?:rm|touch|curl|wget|sh|bash)\b|\|\s*(?:sh|bash)\b",
    re.IGNORECASE,
)


def looks_like_code(answer: str) -> bool:
    """True when ``answer`` contains Python/shell constructs (dunder names, ``import``, ``os.``, method calls,
    backticks, ``$(``, ...). Such answers are refused (``UNPARSABLE``) without being parsed."""
    return bool(_CODE_PATTERNS.search(answer))


def _find(p: list[int], x: int) -> int:
    """Root of ``x`` in the union-find parent list ``p`` (with path halving)."""
    while p[x] != x:
        p[x] = p[p[x]]
        x = p[x]
    return x


def _union(p: list[int], a: int, b: int) -> None:
    """Merge the classes of ``a`` and ``b``; the root of a class is always its smallest member."""
    ra, rb = _find(p, a), _find(p, b)
    if ra != rb:
        p[max(ra, rb)] = min(ra, rb)


class Verifier:
    """Judge extracted answers against gold answers by mathematical equivalence (math-verify), sandboxed.

    Args:
        workers: number of worker processes (default: ``min(4, os.cpu_count())``).
        timeout_s: hard wall-clock limit per judgement, measured from dispatch to a warm worker.
        max_answer_chars: longer extracted answers are ``UNPARSABLE`` without parsing.
        memory_limit_mb: address space each worker may add above its own baseline (a bare interpreter, measured
            when it starts, before math-verify loads); ``None``: no limit. It stops a runaway sympy computation
            (an enormous exact integer), which then gives ``TIMEOUT``.
        float_rounding: decimal places math-verify rounds floats to before comparing.
        startup_timeout_s: how long a new worker may take to import sympy/math-verify and warm up.
        exact_match_shortcut: judge identical strings ``CORRECT``, and two integer literals by integer equality,
            without parsing (saves a worker round trip;
            turn off to make every judgement go through math-verify, as the MATH-500 self-check does).
        max_retries: how many times an item whose worker died is retried in a fresh worker.

    Use as a context manager, or call :meth:`close`. Workers start lazily on first use.
    """

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = 5.0,
        max_answer_chars: int = 1000,
        memory_limit_mb: int | None = 4096,
        float_rounding: int = 6,
        startup_timeout_s: float = 120.0,
        exact_match_shortcut: bool = True,
        max_retries: int = 2,
    ):
        if workers is None:
            workers = max(1, min(4, os.cpu_count() or 1))
        if not is_int(workers) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if not (timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if not is_int(max_retries) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.grace_s = min(1.0, 0.25 * self.timeout_s)
        self.max_answer_chars = int(max_answer_chars)
        self.memory_limit_mb = memory_limit_mb
        self.float_rounding = int(float_rounding)
        self.startup_timeout_s = float(startup_timeout_s)
        self.exact_match_shortcut = bool(exact_match_shortcut)
        self._pool = Pool(workers, self.timeout_s, memory_limit_mb, self.startup_timeout_s, max_retries=max_retries)
        self._lock = threading.RLock()
        self.last_elapsed: list[float] = []

    @property
    def n_killed(self) -> int:
        """Workers killed after a hard timeout, or found dead, so far (for tests and logs)."""
        return self._pool.n_killed

    @property
    def worker_failures(self) -> list[str]:
        """Reports (exit status, stderr tail) of the workers that died while judging an item."""
        return self._pool.failures

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        """Stop all workers."""
        with self._lock:
            self._pool.close()

    def _run_tasks(self, tasks: list[tuple], on_timeout: str) -> list[str]:
        """Run ``(fn, *args)`` tasks (``fn`` one of ``_worker.TASKS``), one per worker at a time, each under the
        hard timeout. Returns result strings.

        ``self.last_elapsed[i]`` is the wall time of task i from dispatch to a warm worker until its result (or its
        kill), the quantity the hard timeout bounds.
        """
        with self._lock:
            results, self.last_elapsed = self._pool.run(tasks, on_timeout) if tasks else ([], [])
        return results

    def _refused(self, answer: str | None) -> bool:
        return answer is None or not answer.strip() or len(answer) > self.max_answer_chars or looks_like_code(answer)

    # ------------------------------------------------------------------ public API
    def verify(self, pred: str | None, gold: str) -> Verdict:
        """Judge one extracted answer ``pred`` against ``gold``."""
        return self.verify_batch([pred], [gold])[0]

    def verify_batch(self, preds: Sequence[str | None], golds: Sequence[str]) -> list[Verdict]:
        """Judge ``preds[i]`` against ``golds[i]`` for every i; one :class:`Verdict` per input, in order.

        ``preds`` are extracted answers (see :func:`capo.verify.extract_answer`); ``None`` is ``UNPARSABLE``.
        A gold answer that math-verify cannot parse makes the item ``UNPARSABLE`` as well (check your data with
        :meth:`gold_parses`).
        """
        if len(preds) != len(golds):
            raise ValueError(f"preds has {len(preds)} items but golds has {len(golds)}; they must match")
        out: list[Verdict | None] = [None] * len(preds)
        tasks, where = [], []
        soft = self.timeout_s - self.grace_s
        for i, (p, g) in enumerate(zip(preds, golds)):
            if self._refused(p) or g is None or len(g) > self.max_answer_chars:
                out[i] = Verdict.UNPARSABLE
                continue
            p, g = p.strip(), str(g).strip()
            if self.exact_match_shortcut and p == g:  # identical strings are equivalent without parsing (math-verify agrees; saves a round trip)
                out[i] = Verdict.CORRECT
                continue
            if self.exact_match_shortcut and _INT.fullmatch(p) and _INT.fullmatch(g):  # two integer literals
                out[i] = Verdict.CORRECT if int(p) == int(g) else Verdict.INCORRECT
                continue
            tasks.append((_worker.verify_task, p, g, soft, self.float_rounding))
            where.append(i)
        for i, r in zip(where, self._run_tasks(tasks, on_timeout="timeout")):
            out[i] = Verdict.UNPARSABLE if r == "gold_unparsable" else Verdict(r)
        return out  # type: ignore[return-value]

    def gold_parses(self, golds: Sequence[str]) -> list[bool]:
        """Whether math-verify can parse each gold answer (a data check)."""
        soft = self.timeout_s - self.grace_s
        res = self._run_tasks([(_worker.parse_ok_task, str(g).strip(), soft) for g in golds], on_timeout="timeout")
        return [r == "ok" for r in res]

    def equivalence_classes(self, answers: Sequence[str | None]) -> list[int]:
        """Group one question's answers by mathematical equivalence.

        Returns one class id per answer: ``0, 1, 2, ...`` numbered by first occurrence; ``-1`` for an answer that
        is missing, refused or unparsable, or whose comparison with a constant times out (an enormous expression).
        Equal strings share a class without parsing; other pairs are compared with math-verify (in both
        directions) and classes are the transitive closure (union-find). A comparison that times out counts as
        "different".
        """
        return self.equivalence_classes_batch([answers])[0]

    def equivalence_classes_batch(self, groups: Sequence[Sequence[str | None]]) -> list[list[int]]:
        """:meth:`equivalence_classes` for many questions at once (one dispatch, all workers busy)."""
        soft = self.timeout_s - self.grace_s
        uniq_per_group = [self._unique_answers(answers) for answers in groups]
        ok_per_group = self._parsable(uniq_per_group, soft)
        parents = [list(range(len(u))) for u in uniq_per_group]
        for gi, a, b in self._equal_pairs(uniq_per_group, ok_per_group, soft):
            _union(parents[gi], a, b)
        return [self._class_ids(answers, uniq, ok, p)
                for answers, uniq, ok, p in zip(groups, uniq_per_group, ok_per_group, parents)]

    def _unique_answers(self, answers: Sequence[str | None]) -> list[str]:
        """The distinct stripped answers of one question that are not refused, in first-occurrence order."""
        seen: dict[str, None] = {}
        for a in answers:
            if not self._refused(a):
                seen.setdefault(a.strip(), None)
        # (equal strings always share a class: they are deduplicated here before any comparison)
        return list(seen)

    def _is_int(self, u: str) -> bool:
        """An integer literal judged without a worker (only with ``exact_match_shortcut``)."""
        return self.exact_match_shortcut and _INT.fullmatch(u) is not None

    def _parsable(self, uniq_per_group: list[list[str]], soft: float) -> list[list[bool]]:
        """Which unique answers parse at all, and can be compared with something in time."""
        parse_tasks = [(_worker.parse_ok_task, u, soft, True) for uniq in uniq_per_group for u in uniq
                       if not self._is_int(u)]
        parse_res = iter(self._run_tasks(parse_tasks, on_timeout="timeout"))
        return [[True if self._is_int(u) else next(parse_res) == "ok" for u in uniq] for uniq in uniq_per_group]

    def _equal_pairs(self, uniq_per_group: list[list[str]], ok_per_group: list[list[bool]],
                     soft: float) -> list[tuple[int, int, int]]:
        """``(group, a, b)`` for each pair of parsable unique answers found equivalent (two integer literals are
        compared as integers, other pairs by math-verify; a comparison that times out counts as different)."""
        pair_tasks, pair_where, int_equal = [], [], []
        for gi, (uniq, ok) in enumerate(zip(uniq_per_group, ok_per_group)):
            idx = [j for j, o in enumerate(ok) if o]
            for a in range(len(idx)):
                for b in range(a + 1, len(idx)):
                    ua, ub = uniq[idx[a]], uniq[idx[b]]
                    if self._is_int(ua) and self._is_int(ub):
                        if int(ua) == int(ub):
                            int_equal.append((gi, idx[a], idx[b]))
                        continue
                    pair_tasks.append((_worker.equal_task, ua, ub, soft, self.float_rounding))
                    pair_where.append((gi, idx[a], idx[b]))
        pair_res = self._run_tasks(pair_tasks, on_timeout="timeout") + ["equal"] * len(int_equal)
        return [w for w, r in zip(pair_where + int_equal, pair_res) if r == "equal"]

    def _class_ids(self, answers: Sequence[str | None], uniq: list[str], ok: list[bool], p: list[int]) -> list[int]:
        """One class id per answer, numbered by first occurrence; -1 for a refused or unparsable answer."""
        pos = {u: j for j, u in enumerate(uniq)}
        label: dict[int, int] = {}
        ids = []
        for a in answers:
            if self._refused(a) or not ok[pos[a.strip()]]:
                ids.append(-1)
                continue
            root = _find(p, pos[a.strip()])
            ids.append(label.setdefault(root, len(label)))
        return ids
