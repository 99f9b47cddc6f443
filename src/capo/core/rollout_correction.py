"""Correction for the mismatch between the rollout engine's log-probs and the trainer's: truncated importance
sampling (TIS) and the mismatch statistics.

When responses are sampled by an engine other than the training forward (vLLM: other kernels, other summation order,
maybe another dtype), the sampling distribution pi_rollout differs slightly from the trainer's pi_old, and the PPO
ratio pi_theta / pi_old alone is then biased. TIS (Yao, Liu et al. 2025, "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training", eq. 4; verl's ``rollout_is="token"``, TRL's ``vllm_importance_sampling_mode=
"token_truncate"``) weights each token's policy loss by

    w_{i,t} = min( pi_old(o_{i,t}) / pi_rollout(o_{i,t}), C ) = min( exp(log pi_old - log pi_rollout), C ),

a constant (sg[.]): it carries no gradient. The cap C bounds the variance; tokens the engine made rarer than the
trainer would get weights above 1, tokens it made more likely get weights below 1.
"""

from __future__ import annotations

import torch

from capo.core import checks

__all__ = ["logprob_mismatch", "truncated_is_weights"]


def _check(old_logp, rollout_logp, mask):
    checks.tensor("old_logp", old_logp, ndim=2, floating=True)
    checks.tensor("rollout_logp", rollout_logp, ndim=2, floating=True)
    checks.tensor("mask", mask, ndim=2)
    checks.same_shape(old_logp=old_logp, rollout_logp=rollout_logp, mask=mask)
    return mask.bool()


def truncated_is_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                         cap: float) -> torch.Tensor:
    """Per-token TIS weights ``min(exp(old_logp - rollout_logp), cap)`` (Yao et al. 2025, eq. 4), detached.

    ``old_logp``: [N, T] log pi_old of the sampled tokens under the trainer's forward (no grad);
    ``rollout_logp``: [N, T] the engine's log-probs of the same tokens; ``mask``: [N, T] 1 for real tokens.
    Returns [N, T] weights, exactly 0 at padding. ``cap``: C >= 1. The log-ratio is clamped at 20 before ``exp``
    (as the policy losses do), so an infinite rollout log-prob gives weight ``cap``, not inf/NaN.
    """
    m = _check(old_logp, rollout_logp, mask)
    checks.positive("cap", cap)
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    log_ratio = (old_logp.detach() - rollout_logp.to(old_logp.dtype)).clamp(max=20.0)
    w = torch.exp(log_ratio).clamp(max=cap)
    return torch.where(m, w, torch.zeros((), dtype=w.dtype, device=w.device))


def logprob_mismatch(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics of ``|old_logp - rollout_logp|`` over the real tokens (mask [N, T]): 0-d detached tensors
    ``sum`` (of the absolute differences), ``count`` (tokens) and ``max`` (0 when there is no token)."""
    m = _check(old_logp, rollout_logp, mask)
    d = (old_logp.detach().double() - rollout_logp.double()).abs()
    d = torch.where(m, d, torch.zeros((), dtype=d.dtype, device=d.device))
    return {"sum": d.sum(), "count": m.sum().to(d.dtype), "max": d.max() if d.numel() else d.new_zeros(())}
