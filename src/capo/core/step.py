"""The one CAPO-input step: a batch's verdicts, rewards and log-probs -> advantages and calibration metrics.

capo's trainer, the TRL adapter (``capo.adapters.trl``) and the verl plugin (``capo.adapters.verl_plugin``) all reach
:func:`guard_batch`, :func:`estimate` and :func:`calibration_metrics` through one function,
:func:`capo.rollout.step.step_advantages`, so "core == trainer == TRL == verl" holds by construction: the engines
differ only in how they collect the inputs (which rows, which log-probs, which verdicts). Every path names the
estimator ``advantage`` and its hyperparameters ``advantage_kwargs`` (capo's trainer: ``algo.advantage``,
``algo.advantage_kwargs``). What an estimator reads is its registry declaration (``ADVANTAGES.register(name,
reads=...)``, e.g. :func:`needs_scores`), never its signature; :func:`advantage_kwargs_problem` is the one early check
of its hyperparameters (their names, and their values by the estimator's own checks).

Conventions every caller follows (docs/papers.md, "Adapters: one CAPO-input step"):
- Correct/incorrect is the verifier's verdict ``correct``; a reward is never thresholded to decide it.
- ``token_logp`` are the rollout policy's raw temperature-1 log-probs (the paper's lpm), ``ref_token_logp`` the
  frozen reference's, on the same tokens. An engine that only exposes temperature-scaled ones says so by a knob.
- Rows are grouped contiguously: rows n*G..(n+1)*G-1 are the G responses of prompt n (callers reorder first).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

import torch

from capo.core import checks
from capo.core.advantages import compute_advantages
from capo.core.calibration import summarize
from capo.core.dapo import informative_groups
from capo.core.masks import capo_noise_mask
from capo.core.registry import ADVANTAGES, POLICY_LOSSES, REWARDS
from capo.core.scores import sequence_logprob_mean


# Per-response inputs an estimator may be given (never hyperparameters): ``scores`` and ``keep`` every estimator takes;
# the others only an estimator that declares them in ``reads=`` gets (the step's own: correct, partners, lengths; the
# ones capo.rollout.method_inputs builds: confidence_shift, cluster_ids, components).
STEP_INPUTS = ("scores", "keep", "correct", "partners", "lengths", "confidence_shift", "cluster_ids", "components")
# the step's keyword arguments under their old names -> the names every path uses now
RENAMED = {"estimator": "advantage", "hparams": "advantage_kwargs"}


def needs_scores(advantage: str) -> bool:
    """Whether estimator ``advantage`` reads per-response scores (lpm under the rollout policy): what it declared
    when it was registered (``ADVANTAGES.register(name, reads=("scores", ...))``: capo, unlikeliness). Every other
    estimator accepts and ignores them."""
    return "scores" in ADVANTAGES.reads(advantage)


def hyperparameters(advantage: str) -> list[str]:
    """The names ``advantage_kwargs`` may hold for estimator ``advantage``: its keyword parameters that are no
    per-response input (``STEP_INPUTS``; the signature says which knobs exist, never which inputs are read)."""
    params = inspect.signature(ADVANTAGES.get(advantage)).parameters
    return [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY and p not in STEP_INPUTS]


def _probe_inputs(advantage: str, advantage_kwargs: dict) -> dict:
    """A two-row batch (one group, one right and one wrong answer) with every input ``advantage`` reads."""
    weights = advantage_kwargs.get("weights")
    k = len(weights) if isinstance(weights, (list, tuple)) and weights else 1
    table = {"correct": torch.tensor([True, False]), "partners": torch.ones(2, dtype=torch.bool),
             "lengths": torch.ones(2, dtype=torch.long), "confidence_shift": torch.zeros(2, dtype=torch.float64),
             "cluster_ids": torch.tensor([0, 1]), "components": torch.zeros(2, k, dtype=torch.float64)}
    return {name: table[name] for name in ADVANTAGES.reads(advantage) if name in table}


def advantage_kwargs_problem(advantage: str, advantage_kwargs: dict, *, key: str = "advantage_kwargs") -> str | None:
    """What is wrong with estimator ``advantage``'s hyperparameters, or None: a name it does not take, or a value
    its own checks refuse (it runs once on a two-row batch, so each rule, e.g. CAPO's tau > 0, lives only in the
    estimator). Every path calls this before any model is loaded; ``key`` is how the setting is spelled there."""
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    return _kwargs_problem(
        f"advantage estimator {advantage!r}", hyperparameters(advantage), advantage_kwargs, key,
        lambda: compute_advantages(advantage, rewards, 2, scores=torch.zeros(2, dtype=torch.float64),
                                   **_probe_inputs(advantage, advantage_kwargs), **advantage_kwargs))


def loss_kwargs_problem(loss: str, loss_kwargs: dict, *, key: str = "loss_kwargs") -> str | None:
    """What is wrong with policy loss ``loss``'s hyperparameters, or None: a name it does not take, or a value its
    own checks refuse (it runs once on a two-row batch, so each rule lives only in the loss). The trainer calls this
    before any model is loaded; ``key`` is how the setting is spelled there."""
    fn = POLICY_LOSSES.get(loss)
    reads = POLICY_LOSSES.reads(loss)
    allowed = [p for p, v in inspect.signature(fn).parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY
               and p not in reads and p != "generator"]
    x = torch.zeros(2, 2, dtype=torch.float64)
    extra = {"rewards": torch.tensor([1.0, 0.0], dtype=torch.float64)} if "rewards" in reads else {}
    return _kwargs_problem(f"policy loss {loss!r}", allowed, loss_kwargs, key,
                           lambda: fn(x, x, torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 2),
                                      **extra, **loss_kwargs))


def reward_kwargs_problem(reward: str, reward_kwargs: dict, *, key: str = "reward_kwargs") -> str | None:
    """What is wrong with reward ``reward``'s hyperparameters, or None: a name it does not take (its keyword
    parameters but the per-response ``confidence`` and ``format_ok``), or a value it refuses (it runs once on a
    two-row batch). The trainer calls this before any model is loaded; ``key`` is how the setting is spelled there."""
    fn = REWARDS.get(reward)
    allowed = [p for p, v in inspect.signature(fn).parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY
               and p not in ("confidence", "format_ok")]
    ok = torch.ones(2, dtype=torch.bool)
    return _kwargs_problem(f"reward {reward!r}", allowed, reward_kwargs, key,
                           lambda: fn(torch.tensor([True, False]), confidence=torch.full((2,), 0.5), format_ok=ok,
                                      **reward_kwargs))


def _kwargs_problem(what: str, allowed: list[str], kwargs: dict, key: str, probe) -> str | None:
    """A name of ``kwargs`` not in ``allowed``, else what ``probe()`` (the function called on a two-row batch with
    ``kwargs``) refuses, as one line naming ``key`` (``key.name`` when the refusal names one of them); None if
    neither."""
    extra = sorted(set(kwargs) - set(allowed))
    if extra:
        return (f"{key}: {what} has no hyperparameter {', '.join(map(repr, extra))}; "
                f"allowed: {', '.join(allowed) or '(none)'}")
    try:
        probe()
    except (ValueError, TypeError) as e:
        msg = str(e)
        name = msg.split("=")[0].split(" ")[0]
        return f"{key}.{msg}" if name in kwargs else f"{key}: {msg}"
    return None


@dataclass(frozen=True)
class StepResult:
    """What :func:`guard_batch` and :func:`advantage_step` return; every tensor is [N].

    advantages: the estimator's advantages (zero for masked, inactive and non-existing rows; None before
        :func:`estimate`).
    rewards: the rewards with 0 where ``bad`` (what the estimator and the group filter see).
    scores: lpm = mean token log-prob under the rollout policy, as computed (non-finite where the log-probs are;
        the estimator sees 0 there).
    keep: CAPO's reference-perplexity noise mask (all True when the mask is off).
    ref_ppl: PPL_ref = exp(-lpm_ref), or None without reference log-probs.
    active: rows whose whole group takes part (the caller's ``active``, minus groups with a non-finite value, minus
        groups the group filter drops).
    bad: rows with a non-finite reward, lpm or reference lpm (their group is inactive).
    valid: rows that exist as responses (the caller's ``valid`` and at least one real token).
    informative: rows whose group is neither all right nor all wrong (DAPO's group filter: its verdicts, or its
        rewards, differ), or None without the filter.
    lengths: real tokens per response (|o_i|, what CAPO's ``score="sum"`` multiplies lpm by), or None.
    """

    advantages: torch.Tensor | None
    rewards: torch.Tensor
    scores: torch.Tensor
    keep: torch.Tensor
    ref_ppl: torch.Tensor | None
    active: torch.Tensor
    bad: torch.Tensor
    valid: torch.Tensor
    informative: torch.Tensor | None = None
    lengths: torch.Tensor | None = None


def guard_batch(
    rewards: torch.Tensor,
    group_size: int,
    *,
    token_logp: torch.Tensor,
    mask: torch.Tensor,
    ref_token_logp: torch.Tensor | None = None,
    active: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    group_filter: bool = False,
    filter_on: torch.Tensor | None = None,
) -> StepResult:
    """The numerical guard and the row bookkeeping of one batch, before any estimator (``advantages`` is None).

    Shapes: rewards [N] floating, token_logp / mask / ref_token_logp [N, T]. A row with a non-finite reward, lpm or
    reference lpm is ``bad`` and deactivates its whole group (its reward becomes 0). Rows with no real token are
    never valid (an empty row's lpm would be 0, the highest possible confidence). ``group_filter``: DAPO's dynamic
    sampling (:func:`capo.core.informative_groups`) also deactivates groups whose ``filter_on`` [N] values are all
    equal: the verdicts as 0/1 for the paper's 0 < |{correct}| < G; None: the guarded rewards. Each lpm is computed
    here once; :func:`estimate` reuses them.
    """
    checks.tensor("rewards", rewards, ndim=1)
    g = checks.group_size(rewards.shape[0], group_size, min_size=2)
    scores = sequence_logprob_mean(token_logp, mask)  # [N]
    ref_lpm = None if ref_token_logp is None else sequence_logprob_mean(ref_token_logp, mask)  # [N]
    bad = ~torch.isfinite(rewards) | ~torch.isfinite(scores)
    if ref_lpm is not None:
        bad |= ~torch.isfinite(ref_lpm)
    ok_groups = ~bad.view(-1, g).any(dim=1).repeat_interleave(g)  # [N]
    active = ok_groups if active is None else active & ok_groups
    rewards = torch.where(bad, torch.zeros((), dtype=rewards.dtype), rewards)
    informative = None
    if group_filter:
        informative = informative_groups(rewards if filter_on is None else filter_on, g).repeat_interleave(g)  # [N]
        active = active & informative
    lengths = mask.bool().sum(dim=-1)  # [N]
    valid = lengths > 0 if valid is None else valid & (lengths > 0)
    return StepResult(advantages=None, rewards=rewards, scores=scores, keep=torch.ones_like(bad),
                      ref_ppl=None if ref_lpm is None else torch.exp(-ref_lpm), active=active, bad=bad, valid=valid,
                      informative=informative, lengths=lengths)


def estimate(
    advantage: str,
    guarded: StepResult,
    correct: torch.Tensor,
    group_size: int,
    *,
    mask_thresholds: tuple[float, float] | None = None,
    advantage_kwargs: dict | None = None,
    inputs: dict | None = None,
    **old,
) -> StepResult:
    """The estimator ``advantage`` (``ADVANTAGES``) on a guarded batch (:func:`guard_batch`), CAPO's noise mask
    included; returns ``guarded`` with ``advantages`` and ``keep`` filled in.

    Shapes: correct [N] bool verdicts. ``mask_thresholds``: (low, high) of :func:`capo.core.capo_noise_mask` (None:
    no mask; needs reference log-probs). A non-valid row gets advantage 0 and is no CAPO pair partner.
    ``advantage_kwargs``: the estimator's hyperparameters; ``inputs``: the per-response inputs built outside the
    step (``confidence_shift``, ``cluster_ids``, ``components``: :func:`capo.rollout.method_inputs.method_inputs`).
    The estimator gets ``correct``, ``partners`` (= valid) and ``lengths`` when it declared them in ``reads=``
    (CAPO). The old keyword names (``estimator``, ``hparams``) raise a TypeError naming the new ones.
    """
    checks.renamed("estimate", old, RENAMED)
    checks.tensor("correct", correct, ndim=1)
    if correct.dtype != torch.bool:
        raise TypeError(f"correct must be a bool tensor of verdicts, got {correct.dtype}")
    checks.same_shape(rewards=guarded.rewards, correct=correct)
    keep = torch.ones_like(correct)
    if mask_thresholds is not None:
        if guarded.ref_ppl is None:
            raise ValueError("CAPO's noise mask needs reference log-probs (ref_token_logp)")
        keep = capo_noise_mask(guarded.ref_ppl, correct, low=mask_thresholds[0], high=mask_thresholds[1])
    own = {"correct": correct, "partners": guarded.valid, "lengths": guarded.lengths}
    reads = ADVANTAGES.reads(advantage)
    extra = dict(inputs or {}) | {k: v for k, v in own.items() if k in reads and v is not None}
    scores = torch.where(guarded.bad, torch.zeros((), dtype=guarded.scores.dtype), guarded.scores)
    adv = compute_advantages(advantage, guarded.rewards, group_size, scores=scores,
                             keep=keep & guarded.active & guarded.valid, **extra, **(advantage_kwargs or {}))
    return replace(guarded, advantages=adv, keep=keep)


def advantage_step(
    advantage: str,
    rewards: torch.Tensor,
    correct: torch.Tensor,
    group_size: int,
    *,
    token_logp: torch.Tensor,
    mask: torch.Tensor,
    ref_token_logp: torch.Tensor | None = None,
    mask_thresholds: tuple[float, float] | None = None,
    active: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    advantage_kwargs: dict | None = None,
    inputs: dict | None = None,
    **old,
) -> StepResult:
    """:func:`guard_batch` then :func:`estimate`: advantages of one batch, CAPO's noise mask included.

    Shapes: rewards [N] floating, correct [N] bool verdicts, token_logp / mask / ref_token_logp [N, T].
    ``active`` [N] bool: rows the caller lets take part; ``valid`` [N] bool: rows that exist as responses (e.g.
    scored by some reward function). Engines go through :func:`capo.rollout.step.step_advantages`, which also
    builds the estimator's extra inputs and the batch metrics. Old keyword names raise as in :func:`estimate`.
    """
    checks.renamed("advantage_step", old, RENAMED)
    guarded = guard_batch(rewards, group_size, token_logp=token_logp, mask=mask, ref_token_logp=ref_token_logp,
                          active=active, valid=valid)
    return estimate(advantage, guarded, correct, group_size, mask_thresholds=mask_thresholds,
                    advantage_kwargs=advantage_kwargs, inputs=inputs)


def calibration_metrics(scores, correct, group_ids, verbal_conf=None) -> dict[str, float]:
    """The ``calib/*`` metrics every path logs for a batch's own rollouts (docs/metrics.md).

    Shapes: scores [N] lpm under the rollout policy, correct [N] bool verdicts, group_ids [N] prompt ids,
    verbal_conf [N] verbalized confidences (NaN = none) or None. Keys: ``calib/`` + accuracy, auc_mean,
    auc_mean_groups, auroc, ece, brier, and with ``verbal_conf`` verbal_ece, verbal_brier, verbal_auroc,
    verbal_auc_mean, verbal_missing (NaN where undefined, e.g. AUC-mean without a mixed prompt).
    """
    s = summarize(scores, correct, group_ids, verbal_conf=verbal_conf)
    keys = ["accuracy", "auc_mean", "auc_mean_groups", "auroc", "ece", "brier"]
    if verbal_conf is not None:
        keys += ["verbal_ece", "verbal_brier", "verbal_auroc", "verbal_auc_mean", "verbal_missing"]
    return {f"calib/{k}": float(s[k]) for k in keys}
