"""Code that runs inside the verifier's worker processes (never in the parent).

Kept import-light (no torch): a fresh worker imports only this module, sympy and math-verify.

Defence in depth against model text being executed:

1. The parent refuses answers that look like code (see ``capo.verify.verifier.looks_like_code``) and bounds
   their length before they reach a worker.
2. :func:`install_sympy_guard` wraps ``sympy.parsing.sympy_parser.stringify_expr`` (which every
   ``sympify(str)`` / ``parse_expr`` call goes through before sympy ``eval``s the generated Python) with an AST
   check that allows only calls, names, constants and arithmetic: no attribute access, no subscripts, no
   lambdas or comprehensions, no name starting with ``_`` and no name from a deny-list (``eval``, ``exec``,
   ``open``, ``getattr``, ``__import__``, ...). math-verify itself only hands sympy's ``parse_expr`` strings made
   of digits and operators, and latex2sympy builds expressions with an ANTLR grammar, but sympy may call
   ``sympify`` on a string internally; the guard makes that path inert too.
3. Each worker has an address-space limit, and the parent kills it after a hard wall-clock timeout.

A worker is its own interpreter, started by the parent as ``python -c LAUNCH`` calling :func:`main` (see
``capo.verify._pool``): it never imports the parent's main script, torch or CUDA, whatever the parent has loaded.
It speaks JSON lines over its stdin/stdout: first one line ``{"ready": true}`` (or ``{"error", "traceback"}`` when
it cannot start), then one reply ``{"result": str}`` or ``{"error", "traceback"}`` per request ``{"fn", "args"}``;
``fn`` must be one of :data:`TASKS`.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import signal
import sys
import traceback
from functools import lru_cache

# Names that must never be reachable from code sympy generates out of a string.
DENIED_NAMES = frozenset(
    {
        "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals", "vars", "input",
        "breakpoint", "help", "exit", "quit", "memoryview", "system", "popen", "os", "sys", "subprocess",
        "builtins", "importlib", "import_module", "lambdify", "pickle", "marshal", "ctypes", "shutil", "socket",
        "dir", "type", "object", "classmethod", "staticmethod", "super", "property", "bytearray", "bytes",
        "print", "iter", "next", "hasattr", "id", "hash", "format", "chr", "ord",
    }
)
_ALLOWED_NODES = (
    ast.Expression, ast.Module, ast.Expr, ast.Call, ast.Name, ast.Load, ast.Constant, ast.keyword, ast.BinOp,
    ast.UnaryOp, ast.Tuple, ast.List, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
    ast.USub, ast.UAdd, ast.MatMult, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
    ast.BitXor, ast.BitAnd, ast.BitOr, ast.Invert, ast.Not, ast.BoolOp, ast.And, ast.Or,
)


class UnsafeExpression(ValueError):
    """sympy was asked to evaluate generated code that is not a plain arithmetic expression."""


def check_generated_code(code: str) -> None:
    """Raise :class:`UnsafeExpression` unless ``code`` is a plain expression of calls, names and arithmetic."""
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"not an expression: {e}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise UnsafeExpression(f"{type(node).__name__} is not allowed in an expression")
        if isinstance(node, ast.Name) and (node.id.startswith("_") or node.id in DENIED_NAMES):
            raise UnsafeExpression(f"name {node.id!r} is not allowed in an expression")
        if isinstance(node, ast.keyword) and node.arg is not None and node.arg.startswith("_"):
            raise UnsafeExpression(f"keyword {node.arg!r} is not allowed in an expression")
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and len(node.value) > 200:
            raise UnsafeExpression("string constant too long")


_GUARD_INSTALLED = False


def install_sympy_guard() -> None:
    """Make every string that sympy turns into Python code pass :func:`check_generated_code` first."""
    global _GUARD_INSTALLED
    if _GUARD_INSTALLED:
        return
    from sympy.parsing import sympy_parser

    original = sympy_parser.stringify_expr

    def guarded_stringify_expr(s, local_dict, global_dict, transformations):
        code = original(s, local_dict, global_dict, transformations)
        check_generated_code(code)
        return code

    original_eval = sympy_parser.eval_expr

    def guarded_eval_expr(code, local_dict, global_dict):
        if isinstance(code, str):
            check_generated_code(code)
        else:  # a code object compiled from an already checked string; refuse nested code (lambdas etc.)
            if any(hasattr(c, "co_code") for c in getattr(code, "co_consts", ())):
                raise UnsafeExpression("nested code is not allowed in an expression")
            for name in getattr(code, "co_names", ()):
                if name.startswith("_") or name in DENIED_NAMES:
                    raise UnsafeExpression(f"name {name!r} is not allowed in an expression")
        return original_eval(code, local_dict, global_dict)

    sympy_parser.stringify_expr = guarded_stringify_expr
    sympy_parser.eval_expr = guarded_eval_expr
    _GUARD_INSTALLED = True


class _Deadline(BaseException):
    """Raised by the soft (in-worker) alarm. A BaseException so that math-verify's ``except Exception`` lets it out."""


