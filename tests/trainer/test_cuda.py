"""The trainer on a CUDA device: every algorithm's rollout, reward, step, update, checkpoint, evaluation and resume
with CUDA tensors. Skipped without a GPU (CI has none); run on the lent H100 (docs/results.md, "The trainer on a
GPU"), where its first run found five CPU-only assumptions that these tests now guard."""

import sys
from pathlib import Path

import pytest
import torch

from capo.core.presets import ALGORITHMS
from capo.trainer.loop import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import cfg_for, rows  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# static KV cache: on CUDA, generate() would compile the forward with CUDA graphs unless capo turns that off;
# the length reward varies on a random model, so every estimator gets non-zero advantages and updates
CUDA = {"run.steps": 2, "algo.kl_coef": 0.01, "rollout.kv_cache": "static", "run.save_every": 1}


@pytest.mark.parametrize("reward", ["native", "length"])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_trains_on_cuda(tiny_model, tmp_path, algo, reward):
    extra = {} if reward == "native" else {"algo.reward": "reward_fns:length_reward"}
    tr = Trainer(cfg_for(tiny_model, tmp_path / algo, **{"algo.name": algo, **CUDA, **extra}))
    assert next(tr.model.parameters()).device.type == "cuda"
    assert tr.train()["step"] == 2
    r = rows(tmp_path / algo)
    assert [x["step"] for x in r] == [1, 2] and "eval/auc_mean" in r[-1] and "calib/auc_mean" in r[-1]
    assert all(v is None or v == v for v in r[-1].values())  # no NaN written
    if reward == "length" and algo != "dapo":  # DAPO may filter every group
        assert any(x.get("policy/grad_norm", 0.0) > 0 for x in r)


def test_resume_on_cuda_continues_the_run(tiny_model, tmp_path):
    """The checkpoint carries the CUDA RNG: a run cut at step 2 and resumed logs the uncut run's numbers."""
    kw = {"algo.name": "capo", **CUDA, "algo.reward": "reward_fns:length_reward", "run.save_every": 2, "run.seed": 3}
    Trainer(cfg_for(tiny_model, tmp_path / "full", **{**kw, "run.steps": 4})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 2})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 4})).train()  # resumes from step 2

    def nums(r):
        return {k: v for k, v in r.items() if not k.startswith(("time/", "eval/")) and isinstance(v, float)}

    full, part = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in part] == [1, 2, 3, 4]
    for a, b in zip(full, part):
        assert nums(b) == pytest.approx(nums(a), rel=1e-5, abs=1e-6)
