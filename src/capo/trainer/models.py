"""Load policies/references by the names users give: 'default', a local folder, DIR/FILE.gguf, or a Hub id."""

from __future__ import annotations

from pathlib import Path

import torch

from capo.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_model_path(path: str, key: str = "model.path") -> None:
    """Fail fast (before any work) on a local-looking model path that does not exist."""
    if path == "default":
        return
    p = Path(path)
    looks_local = path.startswith((".", "/", "~")) or p.suffix == ".gguf" or p.exists() or path.count("/") != 1
    if looks_local and not p.expanduser().exists():
        raise ConfigError(f"{key}={path!r}: no such file or folder (give 'default', a Hugging Face model folder, "
                          "DIR/FILE.gguf, or a Hub id like 'Qwen/Qwen2.5-Math-1.5B')")
    if p.is_dir() and not (p / "config.json").is_file():
        raise ConfigError(f"{key}={path!r} is a folder without config.json: not a Hugging Face model folder")


def load_model(path: str, dtype: str = "float32"):
    """Return (model, tokenizer) in eval mode with a pad token set."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_path(path)
    td = DTYPES[dtype]
    if path == "default":
        from capo.tasks.default import load_default

        model, tok = load_default(dtype=td)
    else:
        p = Path(path).expanduser()
        kw = {}
        if p.suffix == ".gguf":
            kw = {"gguf_file": p.name}
            p = p.parent
        try:
            tok = AutoTokenizer.from_pretrained(str(p), **kw)
            model = AutoModelForCausalLM.from_pretrained(str(p), dtype=td, **kw)
        except OSError as e:
            raise ConfigError(f"could not load model {path!r}: {e}") from None
        if getattr(model.config, "quantization_config", None) is not None and kw:
            model.config.quantization_config = None  # dequantized GGUF weights; save as a normal folder
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok
