"""capo's verl plugin, loaded the way verl loads plugins, inside verl's own advantage step.

Runs in the verl environment: .venv-verl/bin/python -m pytest tests/adapters/test_verl.py
(created by scripts/verl-env.sh). Skipped where verl is not importable (the main .venv).
"""

from __future__ import annotations

import sys

import pytest

# Import verl first and alone: its __init__ loads the `verl.plugins` entry points, which is what must register capo.
verl = pytest.importorskip("verl", reason="verl is not installed here; run with .venv-verl (sh scripts/verl-env.sh)")
PLUGIN_LOADED_BY_VERL = "capo.adapters.verl_plugin" in sys.modules

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from capo.core import capo_noise_mask, compute_advantages, sequence_logprob_mean  # noqa: E402
from capo.errors import ConfigError  # noqa: E402

TOL = 1e-6
B, G, T = 4, 4, 6


def _ray_trainer():
    try:
        import verl.trainer.ppo.ray_trainer as rt
    except ImportError as e:  # pragma: no cover - environment problem, not a capo bug
        pytest.skip(f"verl's trainer module does not import here ({e}); run sh scripts/verl-env.sh")
    return rt


def _batch(seed=0, with_ref=True):
    """A verl DataProto: B prompts x G responses, groups shuffled (verl reorders rows), reward on the last token."""
    from verl import DataProto

    gen = torch.Generator().manual_seed(seed)
    n = B * G
    lengths = torch.randint(2, T + 1, (n,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # [N, T]
    correct = torch.tensor([1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)  # 2 mixed, 1 all, 1 none... per group below
    rewards_tok = torch.zeros(n, T)
    rewards_tok[torch.arange(n), lengths - 1] = correct.float()
    old = -torch.rand(n, T, generator=gen) * 2 * mask  # [N, T] rollout-policy token log-probs
    ref = -torch.rand(n, T, generator=gen) * 1.5 * mask
    uid = np.array([f"q{i // G}" for i in range(n)], dtype=object)
    perm = torch.randperm(n, generator=gen)  # verl's balancing reorders rows: groups are not contiguous
    tensors = {"token_level_rewards": rewards_tok[perm], "response_mask": mask[perm], "old_log_probs": old[perm],
               "responses": torch.zeros(n, T, dtype=torch.long)}
    if with_ref:
        tensors["ref_log_prob"] = ref[perm]
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid[perm.numpy()]})
    return data


def _expected(data, name, **hp):
    """capo core on the same batch, grouped by uid by hand (independent of the plugin's grouping code)."""
    uid = list(data.non_tensor_batch["uid"])
    order = sorted(range(len(uid)), key=lambda i: (int(uid[i][1:]), i))
    order = torch.tensor(order)
    mask = data.batch["response_mask"]
    r = data.batch["token_level_rewards"].sum(-1).double()
    low, high = hp.pop("mask_low", None), hp.pop("mask_high", None)
    kw = {}
    if name == "capo":
        kw["scores"] = sequence_logprob_mean(data.batch["old_log_probs"].double(), mask)[order]
        if low is not None:
            ppl = torch.exp(-sequence_logprob_mean(data.batch["ref_log_prob"].double(), mask))
            kw["keep"] = capo_noise_mask(ppl, r > 0.5, low=low, high=high)[order]
    adv_sorted = compute_advantages(name, r[order], G, **kw, **hp)
    adv = torch.empty_like(adv_sorted)
    adv[order] = adv_sorted
    return adv.float()[:, None] * mask


def test_verl_loaded_the_plugin_through_its_entry_point():
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    assert PLUGIN_LOADED_BY_VERL, (
        "`import verl` did not import capo.adapters.verl_plugin: is capo installed in this environment with its "
        "`verl.plugins` entry point (pip install -e . ), and VERL_USE_EXTERNAL_PLUGINS not 'none'?"
    )
    assert {"capo", "capo_grpo", "capo_dr_grpo", "capo_rloo"} <= set(ADV_ESTIMATOR_REGISTRY)
    rt = _ray_trainer()
    assert getattr(rt.compute_advantage, "__capo_wrapped__", False), "compute_advantage was not wrapped on import"


def test_capo_through_verl_compute_advantage_equals_core():
    rt = _ray_trainer()
    data = _batch()
    cfg = OmegaConf.create({"adv_estimator": "capo", "capo": {"tau": 0.6, "mask_low": 1.6, "mask_high": 2.2}})
    out = rt.compute_advantage(data, adv_estimator="capo", num_repeat=G, config=cfg)
    got = out.batch["advantages"]
    exp = _expected(data, "capo", tau=0.6, mask_low=1.6, mask_high=2.2)
    assert got.shape == (B * G, T)
    assert torch.allclose(got, exp, atol=TOL, rtol=0), (got - exp).abs().max()
    assert (got.abs() > 1e-3).any()
    # the mask did something here, and the result differs from CAPO without the mask (so the test can fail)
    nomask = _expected(data, "capo", tau=0.6)
    assert not torch.allclose(got, nomask, atol=1e-3)
    assert torch.equal(out.batch["returns"], got)


def test_capo_without_mask_needs_no_reference():
    rt = _ray_trainer()
    data = _batch(seed=1, with_ref=False)
    cfg = OmegaConf.create({"capo": {"tau": 0.5, "noise_mask": False, "norm": "pairs"}})
    got = rt.compute_advantage(data, adv_estimator="capo", config=cfg).batch["advantages"]
    assert torch.allclose(got, _expected(data, "capo", tau=0.5, norm="pairs"), atol=TOL, rtol=0)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_verl_grpo_and_capo_grpo_agree(norm_by_std):
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    rt = _ray_trainer()
    data = _batch(seed=2)
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": norm_by_std})
    verl_adv = rt.compute_advantage(_copy(data), adv_estimator=AdvantageEstimator.GRPO,
                                    norm_adv_by_std_in_grpo=norm_by_std, config=cfg).batch["advantages"]
    capo_adv = rt.compute_advantage(_copy(data), adv_estimator="capo_grpo", config=cfg).batch["advantages"]
    assert (verl_adv.abs() > 1e-3).any()
    assert torch.allclose(capo_adv, verl_adv, atol=TOL, rtol=0), (capo_adv - verl_adv).abs().max()
    scale = "group" if norm_by_std else "none"
    assert torch.allclose(capo_adv, _expected(data, "grpo", eps=1e-6, scale=scale), atol=TOL, rtol=0)


def _copy(data):
    from verl import DataProto

    return DataProto.from_dict(tensors={k: v.clone() for k, v in data.batch.items()},
                               non_tensors={k: v.copy() for k, v in data.non_tensor_batch.items()})


def test_capo_without_reference_says_what_to_enable():
    rt = _ray_trainer()
    with pytest.raises(ConfigError, match=r"set actor_rollout_ref\.actor\.use_kl_loss=True with "
                                          r"actor_rollout_ref\.actor\.kl_loss_coef=0 so verl computes ref_log_prob"):
        rt.compute_advantage(_batch(with_ref=False), adv_estimator="capo", config=OmegaConf.create({}))


def test_unknown_capo_names_say_what_exists():
    rt = _ray_trainer()
    with pytest.raises(ConfigError, match="'capo_gspo' is not an estimator the installed capo provides; capo's verl "
                                          "estimators: capo, capo_grpo, capo_dr_grpo, capo_rloo"):
        rt.compute_advantage(_batch(), adv_estimator="capo_gspo", config=OmegaConf.create({}))
    with pytest.raises(ConfigError, match="no hyperparameter 'temperature'; allowed: tau"):
        rt.compute_advantage(_batch(), adv_estimator="capo", config=OmegaConf.create({"capo": {"temperature": 1}}))


def test_unequal_groups_are_refused():
    rt = _ray_trainer()
    data = _batch()
    data.non_tensor_batch["uid"][0] = "q_extra"
    with pytest.raises(ConfigError, match="same number of responses"):
        rt.compute_advantage(data, adv_estimator="capo_grpo", config=OmegaConf.create({}))


def test_rlcr_reward_function_signature_and_values():
    from capo.adapters.verl_plugin import compute_score, compute_score_correctness, compute_score_rlcr

    assert compute_score is compute_score_rlcr
    r = compute_score_rlcr("math", "<think>..</think><answer>0.5</answer><confidence>0.7</confidence>", "1/2", {})
    assert r["score"] == pytest.approx(1 - 0.3 ** 2, abs=1e-6) and r["correct"] == 1.0 and r["format_ok"] == 1.0
    r = compute_score_rlcr(data_source="math", solution_str="<answer>3</answer><confidence>0.7</confidence>",
                           ground_truth="4", extra_info=None)
    assert r["score"] == pytest.approx(-0.49, abs=1e-6) and r["correct"] == 0.0
    assert compute_score_rlcr("math", "<answer>4</answer>", "4", {})["score"] == -1.0
    assert compute_score_correctness("math", "so \\boxed{\\frac{1}{2}}", "0.5", {})["score"] == 1.0


def test_reward_file_loaded_by_path_like_verl_does():
    """verl imports a custom reward function from a file path; the example's reward file must work that way."""
    import pathlib

    from verl.utils.import_utils import load_extern_object

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "verl" / "capo_reward.py"
    fn = load_extern_object(module_path=str(path), object_name="compute_score")
    assert fn("math", "<answer>7</answer><confidence>1</confidence>", "7", {})["score"] == 1.0


def test_example_launch_script_composes_with_verls_config(tmp_path):
    """Every override of examples/verl/run_capo_qwen2.5_math_1.5b.sh exists in verl's config, and the settings
    that CAPO depends on come out as intended (reference policy on with KL weight 0, capo estimator)."""
    import os
    import pathlib
    import subprocess

    from hydra import compose, initialize_config_dir

    root = pathlib.Path(__file__).resolve().parents[2]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "$OVERRIDES"\n')
    (fake / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OVERRIDES=str(tmp_path / "ov.txt"), DATA="/data")
    subprocess.run(["sh", str(root / "examples/verl/run_capo_qwen2.5_math_1.5b.sh")], env=env, check=True)
    args = [a for a in (tmp_path / "ov.txt").read_text().splitlines() if a]
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    cfgdir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfgdir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=args[2:])
    from verl.trainer.ppo.utils import need_reference_policy

    a = cfg.actor_rollout_ref
    assert cfg.algorithm.adv_estimator == "capo" and cfg.algorithm.capo.tau == 0.6
    assert need_reference_policy(cfg) and a.actor.use_kl_loss and a.actor.kl_loss_coef == 0
    assert a.actor.entropy_coeff == 0 and a.actor.clip_ratio == 0.2 and a.actor.optim.lr == 1e-6
    assert cfg.data.train_batch_size == 128 and a.actor.ppo_mini_batch_size == 64 and a.rollout.n == 8
    assert a.rollout.temperature == 1.0 and cfg.trainer.total_training_steps == 600
    assert not cfg.algorithm.use_kl_in_reward
