"""The Hugging Face engine: sample k responses per prompt with ``model.generate`` and record, for every sampled
token, its raw temperature-1 log-prob.

Log-prob definition (the one every perplexity metric in capo uses, whichever engine sampled): for each generated
token y_t, ``log p_theta(y_t | x, y_<t)`` = the model's raw ``log_softmax`` at temperature 1, with no
top-p/top-k/repetition processing -- the policy's own distribution, not the (tempered, truncated) sampling
distribution. Here it is recorded during ``generate`` by a forward hook on the model (the raw logits of every
decoding step), so it costs no extra forward pass and does not depend on which logits processors ``generate``
applied; it equals a re-forward over prompt + response up to floating-point summation order (tested).
``mean_logprob`` = (1/T) sum_t log p(y_t), T = response tokens including the EOS token when one was generated;
``PPL = exp(-mean_logprob)``.
"""

from __future__ import annotations

import warnings

import torch

from capo.rollout.decode import StaticDecoder, append_token_stats, fill_cache, new_static_cache, use_static_decoder
from capo.rollout.engine import DECODERS, KV_CACHES
from capo.rollout.models import autocast_context, eos_token_ids
from capo.rollout.prefix import cache_kwarg, grouped_prefix_attention, shared_prefix
from capo.rollout.types import TOKEN_STATS, Rollout
from capo.tasks.prompts import check_context

__all__ = ["HFEngine", "sample_rollout"]


class _RecordLogprobs:
    """Forward hook on the causal LM: at every decoding step it sees the raw next-token logits (before any
    temperature/top-p/penalty processing), keeps their log-softmax, and at the next step gathers the log-prob of the
    token that was sampled (the next forward's last input id). With ``stats`` it also keeps, for every step, the
    entropy / self-certainty / DeepConf confidence of that step's distribution
    (:func:`capo.core.confidence.token_statistics`): the step-t distribution is the one y_t was drawn from."""

    def __init__(self, stats: bool = False):
        self.prev: torch.Tensor | None = None  # [N, V] log-softmax of the previous step
        self.out: list[torch.Tensor] = []
        self.stats: dict[str, list[torch.Tensor]] | None = {k: [] for k in TOKEN_STATS} if stats else None

    def __call__(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, ids[:, -1:]).squeeze(-1))
        logits = output.logits if hasattr(output, "logits") else output[0]
        self.prev = torch.log_softmax(logits[:, -1].float(), dim=-1)
        if self.stats is not None:
            append_token_stats(self.stats, self.prev)

    def finish(self, sequences: torch.Tensor, n_new: int) -> torch.Tensor:
        if self.prev is not None and len(self.out) < n_new:
            self.out.append(self.prev.gather(-1, sequences[:, -1:]).squeeze(-1))
        if not self.out:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.out, dim=1)

    def finish_stats(self, n: int, n_new: int) -> dict[str, torch.Tensor] | None:
        """The per-token statistics [N, n_new] (one entry per generated token), None when not recorded."""
        if self.stats is None:
            return None
        return {k: torch.stack(v[:n_new], dim=1) if n_new else torch.zeros(n, 0) for k, v in self.stats.items()}


def _prefix_cache(model, ids: torch.Tensor, am: torch.Tensor, k: int):
    """KV cache of every prompt's first P-1 tokens, computed once per prompt and copied to its k rows (``generate``
    then runs only the last prompt token for the N = B*k rows). None where the model gives no such cache."""
    rows = torch.arange(ids.shape[0], device=ids.device).repeat_interleave(k)
    try:
        return shared_prefix(model, ids[:, :-1], am[:, :-1], rows, logits_to_keep=1)[1]
    except TypeError:  # architectures without logits_to_keep
        return shared_prefix(model, ids[:, :-1], am[:, :-1], rows)[1]


