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

import math

import torch

from capo.core import checks
from capo.core.registry import REWARDS


def _correct(correct: torch.Tensor) -> torch.Tensor:
    checks.tensor("correct", correct, ndim=1)
    if correct.dtype != torch.bool:
        raise TypeError(f"correct must be a bool tensor, got {correct.dtype}")
    return correct


# what a reward on a stated confidence reads beyond the verdicts (REWARDS.reads): the engines grade its responses
# in a format that states one (capo.rollout.grading.reward_answer_format)
STATED = ("confidence", "format_ok")


@REWARDS.register("correctness")
def correctness_reward(
    correct: torch.Tensor, *, confidence: torch.Tensor | None = None, format_ok: torch.Tensor | None = None
) -> torch.Tensor:
    """Binary verifiable reward (RLVR): R_i = 1[y_i == y*]. [N] -> [N]."""
    return _correct(correct).to(torch.float32)


@REWARDS.register("rlcr", reads=STATED)
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


# The rewards made of separate terms, name -> the function giving its [N, K] terms (what GDPO normalises apart): the
# one list (``capo.rollout.method_inputs`` reads it). Any other reward is one term, or the engine's reward terms.
REWARD_COMPONENTS = {"rlcr": rlcr_components}


@REWARDS.register("ppo_c", reads=STATED)
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


SCORING_RULES = ("log", "brier")
# The worst score a two-digit stated probability (0.01 ... 0.99) can get: what a malformed answer gets by default.
WORST_STATED = 0.01


def scoring_rule(stated: torch.Tensor, outcome: torch.Tensor, rule: str = "log") -> torch.Tensor:
    """A proper scoring rule of a stated probability q for a binary outcome a, maximised in expectation by the true
    rate P(a = 1) (Bereket & Leskovec, arXiv 2508.11800, Sec. 3: the log score is their reward):

        "log":    a log q + (1 - a) log(1 - q)
        "brier":  -(q - a)^2

    ``stated``: floating q (for "log", in (0, 1)); ``outcome``: 0/1 (bool or numeric). Shapes broadcast; the result
    has ``stated``'s dtype."""
    checks.choice("rule", rule, SCORING_RULES)
    a = outcome.to(stated.dtype)
    if rule == "log":
        return a * torch.log(stated) + (1 - a) * torch.log1p(-stated)
    return -(stated - a) ** 2


def _stated_reward(correct, confidence, format_ok, rule: str, failure: float | None) -> torch.Tensor:
    """The scoring rule on the verdicts' outcome, or ``failure`` where the stated probability is invalid (missing,
    outside (0, 1) for the log score, outside [0, 1] for Brier's, or ``format_ok`` False)."""
    a = _correct(correct).to(torch.float32)
    q, ok = _confidence(correct, confidence, format_ok, f"{rule}_score")
    if rule == "log":
        ok = ok & (q > 0) & (q < 1)
    q = torch.where(ok, q, torch.full_like(q, 0.5))  # keeps log() finite where the value is replaced anyway
    worst = (math.log(WORST_STATED) if rule == "log" else -(1 - WORST_STATED) ** 2) if failure is None else failure
    return torch.where(ok, scoring_rule(q, a, rule), torch.full_like(q, float(worst)))


@REWARDS.register("log_score", reads=STATED)
def log_score_reward(
    correct: torch.Tensor,
    *,
    confidence: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    format_failure_reward: float | None = None,
) -> torch.Tensor:
    """Log score of a stated probability against a stochastic outcome (arXiv 2508.11800, Sec. 3, the reward of its
    synthetic experiment): R_i = a_i log q_i + (1 - a_i) log(1 - q_i), with a_i = ``correct`` (the question's fixed
    outcome: the grader sets it from the gold "1"/"0" for the ``percent`` answer format) and q_i = ``confidence``
    (the stated probability). An invalid q (NaN, outside (0, 1), or ``format_ok`` False) gets
    ``format_failure_reward``; None (default) = log(0.01), the worst score of a two-digit answer 01-99 (the paper's
    answers are always valid, so the value is capo's). Shapes: [N] -> [N] float32."""
    return _stated_reward(correct, confidence, format_ok, "log", format_failure_reward)


@REWARDS.register("brier_score", reads=STATED)
def brier_score_reward(
    correct: torch.Tensor,
    *,
    confidence: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    format_failure_reward: float | None = None,
) -> torch.Tensor:
    """Negative Brier score of a stated probability against a stochastic outcome (arXiv 2508.11800 names it as the
    alternative proper scoring rule): R_i = -(q_i - a_i)^2, a_i = ``correct``, q_i = ``confidence``. Unlike RLCR's
    reward (:func:`rlcr_reward`) there is no correctness term: the outcome is not the model's to get right. An
    invalid q gets ``format_failure_reward``; None (default) = -(0.99)^2, the worst score of a two-digit answer.
    Shapes: [N] -> [N] float32."""
    return _stated_reward(correct, confidence, format_ok, "brier", format_failure_reward)
