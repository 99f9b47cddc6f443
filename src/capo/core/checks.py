"""Argument checks shared by the core: each raises ``ValueError``/``TypeError`` naming the argument and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import numpy as np
import torch

from capo.errors import is_int, is_real  # noqa: F401 -- the one definition; core modules say checks.is_int


def tensor(name: str, x, *, ndim: int | None = None, floating: bool = False) -> torch.Tensor:
    """Check that ``x`` is a tensor with ``ndim`` dimensions (and a floating dtype if asked)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype (float16/bfloat16/float32/float64), got {x.dtype}")
    return x


def same_shape(**tensors: torch.Tensor) -> None:
    """Check that all given tensors have the same shape."""
    items = list(tensors.items())
    ref_name, ref = items[0]
    for name, t in items[1:]:
        if t.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
            )


def group_size(n: int, g, *, min_size: int = 1) -> int:
    """Check that ``g`` is an int >= ``min_size`` that divides ``n``."""
    if not is_int(g):
        raise TypeError(f"group_size must be an int, got {type(g).__name__}")
    if g < min_size:
        raise ValueError(f"group_size must be >= {min_size}, got {g}")
    if n % g != 0:
        raise ValueError(f"group_size={g} does not divide the number of responses N={n}; N must equal B*G")
    return g


def positive(name: str, v: float) -> float:
    if not (is_real(v) and v > 0):
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return float(v)


def non_negative(name: str, v: float) -> float:
    if not (is_real(v) and v >= 0):
        raise ValueError(f"{name} must be >= 0, got {v!r}")
    return float(v)


SEED_LIMIT = 2**32  # seeds are 32-bit, as numpy's and vLLM's: capo derives per-batch seeds from them (eval: seed *
# 1_000_003 + batch), and torch refuses a seed past 2**64 with a traceback


def seed_problem(name: str, v) -> str | None:
    """Why ``v`` is no seed (an integer in [0, 2**32)), naming ``name``; None when it is one. The one rule for every
    seed capo takes (``run.seed``, ``capo eval --seed``, ``build-default --seed``, ``demo --seeds``, sweep seeds)."""
    if is_int(v) and 0 <= v < SEED_LIMIT:
        return None
    return f"{name} must be an integer in [0, 2**32), got {v!r}"


def did_you_mean(v, allowed: Iterable) -> str:
    """`` (did you mean 'grpo'?)`` for the allowed name closest to ``v`` (difflib, similarity >= 0.6), else ``""``:
    the one suggestion helper behind every "unknown name" error (algorithm, estimator, config key, dataset)."""
    close = difflib.get_close_matches(str(v), [str(a) for a in allowed], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def renamed(where: str, given: dict, renames: dict[str, str]) -> None:
    """TypeError for keyword arguments in ``given`` (a function's ``**old``): an old name says its new one
    (``renames``: old -> new), any other is unexpected, as Python would say."""
    for old in given:
        if old in renames:
            raise TypeError(f"{where}: {old!r} is now called {renames[old]!r} (the same name on every path: capo's "
                            f"trainer, TRL, verl); pass {renames[old]}=...")
    if given:
        raise TypeError(f"{where}() got an unexpected keyword argument {next(iter(given))!r}")


def choice(name: str, v, allowed: Iterable) -> object:
    allowed = list(allowed)
    if v not in allowed:
        raise ValueError(f"{name}={v!r} is not allowed{did_you_mean(v, allowed)}; allowed values: "
                         f"{', '.join(map(repr, allowed))}")
    return v


# 1-D per-response inputs of the calibration metrics and voting rules (lists / numpy arrays accepted)


def array1d(name: str, x) -> torch.Tensor:
    """Tensor / numpy array / list -> 1-D tensor (detached), with a TypeError naming ``name`` otherwise."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, (np.ndarray, list, tuple)):
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must hold numbers (a 1-D tensor, numpy array or list), got {e}") from None
    else:
        raise TypeError(f"{name} must be a torch.Tensor, numpy array or list, got {type(x).__name__}")
    if t.is_complex():
        raise TypeError(f"{name} must be real, got dtype {t.dtype}")
    return tensor(name, t, ndim=1)


def nonempty(name: str, t: torch.Tensor) -> None:
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (N = 0); at least one response is needed")


def scores(name: str, x, *, allow_nan: bool = False) -> torch.Tensor:
    """Real-valued scores -> float64 [N]; NaN rejected unless ``allow_nan``; +-inf allowed."""
    t = array1d(name, x)
    if t.dtype == torch.bool:
        raise TypeError(f"{name} must be a real-valued score, got a bool tensor")
    t = t.to(torch.float64)
    if not allow_nan and bool(torch.isnan(t).any()):
        i = int(torch.isnan(t).nonzero()[0])
        raise ValueError(f"{name} contains NaN (first at index {i}); scores must be numbers (+-inf allowed)")
    return t


def probs(name: str, x, *, allow_nan: bool = False) -> tuple[torch.Tensor, torch.dtype]:
    """Probabilities in [0, 1] -> (float64 [N], the input's floating dtype or float64 for integer inputs)."""
    t = array1d(name, x)
    if t.dtype == torch.bool:
        raise TypeError(f"{name} must be a probability in [0, 1], got a bool tensor")
    src = t.dtype if t.is_floating_point() else torch.float64
    t = scores(name, t, allow_nan=allow_nan)
    bad = (t < 0) | (t > 1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{name} must lie in [0, 1], got {float(t[i])!r} at index {i}")
    return t, src


def labels(name: str, x) -> torch.Tensor:
    """Correctness labels: bool, or numbers that are all 0/1 -> bool [N]."""
    t = array1d(name, x)
    if t.dtype == torch.bool:
        return t
    bad = (t != 0) & (t != 1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{name} must contain only 0/1 or True/False, got {t[i].item()!r} at index {i}")
    return t != 0


def group_ids_1d(name: str, x) -> torch.Tensor:
    """Group (question) ids: an integer tensor of arbitrary labels -> int64 [N]."""
    t = array1d(name, x)
    if t.dtype == torch.bool or t.is_floating_point():
        raise TypeError(f"{name} must have an integer dtype (arbitrary question labels), got {t.dtype}")
    return t.to(torch.int64)

