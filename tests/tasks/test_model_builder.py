"""The one model builder every task's shipped model comes from (capo.tasks.model_builder).

The pinned weights: each task's public builder, at a tiny size, writes the same model.safetensors as the per-task
builders did before they became calls of ``build_model`` (hashes recorded with the old code, then checked equal
after the change, and equal over two runs). Floating-point sums differ between torch versions and CPU kernels, so
a pin holds only for the torch, transformers, CPU capability and CPU vendor it was recorded with (the same AVX-512
capability gives other sums on an Intel Xeon and an AMD EPYC: the BLAS picks its kernels by vendor); elsewhere the
test is skipped. The Intel pins are the ones checked against the per-task builders; the AMD ones were recorded
2026-12-02 from the code of e745644 (the same builders), when CI first ran on such a machine. Re-record (print
``_weights_sha(...)``) only when a change to the weights is intended, and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
import torch

from capo.tasks import coin_sum, default, stochastic, word_problems
from capo.tasks import model_builder as mb

PINNED = {  # (torch, transformers, torch's CPU capability, CPU vendor) -> first 16 hex digits of
    # sha256(model.safetensors), torch threads = 1
    ("2.13.0+cpu", "5.24.0", "AVX512", "GenuineIntel"): {
        "default": "4c5a885d36f5f91b",
        "stochastic": "18f7860dc1e78806",
        "binary": "29cc5c97c28a9302",
        "word": "5f62839b3f1a1181",
        "coin": "325e7c061645072a",
    },
    ("2.13.0+cpu", "5.24.0", "AVX512", "AuthenticAMD"): {
        "default": "39e48d8e33dedf22",
        "stochastic": "46fe4754d4c088bd",
        "binary": "c532a376d1eeadf5",
        "word": "d1acf98bbc7d5fb7",
        "coin": "04da2adae702a004",
    },
}
BUILDS = {
    "default": lambda o: default.build_default_model(o, seed=5, steps=3, batch_size=8, log_every=1),
    "stochastic": lambda o: stochastic.build_stochastic_model(o, seed=3, steps=3, batch_size=8, log_every=1),
    "binary": lambda o: stochastic.build_binary_model(o, seed=2, steps=3, batch_size=8),
    "word": lambda o: word_problems.build_word_model(o, seed=3, steps=2, batch_size=2, log_every=1),
    "coin": lambda o: coin_sum.build_coin_model(o, seed=2, steps=3, batch_size=8, log_every=1),
}


def _weights_sha(folder) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]


def _cpu_vendor() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("vendor_id")), "unknown")


def _environment() -> tuple[str, str, str, str]:
    import transformers

    return torch.__version__, transformers.__version__, torch.backends.cpu.get_cpu_capability(), _cpu_vendor()


@pytest.mark.parametrize("name", list(BUILDS))
def test_each_task_builder_writes_the_pinned_weights(name, tmp_path):
    if _environment() not in PINNED:
        pytest.skip(f"weights pinned on torch/transformers/CPU/vendor {list(PINNED)}, this is {_environment()}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        BUILDS[name](tmp_path / name)
    finally:
        torch.set_num_threads(threads)
    assert _weights_sha(tmp_path / name) == PINNED[_environment()][name]
    record = json.loads((tmp_path / name / "capo_default.json").read_text())
    assert record["seed"] == {"default": 5, "stochastic": 3, "binary": 2, "word": 3, "coin": 2}[name]


def _respond(problem, rng):
    return default.format_response(problem, rng.choice(mb.CONFIDENCE_GRID))


def _recipe(**kw) -> mb.ModelRecipe:
    base = dict(problems=lambda n: default.default_problems("train", n, seed=0), respond=_respond,
                prompt=default.format_prompt, steps=2, batch_size=2, lr=1e-3, warmup_steps=1,
                arch=mb.Architecture(16, 1, 2, 32))
    return mb.ModelRecipe(**(base | kw))


def test_a_recipe_needs_exactly_one_start_and_positive_sizes(tmp_path):
    with pytest.raises(ValueError, match="exactly one of arch"):
        _recipe(base_dir=tmp_path)
    with pytest.raises(ValueError, match="exactly one of arch"):
        _recipe(arch=None)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        _recipe(steps=0)
    with pytest.raises(ValueError, match="lr must be > 0"):
        _recipe(lr=0.0)


def test_build_model_draws_in_the_documented_order_and_saves_a_loadable_folder(tmp_path):
    built = mb.build_model(_recipe(seed=7), tmp_path / "m")
    model, tok = mb.load_model(tmp_path / "m")
    assert type(model).__name__ == "LlamaForCausalLM" and len(built.losses) == 2
    # the same draws by hand: manual_seed, Random(seed), init, problems, warm-up
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(7)
    rng = random.Random(7)
    tok2 = mb.build_tokenizer(256)
    qwen = Qwen2ForCausalLM(mb.model_config(tok2, 16, 1, 2, 32)).float()
    losses = mb.warmup(qwen, default.default_problems("train", 4, seed=0), tok2, rng, steps=2, batch_size=2,
                       lr=1e-3, warmup_steps=1, respond=_respond, prompt_fn=default.format_prompt)
    assert losses == built.losses
    for k, v in mb.export_llama(qwen).state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k


def test_a_missing_base_model_is_a_data_error_naming_the_folder(tmp_path):
    from capo.errors import DataError

    with pytest.raises(DataError, match="no default model at .*nowhere"):
        coin_sum.build_coin_model(tmp_path / "out", base_dir=tmp_path / "nowhere", steps=1, batch_size=1)
