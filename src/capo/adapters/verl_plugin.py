"""verl plugin: capo's advantage estimators (CAPO with its noise mask, GRPO family) and RLCR rewards inside verl.

Install in the verl environment (``sh scripts/verl-env.sh``, or ``pip install 'capo[verl]'``). verl imports every
entry point of the ``verl.plugins`` group when ``verl`` itself is imported (``verl/__init__.py``: ``ep.load()``,
governed by ``VERL_USE_EXTERNAL_PLUGINS``, default "auto"; a plugin that fails to import is skipped with only a
debug log). Loading ``capo.adapters.verl_plugin:register`` imports this module, and importing it registers
everything: verl never *calls* the entry point, so registration cannot wait for a call. ``register()`` is
idempotent and may also be called by hand.

What it registers
- Advantage estimators in verl's ``ADV_ESTIMATOR_REGISTRY`` (``algorithm.adv_estimator=<name>``):
  ``capo`` (CAPO, arXiv 2604.12632) and ``capo_grpo``, ``capo_dr_grpo``, ``capo_rloo`` (capo core's versions of
  the GRPO family, prefixed so they never clash with verl's own ``grpo``/``rloo``).
- A narrow wrapper of verl's ``compute_advantage`` (module ``verl.trainer.ppo.ray_trainer``, also imported by
  name into ``verl.trainer.ppo.v1.utils``): verl passes custom estimators only (token_level_rewards,
  response_mask, index, config), but CAPO needs the batch's ``old_log_probs`` (rollout-policy log-probs, for lpm)
  and ``ref_log_prob`` (reference log-probs, for the noise mask). For capo's estimators the wrapper exposes the
  batch to the estimator for the duration of the call (a context variable) and then runs verl's own
  ``compute_advantage`` unchanged; for every other estimator it calls verl's function directly. It also turns an
  unknown ``capo*`` estimator name into an error listing the names capo knows. The wrapper is installed when
  ``verl.trainer.ppo.ray_trainer`` is first imported (a one-shot import hook), or at once if it already is.

Hyperparameters come from ``algorithm.capo`` (add with ``+algorithm.capo.tau=0.6`` on verl's command line):
  tau, surrogate, norm, masked_partners, correct_threshold (CAPO, see ``capo.core.capo_advantage``);
  noise_mask (default true), mask_low (1.05), mask_high (2.5) (CAPO's reference-perplexity mask);
  eps, std_ddof, scale (capo_grpo; scale defaults to "group" or "none" following
  ``algorithm.norm_adv_by_std_in_grpo``).

Rewards (verl's custom reward function: ``reward.custom_reward_function.path=<this file>``,
``.name=compute_score_rlcr`` or ``compute_score_correctness``): see :func:`compute_score_rlcr`.

Exactness: the advantage is computed by capo core on the very tensors verl holds, so it equals the core's result
to float precision (tested to 1e-6). Rows are grouped by verl's ``uid``; every group must have the same size
(verl's ``rollout.n``).
"""

from __future__ import annotations

import contextvars
import importlib.abc
import importlib.util
import sys
import threading
from enum import Enum
from typing import Any

import torch

from capo.adapters._common import check_estimator, reference_keep, score_texts
from capo.core import ADVANTAGES, MASK_HIGH, MASK_LOW, compute_advantages, sequence_logprob_mean
from capo.errors import ConfigError

__all__ = ["ESTIMATORS", "compute_score_correctness", "compute_score_rlcr", "register"]

# verl estimator name -> capo core estimator name
ESTIMATORS = {"capo": "capo", "capo_grpo": "grpo", "capo_dr_grpo": "dr_grpo", "capo_rloo": "rloo"}
_MASK_KEYS = ("noise_mask", "mask_low", "mask_high")
_ENABLE_REF = ("set actor_rollout_ref.actor.use_kl_loss=True with actor_rollout_ref.actor.kl_loss_coef=0 so verl "
               "computes ref_log_prob (the KL term then contributes nothing), or disable CAPO's noise mask with "
               "+algorithm.capo.noise_mask=false")

_BATCH: contextvars.ContextVar = contextvars.ContextVar("capo_verl_batch", default=None)
_TARGET = "verl.trainer.ppo.ray_trainer"
_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------------------------
# estimators
# ---------------------------------------------------------------------------------------------------------------


