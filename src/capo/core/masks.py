"""CAPO's noise mask from reference-model perplexity (arXiv 2604.12632, Sec. 4.3).

Responses whose reference (base-model) perplexity contradicts their label are treated as noise:
- a *correct* response with PPL_ref > high is a "lucky guess" and is masked;
- an *incorrect* response with PPL_ref < low is "near-correct" and is masked.
The final advantage is A_i * keep_i (every estimator in ``capo.core.advantages`` takes ``keep``).

The paper's thresholds (low = 1.05, high = 2.5 for Qwen2.5-Math) are described as quartiles of the base model's
PPL distribution, so they are model specific. :func:`ppl_quantile_thresholds` measures them on the base model's
own rollouts; fixed numbers remain an option.

This module owns every rule of the mask, read by capo's trainer, the TRL adapter and the verl plugin alike:
its defaults (``MASK_LOW``/``MASK_HIGH``, ``MASK_Q_LOW``/``MASK_Q_HIGH``), the allowed ranges of its knobs
(:func:`mask_knob_problem`), how adapters obtain thresholds (``MASK_RULES``) and which estimators it applies to
(:func:`mask_applies`: any estimator when enabled, the paper's "GRPO + mask" ablation included; on by default only
for an estimator whose same-named algorithm preset turns it on, i.e. CAPO).
"""

from __future__ import annotations

import torch

from capo.core import checks
from capo.core.presets import ALGORITHMS

# The paper's fixed thresholds (Qwen2.5-Math): the defaults of every fixed-mask knob (trainer, TRL, verl).
MASK_LOW, MASK_HIGH = 1.05, 2.5
# The quartiles the paper describes its thresholds as: the defaults of every quantile-mask knob.
MASK_Q_LOW, MASK_Q_HIGH = 0.25, 0.75
# How the adapters take the thresholds: the fixed numbers, or quantiles of the reference perplexities of the first
# training batch (then frozen; at step 0 the policy is the base model). capo's trainer measures its quantiles on the
# reference model's own rollouts before training instead (it can sample them; an adapter cannot).
MASK_RULES = ("fixed", "quantile")


def mask_on_by_default(estimator: str) -> bool:
    """Whether the noise mask is on when a setting leaves it unset: iff the algorithm preset named like the
    estimator uses that estimator and turns the mask on (``capo.core.presets.ALGORITHMS``; only ``capo``)."""
    p = ALGORITHMS.get(estimator)
    return p is not None and p["advantage"] == estimator and p.get("noise_mask", "off") != "off"


def mask_applies(estimator: str, enabled: bool | None) -> bool:
    """Whether CAPO's noise mask multiplies ``estimator``'s advantages: ``enabled`` when set (any estimator: the
    mask is estimator independent, A_i * keep_i), else :func:`mask_on_by_default`."""
    return mask_on_by_default(estimator) if enabled is None else bool(enabled)


def mask_knob_problem(low: float, high: float, q_low: float = MASK_Q_LOW, q_high: float = MASK_Q_HIGH, *,
                      prefix: str = "") -> str | None:
    """What is wrong with the mask knobs (``prefix`` + mask_low, mask_high, mask_q_low, mask_q_high), or None.
    Allowed: 0 < mask_low <= mask_high (perplexities are >= 1) and 0 <= mask_q_low <= mask_q_high <= 1."""
    if not 0 < low <= high:
        return f"need 0 < {prefix}mask_low <= {prefix}mask_high, got {low}, {high}"
    if not 0 <= q_low <= q_high <= 1:
        return f"need 0 <= {prefix}mask_q_low <= {prefix}mask_q_high <= 1, got {q_low}, {q_high}"
    return None


def capo_noise_mask(ref_ppl: torch.Tensor, correct: torch.Tensor, *, low: float, high: float) -> torch.Tensor:
    """keep_i = (correct_i and PPL_ref_i <= high) or (not correct_i and PPL_ref_i >= low).

    Shapes: ref_ppl [N] floating (exp(-mean token log-prob) under the frozen reference model), correct [N] bool
    -> keep [N] bool. NaN perplexities are masked (kept = False). Requires 0 < low <= high.
    """
    checks.tensor("ref_ppl", ref_ppl, ndim=1, floating=True)
    checks.tensor("correct", correct, ndim=1)
    if correct.dtype != torch.bool:
        raise TypeError(f"correct must be a bool tensor, got {correct.dtype}")
    checks.same_shape(ref_ppl=ref_ppl, correct=correct)
    checks.positive("low", low)
    checks.positive("high", high)
    if low > high:
        raise ValueError(f"low={low} must be <= high={high}")
    return torch.where(correct, ref_ppl <= high, ref_ppl >= low)


def ppl_quantile_thresholds(base_ppl: torch.Tensor, q_low: float = MASK_Q_LOW,
                            q_high: float = MASK_Q_HIGH) -> tuple[float, float]:
    """(low, high) = (quantile(PPL, q_low), quantile(PPL, q_high)) of the base model's rollout perplexities.

    Shapes: base_ppl [M] floating, finite values only are used (M >= 2 of them). Quantiles use linear
    interpolation (``torch.quantile`` default). Returns Python floats: this is a one-off calibration of the mask,
    run before training, not a per-step function.
    """
    checks.tensor("base_ppl", base_ppl, ndim=1, floating=True)
    if not (0.0 <= q_low <= q_high <= 1.0):
        raise ValueError(f"need 0 <= q_low <= q_high <= 1, got q_low={q_low}, q_high={q_high}")
    x = base_ppl[torch.isfinite(base_ppl)].double()
    if x.numel() < 2:
        raise ValueError(f"base_ppl needs at least 2 finite values to estimate quantiles, got {x.numel()}")
    q = torch.quantile(x, torch.tensor([q_low, q_high], dtype=torch.float64, device=x.device))
    return float(q[0]), float(q[1])
