"""The training forward: log-probs (and entropies) of given response tokens under a model, with gradient.

Used for the reference, old and training log-probs (trainer) and by the adapters' checks. For plain-head
architectures (Qwen2/3, Llama, Mistral) on an unwrapped model it runs the backbone, projects onto the vocabulary in
tiles (no [N, T, V] tensor), trims response columns past the longest response and, with ``share_prefix``, runs each
distinct prompt once (:func:`capo.rollout.prefix.shared_prefix`). Other models take one plain forward with
``logits_to_keep``. Every path is checked against an independent full-logits forward, gradients included
(``tests/rollout/test_forward_equivalence.py``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from capo.rollout.prefix import position_ids as _position_ids
from capo.rollout.prefix import cache_kwarg, shared_prefix

__all__ = ["ATTENTIONS", "LOGPROB_TILE_TOKENS", "attention", "token_logprobs"]

# transformers' attention implementations a log-prob forward may run with (``model.attention``): on the CPU, at short
# responses on a shared prefix (the facts task's 16 prompts x 8 x 16 tokens), SDPA's flash kernel spends more in its
# backward than the eager matmuls (docs/results/real-model.md, "Facts: the step"); rollouts keep the model's own (SDPA).
ATTENTIONS = ("sdpa", "eager")


@contextmanager
def attention(model, impl: str | None):
    """Within the block, ``model`` (or the model a DDP wrapper holds) runs transformers' attention ``impl`` (one of
    :data:`ATTENTIONS`); the implementation it had is restored on exit. None, or the one it has: unchanged. The
    autograd graph keeps the ops that ran, so a backward after the block differentiates ``impl``."""
    base = getattr(model, "module", model)
    cfg = getattr(base, "config", None)
    old = getattr(cfg, "_attn_implementation", None)
    if impl is None or old is None or old == impl:
        yield
        return
    if impl not in ATTENTIONS:
        raise ValueError(f"attention {impl!r} is not allowed; allowed values: {', '.join(ATTENTIONS)}")
    base.set_attn_implementation(impl)
    try:
        yield
    finally:
        base.set_attn_implementation(old)

# Architectures whose logits are exactly ``lm_head(backbone(x))`` (no soft-capping or logit scale): for these the
# log-probs are computed by :class:`_TiledLogprobs` from the backbone's hidden states without materialising [N, T, V].
_PLAIN_HEAD_TYPES = ("qwen2", "qwen3", "llama", "mistral")
LOGPROB_TILE_TOKENS = 1024  # tokens per vocabulary-projection tile: a [1024, V] float32 block (200 MB at V = 49k)


class _TiledLogprobs(torch.autograd.Function):
    """log softmax(h W^T)[target] (and the entropy, without gradient) over tiles of tokens.

    Forward keeps only the hidden states, the head weight and log Z; backward recomputes each tile's logits, so no
    [M, V] tensor outlives a tile (the full-logits path keeps bf16 logits, their float32 copy and a softmax). Shapes:
    hidden [M, d], weight [V, d], target [M] -> (logp [M], entropy [M]) in float32. ``dtype`` is the matmul dtype
    (bfloat16 under autocast, else the weight's)."""

    @staticmethod
    def forward(ctx, hidden, weight, target, dtype, tile):
        h, w = hidden.to(dtype), weight.to(dtype)
        logp, ent, logz = [], [], []
        for s in range(0, h.shape[0], tile):
            logits = (h[s:s + tile] @ w.T).float()  # [m, V]
            lz = torch.logsumexp(logits, dim=-1)
            logp.append(logits.gather(-1, target[s:s + tile, None]).squeeze(-1) - lz)
            logits.sub_(lz[:, None])  # log-probs, in place
            ent.append(-(logits.exp() * logits).sum(-1))
            logz.append(lz)
        ctx.save_for_backward(hidden, weight, target, torch.cat(logz))
        ctx.dtype, ctx.tile = dtype, tile
        entropy = torch.cat(ent)
        ctx.mark_non_differentiable(entropy)
        return torch.cat(logp), entropy

    @staticmethod
    def backward(ctx, g_logp, _g_entropy):
        hidden, weight, target, logz = ctx.saved_tensors
        h, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
        g_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        g_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        for s in range(0, h.shape[0], ctx.tile):
            e = slice(s, s + ctx.tile)
            probs = (h[e] @ w.T).float().sub_(logz[e, None]).exp_()  # [m, V]
            # d logp / d logits = onehot(target) - softmax
            d = probs.mul_(-g_logp[e, None].float())
            d.scatter_add_(-1, target[e, None], g_logp[e, None].float())
            d = d.to(ctx.dtype)
            if g_h is not None:
                g_h[e] = (d @ w).to(hidden.dtype)
            if g_w is not None:
                g_w += (d.T @ h[e]).float()
        return g_h, None if g_w is None else g_w.to(weight.dtype), None, None, None


def _shared_prefix_hidden(backbone, prompt_ids, prompt_mask, response_ids, attn, position_ids):
    """[N, T, d] hidden states predicting each response token, with every distinct prompt run once: the prompt pass
    gives U <= N rows of keys/values (with gradient), copied to the N rows by index (backward sums them), then the
    responses run on top. None when no two rows share a prompt (then one plain forward is cheaper)."""
    p = prompt_ids.shape[1]
    uniq, inv = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    if len(uniq) == len(prompt_ids):
        return None
    out, cache = shared_prefix(backbone, uniq[:, :p], uniq[:, p:], inv)
    if cache is None:
        return None
    h_resp = backbone(input_ids=response_ids, attention_mask=attn, position_ids=position_ids[:, p:],
                      use_cache=True, **{cache_kwarg(backbone): cache}).last_hidden_state  # [N, T, d]
    return torch.cat([out.last_hidden_state[inv, -1:], h_resp[:, :-1]], dim=1)


def _plain_head(model):
    """(backbone, lm_head) when the tiled path applies to ``model`` exactly, else None (wrapped models -- DDP must see
    its own forward -- and architectures with soft-capped or scaled logits use the full-logits path)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    head = getattr(model, "lm_head", None)
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or backbone is None:
        return None
    return backbone, head


def token_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, *, autocast_bf16: bool = False,
                   with_entropy: bool = False, share_prefix: bool = True, attention_impl: str | None = None):
    """Log-probs of the response tokens under ``model`` by one forward pass over prompt + response.

    Shapes: prompt_* [N, P], response_* [N, T] -> logp [N, T] (float32), and entropy [N, T] of the next-token
    distribution if ``with_entropy``. Padding positions hold finite values (mask them): response columns past the
    longest real response are not computed at all (they return 0), which is exact because attention is causal and
    responses are right-padded.

    ``share_prefix`` (plain-head architectures, unwrapped models): rows with the same prompt (the G responses of a
    group) run the prompt once; its keys/values, kept in the autograd graph, are copied to the rows and only the
    responses are run (exact up to floating-point summation order: the copy's backward sums the rows' gradients).
    ``attention_impl``: run the forward with this attention implementation (:func:`attention`); None: the model's.
    """
    n, t_full = response_ids.shape
    t = int(response_mask.sum(-1).max()) if n and t_full else 0  # longest real response
    if t < t_full:
        response_ids, response_mask = response_ids[:, :t], response_mask[:, :t]
    with attention(model, attention_impl):
        logp, entropy = _token_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, autocast_bf16,
                                       share_prefix)
    if t < t_full:
        logp = torch.nn.functional.pad(logp, (0, t_full - t))
        entropy = torch.nn.functional.pad(entropy, (0, t_full - t))
    return (logp, entropy) if with_entropy else logp


def _token_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, autocast_bf16, share_prefix):
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, response_mask], dim=1)
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    position_ids = _position_ids(attn)
    parts = _plain_head(model)
    if t == 0:
        z = torch.zeros(ids.shape[0], 0, device=ids.device)
        return z, z
    if parts is not None:
        backbone, head = parts
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
            hidden = _shared_prefix_hidden(backbone, prompt_ids, prompt_mask, response_ids, attn, position_ids) \
                if share_prefix and p > 0 else None
            if hidden is None:
                hidden = backbone(input_ids=ids, attention_mask=attn, position_ids=position_ids).last_hidden_state
                hidden = hidden[:, p - 1:p + t - 1]  # [N, T, d]: position j predicts token j+1
        dtype = torch.bfloat16 if autocast_bf16 else head.weight.dtype
        logp, entropy = _TiledLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), head.weight,
                                             response_ids.reshape(-1), dtype, LOGPROB_TILE_TOKENS)
        return logp.view(response_ids.shape), entropy.view(response_ids.shape)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids,
                       logits_to_keep=t + 1).logits  # [N, T+1, V]
    logits = logits[:, :-1].float()  # position j predicts token j+1: response token k is predicted at p-1+k
    logz = torch.logsumexp(logits, dim=-1)  # [N, T]
    logp = logits.gather(-1, response_ids[..., None]).squeeze(-1) - logz
    with torch.no_grad():
        entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy
