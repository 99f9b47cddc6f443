"""The one glue from a graded batch to advantages and batch metrics, called by capo's trainer, the TRL adapter and
the verl plugin (each only collects its :class:`~capo.rollout.method_inputs.StepBatch` its own way).

:func:`step_advantages` runs, in this order and nowhere else:

1. the numerical guard and the row bookkeeping (:func:`capo.core.guard_batch`; DAPO's group filter when asked);
2. CAPO's noise-mask thresholds (:class:`MaskThresholds`), when the spec has a mask;
3. the estimator's and the policy loss's extra inputs (:func:`capo.rollout.method_inputs.method_inputs`);
4. the estimator (:func:`capo.core.estimate`);
5. the batch metrics: ``calib/*`` (:func:`capo.core.calibration_metrics`), ``train/masked_frac`` (and per
   verdict, ``train/masked_frac_correct`` / ``_incorrect``), ``train/filtered_frac`` (docs/metrics.md).

The noise mask is one ``noise_mask`` value on every path (``capo.core.NOISE_MASKS``: off, fixed, quantile) with the
knobs ``mask_low``, ``mask_high``, ``mask_q_low``, ``mask_q_high``; :func:`noise_mask_thresholds` turns them into a
run's :class:`MaskThresholds` (None when off), after the one check of each (:mod:`capo.core.masks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from capo.core import (
    ADVANTAGES,
    MASK_HIGH,
    MASK_LOW,
    MASK_Q_HIGH,
    MASK_Q_LOW,
    StepResult,
    calibration_metrics,
    estimate,
    guard_batch,
    mask_knob_problem,
    noise_mask_problem,
    ppl_quantile_thresholds,
    resolve_noise_mask,
    sequence_logprob_mean,
)
from capo.errors import ConfigError
from capo.rollout.method_inputs import StepBatch, StepSpec, method_inputs

__all__ = ["MaskThresholds", "StepBatch", "StepOutput", "StepSpec", "noise_mask_thresholds", "step_advantages"]


class MaskThresholds:
    """CAPO's noise-mask thresholds (low, high) of one run, by ``noise_mask`` (``capo.core.MASK_RULES``):

    "fixed": ``mask_low`` and ``mask_high`` as given (the paper's 1.05 and 2.5 for Qwen2.5-Math by default; capo's
    trainer passes the quantiles it measured on the reference model's own rollouts before training);
    "quantile": the (``mask_q_low``, ``mask_q_high``) quantiles of the reference perplexities of the first batch this
    object sees (:func:`capo.core.ppl_quantile_thresholds`), then frozen for the rest of the run. At the first
    training step the policy is still the base model, so these are the base model's own rollouts, as in the paper.
    The object is the run's state: create one per run (:func:`noise_mask_thresholds`).
    """

    def __init__(self, noise_mask: str = "fixed", mask_low: float = MASK_LOW, mask_high: float = MASK_HIGH,
                 mask_q_low: float = MASK_Q_LOW, mask_q_high: float = MASK_Q_HIGH, *, engine: str):
        problem = noise_mask_problem(noise_mask) or mask_knob_problem(mask_low, mask_high, mask_q_low, mask_q_high)
        if problem or noise_mask == "off":
            raise ConfigError(f"{engine}: {problem or 'noise_mask=off has no thresholds'}")
        self.rule, self.q_low, self.q_high = noise_mask, mask_q_low, mask_q_high
        self.value: tuple[float, float] | None = (mask_low, mask_high) if noise_mask == "fixed" else None

    def resolve(self, ref_ppl: torch.Tensor) -> tuple[float, float] | None:
        """(low, high) for this batch; ``ref_ppl`` [M] are the reference perplexities of its existing rows (read
        once for "quantile"; a batch with fewer than 2 finite ones is left unmasked and the next one is read)."""
        if self.value is None:
            ppl = ref_ppl.double().cpu()
            if int(torch.isfinite(ppl).sum()) < 2:
                return None
            self.value = ppl_quantile_thresholds(ppl, self.q_low, self.q_high)
        return self.value


def noise_mask_thresholds(advantage: str, noise_mask: str | None, *, engine: str, key: str = "noise_mask",
                          **knobs: float) -> MaskThresholds | None:
    """A run's :class:`MaskThresholds` for estimator ``advantage``, or None when the mask is off. ``noise_mask``:
    one of ``capo.core.NOISE_MASKS``, or None = :func:`capo.core.default_noise_mask` (fixed for capo, else off);
    ``knobs``: mask_low, mask_high, mask_q_low, mask_q_high (defaults: ``capo.core.masks``). ConfigError naming
    ``key`` (how the engine spells the setting) for a value not allowed, the old bools included."""
    value = resolve_noise_mask(advantage, noise_mask)
    problem = noise_mask_problem(value, key=key)
    if problem:
        raise ConfigError(f"{engine}: {problem}")
    return None if value == "off" else MaskThresholds(value, **knobs, engine=engine)


@dataclass(frozen=True)
class StepOutput:
    """result: the core step's tensors ([N]; ``result.advantages`` are the advantages); loss_inputs: the policy
    loss's extra [N] inputs; thresholds: the mask's (low, high) used (None: no mask this batch); metrics:
    ``calib/*``, ``train/masked_frac``, ``train/filtered_frac`` (only those that apply), over every process."""

    result: StepResult
    loss_inputs: dict
    thresholds: tuple[float, float] | None
    metrics: dict[str, float]


def _filter_on(spec: StepSpec, batch: StepBatch) -> torch.Tensor | None:
    """What DAPO's group filter compares within a group: the verdicts as 0/1 (``group_filter_by="correct"``, the
    paper's 0 < |{correct}| < G) or None for the rewards."""
    if not spec.group_filter or spec.group_filter_by == "reward":
        return None
    if batch.correct is None:
        raise ConfigError(f"{spec.engine}: DAPO's group filter by correctness needs the verdicts, and this batch has "
                          "none; set algo.group_filter_by=reward to filter on the rewards")
    return batch.correct.to(torch.float64)


def _no_verdicts(spec: StepSpec, n: int) -> torch.Tensor:
    """The verdicts of a batch that has none: all False, which only an estimator that does not read them and no noise
    mask may take (CAPO's pairs and the mask's two thresholds are chosen by them: all False would give CAPO no pairs
    and mask every response as incorrect, without a word)."""
    for needs, who in (("correct" in ADVANTAGES.reads(spec.advantage), f"the estimator {spec.advantage!r}"),
                       (spec.mask is not None, "CAPO's noise mask")):
        if needs:
            raise ConfigError(f"{spec.engine}: {who} reads the verifier's verdicts (correct / incorrect), and this "
                              "batch has none: give StepBatch(correct=...)")
    return torch.zeros(n, dtype=torch.bool)


def step_advantages(batch: StepBatch, spec: StepSpec) -> StepOutput:
    """Advantages, the loss's extra inputs and the batch metrics of one graded batch (see the module docstring)."""
    g = batch.group_size
    lp = batch.token_logp if batch.token_logp is not None else torch.zeros(batch.mask.shape, dtype=torch.float64)
    guarded = guard_batch(batch.rewards, g, token_logp=lp, mask=batch.mask, ref_token_logp=batch.ref_token_logp,
                          valid=batch.valid, group_filter=spec.group_filter, filter_on=_filter_on(spec, batch))
    thresholds = None
    if spec.mask is not None:
        if guarded.ref_ppl is None:
            raise ConfigError(f"{spec.engine}: CAPO's noise mask needs reference-model log-probs, and this batch has "
                              "none")
        thresholds = spec.mask.resolve(guarded.ref_ppl[guarded.valid])
    x = method_inputs(spec, batch, rewards=guarded.rewards)
    correct = batch.correct if batch.correct is not None else _no_verdicts(spec, len(batch.rewards))
    res = estimate(spec.advantage, guarded, correct, g, mask_thresholds=thresholds,
                   advantage_kwargs=spec.advantage_kwargs, inputs=x.advantage)
    return StepOutput(result=res, loss_inputs=x.loss, thresholds=thresholds,
                      metrics=_batch_metrics(batch, spec, res, thresholds))


def _batch_metrics(batch: StepBatch, spec: StepSpec, res: StepResult, thresholds) -> dict[str, float]:
    """Every process's rows (``spec.gather``) -> ``train/filtered_frac``, ``train/masked_frac`` (over existing
    rows) and ``calib/*`` of lpm over the existing rows with a finite lpm (group ids = row // G after gathering)."""
    gather = spec.gather or (lambda t: t)
    out: dict[str, float] = {}
    if res.informative is not None:
        out["train/filtered_frac"] = float(gather(1.0 - res.informative.float()).mean())
    valid = gather(res.valid).cpu()
    if thresholds is not None:
        removed = 1.0 - gather(res.keep).cpu().float()
        out["train/masked_frac"] = float(removed[valid].mean())
        if batch.correct is not None:  # per verdict: rho = (1 - incorrect) / (1 - correct), docs/papers.md
            right = gather(batch.correct).cpu()
            for key, rows in (("correct", valid & right), ("incorrect", valid & ~right)):
                out[f"train/masked_frac_{key}"] = float(removed[rows].mean()) if bool(rows.any()) else math.nan
    logp = batch.token_logp if batch.confidence_logp is None else batch.confidence_logp
    if not spec.calibration or batch.correct is None or logp is None:
        return out
    lpm = res.scores if batch.confidence_logp is None else sequence_logprob_mean(logp, batch.mask)
    lpm, correct = gather(lpm).cpu(), gather(batch.correct).cpu()
    ok = valid & torch.isfinite(lpm)
    if not bool(ok.any()):
        return out
    groups = torch.arange(len(lpm)) // batch.group_size
    conf = None if batch.confidence is None else gather(batch.confidence).cpu()[ok]
    return out | calibration_metrics(lpm[ok], correct[ok], groups[ok], verbal_conf=conf)