def _static_cache(model, prefix, max_len: int):
    """A KV cache preallocated for ``max_len`` positions, holding ``prefix``'s keys/values (a DynamicCache of the
    prompts' first P-1 tokens, already copied to the N rows) when given. Sized by this call alone (never by earlier
    calls, as ``generate(cache_implementation="static")`` would), so the same call computes the same numbers whatever
    ran before it. ``prefix`` unchanged (None: ``generate`` builds its own dynamic cache) where the model takes no
    Cache object or this transformers has no layered static cache."""
    cache = new_static_cache(model, max_len)
    if cache is None:
        if getattr(model, "_supports_default_dynamic_cache", lambda: False)():
            warnings.warn("rollout.kv_cache=static is not available with this transformers; sampling with the "
                          "dynamic cache", stacklevel=3)
        return prefix
    if prefix is not None:
        fill_cache(cache, prefix)  # positions 0..P-2
    return cache


def _generation_cache(model, enc, k: int, max_new_tokens: int, share_prefix: bool, kv_cache: str):
    """The KV cache ``generate`` starts from: the prompts' shared prefix (when shared) in a static or dynamic cache;
    None lets ``generate`` build its own dynamic one. Also returns the number of leading cache positions shared by
    each group of k rows (the prefix copied to them; 0 when none was)."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    cache, shared = None, 0
    if share_prefix and k > 1 and enc["input_ids"].shape[1] > 1 and max_new_tokens > 0:
        cache = _prefix_cache(model, enc["input_ids"], enc["attention_mask"], k)
        shared = enc["input_ids"].shape[1] - 1 if cache is not None else 0
    # under bf16 autocast RoPE can return fp32 keys beside bf16 values (CUDA, seen on an H100), which one static cache
    # cannot hold: the growing cache keeps each as it comes
    if kv_cache == "static" and max_new_tokens > 0 and not torch.is_autocast_enabled(enc["input_ids"].device.type):
        cache = _static_cache(model, cache, enc["input_ids"].shape[1] + max_new_tokens)
    return cache, shared


@torch.no_grad()
def sample_rollout(model, tokenizer, prompts: list[str], *, k: int, max_new_tokens: int, temperature: float = 1.0,
                   top_p: float = 1.0, share_prefix: bool = True, record_stats: bool = False,
                   kv_cache: str = KV_CACHES[0], prefix_attention: bool = True,
                   decoder: StaticDecoder | None = None) -> Rollout:
    """Sample ``k`` responses per prompt string; the one sampler of trainer and evaluation.

    The per-token log-probs are the policy's own (raw logits, log-softmax at temperature 1, no top-p/top-k or
    penalties), recorded while decoding: no extra forward pass. Sampling uses only ``temperature``/``top_p`` (a
    fresh generation config: the model's own defaults, e.g. a repetition penalty, are not applied);
    ``temperature == 0`` is greedy decoding. ``decoder``: sample with capo's static-cache decoding loop
    (:class:`capo.rollout.decode.StaticDecoder`, CUDA graphs on a GPU; the same tokens and log-probs as
    ``generate`` at a fixed seed) instead of ``model.generate`` with a log-prob hook. ``share_prefix``: each prompt's
    prefix is run once and its KV cache copied to its k rows instead of k times (the knob ``rollout.share_prefix`` /
    eval's ``share_prefix``; exact up to floating-point summation order). ``kv_cache``
    (:data:`capo.rollout.engine.KV_CACHES`, the knob ``rollout.kv_cache``; ``generate`` only): "static" preallocates
    the keys/values for the whole response (P + max_new_tokens positions) and writes each step in place; "dynamic"
    (transformers' default) grows them by concatenation, which copies the whole cache at every decoding step. Same
    distribution; the sampled tokens agreed exactly in the measured cases (docs/performance.md). ``record_stats``: also
    record each token's entropy, self-certainty and DeepConf confidence (:data:`TOKEN_STATS`, into
    ``Rollout.token_stats``) for the confidence estimators of :mod:`capo.core.confidence`. ``prefix_attention``
    (``generate`` with a shared prefix): each decoding step reads a group's prompt keys/values once
    (:class:`capo.rollout.prefix.GroupedPrefixAttention`, SDPA models); False attends the k copies with SDPA, for
    comparison. Draws from torch's global RNG."""
    device = next(model.parameters()).device
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)  # complete
    check_context(model, enc["attention_mask"], max_new_tokens, prompts)
    eos = eos_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    ids, am = enc["input_ids"].repeat_interleave(k, 0), enc["attention_mask"].repeat_interleave(k, 0)  # [N, P]
    sampling = dict(temperature=temperature, top_p=top_p, eos=eos, pad=pad, record_stats=record_stats)
    if decoder is not None and max_new_tokens > 0:
        prefix = _prefix_cache(model, enc["input_ids"], enc["attention_mask"], k) \
            if share_prefix and k > 1 and ids.shape[1] > 1 else None
        out = decoder.decode(ids, am, prefix=prefix, prefilled=ids.shape[1] - 1 if prefix is not None else 0,
                             max_new_tokens=max_new_tokens, **sampling)
        resp, logp, stats = out.tokens, out.logp, out.stats
    else:
        resp, logp, stats = _generate(model, enc, ids, am, k=k, max_new_tokens=max_new_tokens, kv_cache=kv_cache,
                                      share_prefix=share_prefix, prefix_attention=prefix_attention, **sampling)
    return _rollout(tokenizer, ids, am, resp, logp, stats, eos, pad)


def _generate(model, enc, ids, am, *, k: int, max_new_tokens: int, temperature: float, top_p: float, eos: list[int],
              pad: int, record_stats: bool, kv_cache: str, share_prefix: bool, prefix_attention: bool):
    """``model.generate`` with the log-prob hook: the response tokens [N, T], their log-probs [N, T] and the
    per-token statistics (None unless ``record_stats``)."""
    from transformers import GenerationConfig

    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
        dict(do_sample=False)
    gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,  # no CUDA graphs:
                               disable_compile=True, **sampling)  # they overwrite the logits the log-prob hook keeps
    cache, shared = _generation_cache(model, enc, k, max_new_tokens, share_prefix, kv_cache)
    recorder = _RecordLogprobs(stats=record_stats)
    handle = model.register_forward_hook(recorder, with_kwargs=True)
    # generate() fills every field left unset in a passed config from model.generation_config (a checkpoint's
    # repetition penalty, top-k, min length, ...): swap in our own config so nothing but temperature/top_p shapes
    # the sampling distribution.
    model_cfg, model.generation_config = model.generation_config, gen_cfg
    try:
        with grouped_prefix_attention(model, k, shared if prefix_attention else 0):
            seq = model.generate(input_ids=ids, attention_mask=am, generation_config=gen_cfg,
                                 **({cache_kwarg(model): cache} if cache is not None else {}))
    finally:
        model.generation_config = model_cfg
        handle.remove()
    resp = seq[:, ids.shape[1]:]  # [N, T]
    return resp, recorder.finish(seq, resp.shape[1]).to(resp.device), recorder.finish_stats(*resp.shape)


