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
  the GRPO family, prefixed so they never clash with verl's own ``grpo``/``rloo``), and ``capo_ace``,
  ``capo_seed_grpo``, ``capo_gdpo``, ``capo_unlikeliness``, ``capo_ngrpo`` (issue 18; their extra inputs come from
  :func:`capo.rollout.method_inputs.method_inputs`, as in capo's trainer and the TRL adapter).
- A narrow wrapper of verl's ``compute_advantage`` (module ``verl.trainer.ppo.ray_trainer``, also imported by
  name into ``verl.trainer.ppo.v1.utils``): verl passes custom estimators only (token_level_rewards,
  response_mask, index, config), but CAPO needs the batch's ``old_log_probs`` (rollout-policy log-probs, for lpm)
  and ``ref_log_prob`` (reference log-probs, for the noise mask). For capo's estimators the wrapper exposes the
  batch to the estimator for the duration of the call (a context variable) and then runs verl's own
  ``compute_advantage`` unchanged; for every other estimator it calls verl's function directly. It also turns an
  unknown ``capo*`` estimator name into an error listing the names capo knows. The wrapper is installed when
  ``verl.trainer.ppo.ray_trainer`` is first imported (a one-shot import hook), or at once if it already is.

Hyperparameters come from ``algorithm.capo`` (add with ``+algorithm.capo.tau=0.6`` on verl's command line):
  tau, surrogate, norm, masked_partners (CAPO, see ``capo.core.capo_advantage``);
  noise_mask (unset: on for capo only; true: on for any estimator, e.g. GRPO + CAPO's mask), mask_rule ("fixed" or "quantile"), mask_low (1.05), mask_high (2.5), mask_q_low
  (0.25), mask_q_high (0.75) (CAPO's reference-perplexity mask); logprobs ("raw": refuse verl's temperature-scaled
  log-probs at a rollout temperature != 1; "sampling": accept them);
  eps, std_ddof, scale (capo_grpo; scale defaults to "group" or "none" following
  ``algorithm.norm_adv_by_std_in_grpo``).

The advantages come from capo's one CAPO-input step (:func:`capo.core.advantage_step`, shared with capo's trainer and
the TRL adapter). Correct/incorrect is the reward function's ``correct`` (legacy trainer: ``non_tensor_batch``; v1
trainer: each row's ``extra_fields``, fetched by a wrapper of ``PPOTrainer._compute_advantage``), never a
thresholded reward. verl's padding rows (uid ``pad...``) get advantage 0.

Rewards (verl's custom reward function: ``reward.custom_reward_function.path=<capo/adapters/verl_reward.py>``,
``.name=compute_score_rlcr``, ``compute_score_correctness`` or ``compute_score_ppo_c``): see
:func:`compute_score_rlcr`. ``algorithm.capo.reward`` names the core reward it computes (GDPO's components).
Presets: :func:`preset_overrides` gives the verl overrides of an ``algo.name`` preset.

Exactness: the advantage is computed by capo core on the very tensors verl holds, so it equals the core's result
to float precision (tested to 1e-6). Rows are grouped by verl's ``uid``; every group except the padding rows must
have the same size (verl's ``rollout.n``).
"""

from __future__ import annotations

import contextvars
import importlib.abc
import importlib.util
import inspect
import os
import sys
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from capo.adapters._common import (
    LOGPROB_MODES,
    TEXT_REWARDS,
    MaskThresholds,
    check_estimator,
    engine_preset,
    score_texts,
)
from capo.core import (
    ADVANTAGES,
    MASK_HIGH,
    MASK_LOW,
    MASK_Q_HIGH,
    MASK_Q_LOW,
    POLICY_LOSSES,
    advantage_step,
    calibration_metrics,
    mask_on,
    sequence_logprob_mean,
)
from capo.errors import ConfigError
from capo.rollout.method_inputs import method_inputs, needed_data

__all__ = ["ESTIMATORS", "compute_score_correctness", "compute_score_ppo_c", "compute_score_rlcr", "preset_overrides",
           "register"]

# verl estimator name -> capo core estimator name
ESTIMATORS = {"capo": "capo", "capo_grpo": "grpo", "capo_dr_grpo": "dr_grpo", "capo_rloo": "rloo",
              "capo_ace": "ace", "capo_seed_grpo": "seed_grpo", "capo_gdpo": "gdpo",
              "capo_unlikeliness": "unlikeliness", "capo_ngrpo": "ngrpo"}
_REF_ON = ("set actor_rollout_ref.actor.use_kl_loss=True with actor_rollout_ref.actor.kl_loss_coef=0 so verl "
           "computes ref_log_prob (the KL term then contributes nothing)")
_ENABLE_REF = _REF_ON + ", or disable CAPO's noise mask with +algorithm.capo.noise_mask=false"
# how verl supplies each piece of data an estimator input is built from (method_inputs' error hints)
_HINTS = {"ref_token_logp": _REF_ON,
          "answers": "use capo's reward function (reward.custom_reward_function.path=<capo/adapters/verl_reward.py>, "
                     "name=compute_score_correctness/_rlcr/_ppo_c): it returns each answer as 'pred'",
          "confidence": "use capo's compute_score_rlcr, which returns 'correct', 'confidence' and 'format_ok'"}

# what capo's reward functions return besides 'score' (verl keeps them per row as reward_extra_info); 'pred' is
# verl's own name for the extracted answer (its validation metrics vote on it)
_REWARD_KEYS = ("correct", "confidence", "format_ok", "pred")
_BATCH: contextvars.ContextVar = contextvars.ContextVar("capo_verl_batch", default=None)
_V1: contextvars.ContextVar = contextvars.ContextVar("capo_verl_v1", default=None)
_TARGET = "verl.trainer.ppo.ray_trainer"
_TARGET_V1 = "verl.trainer.ppo.v1.trainer_base"
# the plugin's own knobs in algorithm.capo (the rest are the estimator's hyperparameters)
_OPTION_DEFAULTS = {"noise_mask": None, "mask_rule": "fixed", "mask_low": MASK_LOW, "mask_high": MASK_HIGH,
                    "mask_q_low": MASK_Q_LOW, "mask_q_high": MASK_Q_HIGH, "logprobs": "raw", "reward": "correctness",
                    "format_failure_reward": -1.0}
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


def _options(hp: dict, core_name: str, config) -> dict[str, Any]:
    """Pop the plugin's own knobs out of ``hp`` (what is left are the estimator's hyperparameters)."""
    opts = {k: hp.pop(k) for k in _OPTION_DEFAULTS if k in hp}
    opts = {**_OPTION_DEFAULTS, **opts}
    opts["noise_mask"] = mask_on(core_name, opts["noise_mask"])  # unset: capo only; true: any estimator
    if opts["reward"] not in TEXT_REWARDS:
        raise ConfigError(f"algorithm.capo.reward={opts['reward']!r} is not allowed; allowed values (the core reward "
                          f"your reward function computes): {', '.join(TEXT_REWARDS)}")
    if opts["logprobs"] not in LOGPROB_MODES:
        raise ConfigError(f"algorithm.capo.logprobs={opts['logprobs']!r} is not allowed; allowed values: "
                          f"{', '.join(LOGPROB_MODES)}")
    if core_name == "grpo" and "scale" not in hp and config is not None:
        hp["scale"] = "group" if (config.get("norm_adv_by_std_in_grpo", True) if hasattr(config, "get")
                                  else True) else "none"
    return opts


def _padding_rows(index, n: int) -> torch.Tensor:
    """[N] bool: verl's synthetic padding rows (``upsample_batch_to_divisible_size`` gives them one ``pad...``
    uid; verl's own uids are uuid4 strings, which never start with "pad")."""
    if index is None:
        raise ConfigError("capo's verl estimators need the batch's uid (verl's `index`) to form groups; it is missing")
    uids = [str(u) for u in list(index)]
    if len(uids) != n:
        raise ValueError(f"index has {len(uids)} entries but the batch has {n} responses")
    return torch.tensor([u.startswith("pad") for u in uids], dtype=torch.bool)


def _group_order(index, n: int) -> tuple[torch.Tensor, int]:
    """A stable permutation putting rows of the same uid next to each other, and the common group size G."""
    first: dict[Any, int] = {}
    gid = torch.tensor([first.setdefault(u, len(first)) for u in list(index)], dtype=torch.long)
    sizes = torch.bincount(gid)
    if not bool((sizes == sizes[0]).all()):
        raise ConfigError(
            f"capo's estimators need every prompt to have the same number of responses (actor_rollout_ref.rollout.n);"
            f" got group sizes {sorted(set(sizes.tolist()))}"
        )
    return torch.sort(gid, stable=True).indices, int(sizes[0])


def _ctx_values(ctx, key: str, n: int) -> list | None:
    """The per-row values the reward function returned under ``key`` (legacy trainer: ``non_tensor_batch``; v1
    trainer: the rows' ``extra_fields.reward_extra_info``, fetched into ``ctx.extra``), or None."""
    if ctx is None:
        return None
    raw = ctx.extra.get(key)
    if raw is None and key in ctx.data.non_tensor_batch:
        raw = ctx.data.non_tensor_batch[key]
    if raw is None or len(raw) != n or all(v is None for v in raw):  # v1: None where a row's dict lacks the key
        return None
    return list(raw)


def _verdicts(ctx, rewards: torch.Tensor, need: bool, who: str = "capo") -> torch.Tensor | None:
    """[N] bool verdicts: the reward function's ``correct``, else the rewards if they are binary 0/1. None if
    unavailable and not needed (GRPO family: only the metrics use them)."""
    raw = _ctx_values(ctx, "correct", rewards.numel())
    if raw is not None:
        return torch.tensor([bool(float(c) > 0.5) if c is not None else False for c in raw])
    if bool(((rewards == 0) | (rewards == 1)).all()):
        return rewards == 1
    if need:
        raise ConfigError(f"verl estimator {who!r} needs the verifier's verdicts: the reward function must return a "
                          "dict with 'correct' (capo's compute_score does), as the rewards here are not binary 0/1 and "
                          "capo never thresholds a reward to decide correctness")
    return None


def _floats(vals: list | None, rows: torch.Tensor) -> torch.Tensor | None:
    if vals is None:
        return None
    return torch.tensor([float("nan") if v is None else float(v) for v in vals], dtype=torch.float64)[rows]


def _method_inputs(ctx, core_name: str, verl_name: str, opts, rows, rewards, correct, lp, ref, mask, g) -> dict:
    """The estimator's extra inputs (ACE, SEED-GRPO, GDPO) on the grouped real rows, built by the function capo's
    trainer and the TRL adapter use (:func:`capo.rollout.method_inputs.method_inputs`). Answers, confidences and
    format flags come from the reward function's dict ('pred', 'confidence', 'format_ok'; '' = no answer)."""
    n = rewards.numel()
    preds = _ctx_values(ctx, "pred", n)
    answers = None if preds is None else [None if p is None or str(p) == "" else str(p) for p in
                                          (preds[i] for i in rows.tolist())]
    fmt = _floats(_ctx_values(ctx, "format_ok", n), rows)
    x = method_inputs(core_name, rewards=rewards[rows], group_size=g, mask=mask,
                      token_logp=None if lp is None else lp[rows], ref_token_logp=None if ref is None else ref[rows],
                      answers=answers, correct=None if correct is None else correct[rows],
                      confidence=_floats(_ctx_values(ctx, "confidence", n), rows),
                      format_ok=None if fmt is None else fmt > 0.5, verifier=_get_verifier() if answers else None,
                      reward=opts["reward"], reward_kwargs={"format_failure_reward": opts["format_failure_reward"]},
                      engine=f"verl estimator {verl_name!r} (algorithm.capo)", hints=_HINTS)
    return x.advantage


def _check_temperature(ctx, opts) -> None:
    t = None if ctx is None else ctx.temperature
    if opts["logprobs"] == "raw" and t is not None and float(t) != 1.0:
        raise ConfigError(
            f"verl computes old_log_probs and ref_log_prob from logits divided by the rollout temperature ({t}), "
            "but CAPO's lpm and PPL_ref are temperature-1 log-probs (the paper's): set "
            "actor_rollout_ref.rollout.temperature=1.0, or accept the scaled ones with +algorithm.capo.logprobs=sampling"
        )


def _log_probs(ctx, name: str, n: int, t: int) -> torch.Tensor | None:
    if ctx is None:
        return None
    batch = ctx.data.batch
    x = batch[name] if name in batch.keys() else None
    if x is None and name == "old_log_probs" and "rollout_log_probs" in batch.keys():
        x = batch["rollout_log_probs"]  # bypass mode: the rollout's log-probs are the old policy's
    return None if x is None else x.double()


def _make_estimator(verl_name: str):
    core_name = ESTIMATORS[verl_name]

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None, config=None,
                  **unused) -> tuple[torch.Tensor, torch.Tensor]:
        """capo core's advantage on verl's batch: [N, T] rewards and mask -> ([N, T] advantages, [N, T] returns).
        Padding rows (uid ``pad...``) get advantage 0 and take no part."""
        hp = _hparams(config)
        opts = _options(hp, core_name, config)
        check_estimator(core_name, hp, engine=f"verl estimator {verl_name!r} (algorithm.capo)")
        n, t = token_level_rewards.shape
        ctx = _BATCH.get()
        need = needed_data(core_name, reward=opts["reward"])
        if ("scores" in ADVANTAGES.reads(core_name) or need) and ctx is None:
            raise ConfigError(
                f"verl estimator {verl_name!r} was called outside verl's compute_advantage, so it cannot see the "
                "batch's old_log_probs/ref_log_prob: load the plugin through verl (entry point group verl.plugins, "
                "VERL_USE_EXTERNAL_PLUGINS not 'none') or call capo.adapters.verl_plugin.register() before "
                "importing verl.trainer.ppo.ray_trainer"
            )
        rows = torch.nonzero(~_padding_rows(index, n)).squeeze(1)  # [N_real]
        order, g = _group_order([list(index)[i] for i in rows.tolist()], rows.numel())
        rows = rows[order]  # real rows, grouped by uid
        rewards = token_level_rewards.sum(dim=-1).double()  # [N] outcome reward (verl puts it on the last token)
        correct = _verdicts(ctx, rewards, need=core_name == "capo" or opts["noise_mask"] or "confidence" in need,
                            who=verl_name)
        _check_temperature(ctx, opts)
        lp, ref = _log_probs(ctx, "old_log_probs", n, t), _log_probs(ctx, "ref_log_prob", n, t)
        if ("scores" in ADVANTAGES.reads(core_name) or "token_logp" in need) and lp is None:
            raise ConfigError(f"verl estimator {verl_name!r} needs old_log_probs (or rollout_log_probs) in the "
                              "batch: keep verl's actor log-prob recomputation on")
        if opts["noise_mask"] and ref is None:
            raise ConfigError(f"verl estimator {verl_name!r} with CAPO's noise mask needs ref_log_prob in the batch: "
                              f"{_ENABLE_REF}")
        mask = response_mask[rows]
        inputs = _method_inputs(ctx, core_name, verl_name, opts, rows, rewards, correct, lp, ref, mask, g)
        thresholds = None
        if opts["noise_mask"]:
            ppl = torch.exp(-sequence_logprob_mean(ref[rows], mask))
            thresholds = _mask_state(opts).resolve(ppl)
        res = advantage_step(
            core_name, rewards[rows], (correct if correct is not None else torch.zeros(n, dtype=torch.bool))[rows],
            g, token_logp=(lp if lp is not None else torch.zeros(n, t, dtype=torch.float64))[rows], mask=mask,
            ref_token_logp=None if ref is None else ref[rows], mask_thresholds=thresholds, hparams=hp, inputs=inputs,
        )
        out = torch.zeros(n, dtype=res.advantages.dtype)
        out[rows] = res.advantages
        if ctx is not None and lp is not None and correct is not None:
            _batch_metrics(ctx, res, correct[rows], g, rows)
        advantages = out.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask  # [N, T]
        return advantages, advantages

    estimator.__capo_verl__ = True
    estimator.__name__ = f"capo_verl_{verl_name}"
    estimator.__qualname__ = estimator.__name__
    return estimator


def _batch_metrics(ctx, res, correct: torch.Tensor, g: int, rows: torch.Tensor) -> None:
    """calib/* of the real rows (grouped order) into ``ctx.metrics``; verbalized confidence from the reward
    function's ``confidence`` (capo's compute_score_rlcr returns it) when present."""
    ok = res.valid & ~res.bad
    if not bool(ok.any()):
        return
    conf = _ctx_values(ctx, "confidence", len(ctx.data))
    verbal = None
    if conf is not None:
        verbal = torch.tensor([float("nan") if c is None else float(c) for c in list(conf)], dtype=torch.float64)
        verbal = verbal[rows][ok]
    ctx.metrics.update(calibration_metrics(res.scores[ok], correct[ok], (torch.arange(rows.numel()) // g)[ok],
                                           verbal_conf=verbal))


_mask_states: dict[tuple, MaskThresholds] = {}


def _mask_state(opts) -> MaskThresholds:
    """One MaskThresholds per mask configuration in this process (quantile thresholds freeze on the first batch)."""
    key = tuple(opts[k] for k in ("mask_rule", "mask_low", "mask_high", "mask_q_low", "mask_q_high"))
    if key not in _mask_states:
        _mask_states[key] = MaskThresholds(*key, engine="verl estimator 'capo' (algorithm.capo)")
    return _mask_states[key]


_ESTIMATOR_FNS = {name: _make_estimator(name) for name in ESTIMATORS}


# ---------------------------------------------------------------------------------------------------------------
# the compute_advantage wrapper
# ---------------------------------------------------------------------------------------------------------------


def _name(adv_estimator) -> str:
    return adv_estimator.value if isinstance(adv_estimator, Enum) else str(adv_estimator)


@dataclass
class _Ctx:
    """What capo's estimators see of the batch during one compute_advantage call."""

    data: Any  # verl's DataProto
    temperature: float | None = None  # the rollout temperature verl's log-probs were computed at
    # the reward function's per-row values (_REWARD_KEYS) from the v1 trainer's extra_fields (legacy trainer:
    # data.non_tensor_batch, read by _ctx_values)
    extra: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)  # calib/* of the batch (v1: merged into verl's step metrics)


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
        v1 = _V1.get()
        ctx = _Ctx(data, extra={} if v1 is None else v1["extra"],
                   temperature=v1["temperature"] if v1 is not None else data.meta_info.get("temperature"),
                   metrics={} if v1 is None else v1["metrics"])
        token = _BATCH.set(ctx)
        try:
            out = original(data, adv_estimator, *args, **kwargs)
        finally:
            _BATCH.reset(token)
        out.meta_info["capo_metrics"] = dict(ctx.metrics)  # legacy trainer: verl does not log them by itself
        return out

    compute_advantage.__capo_wrapped__ = True
    compute_advantage.__wrapped__ = original
    compute_advantage.__doc__ = (original.__doc__ or "") + "\n\n(wrapped by capo.adapters.verl_plugin)"
    return compute_advantage


def _v1_extra(extra_fields, key: str) -> list:
    """``key`` of each row's ``extra_fields["reward_extra_info"]`` (None where absent)."""
    vals = extra_fields.tolist() if hasattr(extra_fields, "tolist") else list(extra_fields)
    out = []
    for v in vals:
        v = getattr(v, "data", v)
        info = v.get("reward_extra_info", {}) if isinstance(v, dict) else {}
        out.append(info.get(key) if isinstance(info, dict) else None)
    return out


def _wrap_v1(original):
    """Wrap verl v1's ``PPOTrainer._compute_advantage``: it reads only the tensors it needs from TransferQueue, so
    the reward function's verdicts (``extra_fields``) are fetched here, and capo's calib/* join the step metrics."""
    if getattr(original, "__capo_wrapped__", False):
        return original

    def _compute_advantage(self, batch, metrics):
        if _name(self.config.algorithm.adv_estimator) not in ESTIMATORS:
            return original(self, batch, metrics)
        tq = sys.modules[_TARGET_V1].tq
        extra = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        v1 = {"extra": {k: _v1_extra(extra["extra_fields"], k) for k in _REWARD_KEYS}, "metrics": {},
              "temperature": self.config.actor_rollout_ref.rollout.temperature}
        token = _V1.set(v1)
        try:
            return original(self, batch, metrics)
        finally:
            _V1.reset(token)
            metrics.update(v1["metrics"])

    _compute_advantage.__capo_wrapped__ = True
    _compute_advantage.__wrapped__ = original
    return _compute_advantage


def _patch_module(module) -> None:
    if module.__name__ == _TARGET_V1:
        cls = getattr(module, "PPOTrainer", None)
        if cls is None or not hasattr(cls, "_compute_advantage"):
            raise ImportError(f"capo verl plugin: {_TARGET_V1}.PPOTrainer._compute_advantage no longer exists")
        cls._compute_advantage = _wrap_v1(cls._compute_advantage)
        return
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
    """One-shot finder: when a target module is imported, patch it right after it executes."""

    def __init__(self, target: str):
        self.target = target

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        _remove_hook(self.target)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _patch_module(module)

        spec.loader.exec_module = exec_module
        return spec


def _remove_hook(target: str) -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _PatchOnImport) and f.target == target)]


