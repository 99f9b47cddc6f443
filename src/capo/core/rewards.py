"""Rewards on verdicts (behind ``REWARDS``). Parsing and answer checking live in ``capo.verify``; these functions
only combine already-computed verdicts, so they are pure.

Uniform signature::

    reward_fn(correct, *, confidence=None, format_ok=None, **hparams) -> rewards

- ``correct``: [N] bool (the extracted answer is mathematically equivalent to the gold answer).
- ``confidence``: [N] floating verbalized confidence q (NaN where missing), used by RLCR.
- ``format_ok``: [N] bool, the response followed the required output format.
- returns [N] float32 rewards.
"""

from __future__ import annotations

import torch

from capo.core import checks
from capo.core.registry import REWARDS


def _correct(correct: torch.Tensor) -> torch.Tensor:
    checks.tensor("correct", correct, ndim=1)
    if correct.dtype != torch.bool:
        raise TypeError(f"correct must be a bool tensor, got {correct.dtype}")
    return correct


@REWARDS.register("correctness")
def correctness_reward(
    correct: torch.Tensor, *, confidence: torch.Tensor | None = None, format_ok: torch.Tensor | None = None
) -> torch.Tensor:
    """Binary verifiable reward (RLVR): R_i = 1[y_i == y*]. [N] -> [N]."""
    return _correct(correct).to(torch.float32)


@REWARDS.register("rlcr")
def rlcr_reward(
    correct: torch.Tensor,
    *,
    confidence: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    format_failure_reward: float = -1.0,
) -> torch.Tensor:
    """RLCR reward (arXiv 2507.16806, Sec. 3, eq. 2): correctness minus the Brier score of the verbalized confidence,

        R_i = c_i - (q_i - c_i)^2,     c_i = 1[y_i == y*],  q_i in [0, 1]

    Range [-1, 1]; a proper scoring rule, maximised in expectation by q = P(correct). A response with a malformed
    format, a missing/NaN confidence or q outside [0, 1] gets ``format_failure_reward`` (default -1, the worst
    well-formed reward, so dropping the confidence never pays; the paper does not state the value).
    Shapes: correct [N] bool, confidence [N] floating, format_ok [N] bool -> [N] float32.
    """
    c = _correct(correct).to(torch.float32)
    if confidence is None:
        raise ValueError("the rlcr reward needs confidence: the verbalized <confidence> value per response, shape [N]")
    checks.tensor("confidence", confidence, ndim=1, floating=True)
    checks.same_shape(correct=correct, confidence=confidence)
    q = confidence.to(torch.float32)
    ok = torch.isfinite(q) & (q >= 0) & (q <= 1)
    if format_ok is not None:
        checks.tensor("format_ok", format_ok, ndim=1)
        checks.same_shape(correct=correct, format_ok=format_ok)
        ok = ok & format_ok.bool()
    r = c - (torch.nan_to_num(q, nan=0.0) - c).square()
    return torch.where(ok, r, torch.full_like(r, float(format_failure_reward)))
