"""Rollouts: sample G responses per prompt with ``model.generate`` and record each sampled token's log-prob.

The log-probs are those of the policy itself (log-softmax of the raw logits, i.e. temperature 1, before any
temperature/top-p warping), recorded during generation by a logits processor at no extra forward pass. They are
the "rollout-time" log-probs: CAPO's sequence confidence lpm and the perplexity used by calibration metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList


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
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=True)
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


def token_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, *, autocast_bf16: bool = False,
                   with_entropy: bool = False):
    """Log-probs of the response tokens under ``model`` by one forward pass over prompt + response.

    Shapes: prompt_* [N, P], response_* [N, T] -> logp [N, T] (float32), and entropy [N, T] of the next-token
    distribution if ``with_entropy``. Padding positions hold finite values (mask them).
    """
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, response_mask], dim=1)
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids,
                       logits_to_keep=t + 1).logits  # [N, T+1, V]
    logits = logits[:, :-1].float()  # position j predicts token j+1: response token k is predicted at p-1+k
    logz = torch.logsumexp(logits, dim=-1)  # [N, T]
    logp = logits.gather(-1, response_ids[..., None]).squeeze(-1) - logz
    if not with_entropy:
        return logp
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = logz - (probs * logits).sum(-1)
    return logp, entropy
