"""Load a causal LM and sample k responses per prompt with the per-token log-probs of the sampled tokens.

Log-prob definition (the one every perplexity metric in capo uses): for each generated token y_t,
``log p_theta(y_t | x, y_<t)`` = the model's raw ``log_softmax`` at temperature 1, with no top-p/top-k/repetition
processing -- the policy's own distribution, not the (tempered, truncated) sampling distribution. It is computed by
one extra forward pass over prompt + response after ``generate`` (micro-batched, only the response positions'
logits are kept), so it does not depend on which logits processors ``generate`` applied, and it is exactly what a
trainer's re-forward computes. ``mean_logprob`` = (1/T) sum_t log p(y_t), T = response tokens including the EOS
token when one was generated; ``PPL = exp(-mean_logprob)``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from capo.errors import ConfigError

__all__ = ["Sample", "check_model_spec", "load_model", "render_prompt", "sample_batch", "autocast_context"]

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


@torch.no_grad()
def _response_logprobs(model, seqs: torch.Tensor, attn: torch.Tensor, n_resp: int, micro: int) -> torch.Tensor:
    """[S, n_resp] float32 log p(token) at T=1 for the last ``n_resp`` positions of each (left-padded) sequence."""
    out = []
    for i in range(0, seqs.shape[0], micro):
        ids, am = seqs[i : i + micro], attn[i : i + micro]
        pos = (am.long().cumsum(-1) - 1).clamp(min=0)  # left padding: positions count real tokens only
        try:
            logits = model(input_ids=ids, attention_mask=am, position_ids=pos, logits_to_keep=n_resp + 1).logits
        except TypeError:  # older architectures without logits_to_keep
            logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits
        logits = logits[:, -(n_resp + 1) : -1].float()  # [m, n_resp, V] predicts the response tokens
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -n_resp:, None]).squeeze(-1)
        out.append(lp)
    return torch.cat(out, 0)


@torch.no_grad()
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
    logprob_micro_batch: int | None = None,
) -> list[list[Sample]]:
    """Sample ``k`` responses for each prompt (rendered text) in one ``generate`` call; returns ``[len(prompts)][k]``.

    The RNG is seeded with ``seed`` right before ``generate``, so the same batch with the same seed gives the same
    samples (on CPU). ``temperature == 0`` means greedy decoding (then the k samples are identical).
    """
    device = next(model.parameters()).device
    n_params = sum(p.numel() for p in model.parameters())
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    check_context(model, enc["attention_mask"], max_new_tokens, prompts)
    ids = enc["input_ids"].repeat_interleave(k, 0)  # [P*k, L]: the k samples of a prompt are contiguous
    am = enc["attention_mask"].repeat_interleave(k, 0)
    eos = tokenizer.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    gen_eos = model.generation_config.eos_token_id
    if gen_eos is not None:
        eos_ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    gen_kw = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    if temperature > 0:
        gen_kw.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0, repetition_penalty=1.0)
    else:
        gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    torch.manual_seed(seed)
    with autocast_context(autocast, device, n_params):
        out = model.generate(input_ids=ids, attention_mask=am, **gen_kw)
    resp = out[:, ids.shape[1] :]  # [S, R]
    S, R = resp.shape
    # response mask: tokens up to and including the first EOS
    is_eos = torch.zeros_like(resp, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= resp == e
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    mask = ~after_eos
    # pad tokens that equal neither EOS nor a real token can only appear after EOS; mask handles them
    lens = mask.sum(-1)
    lp = torch.zeros(S, R)
    if R > 0:
        full_am = torch.cat([am, mask.to(am.dtype)], dim=1)
        vocab = getattr(model.config, "vocab_size", 50_000) or 50_000
        micro = logprob_micro_batch or max(1, int(2e8 // max(1, (R + 1) * vocab)))
        with autocast_context(autocast, device, n_params):
            lp = _response_logprobs(model, out, full_am, R, micro).cpu()
    results: list[list[Sample]] = []
    for p in range(len(prompts)):
        row = []
        for j in range(k):
            s = p * k + j
            n = int(lens[s])
            toks = resp[s, :n].tolist()
            finished = bool(is_eos[s, :n].any())
            text_ids = toks[:-1] if finished else toks
            text = tokenizer.decode(text_ids, skip_special_tokens=True)
            lps = [float(x) for x in lp[s, :n].tolist()]
            if any(math.isnan(x) for x in lps):
                raise RuntimeError("NaN log-prob from the model: check the weights / dtype")
            row.append(Sample(text=text, token_ids=toks, token_logprobs=lps, finish_reason="stop" if finished else "length"))
        results.append(row)
    return results
