"""Loading a causal LM and its tokenizer, and the numeric policy (bf16 autocast) of the forwards that use it.

``spec`` everywhere is a local Hugging Face folder, ``DIR/FILE.gguf`` (dequantised by transformers; needs
``gguf``), ``"default"`` (capo's embedded tiny model) or a Hub id (downloaded by transformers for users who have
the Hub). Bad specs fail in :func:`check_model_spec` before anything heavy is loaded.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from capo.errors import ConfigError
from capo.tasks.datasets import GENERATED_TASKS

__all__ = ["AUTOCAST_MODES", "autocast_context", "check_model_spec", "eos_token_ids", "load_model",
           "load_tokenizer_and_context", "merge_eos_ids", "tune_cpu_allocator"]

AUTOCAST_MODES = ("auto", "on", "off")  # the one list of bf16 autocast policies (`capo eval --autocast`)
BUILTIN_MODELS = GENERATED_TASKS  # model specs naming a model shipped in capo/assets: one per generated task


MMAP_THRESHOLD = 1 << 30  # bytes: tensors below this are served from the heap and reused (tune_cpu_allocator)


def tune_cpu_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Keep large CPU tensors on glibc's heap instead of fresh ``mmap`` pages (``mallopt(M_MMAP_THRESHOLD)``).

    glibc serves every allocation above its mmap threshold (at most 32 MiB by default) with new pages and returns
    them on free. A KV cache that grows by one token per decoding step is re-allocated at every step; once its
    tensors pass 32 MiB (the reasoning testbed's shape: 128 rows x ~420 positions) each step maps, zero-fills and
    unmaps them, and the kernel's share of the sampler's time reached 65% (docs/results.md, "The reasoning
    testbed's step"). Above the threshold set here memory is reused instead. Numerics are untouched (tested: the same
    tokens and log-probs). Returns whether it applied: False off glibc (macOS, musl, Windows). The ``capo`` command
    calls it at start (``capo --system-malloc`` keeps glibc's defaults)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not name.startswith("libc.so"):
        return False
    try:
        libc = ctypes.CDLL(name)
        m_mmap_threshold = -3  # from glibc's <malloc.h>
        return bool(libc.mallopt(m_mmap_threshold, int(threshold)))
    except (OSError, AttributeError):
        return False


def _builtin_model_dir(spec: str) -> Path:
    from capo.tasks.generated import generated_task

    return generated_task(spec).model_dir


def check_model_spec(spec: str) -> None:
    """Fail fast on a local-looking model path that does not exist, or a shipped model missing from this
    installation (before anything heavy is loaded)."""
    if spec in BUILTIN_MODELS:
        d = _builtin_model_dir(spec)
        if not (d / "config.json").exists():
            raise ConfigError(f"model {spec!r}: not shipped in this installation (no model in {d}); build it with "
                              f"`capo build-default --task {spec} --out DIR` and pass DIR as the model")
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
    if spec in BUILTIN_MODELS:
        from capo.tasks.default import load_default

        model, tok = load_default(dtype=dtype, model_dir=_builtin_model_dir(spec))
    else:
        src, kw = _hf_source(spec)
        with _load_errors(spec):
            tok = AutoTokenizer.from_pretrained(src, **kw)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
        if kw and getattr(model.config, "quantization_config", None) is not None:
            model.config.quantization_config = None  # weights are dequantised; lets users save a normal folder
            model.hf_quantizer, model.is_quantized = None, False  # (checkpoints of a GGUF-started run are plain)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def _hf_source(spec: str) -> tuple[str, dict]:
    """What transformers' ``from_pretrained`` takes for ``spec``: a folder or Hub id, and ``gguf_file`` for a GGUF."""
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        return str(p.parent), {"gguf_file": p.name}
    return (str(p) if p.exists() else spec), {}


@contextlib.contextmanager
def _load_errors(spec: str):
    """A loading failure as a ConfigError naming the model (and an offline Hub, when set)."""
    try:
        yield
    except (OSError, ValueError) as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        raise ConfigError(
            f"could not load model {spec!r}{' (HF_HUB_OFFLINE is set)' if offline else ''}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None


def load_tokenizer_and_context(spec: str):
    """``(tokenizer, context)`` of a model without loading its weights: the tokenizer :func:`load_model` gives and the
    model's context window in positions (``max_position_embeddings``; None when the config has none)."""
    from transformers import AutoConfig, AutoTokenizer

    check_model_spec(spec)
    if spec in BUILTIN_MODELS:
        src, kw = str(_builtin_model_dir(spec)), {}
    else:
        src, kw = _hf_source(spec)
    with _load_errors(spec):
        tok = AutoTokenizer.from_pretrained(src, **kw)
        cfg = AutoConfig.from_pretrained(src, **kw)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok, getattr(cfg.get_text_config(), "max_position_embeddings", None)


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_context(mode: str, device: torch.device, n_params: int):
    """bf16 autocast: ``on``, ``off``, or ``auto`` (on for CUDA with bf16, and for CPUs with AVX512-bf16/AMX when
    the model has >= 25M parameters, where it is 2-3x faster than fp32)."""
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


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation-config EOS id(s)."""
    return merge_eos_ids(tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None))


def merge_eos_ids(*eos) -> list[int]:
    """The distinct ids among EOS specifications (each an id, a list of ids or None), in order; every engine stops a
    response at any of them. ConfigError if there is none."""
    ids: list[int] = []
    for e in eos:
        for i in e if isinstance(e, (list, tuple)) else [e]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ConfigError("the tokenizer and the model's generation config define no EOS token")
    return ids
