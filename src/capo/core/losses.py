"""Policy losses (behind ``POLICY_LOSSES``), KL estimators and the one loss-aggregation function.

Uniform policy-loss signature::

    loss_fn(logp, old_logp, advantages, mask, **hparams) -> (per_token_loss, metrics)

- ``logp``: [N, T] log pi_theta(o_{i,t}) of the sampled tokens (with grad).
- ``old_logp``: [N, T] log pi_old(o_{i,t}) from rollout time (no grad; ``logp.detach()`` when on-policy).
- ``advantages``: [N] per-response advantages, broadcast over tokens.
- ``mask``: [N, T] 1 for real response tokens, 0 for padding.
- ``per_token_loss``: [N, T], exactly 0 where mask is 0. Reduce it with :func:`aggregate`.
- ``metrics``: dict of detached 0-d tensors (masked means over real tokens).

Ratios are computed from log-ratios clamped to [-20, 20] before ``exp`` (as verl does); this changes nothing unless
a probability moved by a factor above e^20.
"""

from __future__ import annotations

import torch

from capo.core import checks
from capo.core.registry import POLICY_LOSSES

_LOG_RATIO_CLAMP = 20.0


def exp_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp of a log importance ratio clamped to +-_LOG_RATIO_CLAMP (no overflow to inf): any shape."""
    return torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))


def check_loss_inputs(logp, old_logp, advantages, mask):
    """The checks every registered policy loss makes at entry: logp and old_logp floating [N, T], advantages floating
    [N], mask [N, T]; ValueError naming the argument otherwise. Returns the mask in logp's dtype."""
    checks.tensor("logp", logp, ndim=2, floating=True)
    checks.tensor("old_logp", old_logp, ndim=2, floating=True)
    checks.tensor("advantages", advantages, ndim=1, floating=True)
    checks.tensor("mask", mask, ndim=2)
    checks.same_shape(logp=logp, old_logp=old_logp, mask=mask)
    if advantages.shape[0] != logp.shape[0]:
        raise ValueError(f"advantages has {advantages.shape[0]} rows but logp has {logp.shape[0]}; both must be N")
    return mask.to(logp.dtype)


def masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Detached mean of x over the real tokens (m [N, T] nonzero), 0 for an empty mask: a loss's logged metric."""
    return (zero_pad(x, m).sum() / m.sum().clamp(min=1)).detach()


def zero_pad(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x where m else 0; unlike ``x * m`` this keeps padding exactly 0 even if x is inf/NaN there."""
    return torch.where(m.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO-clip surrogate (Schulman et al. 2017, eq. 7; GRPO arXiv 2402.03300 eq. 3; DAPO's
    clip-higher, arXiv 2503.14476 eq. 10 uses eps_low=0.2, eps_high=0.28):

        r_{i,t} = exp(logp - old_logp),   l_{i,t} = -min(r A_i, clip(r, 1 - eps_low, 1 + eps_high) A_i)

    ``dual_clip`` (Ye et al. 2020, verl's ``clip_ratio_c``): for A < 0 the loss is further capped at
    -dual_clip * A; None (default, as TRL and the GRPO paper) disables it.
    Metrics: ``clip_frac`` (tokens where the clipped branch is taken), ``low_clip_frac`` (r < 1-eps_low, A < 0),
    ``high_clip_frac`` (r > 1+eps_high, A > 0), ``ratio_mean``.
    """
    checks.non_negative("eps_low", eps_low)
    checks.non_negative("eps_high", eps_high)
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 or None, got {dual_clip!r}")
    m = check_loss_inputs(logp, old_logp, advantages, mask)
    ratio = exp_ratio(logp - old_logp)  # [N, T]
    a = advantages[:, None]  # [N, 1]
    unclipped = -ratio * a
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * a
    loss = torch.maximum(unclipped, clipped)  # = -min(r A, clip(r) A)
    if dual_clip is not None:
        loss = torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)
    loss = zero_pad(loss, m)
    metrics = {
        "clip_frac": masked_mean((clipped > unclipped).to(m.dtype), m),
        "low_clip_frac": masked_mean(((ratio < 1 - eps_low) & (a < 0)).to(m.dtype), m),
        "high_clip_frac": masked_mean(((ratio > 1 + eps_high) & (a > 0)).to(m.dtype), m),
        "ratio_mean": masked_mean(ratio, m),
    }
    return loss, metrics


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio (1/|o_i|) sum_t (logp - old_logp): [N, T] x3 -> [N]."""
    m = mask.to(logp.dtype)
    return zero_pad(logp - old_logp, m).sum(-1) / m.sum(-1).clamp(min=1)


@POLICY_LOSSES.register("gspo", per_response=("clip_frac", "ratio_mean"))
def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO, sequence-level (arXiv 2507.18071, eqs. 5-7):

        s_i = exp((1/|o_i|) sum_t (logp - old_logp)),   l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    One term per sequence, broadcast to its real tokens, so ``aggregate(..., "seq-mean-token-mean")`` gives the
    paper's (1/G) sum_i l_i. Metrics: ``clip_frac`` (fraction of sequences clipped), ``ratio_mean``.
    """
    checks.non_negative("eps_low", eps_low)
    checks.non_negative("eps_high", eps_high)
    m = check_loss_inputs(logp, old_logp, advantages, mask)
    s = exp_ratio(sequence_log_ratio(logp, old_logp, mask))  # [N]
    unclipped = -s * advantages
    clipped = -s.clamp(1 - eps_low, 1 + eps_high) * advantages
    seq_loss = torch.maximum(unclipped, clipped)  # [N]
    has_tokens = (m.sum(-1) > 0).to(m.dtype)
    metrics = {
        "clip_frac": ((clipped > unclipped).to(m.dtype) * has_tokens).sum().detach() / has_tokens.sum().clamp(min=1),
        "ratio_mean": ((s * has_tokens).sum() / has_tokens.sum().clamp(min=1)).detach(),
    }
    return zero_pad(seq_loss[:, None].expand_as(logp), m), metrics


@POLICY_LOSSES.register("gspo_token", per_response=("clip_frac", "ratio_mean"))
def gspo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token (arXiv 2507.18071, eqs. 13-14): s_{i,t} = sg[s_i] * pi(o_{i,t}) / sg[pi(o_{i,t})],

        l_{i,t} = -min(s_{i,t} A_i, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_i)

    Numerically s_{i,t} = s_i; with equal per-token advantages its gradient under "seq-mean-token-mean" equals
    sequence-level GSPO's (a test checks this). Metrics as :func:`gspo_loss`.
    """
    checks.non_negative("eps_low", eps_low)
    checks.non_negative("eps_high", eps_high)
    m = check_loss_inputs(logp, old_logp, advantages, mask)
    s = exp_ratio(sequence_log_ratio(logp, old_logp, mask)).detach()
    s_tok = s[:, None] * torch.exp(logp - logp.detach())  # [N, T], value s_i, grad s_i * dlogp
    a = advantages[:, None]
    unclipped = -s_tok * a
    clipped = -s_tok.clamp(1 - eps_low, 1 + eps_high) * a
    loss = zero_pad(torch.maximum(unclipped, clipped), m)
    has_tokens = (m.sum(-1) > 0).to(m.dtype)
    seq_clipped = ((-s.clamp(1 - eps_low, 1 + eps_high) * advantages) > (-s * advantages)).to(m.dtype)
    metrics = {
        "clip_frac": (seq_clipped * has_tokens).sum() / has_tokens.sum().clamp(min=1),
        "ratio_mean": ((s * has_tokens).sum() / has_tokens.sum().clamp(min=1)).detach(),
    }
    return loss, metrics


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float | None = None,
    eps_high: float = 4.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eqs. 4-5): clip the importance weight, never drop a token's gradient:

        l_{i,t} = -sg[clip(r_{i,t}, 1 - eps_low, 1 + eps_high)] * A_i * logp_theta(o_{i,t})

    ``eps_low=None`` means no lower bound (the paper's practice: only the upper bound is active). The default
    upper bound 1 + 4.0 = 5 equals TRL's CISPO cap with ``epsilon_high=5``, the value TRL's docs recommend (TRL clamps
    at ``epsilon_high`` directly, and leaves it at ``epsilon`` = 0.2 when it is not set).
    Metrics: ``clip_frac`` (tokens whose weight was clipped), ``ratio_mean``.
    """
    checks.non_negative("eps_high", eps_high)
    if eps_low is not None:
        checks.non_negative("eps_low", eps_low)
    m = check_loss_inputs(logp, old_logp, advantages, mask)
    ratio = exp_ratio(logp - old_logp).detach()
    lo = None if eps_low is None else 1 - eps_low
    weight = ratio.clamp(min=lo, max=1 + eps_high)
    loss = zero_pad(-weight * advantages[:, None] * logp, m)
    metrics = {
        "clip_frac": masked_mean((weight != ratio).to(m.dtype), m),
        "ratio_mean": masked_mean(ratio, m),
    }
    return loss, metrics


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3", clamp: float | None = None) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimators (Schulman 2020, "Approximating KL divergence"), [N, T] -> [N, T]:

        k1 = logp - ref_logp
        k2 = 0.5 * (logp - ref_logp)^2
        k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1      (GRPO, arXiv 2402.03300 eq. 4)

    ``clamp``: optional symmetric clamp of the estimate (verl's "low_var_kl" clamps k3 to [-10, 10]; TRL does not;
    default None). Padding positions are not zeroed here: multiply by the mask or aggregate with it.
    """
    checks.choice("kind", kind, ("k1", "k2", "k3"))
    checks.tensor("logp", logp, ndim=2, floating=True)
    checks.tensor("ref_logp", ref_logp, ndim=2, floating=True)
    checks.same_shape(logp=logp, ref_logp=ref_logp)
    d = ref_logp - logp
    if kind == "k1":
        kl = -d
    elif kind == "k2":
        kl = 0.5 * d.square()
    else:
        kl = torch.exp(d) - d - 1
    return kl if clamp is None else kl.clamp(-clamp, clamp)


AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_seqs: int | float | None = None,
    num_tokens: int | float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce a [N, T] per-token loss to a scalar. The one aggregation function (names as verl's ``loss_agg_mode``):

    - "token-mean"              sum_{i,t} m l / sum_{i,t} m                     (DAPO, arXiv 2503.14476 eq. 8)
    - "seq-mean-token-mean"     (1/N) sum_i (sum_t m l / |o_i|)                 (GRPO, arXiv 2402.03300 eq. 3)
    - "seq-mean-token-sum"      (1/N) sum_i sum_t m l
    - "seq-mean-token-sum-norm" sum_{i,t} m l / (N * L_max)                     (Dr. GRPO, arXiv 2503.20783 eq. 4)

    For micro-batching and data parallelism pass the *global* denominators: ``num_seqs`` (N of the whole batch),
    ``num_tokens`` (real tokens of the whole batch); then the sum of the micro-batch losses equals the full-batch
    loss exactly. ``max_len``: L_max (default: T of this tensor; pass the generation limit for Dr. GRPO so the
    constant does not depend on padding). Empty responses contribute 0 and count in N; a batch without a token (or
    ``num_tokens`` 0) gives 0 in every mode.
    """
    checks.choice("mode", mode, AGGREGATIONS)
    checks.tensor("per_token_loss", per_token_loss, ndim=2, floating=True)
    checks.tensor("mask", mask, ndim=2)
    checks.same_shape(per_token_loss=per_token_loss, mask=mask)
    m = mask.to(per_token_loss.dtype)
    lm = torch.where(mask.bool(), per_token_loss, torch.zeros_like(per_token_loss))  # padding never leaks (NaN-safe)
    n = per_token_loss.shape[0] if num_seqs is None else num_seqs
    if mode == "token-mean":
        denom = m.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1)  # no token anywhere: 0
        return lm.sum() / denom
    if mode == "seq-mean-token-mean":
        return (lm.sum(-1) / m.sum(-1).clamp(min=1)).sum() / max(n, 1)
    if mode == "seq-mean-token-sum":
        return lm.sum() / max(n, 1)
    return lm.sum() / (max(n, 1) * (per_token_loss.shape[1] if max_len is None else max_len))


def policy_loss(name: str, logp, old_logp, advantages, mask, **hparams):
    """Look up a policy loss by name in ``POLICY_LOSSES`` and call it."""
    return POLICY_LOSSES.get(name)(logp, old_logp, advantages, mask, **hparams)
