"""capo's own decoding loop over a static KV cache, whose one-token step runs as a CUDA graph on a GPU: the hf
engine's sampler when ``rollout.decode`` (:data:`capo.rollout.engine.DECODERS`) selects it.

Why: at the reasoning testbed's shape a decoding step of a 5M-parameter model costs ~9 ms on an H200 under
``generate``, almost all of it kernel launches (docs/performance.md). Captured as a CUDA graph (``torch.compile(mode=
"reduce-overhead")``), a step's forward is one launch. ``generate`` cannot keep capo's log-prob hook inside a graph
(a replay overwrites the logits the hook kept: the CUDA-graph error found on an H100), so here the loop is capo's:
each step's forward returns its raw logits, and the sampled token's log-prob, the per-token statistics and the
sampling itself are computed from them outside the graph.

The loop samples exactly as ``generate`` does with capo's generation config, so at a fixed seed it draws the same
tokens from the same torch RNG stream (tested on the CPU: same tokens and log-probs): the same logits processors
(temperature, top-p), ``softmax`` then ``torch.multinomial`` (``argmax`` when greedy), rows that have emitted an
EOS token continue with the pad token, and the loop stops after the step where every row has finished (one host
synchronisation per step, as ``generate``'s stop check on the CPU). Positions are those ``generate`` gives
left-padded prompts. Every step has the same shapes, so a graph is compiled once per rollout shape and replayed at
every step of every later rollout of that shape: the cache is kept between rollouts (zeroed in place, so its
addresses, which the graph holds, do not change), one per row count (at most :data:`MAX_CACHES`: training's and
evaluation's), its length rounded up to a multiple of :data:`CACHE_BUCKET` positions and the attention mask
allocated for all of it (positions not yet written are hidden by causality). A cache only grows: a rollout whose
prompts and budget fit a kept cache decodes in it, so a training run whose prompt lengths vary from step to step
compiles once per growth, not at every step (the reasoning testbed's 3-step timing on an H200 recompiled each step
when the length followed each batch: docs/performance.md). torch compiles the step once per decoder and shape; past its
recompile limit (``torch._dynamo.config.recompile_limit``, 8 by default, counted per process) a further model or
shape decodes eagerly, with torch's warning.

Shapes: ``ids``/``am`` [N, P] (N = B*k rows, left-padded); tokens and log-probs [N, T] (T <= max_new_tokens).
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass

import torch

from capo.core.confidence import token_statistics
from capo.rollout.engine import DECODERS
from capo.rollout.prefix import cache_kwarg, position_ids
from capo.rollout.types import TOKEN_STATS

__all__ = ["CACHE_BUCKET", "MAX_CACHES", "Decoded", "StaticDecoder", "append_token_stats", "fill_cache",
           "new_static_cache", "use_static_decoder"]

CACHE_BUCKET = 64  # the static cache's length is P + max_new_tokens rounded up to a multiple of this
MAX_CACHES = 4  # static caches a decoder keeps, one per row count (the oldest is dropped)


@dataclass
class Decoded:
    """What :meth:`StaticDecoder.decode` returns: the sampled tokens [N, T] (the pad token after a row's EOS), each
    token's raw temperature-1 log-prob [N, T], and with ``record_stats`` the per-token statistics {name: [N, T]}."""

    tokens: torch.Tensor
    logp: torch.Tensor
    stats: dict[str, torch.Tensor] | None


def use_static_decoder(decode: str, device: torch.device) -> bool:
    """Whether ``rollout.decode`` = ``decode`` samples with :class:`StaticDecoder`: "graph" always (eagerly on the
    CPU, where CUDA graphs do not exist: for equivalence checks), "generate" never, "auto" on CUDA only."""
    if decode not in DECODERS:
        raise ValueError(f"decode must be one of {DECODERS}, got {decode!r}")
    return decode == "graph" or (decode == "auto" and device.type == "cuda")


def new_static_cache(model, max_len: int):
    """A transformers ``StaticCache`` of ``max_len`` positions for ``model``; None where the model takes no Cache
    object or this transformers has no layered static cache (the caller then samples another way)."""
    from transformers import StaticCache

    if not getattr(model, "_supports_default_dynamic_cache", lambda: False)():
        return None
    try:
        cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=max_len)
        layers = cache.layers  # the layered API (transformers >= 4.56)
    except (TypeError, AttributeError):
        return None
    for layer in layers:
        _writes_in_the_cache_dtype(layer)
    return cache


