"""The trainer's engine wiring: truncated importance sampling applies exactly when the engine's log-probs are not
the trainer's own, the mismatch is logged, and `rollout.engine` / `--engine` reject what they cannot run."""

import importlib.util
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from capo.errors import ConfigError
from capo.rollout import HFEngine
from capo.trainer.config import load_config
from capo.trainer.data import render_prompts
from capo.trainer.loop import Trainer

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


class ShiftedEngine(HFEngine):
    """The HF engine with its recorded log-probs lowered by ``shift`` nats per token: an engine whose log-probs
    differ from the trainer's by a known amount (as vLLM's do by numerics)."""

    name = "shifted"

    def __init__(self, model, tok, shift):
        super().__init__(model, tok)
        self.shift = shift

    def sample(self, *args, **kwargs):
        ro = super().sample(*args, **kwargs)
        return replace(ro, gen_logp=torch.where(ro.response_mask.bool(), ro.gen_logp - self.shift, 0.0))


def _config(model, out, **kw):
    return load_config(None, {"model.path": model, "run.out_dir": str(out), "rollout.prompts_per_step": 4,
                              "rollout.group_size": 4, "rollout.max_new_tokens": 10, "data.n_train": 32,
                              "data.n_eval": 4, "run.progress": False, "optim.max_grad_norm": 0.0,
                              "run.resume": False, **kw})


def _one_update(model, out, shift=None, **kw):
    """The gradient of one GRPO update on a fixed rollout batch (rewards fixed), and the update's statistics."""
    tr = Trainer(_config(model, out, **kw), engine=None if shift is None else ShiftedEngine(None, None, shift))
    tr.engine.sync_weights(tr.acc.unwrap_model(tr.model))
    tr.engine.tokenizer = tr.tok
    torch.manual_seed(5)
    ro = tr.engine.sample(render_prompts(tr.train_set[:4], tr.tok, tr.cfg.data, use_chat_template=False), k=4,
                          max_new_tokens=10)
    rewards = torch.rand(16, generator=torch.Generator().manual_seed(5)).round()
    g, _ = tr.reward(ro, tr.train_set[:4])
    batch, _ = tr.advantages(ro, g, rewards, None, None)
    seen, step = [], tr.opt.step
    tr.opt.step = lambda *a, **k: (seen.append(torch.cat([p.grad.flatten() for p in tr.model.parameters()])),
                                   step(*a, **k))[1]
    stats = tr.update(batch)
    return seen[0], stats


def test_tis_weights_the_loss_only_for_a_mismatched_engine(tiny_model, tmp_path):
    base, s_hf = _one_update(tiny_model, tmp_path / "hf")
    assert base.abs().max() > 1e-4
    assert s_hf["rollout/logprob_diff_max"] < 1e-4  # HF's recorded log-probs are the trainer's own (up to numerics)
    # log-probs lower by log 1.5 => every weight is 1.5 (below the cap 2): the gradient is 1.5x the uncorrected one
    g15, s15 = _one_update(tiny_model, tmp_path / "a", shift=math.log(1.5))
    torch.testing.assert_close(g15, 1.5 * base, rtol=1e-4, atol=1e-6 * float(base.abs().max()))
    assert s15["rollout/logprob_diff_mean"] == pytest.approx(math.log(1.5), abs=1e-4)
    assert s15["rollout/logprob_diff_max"] == pytest.approx(math.log(1.5), abs=1e-4)
    g3, _ = _one_update(tiny_model, tmp_path / "b", shift=math.log(3.0))  # weight 3 > cap 2: truncated at 2
    torch.testing.assert_close(g3, 2.0 * base, rtol=1e-4, atol=1e-6 * float(base.abs().max()))
    g_off, _ = _one_update(tiny_model, tmp_path / "c", shift=math.log(3.0), **{"rollout.tis_cap": 0})
    torch.testing.assert_close(g_off, base, rtol=1e-4, atol=1e-6 * float(base.abs().max()))  # 0 = off


@pytest.mark.parametrize("override,message", [
    ({"rollout.engine": "sglang"}, "rollout.engine='sglang' is not allowed; allowed values: hf, vllm"),
    ({"rollout.tis_cap": 0.5}, r"rollout.tis_cap must be 0 \(off\) or >= 1, got 0.5"),
    ({"rollout.vllm_gpu_memory_utilization": 1.5}, r"rollout.vllm_gpu_memory_utilization must be in \(0, 1\]"),
    ({"rollout.engine": "vllm"}, "rollout.engine=vllm cannot run the embedded default model: its head_dim is 24"),
    ({"rollout.engine": "vllm", "model.path": "/tmp/m.gguf"}, "no such file"),
])
def test_engine_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, override)


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "capo.cli", *argv], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)


def test_cli_engine_vllm_on_the_default_model_names_head_dim_and_hf(tmp_path):
    p = _cli("eval", "--model", "default", "--engine", "vllm", "--limit", "1", "--out", str(tmp_path / "e"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "head_dim is 24" in p.stderr and "--engine hf" in p.stderr
    assert not (tmp_path / "e").exists()  # nothing written


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed here")
def test_cli_engine_vllm_without_vllm_gives_the_install_command(tiny_model, tmp_path):
    p = _cli("eval", "--model", tiny_model, "--engine", "vllm", "--limit", "1", "--out", str(tmp_path / "e"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "vLLM is not installed" in p.stderr and "sh scripts/engine-env.sh vllm" in p.stderr
    assert "pip install -e '.[vllm]'" in p.stderr and "--engine hf" in p.stderr
    assert not (tmp_path / "e").exists()
    p = _cli("train", "--model.path", tiny_model, "--rollout.engine", "vllm", "--run.out_dir", str(tmp_path / "t"))
    assert p.returncode == 2 and "vLLM is not installed" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "t").exists()


def test_help_shows_the_engines():
    assert "{hf,vllm}" in _cli("eval", "--help").stdout
    out = _cli("train", "--help").stdout
    assert "--rollout.engine" in out and "--rollout.tis_cap" in out and "vllm_sleep_mode" in out


def test_eval_resume_refuses_another_engine_and_takes_older_runs_as_hf(tiny_model, tmp_path, capsys):
    import json

    from capo.cli import main

    out = tmp_path / "r"
    argv = ["eval", "--model", tiny_model, "--dataset", "default", "--limit", "2", "-k", "2", "--max-new-tokens", "4",
            "--n-boot", "0", "--verify-workers", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["engine"] == "hf"
    (out / "config.json").write_text(json.dumps({**cfg, "engine": "vllm"}))
    assert main(argv) == 2
    assert "engine: 'vllm' -> 'hf'" in capsys.readouterr().err
    del cfg["engine"]  # a run directory written before --engine existed was sampled by the HF engine
    (out / "config.json").write_text(json.dumps(cfg))
    assert main(argv) == 0
