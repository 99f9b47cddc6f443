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
    q, ok = _confidence(correct, confidence, format_ok, "rlcr")
    r = c - (q - c).square()
    return torch.where(ok, r, torch.full_like(r, float(format_failure_reward)))


def _confidence(correct: torch.Tensor, confidence, format_ok, who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q as float32 with NaN -> 0, ok mask): ok where the confidence is a number in [0, 1] and the format held."""
    if confidence is None:
        raise ValueError(f"the {who} reward needs confidence: the verbalized <confidence> value per response, shape [N]")
    checks.tensor("confidence", confidence, ndim=1, floating=True)
    checks.same_shape(correct=correct, confidence=confidence)
    q = confidence.to(torch.float32)
    ok = torch.isfinite(q) & (q >= 0) & (q <= 1)
    if format_ok is not None:
        checks.tensor("format_ok", format_ok, ndim=1)
        checks.same_shape(correct=correct, format_ok=format_ok)
        ok = ok & format_ok.bool()
    return torch.nan_to_num(q, nan=0.0), ok


def rlcr_components(
    correct: torch.Tensor,
    *,
    confidence: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    format_failure_reward: float = -1.0,
) -> torch.Tensor:
    """RLCR's two reward terms kept apart, for GDPO's decoupled normalisation: column 0 = c_i (correctness),
    column 1 = -(q_i - c_i)^2 (negative Brier), or ``format_failure_reward`` where the format or confidence is
    invalid (the worst Brier term, as :func:`rlcr_reward` gives the whole reward). Shapes: [N] -> [N, 2] float32.
    Their sum equals :func:`rlcr_reward` wherever the format is valid."""
    c = _correct(correct).to(torch.float32)
    q, ok = _confidence(correct, confidence, format_ok, "rlcr")
    brier = torch.where(ok, -(q - c).square(), torch.full_like(c, float(format_failure_reward)))
    return torch.stack([c, brier], dim=1)


@REWARDS.register("ppo_c")
def ppo_c_reward(
    correct: torch.Tensor,
    *,
    confidence: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    weight: float = 0.5,
    threshold: float = 0.5,
    format_failure_reward: float = -1.0,
) -> torch.Tensor:
    """PPO-C calibrated reward calculation (Leng et al., "Taming Overconfidence in LLMs: Reward Calibration in
    RLHF", arXiv 2410.09724, Sec. 4.2), with the verifier's correctness in place of the reward model's score
    (reconstructed for verifiable rewards):

        R_i = c_i + w * (q_i - 0.5)   if c_i > threshold       (a good answer: stated confidence pays)
        R_i = c_i - w * (q_i - 0.5)   otherwise                 (a bad answer: stated confidence costs)

    The paper compares the reward with a running mean of past rewards; for binary correctness that mean lies
    strictly between 0 and 1 once both outcomes have occurred, so it separates right from wrong exactly as the
    fixed ``threshold`` 0.5 does (and a pure function keeps no running state). This is also the ordering PPO-M's
    calibrated reward model is trained to produce (correct+sure > correct+unsure > wrong+unsure > wrong+sure).
    ``weight`` w (default 0.5). Malformed output or a missing/out-of-range confidence gets
    ``format_failure_reward`` (default -1, below every well-formed reward). Unlike RLCR's Brier term this is a
    linear score, not a proper scoring rule: its expected value is maximised by q in {0, 1}, not q = P(correct).
    Shapes: correct [N] bool, confidence [N] floating, format_ok [N] bool -> [N] float32.
    """
    checks.non_negative("weight", weight)
    c = _correct(correct).to(torch.float32)
    q, ok = _confidence(correct, confidence, format_ok, "ppo_c")
    sign = torch.where(c > threshold, torch.ones_like(c), -torch.ones_like(c))
    r = c + sign * weight * (q - 0.5)
    return torch.where(ok, r, torch.full_like(r, float(format_failure_reward)))