def _writes_in_the_cache_dtype(layer) -> None:
    """Make a static cache ``layer`` cast what it is given to the dtypes it holds. Under bf16 autocast RoPE returns
    fp32 keys beside bf16 values, and some transformers versions (5.17; not 5.24) hold values in fp32: a layer
    allocates both in the keys' dtype, and a DynamicCache prefix upcasts its values. The first bf16 write then failed
    (index_copy_: Float and BFloat16; seen on an H200). The upcast is exact; where the dtypes agree it does nothing.

    The wrapper reaches its layer through a weak reference: a strong one (the closure's cell, or the bound method it
    wraps) makes a cycle, layer -> its ``update`` -> the layer, which reference counting never frees. Every sampling
    call's cache (3.2 GB at the reasoning testbed's mask calibration) then stayed resident until Python's cyclic
    collector happened to run (docs/performance.md, "Memory of a testbed run")."""
    own, update = weakref.ref(layer), type(layer).update

    def cast_update(key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        lay = own()
        if lay.is_initialized:
            key_states, value_states = key_states.to(lay.keys.dtype), value_states.to(lay.values.dtype)
        return update(lay, key_states, value_states, *args, **kwargs)

    layer.update = cast_update


def fill_cache(cache, prefix) -> None:
    """Write ``prefix``'s keys/values (a DynamicCache of the prompts' first positions, one row per cache row) at
    the start of the static ``cache``, in place."""
    for static, filled in zip(cache.layers, prefix.layers, strict=True):
        static.update(filled.keys, filled.values)


def append_token_stats(stats: dict[str, list[torch.Tensor]], lp: torch.Tensor) -> None:
    """Append to ``stats`` the :data:`~capo.rollout.types.TOKEN_STATS` of one step's raw temperature-1 log-softmax
    ``lp`` [N, V] (the distribution the step's token is drawn from), each [N]."""
    st = token_statistics(lp, normalized=True)
    for name in TOKEN_STATS:
        stats[name].append(getattr(st, name))


def _processors(temperature: float, top_p: float):
    """The logits processors ``generate`` applies for capo's config (temperature, top-p; top_k=0 adds none). Neither
    reads the tokens so far (their ``input_ids`` argument)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    procs = LogitsProcessorList()
    if temperature > 0 and temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if temperature > 0 and top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return procs


class StaticDecoder:
    """Samples with capo's decoding loop (module docstring) for one model, keeping its static cache and compiled
    step between rollouts. ``graphs``: each step's forward is ``torch.compile(mode="reduce-overhead")`` (CUDA graphs;
    compiled at the first step of a new shape). ``backend``: compile the step with this torch.compile backend and
    ``fullgraph=True`` instead (the CPU tests trace it with "aot_eager" to show it compiles whole). Neither: eager."""

    def __init__(self, model, *, graphs: bool = False, backend: str | None = None):
        self.model, self.key, self.graphs = model, cache_kwarg(model), graphs
        self.cache, self.caches = None, {}  # the rollout's cache; kept caches by (rows, device)
        self.compiled = graphs or backend is not None  # False from a compiled step's failure on (eager)
        if self.compiled:
            kw = dict(mode="reduce-overhead") if graphs else dict(backend=backend, fullgraph=True)
            self._step = torch.compile(self._forward, dynamic=False, **kw)
        else:
            self._step = self._forward

    def supported(self) -> bool:
        """Whether this model can decode over a static cache here."""
        return new_static_cache(self.model, CACHE_BUCKET) is not None

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                         **{self.key: self.cache})
        return out.logits[:, -1].float()

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, written: int) -> torch.Tensor:
        """One decoding step's fp32 logits [N, V] from the last tokens and their positions [N, 1]; ``written``: the
        cache positions filled before it. Where compiling or replaying the step fails (a GPU stack without a working
        Triton, say), the step runs eagerly from then on, with a warning naming the error: the same numbers, slower."""
        if not self.compiled:
            return self._forward(tokens, positions, mask)
        try:
            if self.graphs:
                torch.compiler.cudagraph_mark_step_begin()
                return self._step(tokens, positions, mask).clone()  # the next replay overwrites the graph's output
            return self._step(tokens, positions, mask)
        except Exception as e:  # noqa: BLE001 -- any compiler failure: decode on, eagerly
            warnings.warn(f"rollout.decode: the compiled decoding step failed ({type(e).__name__}: {e}); decoding "
                          "eagerly from here on (same tokens, no CUDA graphs)", stacklevel=3)
            self.compiled, self._step = False, self._forward
            for layer in self.cache.layers:  # undo a partial write: the cache holds `written` positions
                layer.cumulative_length.fill_(written)
            return self._forward(tokens, positions, mask)

    def _cache_for(self, n: int, need: int, device: torch.device):
        """A zeroed static cache of ``n`` rows and at least ``need`` positions: the kept one for ``n`` rows (reset
        in place: the addresses a captured graph reads stay the same), or a new one rounded up to a multiple of
        :data:`CACHE_BUCKET` where none is kept or it is too short."""
        key = (n, device)
        cache = self.caches.pop(key, None)  # popped and put back: the dict's order is the order of use
        if cache is not None and cache.layers[0].max_cache_len >= need:
            cache.reset()
        else:
            cache = new_static_cache(self.model, -(-need // CACHE_BUCKET) * CACHE_BUCKET)
        self.caches[key] = cache
        while len(self.caches) > MAX_CACHES:
            self.caches.pop(next(iter(self.caches)))
        return cache

    def _start(self, ids: torch.Tensor, am: torch.Tensor, prefix, prefilled: int, max_new_tokens: int):
        """Take a zeroed cache for the rows (:meth:`_cache_for`), write the shared prefix, run the prompt positions the
        cache lacks eagerly; the last position's fp32 logits [N, V] and the mask [N, L] every step attends."""
        n, p = ids.shape
        self.cache = self._cache_for(n, p + max_new_tokens, ids.device)
        length = self.cache.layers[0].max_cache_len
        if prefix is not None:
            fill_cache(self.cache, prefix)
        out = self.model(input_ids=ids[:, prefilled:], attention_mask=am, use_cache=True, logits_to_keep=1,
                         position_ids=position_ids(am)[:, prefilled:], **{self.key: self.cache})
        return out.logits[:, -1].float(), torch.cat([am, am.new_ones(n, length - p)], dim=1)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, am: torch.Tensor, *, prefix=None, prefilled: int = 0, max_new_tokens: int,
               temperature: float, top_p: float, eos: list[int], pad: int, record_stats: bool = False) -> Decoded:
        """Sample up to ``max_new_tokens`` tokens after each row of ``ids``/``am`` [N, P] as ``generate`` would.
        ``prefix``: a DynamicCache of the first ``prefilled`` prompt positions (shared by each prompt's k rows and
        copied to them), or None (``prefilled`` = 0). Draws from torch's global RNG."""
        n = ids.shape[0]
        procs, eos_t = _processors(temperature, top_p), torch.tensor(eos, device=ids.device)
        logits, mask = self._start(ids, am, prefix, prefilled, max_new_tokens)
        pos = position_ids(am)[:, -1:]  # [N, 1]: the last prompt token's position
        unfinished = torch.ones(n, dtype=torch.bool, device=ids.device)
        tokens, logps = [], []
        stats: dict[str, list[torch.Tensor]] | None = {k: [] for k in TOKEN_STATS} if record_stats else None
        for t in range(max_new_tokens):
            if t:
                logits = self.step(tokens[-1][:, None], pos + t, mask, written=ids.shape[1] + t - 1)
            lp = torch.log_softmax(logits, dim=-1)  # the raw temperature-1 distribution the token is drawn from
            scores = procs(ids, logits)  # the processors ignore the token history (see _processors)
            nxt = torch.multinomial(torch.softmax(scores, -1), 1).squeeze(1) if temperature > 0 else scores.argmax(-1)
            nxt = torch.where(unfinished, nxt, torch.full_like(nxt, pad))
            tokens.append(nxt)
            logps.append(lp.gather(-1, nxt[:, None]).squeeze(-1))
            if stats is not None:
                append_token_stats(stats, lp)
            unfinished &= ~torch.isin(nxt, eos_t)
            if not bool(unfinished.any()):
                break
        return _stacked(tokens, logps, stats, n, ids.device)


def _stacked(tokens: list, logps: list, stats: dict | None, n: int, device) -> Decoded:
    if not tokens:
        empty = torch.zeros(n, 0, device=device)
        return Decoded(empty.long(), empty, {k: empty for k in TOKEN_STATS} if stats is not None else None)
    return Decoded(torch.stack(tokens, 1), torch.stack(logps, 1),
                   {k: torch.stack(v, 1) for k, v in stats.items()} if stats is not None else None)
