"""What an engine hands to capo's one step, and the extra per-response inputs some methods read, built for capo's
trainer, the TRL adapter and the verl plugin alike.

:class:`StepBatch` is one graded batch as an engine collected it; :class:`StepSpec` says what to compute from it
(advantage, loss, reward, mask, ...). :func:`method_inputs` builds the inputs a method declares it reads at
registration (``ADVANTAGES.register(name, reads=...)``, ``POLICY_LOSSES.register(name, reads=...)``; never its
signature, never a list of method names):

- ``confidence_shift`` [N] (advantage ``ace``): c_i = sum_t (log pi_old - log pi_ref) over the response's real
  tokens, 0 where non-finite (that row's group is dropped by the numerical guard anyway);
- ``cluster_ids`` [N] int (advantage ``seed_grpo``): the extracted answers' equivalence classes within each prompt
  (:meth:`capo.verify.Verifier.equivalence_classes_batch`, the classes capo's voting uses; -1 = no answer);
- ``components`` [N, K] (advantage ``gdpo``): the reward's own terms when it has them
  (:data:`capo.core.rewards.REWARD_COMPONENTS`: RLCR's two, :func:`capo.core.rlcr_components`), else the engine's
  reward terms (``reward_terms``; default the reward itself as one column);
- ``rewards`` [N] (policy loss ``c2gspg``, the calibration target): the rewards as given.

Everything is engine independent (tensors, strings, a verifier); each engine only says how a missing input is
enabled there (``StepSpec.hints``), so the error names the setting to change. :func:`capo.rollout.step.step_advantages`
is the one caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from capo.core import ADVANTAGES, POLICY_LOSSES, RENAMED, REWARD_COMPONENTS, checks
from capo.errors import ConfigError
from capo.rollout.grading import answer_classes

__all__ = ["MethodInputs", "StepBatch", "StepSpec", "advantage_inputs", "method_inputs", "needed_data",
           "needs_reference", "summed_reward_unread", "verdicts_only"]

# input name -> the engine data it is built from (what an engine must supply)
_NEEDS = {"confidence_shift": ("token_logp", "ref_token_logp"), "cluster_ids": ("answers",),
          "components": ("confidence", "format_ok"), "rewards": ()}


@dataclass(frozen=True)
class MethodInputs:
    """``advantage``: keyword inputs for :func:`capo.core.advantage_step` (``inputs=``); ``loss``: keyword inputs
    for the policy loss (row-aligned [N], to be sliced like the advantages)."""

    advantage: dict = field(default_factory=dict)
    loss: dict = field(default_factory=dict)


def advantage_inputs(advantage: str) -> set[str]:
    """The inputs built here (``confidence_shift``, ``cluster_ids``, ``components``) that estimator ``advantage``
    declared it reads."""
    return set(ADVANTAGES.reads(advantage)) & {"confidence_shift", "cluster_ids", "components"}


def _wants(advantage: str, loss: str | None) -> tuple[set, set]:
    los = set() if loss is None else set(POLICY_LOSSES.reads(loss)) & {"rewards"}
    return advantage_inputs(advantage), los


def summed_reward_unread(advantage: str, loss: str | None, reward: str) -> str | None:
    """Why the update of this estimator and loss never reads the summed reward (the reward function's value plus any
    overlong shaping), or None when it does. From the declarations: an estimator that reads ``correct`` ranks the
    verifier's verdicts (CAPO, :func:`verdicts_only`); one that reads ``components`` takes a reward's own terms one
    by one when it has them (GDPO with RLCR); a loss that reads ``rewards`` (C2GSPG) reads them. Then a reward's
    shaping changes ``train/reward_mean`` but not the update."""
    if verdicts_only(advantage, loss):
        return f"advantage {advantage!r} ranks responses by the verifier's verdicts, not by their rewards"
    if "components" in ADVANTAGES.reads(advantage) and reward in REWARD_COMPONENTS and not _loss_reads_rewards(loss):
        return f"advantage {advantage!r} normalises the terms of reward {reward!r} one by one and never reads their sum"
    return None


def verdicts_only(advantage: str, loss: str | None) -> bool:
    """Whether the update reads nothing of the rewards but the verifier's verdicts: an estimator that declared it
    reads ``correct`` (CAPO's pairs are right vs wrong) with a loss that does not read ``rewards``. Then the choice
    of reward beyond its verdicts does not change the update either."""
    return "correct" in ADVANTAGES.reads(advantage) and not _loss_reads_rewards(loss)


def _loss_reads_rewards(loss: str | None) -> bool:
    return loss is not None and "rewards" in POLICY_LOSSES.reads(loss)


def needed_data(advantage: str, loss: str | None = None, *, reward: str = "correctness") -> set[str]:
    """The engine data (``token_logp``, ``ref_token_logp``, ``answers``, ``confidence``, ``format_ok``) that
    :func:`method_inputs` needs for this estimator/loss/reward, so an engine can prepare it (e.g. a reference model)
    or refuse at construction time."""
    adv, los = _wants(advantage, loss)
    out: set[str] = set()
    for name in adv | los:
        if name == "components" and reward not in REWARD_COMPONENTS:
            continue
        out.update(_NEEDS[name])
    return out


def needs_reference(advantage: str, noise_mask: str, *, kl_coef: float = 0.0) -> bool:
    """Whether a run needs the frozen reference model's log-probs: a KL penalty (``kl_coef`` > 0), a noise mask that
    is on (``noise_mask``, resolved: ``off``, ``fixed`` or ``quantile``; it reads PPL_ref), or an estimator input built
    from them (ACE's confidence shift). The one rule capo's trainer, TRL and verl follow; an unknown estimator needs
    nothing here (its name is refused where it is checked)."""
    return kl_coef > 0 or noise_mask != "off" or (advantage in ADVANTAGES
                                                  and "ref_token_logp" in needed_data(advantage))


@dataclass
class StepBatch:
    """One graded batch as an engine collected it; rows n*G..(n+1)*G-1 are prompt n's G responses.

    rewards [N] floating; correct [N] bool verdicts (None: the engine has none; then no ``calib/*``);
    mask [N, T] real response tokens; token_logp [N, T] the rollout policy's log-probs (None: not collected; lpm is
    then 0 and there are no ``calib/*``); ref_token_logp [N, T] the frozen reference's, on the same tokens;
    valid [N] bool rows that exist as responses (None: all); answers: N extracted answers (None = no answer);
    confidence [N] verbalized confidences (NaN = none); format_ok [N] bool; reward_terms [N, K] GDPO's components
    when the reward has no terms of its own (``REWARD_COMPONENTS``); verifier: groups answers into SEED-GRPO's clusters
    (:func:`capo.rollout.grading.answer_classes`, by ``answer_format``: the short formats' normal forms, else
    math-verify; None = math-verify);
    confidence_logp [N, T]: the log-probs whose lpm is the ``calib/*`` confidence, when not ``token_logp``
    (capo's trainer: the rollout-time ones, while its advantages read its own recomputed old log-probs).
    """

    rewards: torch.Tensor
    group_size: int
    mask: torch.Tensor
    correct: torch.Tensor | None = None
    token_logp: torch.Tensor | None = None
    ref_token_logp: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    answers: Sequence[str | None] | None = None
    confidence: torch.Tensor | None = None
    format_ok: torch.Tensor | None = None
    reward_terms: torch.Tensor | None = None
    verifier: Any = None
    confidence_logp: torch.Tensor | None = None
    answer_format: str | None = None


@dataclass(frozen=True)
class StepSpec:
    """What to compute from a :class:`StepBatch`.

    advantage / advantage_kwargs: the advantage estimator (``ADVANTAGES``) and its hyperparameters (the names of
    capo's trainer's ``algo.advantage`` / ``algo.advantage_kwargs``; the old ``estimator`` / ``hparams`` raise a
    TypeError naming them); loss: the policy loss whose inputs
    to build (None: none); reward / reward_kwargs: the core reward that produced the rewards (its
    ``format_failure_reward`` enters RLCR's components; any other name means "not a core reward");
    mask: CAPO's noise-mask thresholds (a :class:`capo.rollout.step.MaskThresholds`; None: the mask is off);
    group_filter: DAPO's dynamic sampling, comparing ``group_filter_by`` (:data:`capo.core.dapo.GROUP_FILTER_BY`:
    the verdicts or the rewards) within each group; calibration: compute ``calib/*``; engine / hints: how errors
    name the engine and the setting that enables a missing input; gather: collects every process's rows of a [N]
    tensor for the batch metrics (None: the batch is already whole).
    """

    advantage: str
    advantage_kwargs: dict = field(default_factory=dict)
    loss: str | None = None
    reward: str = "correctness"
    reward_kwargs: dict = field(default_factory=dict)
    mask: Any = None
    group_filter: bool = False
    group_filter_by: str = "correct"
    calibration: bool = True
    engine: str = "capo"
    hints: dict[str, str] = field(default_factory=dict)
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __new__(cls, *args, **kwargs):
        checks.renamed("StepSpec", {k: v for k, v in kwargs.items() if k in RENAMED}, RENAMED)
        return super().__new__(cls)


def _missing(spec: StepSpec, method: str, what: str, data: str) -> ConfigError:
    hint = spec.hints.get(data)
    return ConfigError(f"{spec.engine}: {method} needs {what}, and this run does not supply them"
                       + (f": {hint}" if hint else ""))


def method_inputs(spec: StepSpec, batch: StepBatch, rewards: torch.Tensor | None = None) -> MethodInputs:
    """The extra inputs estimator ``spec.advantage`` and policy loss ``spec.loss`` declared they read, built from
    ``batch``; ``rewards``: the rewards to use instead of ``batch.rewards`` (the step passes the guarded ones).
    """
    adv, los = _wants(spec.advantage, spec.loss)
    rewards = batch.rewards if rewards is None else rewards
    out = MethodInputs()
    what = f"advantage estimator {spec.advantage!r}"
    if "confidence_shift" in adv:  # ACE: c_i = sum_t (log pi_old - log pi_ref), a constant
        out.advantage["confidence_shift"] = _confidence_shift(spec, batch, what)
    if "cluster_ids" in adv:  # SEED-GRPO: answer equivalence classes within each prompt (-1 = no answer)
        if batch.answers is None or batch.verifier is None:
            raise _missing(spec, what, "the extracted answers and a verifier (its semantic clusters are the "
                           "answers' equivalence classes)", "answers")
        g, answers = batch.group_size, batch.answers
        groups = [list(answers[i:i + g]) for i in range(0, len(answers), g)]
        classes = answer_classes(groups, batch.verifier, batch.answer_format)
        out.advantage["cluster_ids"] = torch.tensor([c for cl in classes for c in cl], dtype=torch.long,
                                                    device=rewards.device)
    if "components" in adv:  # GDPO: the reward's terms, each normalised on its own
        out.advantage["components"] = _components(spec, batch, rewards, what)
    if "rewards" in los:  # C2GSPG's calibration target
        out.loss["rewards"] = rewards
    return out


def _confidence_shift(spec: StepSpec, batch: StepBatch, what: str) -> torch.Tensor:
    if batch.ref_token_logp is None:
        raise _missing(spec, what, "reference-model log-probs (its confidence shift is log pi_old - log pi_ref)",
                       "ref_token_logp")
    if batch.token_logp is None:
        raise _missing(spec, what, "the rollout policy's log-probs", "token_logp")
    lp, m = batch.token_logp, batch.mask.bool()
    c = torch.where(m, lp - batch.ref_token_logp, torch.zeros((), dtype=lp.dtype)).sum(-1)  # [N]
    return torch.where(torch.isfinite(c), c, torch.zeros((), dtype=c.dtype))


def _components(spec: StepSpec, batch: StepBatch, rewards: torch.Tensor, what: str) -> torch.Tensor:
    split = REWARD_COMPONENTS.get(spec.reward)
    if split is None:
        return (rewards[:, None] if batch.reward_terms is None else batch.reward_terms).to(rewards.dtype)
    if batch.correct is None or batch.confidence is None:
        raise _missing(spec, f"{what} with the {spec.reward} reward", "the verdicts and verbal confidences (its "
                       "components are RLCR's correctness and Brier terms)", "confidence")
    fail = {k: v for k, v in spec.reward_kwargs.items() if k == "format_failure_reward"}
    return split(batch.correct, confidence=batch.confidence.float(), format_ok=batch.format_ok,
                 **fail).to(rewards.dtype)
