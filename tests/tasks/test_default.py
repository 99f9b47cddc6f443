"""The embedded default: shipped folder, tokenizer, problem generation, deterministic builder, output format."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from capo.tasks import default as d
from capo.tasks.problem import Problem
from capo.verify.extract import extract_rlcr


@pytest.fixture(scope="module")
def shipped():
    return d.load_default()


def test_shipped_folder_loads_with_plain_transformers():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = d.DEFAULT_MODEL_DIR
    assert (folder / "model.safetensors").exists()
    assert sum(f.stat().st_size for f in folder.iterdir()) < 8 * 2**20
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert model.config.model_type == "llama"
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "</s>" and tok.pad_token == "<pad>" and tok.bos_token == "<s>"
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    n = sum(p.numel() for p in model.parameters())
    assert 3e5 < n < 3e6
    ids = tok([d.format_prompt(d.default_problems("eval", 1)[0])], return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()


def test_tokenizer_round_trips_task_text(shipped):
    _, tok = shipped
    for p in d.default_problems("train", 50, seed=1) + d.default_problems("eval", 50, seed=1):
        for q in d.CONFIDENCE_GRID:
            text = d.format_prompt(p) + d.format_response(p, q)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == text
    # the tags are single tokens; BOS is added in front of prompts; decoding keeps the tags
    assert len(tok("<answer>", add_special_tokens=False)["input_ids"]) == 1
    assert tok("1+2=")["input_ids"][0] == tok.bos_token_id
    free = "Q: 12 + 3 =\n  <think>x</think> <answer>-15</answer><confidence>.25</confidence>~"
    assert tok.decode(tok(free, add_special_tokens=False)["input_ids"]) == free
    assert tok.decode(tok(free)["input_ids"] + [tok.eos_token_id], skip_special_tokens=True) == free


def test_problems_deterministic_disjoint_and_integer():
    a = d.default_problems("train", 300, seed=0)
    b = d.default_problems("train", 300, seed=0)
    assert [(p.id, p.prompt, p.answer) for p in a] == [(p.id, p.prompt, p.answer) for p in b]
    assert [p.prompt for p in d.default_problems("train", 300, seed=1)] != [p.prompt for p in a]
    ev = d.default_problems("eval", 400, seed=0)
    assert len({p.prompt for p in ev}) == len(ev)
    train_prompts = {p.prompt for s in (0, 1, 2) for p in d.default_problems("train", 2000, seed=s)}
    assert not train_prompts & {p.prompt for s in (0, 1) for p in d.default_problems("eval", 400, seed=s)}
    for p in a + ev:
        assert isinstance(p, Problem)
        assert str(int(p.answer)) == p.answer
        assert eval(p.prompt) == int(p.answer)  # noqa: S307 - digits and +/- only
        assert set(p.prompt) <= set("0123456789+-")
    with pytest.raises(ValueError, match="split"):
        d.default_problems("test", 3)


def test_format_response_parses_with_capo_extractor():
    for p in d.default_problems("eval", 30):
        text = d.format_response(p, "0.3")
        parse = extract_rlcr(text)
        assert parse.format_ok and parse.answer == p.answer and parse.confidence == pytest.approx(0.3)
    assert d.solution_trace("55+98-93+77") == "55+98=153 153-93=60 60+77=137"
    assert d.format_prompt(Problem("x", "4-1", "3")) == "4-1="


def test_tiny_build_is_deterministic_and_loadable(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(steps=3, batch_size=8, hidden=32, layers=1, heads=2, intermediate=64)
    s1 = d.build_default_model(tmp_path / "a", seed=5, **kw)
    s2 = d.build_default_model(tmp_path / "b", seed=5, **kw)
    s3 = d.build_default_model(tmp_path / "c", seed=6, **kw)
    wa, wb, wc = (load_file(str(tmp_path / x / "model.safetensors")) for x in "abc")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert s1["final_loss"] == s2["final_loss"]
    assert s1["params"] == s3["params"]
    assert json.loads((tmp_path / "a" / "capo_default.json").read_text())["seed"] == 5
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "a"))
    out = model.generate(**tok(["1+2="], return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 5 + 4) or out.shape[1] <= 9


def test_build_default_cli_rejects_bad_arguments(tmp_path):
    from capo.cli import main

    assert main(["build-default", "--out", str(tmp_path / "x"), "--steps", "0"]) == 2
    assert not (tmp_path / "x").exists()
