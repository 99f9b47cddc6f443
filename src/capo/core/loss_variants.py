"""Entropy-preserving and confidence-calibrating policy losses, behind ``POLICY_LOSSES`` with the uniform signature
of :mod:`capo.core.losses` (``loss_fn(logp, old_logp, advantages, mask, **hparams) -> (per_token_loss, metrics)``).

- ``clip_cov`` / ``kl_cov``: Cui et al., "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617).
  Their token covariances are computed over the tokens of the tensors passed in (one micro-batch), as verl does, so
  both are registered ``batch_dependent``: the micro-batch size changes their result.
- ``c2gspg``: Liu, Wang & Xu, arXiv 2509.23129; needs the keyword ``rewards`` [N] in [0, 1].
"""

from __future__ import annotations

import torch

from capo.core import checks
from capo.core.losses import check_loss_inputs, exp_ratio, masked_mean, zero_pad, gspo_loss
from capo.core.registry import POLICY_LOSSES


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred product Cov_{i,t} = (A_i - mean A) * (logp_{i,t} - mean logp), both means over the real
    tokens (token-weighted), everything detached (arXiv 2505.22617, eq. 10's summands). [N, T] -> [N, T]; padding
    positions hold 0."""
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    a = advantages.detach()[:, None].expand_as(logp)
    lp = logp.detach()
    a_bar = (a * m).sum() / n
    lp_bar = zero_pad(lp, m).sum() / n
    return zero_pad((a - a_bar) * (lp - lp_bar), m)


def logprob_advantage_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Batch covariance between a token's log-prob and its response's advantage, over the real tokens (token-weighted):
    Cov = (1/n) sum_{i,t} m_{i,t} (A_i - mean A)(logp_{i,t} - mean logp), n = sum m (arXiv 2505.22617, eq. 10, the
    quantity whose sign drives the entropy change under a policy-gradient step). logp [N, T], advantages [N], mask
    [N, T] -> scalar tensor (detached); 0 for an empty mask."""
    m = mask.to(logp.dtype)
    return token_covariance(logp, advantages, m).sum() / m.sum().clamp(min=1)


@POLICY_LOSSES.register("clip_cov", batch_dependent=True)
def clip_cov_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
    seed: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (arXiv 2505.22617, Sec. 4.2, eq. 11): PPO-clip, except that a few tokens whose covariance lies in
    (omega_low, omega_high) take no part (their loss term and gradient are 0):

        I = uniformly random floor(r * #tokens) (at least 1) of {(i,t): omega_low < Cov_{i,t} < omega_high,
            token not already clipped by PPO}
        l_{i,t} = -min(r_{i,t} A_i, clip(r_{i,t}, 1 - eps_low, 1 + eps_high) A_i) * 1[(i,t) not in I]

    Cov from :func:`token_covariance`. Defaults are verl's (r = ``clip_ratio`` 2e-4, omega 1 / 5). The random choice
    draws from ``generator`` if given, else from a fresh generator seeded with ``seed`` (never the global RNG);
    ``torch.Generator().manual_seed(s)`` gives the same choice as verl after ``torch.manual_seed(s)``.
    Metrics: ``clip_frac`` (PPO), ``cov_clip_frac`` (tokens removed), ``ratio_mean``.
    """
    checks.non_negative("eps_low", eps_low)
    checks.non_negative("eps_high", eps_high)
    checks.positive("clip_ratio", clip_ratio)
    if not cov_low < cov_high:
        raise ValueError(f"need cov_low < cov_high, got {cov_low!r}, {cov_high!r}")
    m = check_loss_inputs(logp, old_logp, advantages, mask)
    ratio = exp_ratio(logp - old_logp)
    a = advantages[:, None]
    unclipped, clipped = -ratio * a, -ratio.clamp(1 - eps_low, 1 + eps_high) * a
    ppo_clipped = (clipped > unclipped) & m.bool()
    cov = token_covariance(logp, advantages, mask)
    cand = ((cov > cov_low) & (cov < cov_high) & m.bool() & ~ppo_clipped).reshape(-1).nonzero().squeeze(1)
    n_clip = max(int(clip_ratio * float(m.sum())), 1)
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    chosen = cand[torch.randperm(len(cand), generator=gen)[:n_clip].to(cand.device)]
    keep = torch.ones(m.numel(), dtype=m.dtype, device=m.device)
    keep[chosen] = 0
    keep = keep.view_as(m)
    loss = zero_pad(torch.maximum(unclipped, clipped) * keep, m)
    metrics = {
        "clip_frac": masked_mean(ppo_clipped.to(m.dtype), m),
        "cov_clip_frac": masked_mean(1 - keep, m),
        "ratio_mean": masked_mean(ratio, m),
    }
    return loss, metrics


@POLICY_LOSSES.register("kl_cov", batch_dependent=True)
def kl_cov_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_ratio: float = 2e-4,
    kl_coef: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (arXiv 2505.22617, Sec. 4.2, eq. 12): the unclipped importance-weighted policy gradient, plus a
    penalty on the largest-covariance tokens:

        I = the top floor(k * #tokens) (at least 1) tokens by Cov_{i,t}
        l_{i,t} = -r_{i,t} A_i + beta * |log pi_theta(o_{i,t}) - log pi_old(o_{i,t})| * 1[(i,t) in I]

    Cov from :func:`token_covariance`. Defaults: k = ``kl_ratio`` 2e-4 (verl's), beta = ``kl_coef`` 1 (the
    paper's recipes and verl's KL-Cov function; verl's config default is 0.1). No ratio
    clipping: the paper's KL-Cov replaces it. Metrics: ``kl_cov_frac`` (tokens penalised), ``abs_kl_mean``,
    ``ratio_mean``, and ``clip_frac`` = 0 (the key every loss reports).
    """
    checks.positive("kl_ratio", kl_ratio)
    checks.non_negative("kl_coef", kl_coef)
    m = check_loss_inputs(logp, old_logp, advantages, mask)
    ratio = exp_ratio(logp - old_logp)
    abs_kl = (logp - old_logp).abs()
    real = m.reshape(-1).bool().nonzero().squeeze(1)
    cov = token_covariance(logp, advantages, mask).reshape(-1)[real]  # real tokens in row-major order
    k = min(max(int(kl_ratio * len(real)), 1), len(real))
    sel = torch.zeros(m.numel(), dtype=m.dtype, device=m.device)
    sel[real[torch.topk(cov, k).indices]] = 1
    sel = sel.view_as(m)
    loss = zero_pad(-ratio * advantages[:, None] + kl_coef * abs_kl * sel, m)
    metrics = {
        "clip_frac": torch.zeros((), dtype=m.dtype, device=m.device),  # KL-Cov never clips; every loss logs the key
        "kl_cov_frac": masked_mean(sel, m),
        "abs_kl_mean": masked_mean(abs_kl, m),
        "ratio_mean": masked_mean(ratio, m),
    }
    return loss, metrics


@POLICY_LOSSES.register("c2gspg", reads=("rewards",),
                       per_response=("clip_frac", "ratio_mean", "bce", "conf_mean"))
def c2gspg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    rewards: torch.Tensor | None = None,
    lam: float = 1.0,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    conf_eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """C2GSPG (arXiv 2509.23129, Sec. 3; reconstructed from the abstract): a group sequence policy gradient plus a
    cross-entropy regulariser that calibrates the sequence confidence to the reward:

        c_i = exp((1/|o_i|) sum_t log pi_theta(o_{i,t}))                   (normalised sequence probability, with grad)
        l_i = l_i^GSPO + lam * BCE(c_i, R_i),   BCE(c, R) = -[R log c + (1 - R) log(1 - c)]

    The policy-gradient part is GSPO's clipped sequence-ratio term (:func:`capo.core.losses.gspo_loss`, same eps);
    each sequence's term is broadcast to its real tokens, so "seq-mean-token-mean" gives (1/N) sum_i l_i.
    ``rewards`` [N] in [0, 1] (binary correctness in the paper's main setting); c is clamped to
    [conf_eps, 1 - conf_eps] inside the logs. ``lam=0`` is GSPO exactly. Metrics: GSPO's, plus ``bce`` and
    ``conf_mean`` (means over sequences).
    """
    checks.non_negative("lam", lam)
    checks.positive("conf_eps", conf_eps)
    m = check_loss_inputs(logp, old_logp, advantages, mask)
    if rewards is None:
        raise ValueError("c2gspg needs rewards: the per-response reward in [0, 1], shape [N]")
    checks.tensor("rewards", rewards, ndim=1, floating=True)
    if rewards.shape[0] != logp.shape[0]:
        raise ValueError(f"rewards has {rewards.shape[0]} rows but logp has {logp.shape[0]}; both must be N")
    if not ((rewards >= 0) & (rewards <= 1)).all():
        raise ValueError("rewards must lie in [0, 1] for the cross-entropy regulariser")
    pg, metrics = gspo_loss(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high)
    lpm = zero_pad(logp, m).sum(-1) / m.sum(-1).clamp(min=1)  # [N], with grad
    c = torch.exp(lpm).clamp(conf_eps, 1 - conf_eps)
    r = rewards.to(logp.dtype)
    bce = -(r * torch.log(c) + (1 - r) * torch.log1p(-c))  # [N]
    has = (m.sum(-1) > 0).to(m.dtype)
    metrics["bce"] = ((bce * has).sum() / has.sum().clamp(min=1)).detach()
    metrics["conf_mean"] = ((c * has).sum() / has.sum().clamp(min=1)).detach()
    return pg + zero_pad(lam * bce[:, None].expand_as(logp), m), metrics
