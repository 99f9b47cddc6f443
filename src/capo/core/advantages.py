"""Advantage estimators: GRPO, Dr. GRPO, RLOO and CAPO, all behind ``ADVANTAGES``.

Uniform signature (every estimator, so callers never special-case one)::

    estimator(rewards, group_size, *, scores=None, keep=None, **advantage_kwargs) -> advantages

- ``rewards``: [N] floating, N = B*G; rows n*G..(n+1)*G-1 are the G responses of prompt n.
- ``group_size``: G >= 2, must divide N.
- ``scores``: [N] floating sequence confidences (mean token log-prob ``lpm`` from rollout-time log-probs, treated
  as constants; CAPO's ``score="sum"`` multiplies them back by ``lengths``, [N] real tokens per response). The others
  accept and ignore them.
- Further per-response inputs an estimator uses (``scores`` itself, CAPO's ``correct`` / ``partners`` / ``lengths``,
  ACE's ``confidence_shift``, ...) are declared once, at registration: ``ADVANTAGES.register(name, reads=...)``.
  The step passes exactly those (:func:`capo.core.step.estimate`); every other keyword argument is a
  hyperparameter (``advantage_kwargs`` on every path).
- ``keep``: [N] bool noise mask (CAPO's reference-perplexity mask, ``capo.core.masks``). Every estimator returns
  ``A_i * keep_i``; CAPO can also drop masked responses as pair partners.
- returns [N] advantages, in the dtype of ``rewards``; broadcast to tokens by the policy loss.
"""

from __future__ import annotations

import torch

from capo.core import checks
from capo.core.registry import ADVANTAGES


def prepare_rewards(rewards, group_size, scores, keep, *, need_scores: bool = False):
    """The checks every registered advantage estimator makes at entry -- rewards floating [N] and finite, N a
    multiple of ``group_size`` G >= 2, scores floating [N] (required and finite when ``need_scores``), keep bool
    [N] -- and the rewards as [B, G] with G: ``(rewards.view(B, G), G)``. ValueError / TypeError naming the
    argument otherwise."""
    checks.tensor("rewards", rewards, ndim=1, floating=True)
    g = checks.group_size(rewards.shape[0], group_size, min_size=2)
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; filter or repair them before computing advantages")
    if scores is None and need_scores:
        raise ValueError("scores (per-response mean token log-prob, shape [N]) are required by this estimator")
    if scores is not None:
        checks.tensor("scores", scores, ndim=1, floating=True)
        checks.same_shape(rewards=rewards, scores=scores)
        if need_scores and not torch.isfinite(scores).all():
            raise ValueError("scores contain NaN or inf; filter responses with non-finite log-probs first")
    if keep is not None:
        checks.tensor("keep", keep, ndim=1)
        if keep.dtype != torch.bool:
            raise TypeError(f"keep must be a bool tensor, got {keep.dtype}")
        checks.same_shape(rewards=rewards, keep=keep)
    return rewards.view(-1, g), g


