"""Shared prompt prefix: run each distinct prompt once and copy its keys/values to the rows that share it.

One helper for both places it pays: generation (each prompt's first P-1 tokens run once and the cache is copied to
its k sampled rows) and the training / reference / old-log-prob forwards (each distinct prompt runs once; its
keys/values stay in the autograd graph and the copy's backward sums the rows' gradients). Exact up to
floating-point summation order (tested in ``tests/rollout/test_forward_equivalence.py``).
"""

from __future__ import annotations

import torch

__all__ = ["position_ids", "shared_prefix"]


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0, 1, ... from each row's first real token (0 on padding). [R, L] -> [R, L]."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def shared_prefix(module, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, **kwargs):
    """Run ``module`` (a causal LM or its backbone) once over the distinct prompts ``ids``/``mask`` [U, L] and copy
    the KV cache to ``rows`` [N] (row n takes distinct prompt ``rows[n]``).

    Returns ``(output, cache)``; ``cache`` is None where the architecture gives no cache that can be copied by index
    (then the caller runs its plain forward). ``kwargs`` go to the forward (e.g. ``logits_to_keep=1``)."""
    out = module(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True, **kwargs)
    cache = getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return out, None
    cache.batch_select_indices(rows)
    return out, cache
