"""The generation-engine interface: what the trainer and ``capo eval`` need from whoever samples responses.

An engine turns complete prompt strings into a :class:`~capo.rollout.types.Rollout`: ``k`` responses per prompt in
contiguous rows, their token ids, and for every sampled token its raw temperature-1 log-prob under the policy
(``log_softmax`` of the unprocessed logits: no temperature, top-p, top-k or penalties), so that lpm, CAPO's scores,
AUC and the noise mask mean the same thing whichever engine sampled. Engines: ``hf`` (Hugging Face ``generate``,
:mod:`capo.rollout.sampling`) and ``vllm`` (:mod:`capo.rollout.vllm_engine`, its own environment).
"""

from __future__ import annotations

from typing import Protocol

from capo.rollout.types import Rollout

__all__ = ["ENGINES", "Engine"]

ENGINES = ("hf", "vllm")  # the one list of generation engines (config validation and `capo eval --engine`)


class Engine(Protocol):
    """What a generation engine provides."""

    name: str

    def sample(self, prompts: list[str], *, k: int, max_new_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, seed: int | None = None) -> Rollout:
        """``k`` responses per prompt (complete strings, tokenized without extra special tokens). ``seed``: seed
        the engine's sampler first (None: continue its RNG stream). ``temperature == 0`` is greedy decoding."""
        ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from ``model``'s current weights (after an optimizer step). A no-op for an engine
        that samples with the training model itself."""
        ...
