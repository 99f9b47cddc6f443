"""Numerical guards, user reward functions and the run-directory lock."""

import dataclasses

import pytest
import torch

from capo.errors import CapoError
from capo.trainer.loop import Trainer
from capo.trainer.user_reward import user_rewards

from test_trainer import _fixed_batch, cfg_for, record_grads, rows


@pytest.fixture
def reward_path(monkeypatch):
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent))


def test_nan_reward_and_inf_logprob_never_reach_parameters(tiny_model, tmp_path):
    tr = Trainer(cfg_for(tiny_model, tmp_path, **{"rollout.prompts_per_step": 4, "run.resume": False,
                                                  "optim.lr": 1e-2}))
    ro, g, rewards = _fixed_batch(tr)
    rewards[1] = float("nan")  # group 0
    ro.gen_logp[9, 0] = float("-inf")  # group 2
    batch, stats = tr.advantages(ro, g, rewards, None, None)
    adv, active = batch.advantages, batch.active
    assert stats["train/bad_samples"] == 2
    assert active.view(4, 4).all(1).tolist() == [False, True, False, True]
    assert torch.isfinite(adv).all() and (adv[~active] == 0).all()
    grads = record_grads(tr)
    tr.update(batch)
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())
    assert torch.isfinite(grads[0]).all()


def test_bad_sample_fail_mode_names_the_sample(tiny_model, tmp_path):
    tr = Trainer(cfg_for(tiny_model, tmp_path, **{"rollout.prompts_per_step": 4, "run.on_bad_sample": "fail"}))
    ro, g, rewards = _fixed_batch(tr)
    rewards[5] = float("inf")
    with pytest.raises(CapoError, match="response 5 .* has reward inf.*run.on_bad_sample=skip"):
        tr.advantages(ro, g, rewards, None, None)


def test_nan_gradient_skips_the_optimizer_step(tiny_model, tmp_path):
    tr = Trainer(cfg_for(tiny_model, tmp_path, **{"rollout.prompts_per_step": 4, "run.resume": False}))
    ro, g, rewards = _fixed_batch(tr)
    batch, _ = tr.advantages(ro, g, rewards, None, None)
    before = [p.detach().clone() for p in tr.model.parameters()]
    out = tr.update(dataclasses.replace(batch, advantages=batch.advantages * float("nan")))  # poison the loss
    assert out["policy/skipped_updates"] == 1 and out["policy/updates"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


def test_user_reward_errors_fail_or_count(reward_path):
    import reward_fns

    texts = ["a", "bb", "ccc", "dddd"]
    with pytest.raises(CapoError, match=r"sample 0 \(prompt 'p', response 'a'\) raised RuntimeError: boom"):
        user_rewards(reward_fns.raises_on_some, ["p"] * 4, texts, ["1"] * 4, timeout=1, on_error="fail")
    r, n, msgs = user_rewards(reward_fns.raises_on_some, ["p"] * 4, texts, ["1"] * 4, timeout=1, on_error="zero")
    assert r.tolist() == [0.0, 1.0, 0.0, 1.0] and n == 2 and "response 'ccc'" in msgs[1]
    r, n, msgs = user_rewards(reward_fns.returns_nan, ["p"], ["x"], ["1"], timeout=1, on_error="zero")
    assert n == 1 and "finite number" in msgs[0]
    r, n, msgs = user_rewards(reward_fns.sleeps, ["p"], ["x"], ["1"], timeout=0.2, on_error="zero")
    assert n == 1 and "timed out after 0.2 s" in msgs[0]


def test_user_reward_function_trains(tiny_model, tmp_path, reward_path):
    Trainer(cfg_for(tiny_model, tmp_path, **{"algo.reward": "reward_fns:raises_on_some", "run.steps": 1,
                                             "algo.reward_errors": "zero"})).train()
    r = rows(tmp_path)[-1]
    assert r["train/reward_errors"] > 0


def test_run_directory_is_locked(tiny_model, tmp_path):
    from capo.errors import ConfigError
    from capo.rundir import run_lock

    with run_lock(tmp_path, "eval"):  # the refusal names the command holding the folder
        with pytest.raises(ConfigError, match="another capo eval"):
            Trainer(cfg_for(tiny_model, tmp_path, **{"run.steps": 1})).train()


def test_advantages_outside_train_with_a_mask_says_to_calibrate_first(tiny_model, tmp_path):
    """`Trainer.advantages` is called outside `train()` (as these tests do): with CAPO's noise mask on and no thresholds
    measured yet it raised a TypeError from unpacking None; it now names the call to make first."""
    tr = Trainer(cfg_for(tiny_model, tmp_path, **{"rollout.prompts_per_step": 4, "algo.name": "capo",
                                                  "algo.noise_mask": "fixed", "algo.mask_low": 1.0,
                                                  "algo.mask_high": 1e9}))
    ro, g, rewards = _fixed_batch(tr)
    ref_logp = tr.logprobs(tr.ref, ro)
    with pytest.raises(CapoError, match=r"trainer.mask_thresholds = trainer.calibrate_mask\(\) first"):
        tr.advantages(ro, g, rewards, ref_logp, None)
    tr.mask_thresholds = tr.calibrate_mask()
    assert tr.mask_thresholds == (1.0, 1e9)
    batch, _ = tr.advantages(ro, g, rewards, ref_logp, None)
    assert batch.advantages.shape == (16,) and batch.active.all()