def _on_alarm(signum, frame):
    raise _Deadline()


def address_space_bytes() -> int | None:
    """This process's current virtual address space (``VmSize``), or None where /proc is not available."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def limit_memory(headroom_mb: int | None) -> int | None:
    """Cap this process's address space at its current size plus ``headroom_mb``; returns the limit in bytes.

    Called before math-verify loads, so the bound is relative to the worker's own baseline (a bare interpreter) and
    only a runaway computation -- sympy expanding an enormous integer -- reaches it, whatever the parent holds.
    """
    if not headroom_mb:
        return None
    try:
        import resource
    except ImportError:  # pragma: no cover - non-POSIX
        return None
    limit = (address_space_bytes() or 0) + int(headroom_mb) * 1024 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def init_worker(memory_headroom_mb: int | None) -> None:
    """Worker start: memory limit (first), quiet logging, sympy guard, warm imports."""
    limit_memory(memory_headroom_mb)
    # The parent owns Ctrl-C; workers are killed by the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)
    import math_verify  # noqa: F401  (warm import)

    install_sympy_guard()
    signal.signal(signal.SIGALRM, _on_alarm)


def ping() -> bool:
    """Warm-up task: parse and verify once so grammar tables and caches are loaded."""
    import math_verify

    math_verify.verify(math_verify.parse("$\\frac{1}{2}$"), math_verify.parse("\\boxed{0.5}"), timeout_seconds=None)
    return True


def _parse_configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


_CONFIGS = None


@lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple:
    """math-verify parse of an extracted answer (wrapped in ``\\boxed{}``); cached (golds repeat k times)."""
    global _CONFIGS
    import math_verify

    if _CONFIGS is None:
        _CONFIGS = _parse_configs()
    return tuple(math_verify.parse("\\boxed{" + answer + "}", extraction_config=_CONFIGS, parsing_timeout=None))


def _equal(gold_parsed: tuple, pred_parsed: tuple, float_rounding: int) -> bool:
    import math_verify

    return bool(
        math_verify.verify(list(gold_parsed), list(pred_parsed), float_rounding=float_rounding, timeout_seconds=None)
    )


def _with_deadline(fn, soft_timeout_s: float):
    signal.setitimer(signal.ITIMER_REAL, max(soft_timeout_s, 0.01))
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _judged(run, soft_timeout_s: float, on_error: str) -> str:
    """``run()`` under the soft deadline: its result string; 'timeout' past the deadline or on memory/recursion
    exhaustion; ``on_error`` for any other failure of math-verify/sympy on hostile input."""
    try:
        return _with_deadline(run, soft_timeout_s)
    except (_Deadline, MemoryError, RecursionError):
        return "timeout"
    except Exception:
        return on_error


# Results are plain strings (Verdict values) so that the parent does not unpickle anything rich from a worker.
def verify_task(pred: str, gold: str, soft_timeout_s: float, float_rounding: int) -> str:
    """Judge one extracted answer against one gold answer. Returns a Verdict value string."""

    def run() -> str:
        g = _parse(gold)
        if not g:
            return "gold_unparsable"
        p = _parse(pred)
        if not p:
            return "unparsable"
        return "correct" if _equal(g, p, float_rounding) else "incorrect"

    return _judged(run, soft_timeout_s, "unparsable")


def parse_ok_task(answer: str, soft_timeout_s: float, probe: bool = False) -> str:
    """'ok' if math-verify can parse the answer, else 'unparsable' / 'timeout'.

    With ``probe`` the parsed answer is also compared once with the constant 0: an answer whose comparison
    cannot finish in time (``9^{9^{9^9}}``, huge factorials) is reported as 'timeout' here, once, instead of
    timing out against every other answer of its question.
    """

    def run() -> str:
        p = _parse(answer)
        if p and probe:
            _equal(_parse("0"), p, 6)
        return "ok" if p else "unparsable"

    return _judged(run, soft_timeout_s, "unparsable")


def equal_task(a: str, b: str, soft_timeout_s: float, float_rounding: int) -> str:
    """'equal' if a and b are mathematically equivalent (either direction), else 'different' / 'timeout'."""

    def run() -> str:
        pa, pb = _parse(a), _parse(b)
        if pa and pb and (_equal(pa, pb, float_rounding) or _equal(pb, pa, float_rounding)):
            return "equal"
        return "different"

    return _judged(run, soft_timeout_s, "different")


def probe_sympify(payload: str) -> str:
    """Test hook: call ``sympy.sympify`` on raw text inside a worker and report what happened."""
    import sympy

    try:
        sympy.sympify(payload)
        return "evaluated"
    except UnsafeExpression:
        return "blocked"
    except Exception as e:  # noqa: BLE001
        return f"error:{type(e).__name__}"


def stall_task(seconds: float) -> str:
    """Test hook: block in a way the soft alarm cannot interrupt (alarm ignored), so only the hard kill stops it."""
    import time

    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(seconds)
    return "finished"


def die_task(marker: str, times: int) -> str:
    """Test hook: kill this worker process (exit status 3, a line on stderr) on each of the first ``times`` calls
    that share the file ``marker`` (it counts them); later calls return 'survived'. Tests a worker that dies mid-item
    being replaced and the item retried."""
    with open(marker, "a+") as f:
        f.seek(0)
        if len(f.read()) >= times:
            return "survived"
        f.write("x")
    print("die_task: exiting on purpose", file=sys.stderr, flush=True)
    os._exit(3)


def imported_task(module: str) -> str:
    """Test hook: 'yes' if ``module`` has been imported in this worker, else 'no'."""
    return "yes" if module in sys.modules else "no"


def module_file_task(module: str) -> str:
    """Test hook: the file this worker imported ``module`` from ('' if it has not imported it)."""
    mod = sys.modules.get(module)
    return str(getattr(mod, "__file__", "") or "")


def address_space_task() -> str:
    """Benchmark hook: this worker's address space in bytes (``VmSize``), as a string; '' where unknown."""
    return str(address_space_bytes() or "")


