"""Load a causal LM and sample k responses per prompt with the per-token log-probs of the sampled tokens.

:func:`sample_rollout` is the one sampler of capo: the trainer's rollouts and ``capo eval`` both call it.

Log-prob definition (the one every perplexity metric in capo uses): for each generated token y_t,
``log p_theta(y_t | x, y_<t)`` = the model's raw ``log_softmax`` at temperature 1, with no top-p/top-k/repetition
processing -- the policy's own distribution, not the (tempered, truncated) sampling distribution. It is recorded
during ``generate`` by a forward hook on the model (the raw logits of every decoding step), so it costs no extra
forward pass and does not depend on which logits processors ``generate`` applied; it equals a re-forward over
prompt + response up to floating-point summation order (tested). ``mean_logprob`` = (1/T) sum_t log p(y_t),
T = response tokens including the EOS token when one was generated; ``PPL = exp(-mean_logprob)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from capo.errors import ConfigError

__all__ = ["Rollout", "Sample", "autocast_context", "check_model_spec", "eos_token_ids", "load_model", "render_prompt",
           "sample_batch", "sample_rollout"]

from capo.tasks.prompts import SYSTEM_BOXED, check_context, render_prompt  # noqa: F401  (re-exported)


def check_model_spec(spec: str) -> None:
    """Fail fast on a local-looking model path that does not exist (before anything heavy is loaded)."""
    if spec == "default":
        return
    p = Path(spec).expanduser()
    looks_local = spec.startswith((".", "/", "~")) or p.suffix == ".gguf" or p.exists() or spec.count("/") != 1
    if looks_local and not p.exists():
        raise ConfigError(
            f"model {spec!r}: no such file or folder (give a Hugging Face model folder, DIR/FILE.gguf, "
            "'default', or a Hub id like 'Qwen/Qwen2.5-Math-1.5B')"
        )
    if p.is_dir() and not (p / "config.json").is_file():
        raise ConfigError(f"model {spec!r} is a folder without config.json: not a Hugging Face model folder")
    if p.is_file() and p.suffix != ".gguf":
        raise ConfigError(f"model {spec!r} is a file but not a .gguf file; give a model folder or DIR/FILE.gguf")


def load_model(spec: str, dtype: torch.dtype = torch.float32):
    """Return ``(model, tokenizer)`` in eval mode, left-padding, with a pad token.

    ``spec``: a local Hugging Face folder, ``DIR/FILE.gguf`` (dequantised by transformers; needs ``gguf``),
    ``"default"`` (capo's embedded tiny model), or a Hub id (downloaded by transformers for users who have the Hub).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_spec(spec)
    if spec == "default":
        from capo.tasks.default import load_default

        model, tok = load_default(dtype=dtype)
    else:
        p = Path(spec).expanduser()
        kw = {}
        if p.suffix == ".gguf":
            kw = {"gguf_file": p.name}
            p = p.parent
        try:
            tok = AutoTokenizer.from_pretrained(str(p) if p.exists() else spec, **kw)
            model = AutoModelForCausalLM.from_pretrained(str(p) if p.exists() else spec, dtype=dtype, **kw)
        except (OSError, ValueError) as e:
            offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
            raise ConfigError(
                f"could not load model {spec!r}{' (HF_HUB_OFFLINE is set)' if offline else ''}: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from None
        if kw and getattr(model.config, "quantization_config", None) is not None:
            model.config.quantization_config = None  # weights are dequantised; lets users save a normal folder
            model.hf_quantizer, model.is_quantized = None, False  # (checkpoints of a GGUF-started run are plain)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_context(mode: str, device: torch.device, n_params: int):
    """bf16 autocast: ``on``, ``off``, or ``auto`` (on for CUDA with bf16, and for CPUs with AVX512-bf16/AMX when
    the model has >= 25M parameters, where it is 2-3x faster than fp32)."""
    import contextlib

    if mode == "off":
        return contextlib.nullcontext()
    if mode == "auto":
        if device.type == "cuda":
            on = torch.cuda.is_bf16_supported()
        else:
            on = device.type == "cpu" and _cpu_has_bf16() and n_params >= 25_000_000
        if not on:
            return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@dataclass
class Sample:
    """One sampled response: its token ids, decoded text, per-token log-probs and why it stopped."""

    text: str
    token_ids: list[int]
    token_logprobs: list[float]
    finish_reason: str  # "stop" (EOS generated) or "length" (hit max_new_tokens)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def sum_logprob(self) -> float:
        return float(sum(self.token_logprobs))

    @property
    def mean_logprob(self) -> float | None:
        return self.sum_logprob / self.n_tokens if self.n_tokens else None


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation-config EOS id(s)."""
    ids: list[int] = []
    for e in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        for i in e if isinstance(e, (list, tuple)) else [e]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ConfigError("the tokenizer and the model's generation config define no EOS token")
    return ids


@dataclass
class Rollout:
    """N = B*k sampled responses, the k responses of a prompt in contiguous rows.

    Shapes: prompt_ids/prompt_mask [N, P] (left-padded), response_ids/response_mask [N, T] (right-padded; the EOS
    token is a real, counted token), gen_logp [N, T] float32 (0 at padding), truncated [N] bool (hit
    max_new_tokens without EOS). ``texts``: the decoded responses without the EOS token."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    gen_logp: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def select(self, idx: torch.Tensor) -> Rollout:
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.response_ids[idx], self.response_mask[idx],
                       self.gen_logp[idx], [self.texts[i] for i in idx.tolist()], self.truncated[idx])


class _RecordLogprobs:
    """Forward hook on the causal LM: at every decoding step it sees the raw next-token logits (before any
    temperature/top-p/penalty processing), keeps their log-softmax, and at the next step gathers the log-prob of the
    token that was sampled (the next forward's last input id)."""

    def __init__(self):
        self.prev: torch.Tensor | None = None  # [N, V] log-softmax of the previous step
        self.out: list[torch.Tensor] = []

    def __call__(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, ids[:, -1:]).squeeze(-1))
        logits = output.logits if hasattr(output, "logits") else output[0]
        self.prev = torch.log_softmax(logits[:, -1].float(), dim=-1)

    def finish(self, sequences: torch.Tensor, n_new: int) -> torch.Tensor:
        if self.prev is not None and len(self.out) < n_new:
            self.out.append(self.prev.gather(-1, sequences[:, -1:]).squeeze(-1))
        if not self.out:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.out, dim=1)