def register() -> None:
    """Register capo's estimators with verl and install the compute_advantage wrappers. Idempotent."""
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
        for target in (_TARGET, _TARGET_V1):
            if target in sys.modules:
                _patch_module(sys.modules[target])
            elif not any(isinstance(f, _PatchOnImport) and f.target == target for f in sys.meta_path):
                sys.meta_path.insert(0, _PatchOnImport(target))


# ---------------------------------------------------------------------------------------------------------------
# algorithm presets as verl command-line overrides
# ---------------------------------------------------------------------------------------------------------------


# capo's clip_cov / kl_cov knobs -> verl's policy_loss keys (capo's defaults are verl's except kl_coef: 1 vs 0.1)
_VERL_LOSS_KNOBS = {"clip_cov": {"clip_ratio": "clip_cov_ratio", "cov_low": "clip_cov_lb", "cov_high": "clip_cov_ub"},
                    "kl_cov": {"kl_ratio": "kl_cov_ratio", "kl_coef": "ppo_kl_coef"}}


def preset_overrides(name: str) -> list[str]:
    """verl command-line overrides that run the ``algo.name`` preset ``name`` (``capo.core.presets.ALGORITHMS``)
    with capo's estimator and reward; ConfigError for a preset verl cannot run (c2gspg: verl's policy-loss functions
    never see the rewards its calibration term reads; DAPO's shaping: use verl's own settings). PPO-clip maps to
    verl's "vanilla" loss mode, clip_cov / kl_cov to verl's own loss modes of that name (equal to capo's on the same
    tensors: tests/core/test_loss_variants.py::test_agrees_with_verl), the aggregation to ``loss_agg_mode``."""
    p = engine_preset(name, "verl")
    verl_est = {core: v for v, core in ESTIMATORS.items()}[p["advantage"]]
    params = inspect.signature(POLICY_LOSSES.get(p["loss"])).parameters
    lk = {k: v.default for k, v in params.items() if v.default is not inspect.Parameter.empty} | p["loss_kwargs"]
    actor = "actor_rollout_ref.actor"
    out = [f"algorithm.adv_estimator={verl_est}",
           f"{actor}.policy_loss.loss_mode={'vanilla' if p['loss'] == 'ppo_clip' else p['loss']}",
           f"{actor}.loss_agg_mode={p['aggregation']}",
           f"{actor}.clip_ratio_low={lk.get('eps_low', 0.2)}", f"{actor}.clip_ratio_high={lk.get('eps_high', 0.2)}",
           f"reward.custom_reward_function.path={os.path.join(os.path.dirname(__file__), 'verl_reward.py')}",
           f"reward.custom_reward_function.name=compute_score_{p['reward']}",
           f"+algorithm.capo.reward={p['reward']}"]
    out += [f"{actor}.policy_loss.{verl_key}={lk[k]}" for k, verl_key in _VERL_LOSS_KNOBS.get(p["loss"], {}).items()]
    if p["loss"] == "ppo_clip" and lk.get("dual_clip") is None:
        out.append(f"{actor}.clip_ratio_c=1e9")  # capo's ppo_clip has no dual clip; verl's vanilla always clips at c
    out += [f"+algorithm.capo.{k}={v}" for k, v in p["advantage_kwargs"].items()]
    out += [f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in p["reward_kwargs"].items()]
    if p["noise_mask"] != "off":
        out.append(f"+algorithm.capo.mask_rule={'quantile' if p['noise_mask'] == 'quantile' else 'fixed'}")
    if p["noise_mask"] != "off" or "ref_token_logp" in needed_data(p["advantage"]):
        out += [f"{actor}.use_kl_loss=True", f"{actor}.kl_loss_coef=0"]
    return out


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


