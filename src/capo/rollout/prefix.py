"""Shared prompt prefix: run each distinct prompt once and copy its keys/values to the rows that share it.

One helper for both places it pays: generation (each prompt's first P-1 tokens run once and the cache is copied to
its k sampled rows) and the training / reference / old-log-prob forwards (each distinct prompt runs once; its
keys/values stay in the autograd graph and the copy's backward sums the rows' gradients). Exact up to
floating-point summation order (tested in ``tests/rollout/test_forward_equivalence.py``).
"""

from __future__ import annotations

import dataclasses
import inspect
from contextlib import contextmanager

import torch

__all__ = ["GroupedPrefixAttention", "cache_kwarg", "grouped_prefix_attention", "output_cache", "position_ids",
           "shared_prefix"]


def cache_kwarg(module) -> str:
    """The keyword ``module``'s forward (and the ``generate`` of the same transformers) takes its KV cache under:
    ``"cache"`` where the forward names it so (transformers 5.2x renamed it; the old name warns and goes in 5.40),
    ``"past_key_values"`` before (the vLLM environments pin transformers < 5.20)."""
    forward = getattr(module, "forward", module)
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def output_cache(out):
    """The KV cache a forward returned (the output field ``cache`` or, before the rename, ``past_key_values``)."""
    names = {f.name for f in dataclasses.fields(out)} if dataclasses.is_dataclass(out) else set()
    return getattr(out, "cache" if "cache" in names else "past_key_values", None)


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0, 1, ... from each row's first real token (0 on padding). [R, L] -> [R, L]."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def shared_prefix(module, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, **kwargs):
    """Run ``module`` (a causal LM or its backbone) once over the distinct prompts ``ids``/``mask`` [U, L] and copy
    the KV cache to ``rows`` [N] (row n takes distinct prompt ``rows[n]``).

    Returns ``(output, cache)``; ``cache`` is None where the architecture gives no cache that can be copied by index
    (then the caller runs its plain forward). ``kwargs`` go to the forward (e.g. ``logits_to_keep=1``)."""
    out = module(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True, **kwargs)
    cache = output_cache(out)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return out, None
    cache.batch_select_indices(rows)
    return out, cache


GROUPED_PREFIX_ATTENTION = "capo_grouped_prefix"  # the name registered in transformers' attention interfaces


class GroupedPrefixAttention:
    """transformers attention function for decoding N = B*k rows whose first ``prefix_len`` cache positions are
    shared in groups of ``k`` (the prompt prefix that :func:`shared_prefix` copied to its k rows).

    At a decoding step (one query token per row) SDPA reads every row's whole KV cache, the k identical copies of
    the prompt included (and, with a preallocated cache, every position not yet written): the step is bound by that
    memory traffic. Here each group's k queries attend its prefix keys/values as one [k, D] x [D, P] product (the
    prefix read once per group, kept contiguous after the first step), each row attends its own written response
    positions, and one softmax runs over both parts: the same attention in exact arithmetic, different
    floating-point summation order (tested against SDPA in ``tests/rollout/test_forward_equivalence.py``).
    Every other call (prefill, no mask, dropout, a position bias or softcap, rows not in groups of k) goes to
    transformers' SDPA unchanged. Shapes: query [N, Hq, 1, D], key/value [N, Hkv, L, D], mask bool [N, 1, 1, L];
    returns [N, 1, Hq, D] as transformers' attention functions do."""

    def __init__(self, k: int, prefix_len: int):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        self.k, self.prefix_len, self.fallback = k, prefix_len, sdpa_attention_forward
        self._prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> keys, values [B, Hkv, P, D]
        self._mask: tuple[torch.Tensor, int] | None = None  # (this step's mask, end of its written positions)

    def _applies(self, query, key, mask, dropout, kwargs) -> bool:
        return (query.shape[2] == 1 and not dropout and mask is not None and mask.dtype == torch.bool
                and mask.shape[1] == 1 and query.shape[0] % self.k == 0 and key.shape[2] > self.prefix_len
                and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
                and not kwargs.get("is_causal"))

    def _end(self, mask: torch.Tensor) -> int:
        """One past the last key position any row may attend (the same for every layer of one forward)."""
        if self._mask is None or self._mask[0] is not mask:
            written = mask[:, 0, 0, self.prefix_len:].any(0).nonzero()
            self._mask = (mask, self.prefix_len + (int(written.max()) + 1 if written.numel() else 0))
        return self._mask[1]

    def __call__(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if not self._applies(query, key, attention_mask, dropout, kwargs):
            return self.fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        n, hq, _, d = query.shape
        k, p, hkv = self.k, self.prefix_len, key.shape[1]
        b, r, end = n // k, hq // hkv, self._end(attention_mask)
        layer = getattr(module, "layer_idx", id(module))
        if layer not in self._prefix:
            self._prefix[layer] = (key[::k, :, :p].contiguous(), value[::k, :, :p].contiguous())
        kp, vp = self._prefix[layer]
        scale = d ** -0.5 if scaling is None else scaling
        qg = query.reshape(b, k, hkv, r, d).transpose(1, 2).reshape(b, hkv, k * r, d)  # a group's queries
        s_pre = (qg @ kp.transpose(-1, -2)).reshape(b, hkv, k, r, p).transpose(1, 2).reshape(n, hkv, r, p)
        q = query.reshape(n, hkv, r, d)
        s_own = q @ key[:, :, p:end].transpose(-1, -2)  # [N, Hkv, r, S]
        keep = attention_mask[:, :, 0, :end].unsqueeze(2)  # [N, 1, 1, P + S]
        s = torch.cat([s_pre, s_own], -1).mul(scale).masked_fill(~keep, float("-inf"))
        w = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
        w_pre = w[..., :p].reshape(b, k, hkv, r, p).transpose(1, 2).reshape(b, hkv, k * r, p)
        out = (w_pre @ vp).reshape(b, hkv, k, r, d).transpose(1, 2).reshape(n, hkv, r, d)
        out = out + w[..., p:] @ value[:, :, p:end]
        return out.reshape(n, 1, hq, d), None


@contextmanager
def grouped_prefix_attention(model, k: int, prefix_len: int):
    """Within the block, ``model`` decodes with :class:`GroupedPrefixAttention` (rows in groups of ``k`` sharing
    their first ``prefix_len`` cache positions). Only for a model running transformers' SDPA attention (any other,
    or k < 2, or no prefix: unchanged); its attention implementation is restored on exit."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    if k < 2 or prefix_len < 1 or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    attend = GroupedPrefixAttention(k, prefix_len)
    AttentionInterface.register(GROUPED_PREFIX_ATTENTION, attend)
    AttentionMaskInterface.register(GROUPED_PREFIX_ATTENTION, sdpa_mask)  # the masks SDPA would get
    config._attn_implementation = GROUPED_PREFIX_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
        attend._prefix.clear()  # the registry keeps the function: drop the prefix copies it holds
        attend._mask = None