def _hparams(config) -> dict[str, Any]:
    """``algorithm.capo`` as a plain dict (config is verl's AlgoConfig, an omegaconf DictConfig, a dict or None)."""
    if config is None:
        return {}
    sub = config.get("capo", None) if hasattr(config, "get") else getattr(config, "capo", None)
    if sub is None:
        return {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(sub):
            sub = OmegaConf.to_container(sub, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(sub)


def _group_order(index, n: int) -> tuple[torch.Tensor, int]:
    """A stable permutation putting rows of the same uid next to each other, and the common group size G."""
    if index is None:
        raise ConfigError("capo's verl estimators need the batch's uid (verl's `index`) to form groups; it is missing")
    first: dict[Any, int] = {}
    gid = torch.tensor([first.setdefault(u, len(first)) for u in list(index)], dtype=torch.long)
    if gid.numel() != n:
        raise ValueError(f"index has {gid.numel()} entries but the batch has {n} responses")
    sizes = torch.bincount(gid)
    if not bool((sizes == sizes[0]).all()):
        raise ConfigError(
            f"capo's estimators need every prompt to have the same number of responses (actor_rollout_ref.rollout.n);"
            f" got group sizes {sorted(set(sizes.tolist()))}"
        )
    return torch.sort(gid, stable=True).indices, int(sizes[0])


def _make_estimator(verl_name: str):
    core_name = ESTIMATORS[verl_name]

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None, config=None,
                  **unused) -> tuple[torch.Tensor, torch.Tensor]:
        """capo core's advantage on verl's batch: [N, T] rewards and mask -> ([N, T] advantages, [N, T] returns)."""
        hp = _hparams(config)
        mask_on = core_name == "capo" and bool(hp.pop("noise_mask", True))
        low, high = float(hp.pop("mask_low", MASK_LOW)), float(hp.pop("mask_high", MASK_HIGH))
        for k in _MASK_KEYS:
            hp.pop(k, None)
        if core_name == "grpo" and "scale" not in hp and config is not None:
            hp["scale"] = "group" if (config.get("norm_adv_by_std_in_grpo", True) if hasattr(config, "get")
                                      else True) else "none"
        check_estimator(core_name, hp, engine=f"verl estimator {verl_name!r} (algorithm.capo)")

        n = token_level_rewards.shape[0]
        mask = response_mask.bool()
        order, g = _group_order(index, n)
        rewards = token_level_rewards.sum(dim=-1).double()  # [N] outcome reward (verl puts it on the last token)
        scores = keep = None
        if core_name == "capo":
            data = _BATCH.get()
            if data is None:
                raise ConfigError(
                    "verl estimator 'capo' was called outside verl's compute_advantage, so it cannot see the batch's "
                    "old_log_probs/ref_log_prob: load the plugin through verl (entry point group verl.plugins, "
                    "VERL_USE_EXTERNAL_PLUGINS not 'none') or call capo.adapters.verl_plugin.register() before "
                    "importing verl.trainer.ppo.ray_trainer"
                )
            batch = data.batch
            old = batch["old_log_probs"] if "old_log_probs" in batch.keys() else None
            if old is None and "rollout_log_probs" in batch.keys():
                old = batch["rollout_log_probs"]  # bypass mode: the rollout's log-probs are the old policy's
            if old is None:
                raise ConfigError("verl estimator 'capo' needs old_log_probs (or rollout_log_probs) in the batch: "
                                  "keep verl's actor log-prob recomputation on")
            scores = sequence_logprob_mean(old.double(), mask)  # [N] lpm under the rollout policy
            correct = rewards > float(hp.get("correct_threshold", 0.5))
            if mask_on:
                if "ref_log_prob" not in batch.keys():
                    raise ConfigError(f"verl estimator 'capo' with its noise mask needs ref_log_prob in the batch: "
                                      f"{_ENABLE_REF}")
                keep = reference_keep(batch["ref_log_prob"], mask, correct, low=low, high=high)
        adv = compute_advantages(
            core_name, rewards[order], g,
            scores=None if scores is None else scores[order],
            keep=None if keep is None else keep[order], **hp,
        )  # [N] in grouped order
        out = torch.empty_like(adv)
        out[order] = adv
        advantages = out.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask  # [N, T]
        return advantages, advantages

    estimator.__capo_verl__ = True
    estimator.__name__ = f"capo_verl_{verl_name}"
    estimator.__qualname__ = estimator.__name__
    return estimator


_ESTIMATOR_FNS = {name: _make_estimator(name) for name in ESTIMATORS}


# ---------------------------------------------------------------------------------------------------------------
# the compute_advantage wrapper
# ---------------------------------------------------------------------------------------------------------------


def _name(adv_estimator) -> str:
    return adv_estimator.value if isinstance(adv_estimator, Enum) else str(adv_estimator)


def _wrap(original):
    if getattr(original, "__capo_wrapped__", False):
        return original

    def compute_advantage(data, adv_estimator, *args, **kwargs):
        name = _name(adv_estimator)
        if name.startswith("capo") and name not in ESTIMATORS:
            raise ConfigError(
                f"algorithm.adv_estimator={name!r} is not an estimator the installed capo provides; capo's verl "
                f"estimators: {', '.join(ESTIMATORS)} (core estimators: {', '.join(ADVANTAGES.names())}). Upgrade "
                "capo in the verl environment if the name comes from a newer version."
            )
        if name not in ESTIMATORS:
            return original(data, adv_estimator, *args, **kwargs)
        token = _BATCH.set(data)
        try:
            return original(data, adv_estimator, *args, **kwargs)
        finally:
            _BATCH.reset(token)

    compute_advantage.__capo_wrapped__ = True
    compute_advantage.__wrapped__ = original
    compute_advantage.__doc__ = (original.__doc__ or "") + "\n\n(wrapped by capo.adapters.verl_plugin)"
    return compute_advantage


def _patch_module(module) -> None:
    fn = getattr(module, "compute_advantage", None)
    if fn is None:
        raise ImportError(f"capo verl plugin: {module.__name__}.compute_advantage no longer exists in this verl")
    module.compute_advantage = _wrap(fn)
    # modules that already imported the original by name (verl.trainer.ppo.v1.utils does)
    for name, other in list(sys.modules.items()):
        if name.startswith("verl.") and other is not None and other is not module:
            if other.__dict__.get("compute_advantage") is fn:
                other.compute_advantage = module.compute_advantage


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """One-shot finder: when ``verl.trainer.ppo.ray_trainer`` is imported, patch it right after it executes."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        _remove_hook()
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _patch_module(module)

        spec.loader.exec_module = exec_module
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchOnImport)]


def register() -> None:
    """Register capo's estimators with verl and install the compute_advantage wrapper. Idempotent."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    with _lock:
        for name, fn in _ESTIMATOR_FNS.items():
            current = ADV_ESTIMATOR_REGISTRY.get(name)
            if current is None:
                register_adv_est(name)(fn)
            elif not getattr(current, "__capo_verl__", False):
                raise ConfigError(f"verl already has an advantage estimator named {name!r} ({current!r}) that is "
                                  "not capo's; capo cannot register its own under that name")
            # else: registered by this module, or by another copy of it (verl loading this file by path for a
            # custom reward function): keep the first, whose compute_advantage wrapper is installed
        if _TARGET in sys.modules:
            _patch_module(sys.modules[_TARGET])
        elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchOnImport())


