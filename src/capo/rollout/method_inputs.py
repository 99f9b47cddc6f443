"""The one builder of the extra per-response inputs some methods read, shared by capo's trainer, the TRL adapter and
the verl plugin (issue 18: "the trainer and both adapters compute CAPO's inputs through the same function").

Which inputs a method needs is read from its registry function's signature (never a list of method names):

- ``confidence_shift`` [N] (advantage ``ace``): c_i = sum_t (log pi_old - log pi_ref) over the response's real
  tokens, 0 where non-finite (that row's group is dropped by the numerical guard anyway);
- ``cluster_ids`` [N] int (advantage ``seed_grpo``): the extracted answers' equivalence classes within each prompt
  (:meth:`capo.verify.Verifier.equivalence_classes_batch`, the classes capo's voting uses; -1 = no answer);
- ``components`` [N, K] (advantage ``gdpo``): RLCR's two terms (:func:`capo.core.rlcr_components`) when the reward
  is ``rlcr``, else the engine's reward terms (``reward_terms``; default the reward itself as one column);
- ``rewards`` [N] (policy loss ``c2gspg``, the calibration target): the rewards as given.

Everything is engine independent (tensors, strings, a verifier); each engine only says how a missing input is
enabled there (``hints``), so the error names the setting to change.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from capo.core import ADVANTAGES, POLICY_LOSSES, rlcr_components
from capo.errors import ConfigError

__all__ = ["MethodInputs", "method_inputs", "needed_data"]

# input name -> the engine data it is built from (what an engine must supply)
_NEEDS = {"confidence_shift": ("token_logp", "ref_token_logp"), "cluster_ids": ("answers",),
          "components": ("confidence", "format_ok"), "rewards": ()}


@dataclass(frozen=True)
class MethodInputs:
    """``advantage``: keyword inputs for :func:`capo.core.advantage_step` (``inputs=``); ``loss``: keyword inputs
    for the policy loss (row-aligned [N], to be sliced like the advantages)."""

    advantage: dict = field(default_factory=dict)
    loss: dict = field(default_factory=dict)


def _wants(estimator: str, loss: str | None) -> tuple[set, set]:
    adv = set(inspect.signature(ADVANTAGES.get(estimator)).parameters) & {"confidence_shift", "cluster_ids",
                                                                          "components"}
    los = set() if loss is None else set(inspect.signature(POLICY_LOSSES.get(loss)).parameters) & {"rewards"}
    return adv, los


def needed_data(estimator: str, loss: str | None = None, *, reward: str = "correctness") -> set[str]:
    """The engine data (``token_logp``, ``ref_token_logp``, ``answers``, ``confidence``, ``format_ok``) that
    :func:`method_inputs` needs for this estimator/loss/reward, so an engine can prepare it (e.g. a reference model)
    or refuse at construction time."""
    adv, los = _wants(estimator, loss)
    out: set[str] = set()
    for name in adv | los:
        if name == "components" and reward != "rlcr":
            continue
        out.update(_NEEDS[name])
    return out


def _missing(engine: str, method: str, what: str, data: str, hints: dict | None) -> ConfigError:
    hint = (hints or {}).get(data)
    return ConfigError(f"{engine}: {method} needs {what}, and this run does not supply them"
                       + (f": {hint}" if hint else ""))


def method_inputs(
    estimator: str,
    loss: str | None = None,
    *,
    rewards: torch.Tensor,
    group_size: int,
    mask: torch.Tensor,
    token_logp: torch.Tensor | None = None,
    ref_token_logp: torch.Tensor | None = None,
    answers: Sequence[str | None] | None = None,
    correct: torch.Tensor | None = None,
    confidence: torch.Tensor | None = None,
    format_ok: torch.Tensor | None = None,
    verifier=None,
    reward: str = "correctness",
    reward_kwargs: dict | None = None,
    reward_terms: torch.Tensor | None = None,
    engine: str = "capo",
    hints: dict[str, str] | None = None,
) -> MethodInputs:
    """The extra inputs estimator ``estimator`` and policy loss ``loss`` name in their signatures.

    Shapes: rewards [N], mask / token_logp / ref_token_logp [N, T] (rollout-policy and reference log-probs of the
    same tokens), answers N extracted answers (None = none), correct / format_ok [N] bool, confidence [N] verbal
    confidences (NaN = none), reward_terms [N, K] (GDPO components when the reward is not ``rlcr``). Rows
    n*G..(n+1)*G-1 are prompt n's. ``reward``/``reward_kwargs``: the core reward that produced ``rewards`` (its
    ``format_failure_reward`` enters RLCR's components). ``hints``: data name -> how to enable it in ``engine``.
    """
    adv, los = _wants(estimator, loss)
    out = MethodInputs()
    if "confidence_shift" in adv:  # ACE: c_i = sum_t (log pi_old - log pi_ref), a constant
        if ref_token_logp is None:
            raise _missing(engine, f"advantage estimator {estimator!r}", "reference-model log-probs (its confidence "
                           "shift is log pi_old - log pi_ref)", "ref_token_logp", hints)
        if token_logp is None:
            raise _missing(engine, f"advantage estimator {estimator!r}", "the rollout policy's log-probs",
                           "token_logp", hints)
        m = mask.bool()
        c = torch.where(m, token_logp - ref_token_logp, torch.zeros((), dtype=token_logp.dtype)).sum(-1)  # [N]
        out.advantage["confidence_shift"] = torch.where(torch.isfinite(c), c, torch.zeros((), dtype=c.dtype))
    if "cluster_ids" in adv:  # SEED-GRPO: answer equivalence classes within each prompt (-1 = no answer)
        if answers is None or verifier is None:
            raise _missing(engine, f"advantage estimator {estimator!r}", "the extracted answers and a verifier (its "
                           "semantic clusters are the answers' equivalence classes)", "answers", hints)
        groups = [list(answers[i:i + group_size]) for i in range(0, len(answers), group_size)]
        out.advantage["cluster_ids"] = torch.tensor([c for cl in verifier.equivalence_classes_batch(groups)
                                                     for c in cl], dtype=torch.long)
    if "components" in adv:  # GDPO: the reward's terms, each normalised on its own
        out.advantage["components"] = _components(rewards, correct, confidence, format_ok, reward, reward_kwargs,
                                                  reward_terms, engine, estimator, hints)
    if "rewards" in los:  # C2GSPG's calibration target
        out.loss["rewards"] = rewards
    return out


def _components(rewards, correct, confidence, format_ok, reward, reward_kwargs, reward_terms, engine, estimator,
                hints) -> torch.Tensor:
    if reward != "rlcr":
        return (rewards[:, None] if reward_terms is None else reward_terms).to(rewards.dtype)
    if correct is None or confidence is None:
        raise _missing(engine, f"advantage estimator {estimator!r} with the rlcr reward", "the verdicts and verbal "
                       "confidences (its components are RLCR's correctness and Brier terms)", "confidence", hints)
    fail = {k: v for k, v in (reward_kwargs or {}).items() if k == "format_failure_reward"}
    return rlcr_components(correct, confidence=confidence.float(), format_ok=format_ok, **fail).to(rewards.dtype)
