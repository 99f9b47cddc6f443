"""Argument checks shared by the core: each raises ``ValueError``/``TypeError`` naming the argument and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable

import torch


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
    if isinstance(g, bool) or not isinstance(g, int):
        raise TypeError(f"group_size must be an int, got {type(g).__name__}")
    if g < min_size:
        raise ValueError(f"group_size must be >= {min_size}, got {g}")
    if n % g != 0:
        raise ValueError(f"group_size={g} does not divide the number of responses N={n}; N must equal B*G")
    return g


def positive(name: str, v: float) -> float:
    if not (isinstance(v, (int, float)) and v > 0):
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return float(v)


def non_negative(name: str, v: float) -> float:
    if not (isinstance(v, (int, float)) and v >= 0):
        raise ValueError(f"{name} must be >= 0, got {v!r}")
    return float(v)


def choice(name: str, v, allowed: Iterable) -> object:
    allowed = list(allowed)
    if v not in allowed:
        raise ValueError(f"{name}={v!r} is not allowed; allowed values: {', '.join(map(repr, allowed))}")
    return v
