"""Sequence scores from token log-probs.

The sequence confidence used by CAPO (arXiv 2604.12632, Sec. 3) and by perplexity-based calibration metrics is the
mean token log-prob of a response,

    lpm(o_i) = (1/|o_i|) * sum_t m_{i,t} * logp(o_{i,t}),      PPL(o_i) = exp(-lpm(o_i)).

Shapes: token_logp and mask are [N, T] (N = B*G responses, T padded response tokens); results are [N].
"""

from __future__ import annotations

import torch

from capo.core import checks


def _check(token_logp: torch.Tensor, mask: torch.Tensor) -> None:
    checks.tensor("token_logp", token_logp, ndim=2, floating=True)
    checks.tensor("mask", mask, ndim=2)
    checks.same_shape(token_logp=token_logp, mask=mask)


def sequence_logprob_sum(token_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t m_{i,t} logp_{i,t}: [N, T], [N, T] -> [N]. Padding positions never contribute (even if -inf/NaN)."""
    _check(token_logp, mask)
    m = mask.bool()
    return torch.where(m, token_logp, torch.zeros_like(token_logp)).sum(-1)


def sequence_logprob_mean(token_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """lpm(o_i) = sum_t m logp / |o_i|: [N, T], [N, T] -> [N].

    An empty response (|o_i| = 0) has lpm = 0 (PPL 1) by convention: it carries no evidence either way, and the
    trainer's numerical guards count such responses separately.
    """
    lengths = mask.bool().sum(-1)
    return sequence_logprob_sum(token_logp, mask) / lengths.clamp(min=1).to(token_logp.dtype)


def sequence_perplexity(token_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PPL(o_i) = exp(-lpm(o_i)): [N, T], [N, T] -> [N]."""
    return torch.exp(-sequence_logprob_mean(token_logp, mask))