def apply_keep(adv: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Advantages [N] with the rows ``keep`` [N] bool leaves out set to 0 (unchanged when ``keep`` is None)."""
    return adv if keep is None else adv * keep.to(adv.dtype)


@ADVANTAGES.register("grpo")
def grpo_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    eps: float = 1e-6,
    std_ddof: int = 1,
    scale: str = "group",
) -> torch.Tensor:
    """GRPO group-relative advantage (DeepSeekMath, arXiv 2402.03300, Sec. 4.1.2, outcome supervision):

        A_i = (R_i - mean_g(R)) / (std(R) + eps)

    ``scale``: "group" (std within the group; the paper), "batch" (std over all N rewards, mean still per group;
    TRL's ``scale_rewards="batch"``), "none" (no division: Dr. GRPO). ``std_ddof``: 1 = Bessel-corrected std
    (``torch.std`` default, used by both verl and TRL), 0 = population std. ``eps``: 1e-6 (verl) or 1e-4 (TRL);
    it must be > 0: a group whose rewards are all equal gets A = 0 exactly (0 / (0 + eps)), where eps = 0 would
    give 0 / 0 = NaN. Shapes: [N] -> [N].
    """
    checks.choice("scale", scale, ("group", "batch", "none"))
    checks.choice("std_ddof", std_ddof, (0, 1))
    checks.positive("eps", eps)  # an all-equal group's std is 0
    r, g = prepare_rewards(rewards, group_size, scores, keep)  # r: [B, G]
    adv = r - r.mean(dim=1, keepdim=True)  # [B, G]
    if scale == "group":
        adv = adv / (r.std(dim=1, keepdim=True, correction=std_ddof) + eps)
    elif scale == "batch":
        adv = adv / (rewards.std(correction=std_ddof) + eps)
    return apply_keep(adv.reshape(-1), keep)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dr. GRPO advantage (arXiv 2503.20783, Sec. 3.2, eq. 3): A_i = R_i - mean_g(R), no std scaling. [N] -> [N]."""
    r, _ = prepare_rewards(rewards, group_size, scores, keep)
    return apply_keep((r - r.mean(dim=1, keepdim=True)).reshape(-1), keep)


@ADVANTAGES.register("rloo")
def rloo_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE leave-one-out baseline (Kool et al. 2019; Ahmadian et al., arXiv 2402.14740, eq. 6):

        A_i = R_i - (1/(G-1)) sum_{j != i} R_j = G/(G-1) * (R_i - mean_g(R)).      [N] -> [N]
    """
    r, g = prepare_rewards(rewards, group_size, scores, keep)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (g - 1)
    return apply_keep((r - baseline).reshape(-1), keep)


# CAPO's ranking scores (capo_advantage's ``score``), its default first: lpm, the paper's
CAPO_SCORES = ("mean", "sum")


@ADVANTAGES.register("capo", reads=("scores", "correct", "partners", "lengths"))
def capo_advantage(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scores: torch.Tensor,
    keep: torch.Tensor | None = None,
    tau: float = 0.6,
    surrogate: str = "logistic",
    norm: str = "group",
    masked_partners: str = "keep",
    correct: torch.Tensor | None = None,
    partners: torch.Tensor | None = None,
    score: str = CAPO_SCORES[0],
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """CAPO advantage: gradient weights of a logistic AUC surrogate (arXiv 2604.12632, Sec. 4, the pairwise loss
    sum_{i in P, j in N} phi_tau(lpm_i - lpm_j) with phi_tau(t) = log(1 + exp(-t / tau))):

        correct i:    A_i = +(1/Z) * sum_{j in N} w_ij
        incorrect j:  A_j = -(1/Z) * sum_{i in P} w_ij
        w_ij = -phi'(lpm_i - lpm_j) = (1/tau) * sigmoid((lpm_j - lpm_i) / tau)      (logistic)
        w_ij = 1                                                                     (linear phi(t) = -t)

    ``scores`` = lpm = sg[mean token log-prob under the rollout (old) policy], [N]. A misranked pair (a wrong
    answer more confident than a right one, lpm_j > lpm_i) gets weight > 1/(2 tau); a well-separated pair ~0.

    Knobs (the paper is silent on all but tau; see docs/papers.md):
    - ``tau`` > 0: temperature (paper: 0.6 for 1.5B, 0.5 for 7B).
    - ``surrogate``: "logistic" (the paper) or "linear" (phi(t) = -t; with ``norm="group"`` this reproduces
      Dr. GRPO's R_i - mean(R) exactly for binary rewards -- GRPO is CAPO with a non-AUC-consistent surrogate).
    - ``norm``: "group" -> Z = G (default), "pairs" -> Z = number of pairs actually summed (|P| * |N| if none is
      dropped). ``masked_partners``: "keep" -> responses removed by ``keep`` still act as partners in others'
      sums (the formula as written), "drop" -> pairs involving a masked response are removed.
    - ``correct`` [N] bool: the verifier's verdicts decide P and N; a reward is never thresholded (RLCR gives a
      correct answer with q = 0.2 reward 0.36). Without it the rewards must be binary 0/1 verdicts.
    - ``partners`` [N] bool: rows that exist (scored, with real tokens); others get A = 0 and join no pair.
    - ``score``: the ranking score in place of lpm: "mean" (lpm, the paper) or "sum" (|o_i| lpm_i = sum_t log
      pi_old, ``lengths`` [N] = |o_i|; capo's ``capo_sum`` at tau 1, whose fixed point on a stochastic outcome is
      the rate, where lpm's is logit(pi) = L tau logit(p), both without a ``keep`` that removes correct and
      incorrect responses at different rates (such a mask pulls either towards 1/2): docs/papers.md, "CAPO's fixed
      point on a stochastic outcome, in general", with the price where lengths vary).
    Groups without both classes get A = 0. Cost O(N*G). Shapes: rewards, scores, keep, correct, partners [N] -> [N].
    """
    checks.positive("tau", tau)
    checks.choice("surrogate", surrogate, ("logistic", "linear"))
    checks.choice("norm", norm, ("group", "pairs"))
    checks.choice("masked_partners", masked_partners, ("keep", "drop"))
    checks.choice("score", score, CAPO_SCORES)
    r, g = prepare_rewards(rewards, group_size, scores, keep, need_scores=True)  # [B, G]
    s = capo_ranking_scores(scores, lengths, score).view(-1, g)  # [B, G]
    c = _verdicts(rewards, correct).view(-1, g)  # [B, G]
    pair = _pairs(c, _partner_rows(keep if masked_partners == "drop" else None, partners, rewards))
    w = _pair_weights(s, pair, tau, surrogate)  # [B, G_i, G_j]
    adv = torch.where(c, w.sum(dim=2), -w.sum(dim=1))  # [B, G]
    z = g if norm == "group" else pair.sum(dim=(1, 2))[:, None].clamp(min=1).to(adv.dtype)  # [B, 1]: pairs summed
    adv = (adv / z).reshape(-1).to(rewards.dtype)
    if partners is not None:
        adv = adv * partners.to(adv.dtype)
    return apply_keep(adv, keep)


def _pairs(c: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """[B, G_i, G_j] bool: i in P and j in N, both rows allowed (c [B, G] verdicts, allowed [N] or None)."""
    pair = c[:, :, None] & ~c[:, None, :]
    if allowed is None:
        return pair
    k = allowed.view(c.shape)
    return pair & k[:, :, None] & k[:, None, :]


def capo_ranking_scores(scores: torch.Tensor, lengths: torch.Tensor | None, score: str) -> torch.Tensor:
    """CAPO's ranking score [N] (:func:`capo_advantage`'s ``score``): lpm ("mean") or lpm * |o_i| = sum_t log
    pi(o_{i,t}) ("sum"); scores, lengths [N]."""
    if score == "mean":
        return scores
    if lengths is None:
        raise ValueError("capo with score='sum' needs lengths ([N] real tokens per response; the step supplies them)")
    checks.tensor("lengths", lengths, ndim=1)
    checks.same_shape(scores=scores, lengths=lengths)
    if bool((lengths < 0).any()):
        raise ValueError("lengths must be >= 0 (real tokens per response)")
    return scores * lengths.to(scores.dtype)


def _pair_weights(s: torch.Tensor, pair: torch.Tensor, tau: float, surrogate: str) -> torch.Tensor:
    """w_ij on the pairs [B, G_i, G_j] (0 elsewhere): (1/tau) sigmoid((s_j - s_i)/tau), or 1 (linear)."""
    g = s.shape[1]
    if surrogate == "logistic":
        w = torch.sigmoid((s[:, None, :] - s[:, :, None]) / tau) / tau
    else:
        w = torch.ones_like(s)[:, :, None].expand(-1, g, g)
    return torch.where(pair, w, torch.zeros((), dtype=s.dtype, device=s.device))


def _verdicts(rewards: torch.Tensor, correct: torch.Tensor | None) -> torch.Tensor:
    """CAPO's P set [N] bool: the verdicts if given, else the rewards when they are binary 0/1 verdicts."""
    if correct is not None:
        checks.tensor("correct", correct, ndim=1)
        if correct.dtype != torch.bool:
            raise TypeError(f"correct must be a bool tensor of verdicts, got {correct.dtype}")
        checks.same_shape(rewards=rewards, correct=correct)
        return correct
    if not bool(((rewards == 0) | (rewards == 1)).all()):
        raise ValueError("capo needs the verifier's verdicts (correct=[N] bool) when rewards are not binary 0/1: "
                         "a reward such as RLCR's c - (q - c)^2 or one with a length penalty does not say which "
                         "answers are correct")
    return rewards == 1


def _partner_rows(keep, partners, rewards) -> torch.Tensor | None:
    """Rows allowed in pairs [N] bool (keep if masked partners are dropped, and the existing rows), or None."""
    if partners is not None:
        checks.tensor("partners", partners, ndim=1)
        if partners.dtype != torch.bool:
            raise TypeError(f"partners must be a bool tensor, got {partners.dtype}")
        checks.same_shape(rewards=rewards, partners=partners)
    if keep is None:
        return partners
    return keep if partners is None else keep & partners


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, **kwargs) -> torch.Tensor:
    """Look up an estimator by name in ``ADVANTAGES`` and call it (an unknown hyperparameter in ``kwargs`` raises a
    TypeError naming it)."""
    fn = ADVANTAGES.get(name)
    try:
        return fn(rewards, group_size, **kwargs)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise TypeError(f"advantage estimator {name!r}: {e}") from None
        raise