# ---------------------------------------------------------------------------------------------------------------
# rewards: verl's custom reward function signature compute_score(data_source, solution_str, ground_truth, extra_info)
# ---------------------------------------------------------------------------------------------------------------

_verifier = None


def _get_verifier():
    global _verifier
    with _lock:
        if _verifier is None:
            from capo.verify import Verifier

            _verifier = Verifier(workers=1)
        return _verifier


def compute_score_rlcr(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                       format_failure_reward: float = -1.0, **kwargs) -> dict[str, float]:
    """RLCR reward (arXiv 2507.16806, eq. 2) for verl: c - (q - c)^2 from ``<answer>``/``<confidence>`` tags,
    answers compared by mathematical equivalence. Returns verl's dict form: ``score`` plus ``correct``,
    ``confidence`` (NaN if missing) and ``format_ok`` (verl logs the extra keys as reward_extra_info)."""
    b = score_texts([solution_str], [str(ground_truth)], kind="rlcr", verifier=_get_verifier(),
                    format_failure_reward=format_failure_reward)
    return {"score": b.rewards[0], "correct": float(b.correct[0]), "confidence": b.confidence[0],
            "format_ok": float(b.format_ok[0])}


def compute_score_correctness(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                              answer_format: str = "auto", **kwargs) -> dict[str, float]:
    """Binary verifiable reward 1[answer equivalent to gold] for verl (answer by ``capo.verify.extract_answer``)."""
    b = score_texts([solution_str], [str(ground_truth)], kind="correctness", verifier=_get_verifier(),
                    answer_format=answer_format)
    return {"score": b.rewards[0], "correct": float(b.correct[0])}


compute_score = compute_score_rlcr  # verl's default custom reward function name

try:  # importing this module (what verl's plugin loader does) registers everything
    register()
except ImportError:  # verl is not installed: the reward functions above stay usable
    pass