# The only functions a request may name (the parent refers to them by function object; see _pool).
TASKS = {f.__name__: f for f in (ping, verify_task, parse_ok_task, equal_task, probe_sympify, stall_task,
                                 die_task, imported_task, module_file_task, address_space_task)}


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def _serve(out, memory_headroom_mb: int | None) -> int:
    """Start, say ready (or why not), then answer requests until stdin closes."""
    try:
        init_worker(memory_headroom_mb)
        ping()
    except BaseException as e:  # noqa: BLE001 - reported to the parent verbatim, then this worker exits
        out.write(json.dumps(_error(e)) + "\n")
        return 1
    out.write('{"ready": true}\n')
    for line in sys.stdin:
        try:
            req = json.loads(line)
            msg = {"result": TASKS[req["fn"]](*req["args"])}
        except BaseException as e:  # noqa: BLE001 - a task bug: reported with its traceback, the worker lives on
            msg = _error(e)
        out.write(json.dumps(msg) + "\n")
    return 0


def main() -> int:
    """Entry point of a worker (``python -P -c LAUNCH HEADROOM_MB``, :data:`capo.verify._pool.LAUNCH`; ``python -m
    capo.verify._worker HEADROOM_MB`` also works): the protocol goes over a private copy of
    stdout; anything else printed (by sympy, say) goes to stderr, which the parent keeps for error reports."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    headroom = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "none" else None
    return _serve(out, headroom)


if __name__ == "__main__":
    sys.exit(main())
