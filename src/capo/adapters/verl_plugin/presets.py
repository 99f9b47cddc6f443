"""An ``algo.name`` preset (``capo.core.presets.ALGORITHMS``) as verl command-line overrides."""

from __future__ import annotations

import os

from capo.adapters._common import VERL_LOSS_MODES, engine_preset, loss_knobs
from capo.adapters.verl_plugin.estimators import ESTIMATORS
from capo.core import default_noise_mask
from capo.rollout.method_inputs import needs_reference

__all__ = ["REWARD_FILE", "preset_overrides"]

# the file verl imports capo's reward functions from (reward.custom_reward_function.path)
REWARD_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "verl_reward.py")

# capo's clip_cov / kl_cov knobs -> verl's policy_loss keys (capo's defaults are verl's except kl_coef: 1 vs 0.1)
_VERL_LOSS_KNOBS = {"clip_cov": {"clip_ratio": "clip_cov_ratio", "cov_low": "clip_cov_lb", "cov_high": "clip_cov_ub"},
                    "kl_cov": {"kl_ratio": "kl_cov_ratio", "kl_coef": "ppo_kl_coef"}}


def preset_overrides(name: str) -> list[str]:
    """verl command-line overrides that run the ``algo.name`` preset ``name`` (``capo.core.presets.ALGORITHMS``)
    with capo's estimator and reward; ConfigError for a preset verl cannot run (c2gspg: verl's policy-loss functions
    never see the rewards its calibration term reads; DAPO's shaping: use verl's own settings). PPO-clip maps to
    verl's "vanilla" loss mode, clip_cov / kl_cov / gspo / cispo to verl's own loss modes of that name (equal to
    capo's on the same tensors: tests/adapters/test_verl.py::test_policy_losses_agree_with_verls; CISPO's missing
    lower bound is verl's clip_ratio_low 1, whose bound r >= 0 never binds), the aggregation to ``loss_agg_mode``."""
    p = engine_preset(name, "verl")
    verl_est = {core: v for v, core in ESTIMATORS.items()}[p["advantage"]]
    lk = loss_knobs(p["loss"], p["loss_kwargs"])
    actor = "actor_rollout_ref.actor"
    out = [f"algorithm.adv_estimator={verl_est}",
           f"{actor}.policy_loss.loss_mode={VERL_LOSS_MODES[p['loss']]}",
           f"{actor}.loss_agg_mode={p['aggregation']}",
           f"{actor}.clip_ratio_low={1.0 if lk.get('eps_low', 0.2) is None else lk.get('eps_low', 0.2)}",
           f"{actor}.clip_ratio_high={lk.get('eps_high', 0.2)}",
           f"reward.custom_reward_function.path={REWARD_FILE}",
           f"reward.custom_reward_function.name=compute_score_{p['reward']}",
           f"+algorithm.capo.reward={p['reward']}"]
    out += [f"{actor}.policy_loss.{verl_key}={lk[k]}" for k, verl_key in _VERL_LOSS_KNOBS.get(p["loss"], {}).items()]
    if p["loss"] == "ppo_clip" and lk.get("dual_clip") is None:
        out.append(f"{actor}.clip_ratio_c=1e9")  # capo's ppo_clip has no dual clip; verl's vanilla always clips at c
    out += [f"+algorithm.capo.advantage_kwargs.{k}={v}" for k, v in p["advantage_kwargs"].items()]
    out += [f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in p["reward_kwargs"].items()]
    if p["noise_mask"] != default_noise_mask(p["advantage"]):  # the mask applies to any estimator
        out.append(f"+algorithm.capo.noise_mask={p['noise_mask']}")
    if needs_reference(p["advantage"], p["noise_mask"]):  # verl computes them only with its KL loss on
        out += [f"{actor}.use_kl_loss=True", f"{actor}.kl_loss_coef=0"]
    return out