def _rollout(tokenizer, ids, am, resp, logp, stats, eos: list[int], pad: int) -> Rollout:
    """The Rollout of sampled ``resp`` [N, T]: real tokens up to and including each row's first EOS, the rest
    padding (and 0 log-prob / statistics); the texts decoded without the EOS token."""
    is_eos = torch.isin(resp, torch.tensor(eos, device=resp.device))
    mask = (is_eos.long().cumsum(-1) - is_eos.long()) == 0  # real tokens: up to and including the first EOS
    truncated = ~(is_eos & mask).any(-1)
    n_text = mask.sum(-1) - (~truncated).long()  # the text excludes the EOS token
    texts = tokenizer.batch_decode([r[:n].tolist() for r, n in zip(resp, n_text)], skip_special_tokens=True)
    resp = resp.masked_fill(~mask, pad)
    logp = torch.where(mask, logp, torch.zeros_like(logp))
    if stats is not None:
        stats = {k: torch.where(mask, v.to(resp.device), torch.zeros_like(logp)) for k, v in stats.items()}
    return Rollout(ids, am, resp, mask.long(), logp, texts, truncated, token_stats=stats)


class HFEngine:
    """The ``hf`` engine: samples with the training model itself (so :meth:`sync_weights` has nothing to do).

    ``autocast``: bf16 policy of the sampling forwards (:data:`capo.rollout.models.AUTOCAST_MODES`).
    ``share_prefix``: each prompt's prefix runs once per group (``rollout.share_prefix`` / eval's ``share_prefix``).
    ``kv_cache``: the generation KV cache, :data:`capo.rollout.engine.KV_CACHES` (``rollout.kv_cache``).
    ``decode``: the decoding loop, :data:`capo.rollout.engine.DECODERS` (``rollout.decode``): "auto" is capo's
    static-cache loop with CUDA graphs on a GPU (:mod:`capo.rollout.decode`) and ``generate`` on the CPU; "graph"
    the loop everywhere (eager on the CPU); "generate" ``model.generate`` everywhere. The loop needs the static
    cache: with ``kv_cache="dynamic"``, "auto" means ``generate``. The loop keeps its cache and compiled step
    between calls, for the model last synced.
    """

    name = "hf"

    def __init__(self, model, tokenizer, *, autocast: str = "off", share_prefix: bool = True,
                 record_stats: bool = False, kv_cache: str = KV_CACHES[0], decode: str = DECODERS[0]):
        if decode not in DECODERS:
            raise ValueError(f"decode must be one of {DECODERS}, got {decode!r}")
        if decode == "graph" and kv_cache != "static":
            raise ValueError("decode='graph' decodes over a static KV cache: it needs kv_cache='static'")
        self.model, self.tokenizer, self.autocast, self.share_prefix = model, tokenizer, autocast, share_prefix
        self.record_stats = record_stats  # per-token entropy / self-certainty / DeepConf confidence (eval)
        self.kv_cache, self.decode = kv_cache, decode
        self._decoder: StaticDecoder | None = None

    def decoder(self, device: torch.device) -> StaticDecoder | None:
        """The static-cache decoder this engine samples with on ``device`` (None: ``generate``); made once per
        model and kept. ValueError for decode="graph" with a model that cannot decode over a static cache."""
        if self.kv_cache != "static" or not use_static_decoder(self.decode, device):
            return None
        if self._decoder is None or self._decoder.model is not self.model:
            decoder = StaticDecoder(self.model, graphs=device.type == "cuda")
            if not decoder.supported():
                if self.decode == "graph":
                    raise ValueError(f"decode='graph' needs a model that takes a static KV cache; "
                                     f"{type(self.model).__name__} does not here: use decode='generate'")
                return None
            self._decoder = decoder
        return self._decoder

    def sample(self, prompts: list[str], *, k: int, max_new_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, seed: int | None = None) -> Rollout:
        """See :class:`capo.rollout.engine.Engine`. ``seed``: ``torch.manual_seed(seed)`` first (the HF sampler
        draws from torch's global RNG); None continues the current stream."""
        if seed is not None:
            torch.manual_seed(seed)
        device = next(self.model.parameters()).device
        n_params = sum(p.numel() for p in self.model.parameters())
        with autocast_context(self.autocast, device, n_params):
            return sample_rollout(self.model, self.tokenizer, prompts, k=k, max_new_tokens=max_new_tokens,
                                  temperature=temperature, top_p=top_p, share_prefix=self.share_prefix,
                                  record_stats=self.record_stats, kv_cache=self.kv_cache,
                                  decoder=self.decoder(device))

    def sync_weights(self, model) -> None:
        """Nothing to copy: the engine samples with the training model. Pass the unwrapped model being trained."""
        self.model = model

    def sleep(self) -> None:
        """Nothing to free: the weights are the training model's."""

    def rng_state(self) -> None:
        """None: this engine draws from torch's global RNG, which the trainer checkpoints itself."""
        return None

    def set_rng_state(self, state: None) -> None:
        """Nothing to restore (see :meth:`rng_state`)."""
