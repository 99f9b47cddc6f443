"""CAPO's noise mask from reference-model perplexity (arXiv 2604.12632, Sec. 4.3).

Responses whose reference (base-model) perplexity contradicts their label are treated as noise:
- a *correct* response with PPL_ref > high is a "lucky guess" and is masked;
- an *incorrect* response with PPL_ref < low is "near-correct" and is masked.
The final advantage is A_i * keep_i (every estimator in ``capo.core.advantages`` takes ``keep``).

The paper's thresholds (low = 1.05, high = 2.5 for Qwen2.5-Math) are described as quartiles of the base model's
PPL distribution, so they are model specific. :func:`ppl_quantile_thresholds` measures them on the base model's
own rollouts; fixed numbers remain an option.

This module owns every rule of the mask, read by capo's trainer, the TRL adapter and the verl plugin alike, which all
name it the same way (``noise_mask`` and the knobs ``mask_low``, ``mask_high``, ``mask_q_low``, ``mask_q_high``):
its allowed values (``NOISE_MASKS``, checked by :func:`noise_mask_problem`), the defaults of its knobs
(``MASK_LOW``/``MASK_HIGH``, ``MASK_Q_LOW``/``MASK_Q_HIGH``) and their allowed ranges (:func:`mask_knob_problem`), and
which estimators it applies to when a setting leaves it unset (:func:`default_noise_mask`: only CAPO). When set, it
applies to any estimator (A_i * keep_i; the paper's "GRPO + mask" ablation).
"""

from __future__ import annotations

import torch

from capo.core import checks
from capo.core.presets import ALGORITHMS

# The paper's fixed thresholds (Qwen2.5-Math): the defaults of every fixed-mask knob (trainer, TRL, verl).
MASK_LOW, MASK_HIGH = 1.05, 2.5
# The quartiles the paper describes its thresholds as: the defaults of every quantile-mask knob.
MASK_Q_LOW, MASK_Q_HIGH = 0.25, 0.75
# The values of ``noise_mask`` on every path (trainer ``algo.noise_mask``, TRL ``CapoAdvantageConfig.noise_mask``,
# verl ``algorithm.capo.noise_mask``): off; fixed = the mask_low/mask_high numbers; quantile = the
# mask_q_low/mask_q_high quantiles of the reference perplexities of the base model's own rollouts (capo's trainer samples them before
# training; an adapter reads the first training batch's, then freezes them: at step 0 the policy is the base model).
NOISE_MASKS = ("off", "fixed", "quantile")
MASK_RULES = NOISE_MASKS[1:]  # the values that turn the mask on: how its thresholds are obtained


def noise_mask_problem(value, *, key: str = "noise_mask") -> str | None:
    """What is wrong with a ``noise_mask`` value (the one check of it on every path), or None. A bool (the adapters'
    old vocabulary) is told its new spelling."""
    if isinstance(value, bool):  # YAML 1.1 readers (PyYAML, a TRL or verl config) read a bare off as false: the hint
        return (f"{key}={value!r} is the old spelling; {key} takes one of {', '.join(NOISE_MASKS)} now: "
                f"{key}={'fixed' if value else 'off'} (or quantile; in YAML write \"off\" quoted)")
    if value not in NOISE_MASKS:
        return (f"{key}={value!r} is not allowed{checks.did_you_mean(value, NOISE_MASKS)}; allowed values: "
                f"{', '.join(NOISE_MASKS)}")
    return None


def default_noise_mask(advantage: str) -> str:
    """The ``noise_mask`` an adapter setting left unset (None) means for estimator ``advantage``: "fixed" (the
    paper's thresholds) iff the algorithm preset named like the estimator uses it and turns the mask on
    (``capo.core.presets.ALGORITHMS``: only ``capo``), else "off". The one place this default is decided; capo's
    trainer takes the unset value from its ``algo.name`` preset instead (the same table)."""
    p = ALGORITHMS.get(advantage)
    on = p is not None and p["advantage"] == advantage and p.get("noise_mask", "off") != "off"
    return "fixed" if on else "off"


def resolve_noise_mask(advantage: str, noise_mask: str | None) -> str:
    """``noise_mask`` as set, or :func:`default_noise_mask` of ``advantage`` when unset (None); unchecked (the check
    is :func:`noise_mask_problem`)."""
    return default_noise_mask(advantage) if noise_mask is None else noise_mask


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