def _shared_prefix_cache(model, ids: torch.Tensor, am: torch.Tensor, k: int):
    """KV cache of every prompt's first P-1 tokens, computed once per prompt and copied to its k rows (``generate``
    then runs only the last prompt token for the N = B*k rows). Returns None where the model gives no cache."""
    pos = (am.long().cumsum(-1) - 1).masked_fill(am == 0, 0)  # the position ids generate itself would use
    kw = dict(input_ids=ids[:, :-1], attention_mask=am[:, :-1], position_ids=pos[:, :-1], use_cache=True)
    try:
        out = model(**kw, logits_to_keep=1)
    except TypeError:  # architectures without logits_to_keep
        out = model(**kw)
    cache = getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    cache.batch_repeat_interleave(k)
    return cache


@torch.no_grad()
def sample_rollout(model, tokenizer, prompts: list[str], *, k: int, max_new_tokens: int, temperature: float = 1.0,
                   top_p: float = 1.0, share_prefix: bool = True) -> Rollout:
    """Sample ``k`` responses per prompt string with ``model.generate``; the one sampler of trainer and evaluation.

    The per-token log-probs are the policy's own (raw logits, log-softmax at temperature 1, no top-p/top-k or
    penalties), recorded during generation by a forward hook: no extra forward pass. Sampling uses only
    ``temperature``/``top_p`` (a fresh generation config: the model's own defaults, e.g. a repetition penalty, are
    not applied); ``temperature == 0`` is greedy decoding. ``share_prefix``: each prompt's prefix is run once and its
    KV cache copied to its k rows instead of k times (the knob ``rollout.share_prefix`` / eval's
    ``share_prefix``; exact up to floating-point summation order). Draws from torch's global RNG.
    """
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)  # complete
    check_context(model, enc["attention_mask"], max_new_tokens, prompts)
    eos = eos_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    ids, am = enc["input_ids"].repeat_interleave(k, 0), enc["attention_mask"].repeat_interleave(k, 0)  # [N, P]
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
        dict(do_sample=False)
    gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, **sampling)
    cache = None
    if share_prefix and k > 1 and enc["input_ids"].shape[1] > 1 and max_new_tokens > 0:
        cache = _shared_prefix_cache(model, enc["input_ids"], enc["attention_mask"], k)
    recorder = _RecordLogprobs()
    handle = model.register_forward_hook(recorder, with_kwargs=True)
    # generate() fills every field left unset in a passed config from model.generation_config (a checkpoint's
    # repetition penalty, top-k, min length, ...): swap in our own config so nothing but temperature/top_p shapes
    # the sampling distribution.
    model_cfg, model.generation_config = model.generation_config, gen_cfg
    try:
        seq = model.generate(input_ids=ids, attention_mask=am, generation_config=gen_cfg,
                             **({"past_key_values": cache} if cache is not None else {}))
    finally:
        model.generation_config = model_cfg
        handle.remove()
    resp = seq[:, ids.shape[1]:]  # [N, T]
    logp = recorder.finish(seq, resp.shape[1]).to(resp.device)
    is_eos = torch.isin(resp, torch.tensor(eos, device=resp.device))
    mask = (is_eos.long().cumsum(-1) - is_eos.long()) == 0  # real tokens: up to and including the first EOS
    truncated = ~(is_eos & mask).any(-1)
    n_text = mask.sum(-1) - (~truncated).long()  # the text excludes the EOS token
    texts = tokenizer.batch_decode([r[:n].tolist() for r, n in zip(resp, n_text)], skip_special_tokens=True)
    resp = resp.masked_fill(~mask, pad)
    logp = torch.where(mask, logp, torch.zeros_like(logp))
    return Rollout(ids, am, resp, mask.long(), logp, texts, truncated)


