"""Rollouts: sample G responses per prompt with ``model.generate`` and record each sampled token's log-prob.

The log-probs are those of the policy itself (log-softmax of the raw logits, i.e. temperature 1, before any
temperature/top-p warping), recorded during generation by a logits processor at no extra forward pass. They are
the "rollout-time" log-probs: CAPO's sequence confidence lpm and the perplexity used by calibration metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from capo.tasks.prompts import check_context


@dataclass
class Rollout:
    """N = B*G responses (rows of one prompt contiguous). Shapes: prompt_ids/prompt_mask [N, P] (left-padded),
    response_ids/response_mask [N, T] (right-padded, EOS included as a real token), gen_logp [N, T]."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    gen_logp: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without EOS

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def select(self, idx: torch.Tensor) -> Rollout:
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.response_ids[idx], self.response_mask[idx],
                       self.gen_logp[idx], [self.texts[i] for i in idx.tolist()], self.truncated[idx])


class _RecordLogprobs(LogitsProcessor):
    """Sees the raw next-token logits at every step; the token sampled at step t is input_ids[:, -1] at step t+1."""

    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len
        self.prev: torch.Tensor | None = None  # [N, V] log-softmax of the previous step
        self.out: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        n_new = sequences.shape[1] - self.prompt_len
        if self.prev is not None and len(self.out) < n_new:
            self.out.append(self.prev.gather(-1, sequences[:, -1:]).squeeze(-1))
        if not self.out:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.out, dim=1)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, group_size: int, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, autocast_bf16: bool = False) -> Rollout:
    """Sample ``group_size`` responses for each prompt string. Returns a :class:`Rollout` with N = len(prompts) * G."""
    device = next(model.parameters()).device
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)  # prompts are complete
    check_context(model, enc["attention_mask"], max_new_tokens, prompts)
    prompt_ids = enc["input_ids"].repeat_interleave(group_size, 0).to(device)  # [N, P]
    prompt_mask = enc["attention_mask"].repeat_interleave(group_size, 0).to(device)
    recorder = _RecordLogprobs(prompt_ids.shape[1])
    eos = tokenizer.eos_token_id
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        seq = model.generate(
            input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=True, temperature=temperature, top_p=top_p,
            top_k=0, max_new_tokens=max_new_tokens, logits_processor=LogitsProcessorList([recorder]),
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos, eos_token_id=eos,
        )
    resp = seq[:, prompt_ids.shape[1]:]  # [N, T]
    logp = recorder.finish(seq).to(resp.device)
    # real tokens: everything up to and including the first EOS
    is_eos = resp == eos
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
    mask = (~after_eos).long()
    truncated = ~is_eos.any(-1)
    texts = tokenizer.batch_decode(resp.masked_fill(~mask.bool(), eos), skip_special_tokens=True)
    resp = resp.masked_fill(~mask.bool(), tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))
    return Rollout(prompt_ids, prompt_mask, resp, mask, logp, texts, truncated)


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
                   with_entropy: bool = False):
    """Log-probs of the response tokens under ``model`` by one forward pass over prompt + response.

    Shapes: prompt_* [N, P], response_* [N, T] -> logp [N, T] (float32), and entropy [N, T] of the next-token
    distribution if ``with_entropy``. Padding positions hold finite values (mask them): response columns past the
    longest real response are not computed at all (they return 0), which is exact because attention is causal and
    responses are right-padded.
    """
    n, t_full = response_ids.shape
    t = int(response_mask.sum(-1).max()) if n and t_full else 0  # longest real response
    if t < t_full:
        response_ids, response_mask = response_ids[:, :t], response_mask[:, :t]
    logp, entropy = _token_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, autocast_bf16)
    if t < t_full:
        logp = torch.nn.functional.pad(logp, (0, t_full - t))
        entropy = torch.nn.functional.pad(entropy, (0, t_full - t))
    return (logp, entropy) if with_entropy else logp


def _token_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, autocast_bf16):
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, response_mask], dim=1)
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    parts = _plain_head(model)
    if t == 0:
        z = torch.zeros(ids.shape[0], 0, device=ids.device)
        return z, z
    if parts is not None:
        backbone, head = parts
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
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
