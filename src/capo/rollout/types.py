"""The data a rollout produces: :class:`Rollout` (tensors, what the trainer consumes) and :class:`Sample` (one
response as Python lists, what ``capo eval`` writes). Every engine returns the same :class:`Rollout`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Rollout", "Sample", "TOKEN_STATS"]

TOKEN_STATS = ("entropy", "kl_uniform", "topk_conf")  # what the hf engine's ``record_stats`` adds (capo.core.confidence)


@dataclass
class Sample:
    """One sampled response: its token ids, decoded text, per-token log-probs and why it stopped."""

    text: str
    token_ids: list[int]
    token_logprobs: list[float]
    finish_reason: str  # "stop" (EOS generated) or "length" (hit max_new_tokens)
    token_stats: dict[str, list[float]] | None = None  # per-token entropy / kl_uniform / topk_conf: those recorded

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def sum_logprob(self) -> float:
        return float(sum(self.token_logprobs))

    @property
    def mean_logprob(self) -> float | None:
        return self.sum_logprob / self.n_tokens if self.n_tokens else None


@dataclass
class Rollout:
    """N = B*k sampled responses, the k responses of a prompt in contiguous rows.

    Shapes: prompt_ids/prompt_mask [N, P] (left-padded), response_ids/response_mask [N, T] (right-padded; the EOS
    token is a real, counted token), gen_logp [N, T] float32 (0 at padding), truncated [N] bool (hit
    max_new_tokens without EOS). ``texts``: the decoded responses without the EOS token. ``token_stats``: when the
    engine recorded them, per-token statistics of each step's distribution, name -> [N, T] float32 (0 at padding;
    names in :data:`TOKEN_STATS`: all three from ``hf``, ``topk_conf`` alone from ``vllm``),
    else None."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    gen_logp: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor
    token_stats: dict[str, torch.Tensor] | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def select(self, idx: torch.Tensor) -> Rollout:
        stats = None if self.token_stats is None else {k: v[idx] for k, v in self.token_stats.items()}
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.response_ids[idx], self.response_mask[idx],
                       self.gen_logp[idx], [self.texts[i] for i in idx.tolist()], self.truncated[idx], stats)

    def to(self, device) -> Rollout:
        """The same rollout with its tensors on ``device`` (the tensors themselves where they are there already)."""
        stats = None if self.token_stats is None else {k: v.to(device) for k, v in self.token_stats.items()}
        return Rollout(self.prompt_ids.to(device), self.prompt_mask.to(device), self.response_ids.to(device),
                       self.response_mask.to(device), self.gen_logp.to(device), self.texts, self.truncated.to(device),
                       stats)

    def samples(self, k: int) -> list[list[Sample]]:
        """The responses as ``[B][k]`` :class:`Sample` lists (what ``capo eval`` writes), B = N // k."""
        lens, toks, lps = self.lengths.tolist(), self.response_ids.tolist(), self.gen_logp.cpu().tolist()
        stats = {n: v.cpu().tolist() for n, v in (self.token_stats or {}).items()}
        return [[Sample(text=self.texts[s], token_ids=toks[s][:lens[s]], token_logprobs=lps[s][:lens[s]],
                        finish_reason="length" if bool(self.truncated[s]) else "stop",
                        token_stats={n: v[s][:lens[s]] for n, v in stats.items()} or None)
                 for s in range(b * k, (b + 1) * k)] for b in range(len(self.texts) // k)]