def _score(kind: str, solution_str: str, ground_truth, **kw) -> dict[str, Any]:
    b = score_texts([solution_str], [str(ground_truth)], kind=kind, verifier=_get_verifier(), **kw)
    out = {"score": b.rewards[0], "correct": float(b.correct[0]), "pred": b.answers[0] or ""}
    if kind != "correctness":
        out |= {"confidence": b.confidence[0], "format_ok": float(b.format_ok[0])}
    return out


def compute_score_rlcr(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                       format_failure_reward: float = -1.0, **kwargs) -> dict[str, Any]:
    """RLCR reward (arXiv 2507.16806, eq. 2) for verl: c - (q - c)^2 from ``<answer>``/``<confidence>`` tags,
    answers compared by mathematical equivalence. Returns verl's dict form: ``score`` plus ``correct``,
    ``confidence`` (NaN if missing), ``format_ok`` and ``pred`` (the extracted answer, "" if none; verl's name for
    it, SEED-GRPO's clusters are its equivalence classes); verl keeps the extra keys as reward_extra_info."""
    return _score("rlcr", solution_str, ground_truth, format_failure_reward=format_failure_reward)


def compute_score_ppo_c(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                        format_failure_reward: float = -1.0, weight: float = 0.5, threshold: float = 0.5,
                        **kwargs) -> dict[str, Any]:
    """PPO-C's calibrated reward in its verifiable form (arXiv 2410.09724, Sec. 4.2; ``capo.core.ppo_c_reward``) for
    verl: c +- w (q - 0.5) from ``<answer>``/``<confidence>`` tags; the same extra keys as
    :func:`compute_score_rlcr`. ``weight``/``threshold`` via ``reward.custom_reward_function.reward_kwargs``."""
    return _score("ppo_c", solution_str, ground_truth, format_failure_reward=format_failure_reward,
                  reward_kwargs={"weight": weight, "threshold": threshold})


def compute_score_correctness(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                              answer_format: str = "auto", **kwargs) -> dict[str, Any]:
    """Binary verifiable reward 1[answer equivalent to gold] for verl (answer by ``capo.verify.extract_answer``);
    extra keys ``correct`` and ``pred``."""
    return _score("correctness", solution_str, ground_truth, answer_format=answer_format)


compute_score = compute_score_rlcr  # verl's default custom reward function name

try:  # importing this module (what verl's plugin loader does) registers everything
    register()
except ImportError:  # verl is not installed: the reward functions above stay usable
    pass

