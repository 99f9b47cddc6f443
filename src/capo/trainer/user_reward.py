"""User-supplied reward functions: ``algo.reward = "package.module:function"``.

The function is called once per response as ``fn(prompt: str, response: str, gold: str) -> float``. Each call runs
under a wall-clock limit (``algo.reward_timeout`` seconds, SIGALRM in the main thread). An exception, a timeout or a
non-finite/non-number result is reported with the offending sample and then, by ``algo.reward_errors``:
``fail`` stops the run with that message; ``zero`` scores the sample 0 and counts it in ``train/reward_errors``.
"""

from __future__ import annotations

import importlib
import math
import signal
import threading
from collections.abc import Callable

import torch

from capo.errors import CapoError, ConfigError, is_real


class _Timeout(BaseException):
    pass


def load_user_reward(spec: str) -> Callable:
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise ConfigError(f"algo.reward={spec!r}: a user reward must be 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"algo.reward={spec!r}: cannot import it ({e})") from None
    if not callable(fn):
        raise ConfigError(f"algo.reward={spec!r} is not callable")
    return fn


def _call_with_timeout(fn, args, timeout: float):
    if threading.current_thread() is not threading.main_thread() or timeout <= 0:
        return fn(*args)

    def on_alarm(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def user_rewards(fn, prompts, texts, golds, *, timeout: float, on_error: str) -> tuple[torch.Tensor, int, list[str]]:
    """Rewards [N] float32, the number of failed samples, and one message per failure."""
    out, errors = [], []
    for i, (p, t, g) in enumerate(zip(prompts, texts, golds)):
        try:
            v = _call_with_timeout(fn, (p, t, g), timeout)
            if not is_real(v) or not math.isfinite(v):
                raise ValueError(f"returned {v!r}; a reward must be a finite number")
            out.append(float(v))
        except _Timeout:
            errors.append(_describe(i, p, t, f"timed out after {timeout:g} s"))
            out.append(0.0)
        except Exception as e:  # noqa: BLE001 -- any failure of user code is reported, never silent
            errors.append(_describe(i, p, t, f"raised {type(e).__name__}: {e}"))
            out.append(0.0)
        if errors and on_error == "fail":
            raise CapoError(f"user reward function failed: {errors[0]} (set algo.reward_errors=zero to score such "
                            "samples 0 and count them instead)")
    return torch.tensor(out, dtype=torch.float32), len(errors), errors


def _describe(i, prompt, text, what) -> str:
    def cut(s):
        s = str(s)
        return s if len(s) <= 80 else s[:77] + "..."

    return f"sample {i} (prompt {cut(prompt)!r}, response {cut(text)!r}) {what}"