def sample_batch(
    model,
    tokenizer,
    prompts: list[str],
    *,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    autocast: str = "auto",
    share_prefix: bool = True,
) -> list[list[Sample]]:
    """Sample ``k`` responses for each prompt (rendered text) in one ``generate`` call; returns ``[len(prompts)][k]``.

    The RNG is seeded with ``seed`` right before sampling, so the same batch with the same seed gives the same
    samples (on CPU). ``temperature == 0`` means greedy decoding (then the k samples are identical).
    """
    device = next(model.parameters()).device
    n_params = sum(p.numel() for p in model.parameters())
    torch.manual_seed(seed)
    with autocast_context(autocast, device, n_params):
        ro = sample_rollout(model, tokenizer, prompts, k=k, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens, share_prefix=share_prefix)
    if not bool(torch.isfinite(ro.gen_logp).all()):
        raise RuntimeError("NaN or infinite log-prob from the model: check the weights / dtype")
    lens = ro.lengths.tolist()
    toks, lps = ro.response_ids.tolist(), ro.gen_logp.cpu().tolist()
    results: list[list[Sample]] = []
    for p in range(len(prompts)):
        row = []
        for j in range(k):
            s = p * k + j
            n = lens[s]
            row.append(Sample(text=ro.texts[s], token_ids=toks[s][:n], token_logprobs=lps[s][:n],
                              finish_reason="length" if bool(ro.truncated[s]) else "stop"))
        results.append(row)
    return results
