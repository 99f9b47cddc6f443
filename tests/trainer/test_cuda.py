"""The trainer on a CUDA device: every algorithm's rollout, reward, step, update, checkpoint, evaluation and resume
with CUDA tensors. Skipped unless the test device (tests/_device.py) is cuda: CI has no GPU; `sh scripts/gpu-check.sh`
runs them on a lent H100/H200 (docs/testing.md, "The trainer on a GPU"), where the first CUDA training run found the
CPU-only assumptions these tests now guard."""

import json
import random
import sys
from pathlib import Path

import pytest

from capo.core.presets import ALGORITHMS
from capo.trainer.loop import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import cfg_for, rows  # noqa: E402

from _device import DEVICE  # noqa: E402  (tests/ is on sys.path: its conftest.py)

cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (and CAPO_TEST_DEVICE unset or cuda)")
LENGTH = {"algo.reward": "reward_fns:length_reward"}  # varies on a random model: the estimators get advantages
# where a random model's batch leaves no advantage under the length reward too, read off what each preset implies
# (not its name: capo_sum uses capo's estimator and was missed by a list of names)
NO_ADVANTAGE_HERE = {"capo": "ranks correct against wrong responses",
                     "seed_grpo": "scales by 1 - semantic entropy: 0 when every answer differs"}


def no_advantage_here(algo: str) -> bool:
    """True where the preset's estimator gives a random model's batch no advantage under the length reward: DAPO's
    group filter drops every group, and the estimators of NO_ADVANTAGE_HERE."""
    preset = ALGORITHMS[algo]
    return bool(preset.get("group_filter")) or preset["advantage"] in NO_ADVANTAGE_HERE


@pytest.fixture
def over(tmp_path):
    """Two steps with a static KV cache (on CUDA, generate() would compile the forward with CUDA graphs unless capo
    turns that off) and generate's decoding (the CUDA-graph loop, rollout.decode's default on CUDA, compiles per
    model: it has the tests at the end of this file), a checkpoint each step, on chain sums written as a user JSONL file (the GPU machine has no
    reasoning-gym, which generates the default task)."""
    rng = random.Random(0)
    terms = [[rng.randint(1, 9) for _ in range(3)] for _ in range(40)]
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps({"prompt": "+".join(map(str, t)), "answer": str(sum(t))}) + "\n"
                            for t in terms))
    return {"run.steps": 2, "algo.kl_coef": 0.01, "rollout.kv_cache": "static", "run.save_every": 1,
            "data.dataset": str(path), "rollout.decode": "generate"}  # the CUDA-graph loop: its own tests below


@cuda
@pytest.mark.parametrize("reward", ["native", "length"])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_trains_on_cuda(tiny_model, tmp_path, over, algo, reward):
    tr = Trainer(cfg_for(tiny_model, tmp_path / algo, **{"algo.name": algo, **over,
                                                         **(LENGTH if reward == "length" else {})}))
    assert next(tr.model.parameters()).device.type == DEVICE
    assert tr.train()["step"] == 2
    r = rows(tmp_path / algo)
    assert [x["step"] for x in r] == [1, 2] and "eval/auc_mean" in r[-1] and "calib/auc_mean" in r[-1]
    assert all(v is None or v == v for v in r[-1].values())  # no NaN written
    # where a batch had non-zero advantages, the update ran on the GPU and moved the weights
    assert all(x.get("policy/grad_norm", 0.0) > 0 for x in r if x.get("policy/adv_abs_mean", 0.0) > 0)
    if reward == "length" and not no_advantage_here(algo):
        assert any(x.get("policy/adv_abs_mean", 0.0) > 0 for x in r)


def test_the_no_advantage_rule_follows_the_estimator_not_the_name():
    """Runs everywhere (no GPU needed): the rule above covers every preset built on capo's estimator."""
    assert {a for a in ALGORITHMS if no_advantage_here(a)} == {"dapo", "capo", "capo_sum", "seed_grpo"}


@cuda
def test_resume_on_cuda_continues_the_run(tiny_model, tmp_path, over):
    """A run cut at step 2 and resumed logs the uncut run's numbers (the checkpoint carries the CUDA RNG)."""
    kw = {**over, **LENGTH, "algo.name": "capo", "run.save_every": 2, "run.seed": 3}
    Trainer(cfg_for(tiny_model, tmp_path / "full", **{**kw, "run.steps": 4})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 2})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 4})).train()  # resumes from step 2

    def nums(r):
        return {k: v for k, v in r.items() if not k.startswith(("time/", "eval/")) and isinstance(v, float)}

    full, part = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in part] == [1, 2, 3, 4]
    for a, b in zip(full, part):
        assert nums(b) == pytest.approx(nums(a), rel=1e-5, abs=1e-6)


@cuda
def test_bf16_autocast_trains_on_cuda(tiny_model, tmp_path, over):
    """bf16 autocast with the static-cache setting: RoPE's fp32 keys beside bf16 values once broke the static cache
    (the engine now generates with the dynamic one under autocast)."""
    tr = Trainer(cfg_for(tiny_model, tmp_path / "bf16", **{**over, **LENGTH, "algo.name": "grpo",
                                                           "model.autocast_bf16": True}))
    assert tr.train()["step"] == 2
    assert any(x.get("policy/grad_norm", 0.0) > 0 for x in rows(tmp_path / "bf16"))


@cuda
@pytest.mark.parametrize("autocast", [False, True])
def test_the_cuda_graph_loop_trains_and_resumes_on_cuda(tiny_model, tmp_path, over, autocast):
    """rollout.decode's default on CUDA: capo's static-cache loop, each step a CUDA graph. CAPO trains with it (fp32
    and bf16 autocast: fp32 keys beside bf16 values in its static cache), the step really ran as a compiled graph, and
    a run cut at step 2 and resumed logs the uncut run's numbers (a fresh compile computes the same)."""
    kw = {**over, **LENGTH, "algo.name": "capo", "rollout.decode": "auto", "run.save_every": 2, "run.seed": 5,
          "model.autocast_bf16": autocast}
    full = Trainer(cfg_for(tiny_model, tmp_path / "full", **{**kw, "run.steps": 4}))
    assert full.train()["step"] == 4
    decoder = full.engine._decoder
    assert decoder is not None and decoder.graphs and decoder.compiled
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 2})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 4})).train()

    def nums(r):
        return {k: v for k, v in r.items() if not k.startswith(("time/", "eval/")) and isinstance(v, float)}

    a, b = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert all(v == v for r in a for v in nums(r).values())  # no NaN
    for x, y in zip(a, b):
        assert nums(y) == pytest.approx(nums(x), rel=1e-5, abs=1e-6)
