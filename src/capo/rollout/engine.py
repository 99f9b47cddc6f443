"""The generation-engine interface: what the trainer and ``capo eval`` need from whoever samples responses.

An engine turns complete prompt strings into a :class:`~capo.rollout.types.Rollout`: ``k`` responses per prompt in
contiguous rows, their token ids, and for every sampled token its raw temperature-1 log-prob under the policy
(``log_softmax`` of the unprocessed logits: no temperature, top-p, top-k or penalties), so that lpm, CAPO's scores,
AUC and the noise mask mean the same thing whichever engine sampled. Engines: ``hf`` (Hugging Face ``generate``,
:mod:`capo.rollout.sampling`) and ``vllm`` (:mod:`capo.rollout.vllm_engine`, its own environment).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Protocol

import torch

from capo.errors import ConfigError
from capo.rollout.types import Rollout

__all__ = ["DECODERS", "DEVICES", "ENGINES", "Engine", "KV_CACHES", "check_engine", "resolve_device"]

ENGINES = ("hf", "vllm")  # the one list of generation engines (config validation and `capo eval --engine`)
KV_CACHES = ("static", "dynamic")  # the hf engine's generation KV cache (``rollout.kv_cache``); the first is default
DECODERS = ("auto", "generate", "graph")  # the hf engine's decoding loop (``rollout.decode``); the first is default
DEVICES = ("auto", "cpu", "cuda")  # where `capo eval`'s hf engine runs the model (the trainer follows accelerate)


def resolve_device(name: str, *, flag: str = "--device") -> torch.device:
    """``auto``: CUDA when visible, else the CPU. ConfigError naming ``flag`` for an unknown name, or for ``cuda``
    where no GPU is visible."""
    if name not in DEVICES:
        raise ConfigError(f"{flag}: {name!r} is not allowed; allowed values: {', '.join(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{flag}: cuda was asked for but torch sees no CUDA GPU (use cpu or auto)")
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


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

    def sleep(self) -> None:
        """Free the engine's accelerator memory until the next :meth:`sample` / :meth:`sync_weights` (a no-op where
        there is nothing to free)."""
        ...

    def rng_state(self) -> dict | None:
        """The engine's own RNG stream for a checkpoint; None for an engine that draws from torch's global RNG
        (which the trainer checkpoints itself)."""
        ...

    def set_rng_state(self, state: dict | None) -> None:
        """Restore what :meth:`rng_state` returned."""
        ...


def check_engine(name: str, model: str | None, *, flag: str = "--engine") -> None:
    """Fail before anything is loaded or written: an unknown engine, or ``vllm`` with a model spec it cannot load
    (the embedded default, a GGUF file) or without vLLM installed. ConfigError naming ``flag`` and the way out."""
    if name not in ENGINES:
        raise ConfigError(f"{flag}={name!r} is not allowed; allowed values: {', '.join(ENGINES)}")
    if name != "vllm":
        return
    if model == "default":
        raise ConfigError(f"{flag}=vllm cannot run the embedded default model: its head_dim is 24, which vLLM's CPU "
                          "attention rejects, and it is built in memory, not a model folder. Use --engine hf "
                          "(rollout.engine=hf), or give a Hugging Face model folder or Hub id")
    from capo.rollout.models import resolve_model_spec

    if model is not None and Path(resolve_model_spec(model)).suffix == ".gguf":
        raise ConfigError(f"{flag}=vllm needs a Hugging Face model folder or Hub id, not a GGUF file ({model}): "
                          "save it as a folder first (load it with capo.rollout.load_model and save_pretrained) "
                          "or use --engine hf")
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError, AttributeError):  # a broken or deliberately hidden install
        found = False
    if not found:
        from capo.rollout.vllm_engine import INSTALL_HINT

        raise ConfigError(INSTALL_HINT)
