"""model.lora_rank: LoRA adapters through peft. The adapted model starts exactly as the base, only the adapters
train, a checkpoint is a plain model of the merged weights that computes what the adapted model computes, and a
LoRA run resumes exactly from its checkpoint."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from capo.errors import ConfigError
from capo.rollout import load_model, token_logprobs
from capo.rollout.lora import add_lora, merged_state_dict
from capo.trainer.config import load_config
from capo.trainer.loop import Trainer
from test_trainer import _fixed_batch

SMALL = {"rollout.prompts_per_step": 2, "rollout.group_size": 4, "rollout.max_new_tokens": 10, "data.n_train": 32,
         "data.n_eval": 4, "run.eval_samples": 2, "run.progress": False, "optim.lr": 1e-2}
LORA = {"model.lora_rank": 4, "model.lora_alpha": 8.0}
sys.path.insert(0, str(Path(__file__).parent))  # reward_fns: a reward that varies on the untrained tiny model
LENGTH = {"algo.reward": "reward_fns:length_reward"}


def cfg_for(model, out, **kw):
    return load_config(None, {"model.path": model, "run.out_dir": str(out), **SMALL, **kw})


def _batch(n=6, p=5, t=7, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(3, vocab, (n, p), generator=g), torch.ones(n, p, dtype=torch.long),
            torch.randint(3, vocab, (n, t), generator=g), torch.ones(n, t, dtype=torch.long))


def test_the_adapted_model_starts_exactly_as_the_base(tiny_model):
    base, _ = load_model(tiny_model)
    adapted, _ = load_model(tiny_model)
    n = add_lora(adapted, 4, 8.0, "all-linear")
    x = _batch()
    assert torch.equal(token_logprobs(base, *x), token_logprobs(adapted, *x))  # B = 0: nothing added
    trained = [name for name, p in adapted.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    assert n["trained"] == sum(p.numel() for p in adapted.parameters() if p.requires_grad) < n["total"]
    assert not any("lm_head" in name or "embed" in name for name in trained)  # all-linear spares the head
    only_q = add_lora(load_model(tiny_model)[0], 2, 4.0, "q_proj")
    assert 0 < only_q["trained"] < n["trained"]


def test_only_the_adapters_train_and_a_checkpoint_is_the_merged_model(tiny_model, tmp_path):
    t = Trainer(cfg_for(tiny_model, tmp_path / "run", **LORA, **{"algo.name": "grpo"}))
    model = t.acc.unwrap_model(t.model)
    before = {k: v.detach().clone() for k, v in model.state_dict().items() if ".lora_" not in k}
    for seed in (5, 6):
        batch, _ = t.advantages(*_fixed_batch(t, seed), None, None)
        assert t.update(batch)["policy/updates"] == 1
    t.step = 2
    t.save()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the base is untouched
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if ".lora_B." in n)  # the adapters moved
    assert sum(len(g["params"]) for g in t.opt.param_groups) == sum(1 for p in model.parameters() if p.requires_grad)
    ck = tmp_path / "run" / "checkpoints" / "step-000002"
    saved = load_file(ck / "model.safetensors")
    assert not any("lora" in k or "base_layer" in k for k in saved)
    plain, _ = load_model(str(ck))  # a plain model of the base architecture
    x = _batch(seed=1)
    got, want = token_logprobs(plain, *x), token_logprobs(model, *x)
    assert not torch.equal(want, token_logprobs(load_model(tiny_model)[0], *x))  # training changed the model
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    merged = merged_state_dict(model)
    assert all(torch.equal(saved[k], merged[k]) for k in saved)


def test_a_lora_run_resumes_exactly(tiny_model, tmp_path):
    kw = {**LORA, **LENGTH, "algo.name": "grpo", "run.save_every": 2, "run.seed": 3}
    Trainer(cfg_for(tiny_model, tmp_path / "full", **{**kw, "run.steps": 4})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 2})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 4})).train()  # resumes from step 2

    def rows(run):
        return [{k: v for k, v in json.loads(ln).items() if not k.startswith(("time/", "eval/"))}
                for ln in (Path(run) / "metrics.jsonl").read_text().splitlines()]

    assert [r["step"] for r in rows(tmp_path / "part")] == [1, 2, 3, 4]
    assert rows(tmp_path / "full") == rows(tmp_path / "part")
    base = load_file(Path(tiny_model) / "model.safetensors")
    moved = load_file(tmp_path / "full/checkpoints/step-000002/model.safetensors")
    assert any(not torch.equal(base[k], moved[k]) for k in base)  # the adapters trained: resuming has work to do
    a = load_file(tmp_path / "full/checkpoints/step-000004/model.safetensors")
    b = load_file(tmp_path / "part/checkpoints/step-000004/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match=r"other settings \(.*model.lora_rank: 4 -> 0"):
        Trainer(cfg_for(tiny_model, tmp_path / "part", **{**LENGTH, "run.steps": 6}))  # resumed without its adapters
    (tmp_path / "part" / "config.yaml").unlink()  # a folder without its settings: the checkpoint itself tells
    with pytest.raises(ConfigError, match="a checkpoint of a LoRA run"):
        Trainer(cfg_for(tiny_model, tmp_path / "part", **{**LENGTH, "run.steps": 6}))


@pytest.mark.parametrize("override, message", [
    ({"model.lora_rank": -1}, "model.lora_rank"),
    ({"model.lora_rank": 4, "model.lora_alpha": 0}, "model.lora_alpha must be > 0"),
    ({"model.lora_rank": 4, "model.train_top_layers": 1}, "set one of them"),
    ({"model.lora_rank": 4, "rollout.engine": "vllm"}, "only the hf engine"),
])
def test_bad_lora_settings_are_refused(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        cfg_for("default", tmp_path, **override)


def test_a_target_the_model_lacks_is_refused_by_name(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="model.lora_targets='nope_proj'"):
        Trainer(cfg_for(tiny_model, tmp_path, **LORA, **{"model.lora_targets": "nope_proj"}))


def test_a_checkpoint_of_another_rank_is_refused_by_name(tiny_model, tmp_path):
    Trainer(cfg_for(tiny_model, tmp_path / "run", **LORA, **{"run.steps": 1})).train()
    with pytest.raises(ConfigError, match=r"other settings \(.*model.lora_rank: 4 -> 8"):  # the run's config.yaml
        Trainer(cfg_for(tiny_model, tmp_path / "run", **{**LORA, "model.lora_rank": 8, "run.steps": 2}))
    (tmp_path / "run" / "config.yaml").unlink()  # without it, the checkpoint's adapters tell
    with pytest.raises(ConfigError, match="LoRA adapters do not match the model's .*model.lora_\\* settings"):
        Trainer(cfg_for(tiny_model, tmp_path / "run", **{**LORA, "model.lora_rank": 8, "run.steps": 2}))
