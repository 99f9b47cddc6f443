"""The narrow wrappers of verl's advantage step, and :func:`register`.

verl passes custom estimators only (token_level_rewards, response_mask, index, config), but capo's estimators need
the batch's ``old_log_probs`` (lpm), ``ref_log_prob`` (the noise mask) and the reward function's verdicts. For
capo's estimators the wrappers expose the batch and the run's state (:mod:`capo.adapters.verl_plugin.run`) for the
duration of the call and then run verl's own function unchanged; for every other estimator they call verl's
function directly. Wrapped: ``compute_advantage`` of ``verl.trainer.ppo.ray_trainer`` (also imported by name into
``verl.trainer.ppo.v1.utils``), the legacy ``RayPPOTrainer.fit`` (its run becomes the current one) and the v1
``PPOTrainer._compute_advantage`` (which reads the verdicts from TransferQueue's ``extra_fields``). The wrappers are
installed when the module is first imported (a one-shot import hook), or at once if it already is.
"""

from __future__ import annotations

import contextvars
import importlib.abc
import importlib.util
import sys
import threading
from enum import Enum

from capo.adapters.verl_plugin.estimators import ESTIMATOR_FNS, ESTIMATORS
from capo.adapters.verl_plugin.run import BatchContext, CapoRun, batch_context
from capo.core import ADVANTAGES
from capo.errors import ConfigError

__all__ = ["register"]

# what capo's reward functions return besides 'score' (verl keeps them per row as reward_extra_info); 'pred' is
# verl's own name for the extracted answer (its validation metrics vote on it)
REWARD_KEYS = ("correct", "confidence", "format_ok", "pred")
_TARGET = "verl.trainer.ppo.ray_trainer"
_TARGET_V1 = "verl.trainer.ppo.v1.trainer_base"
_lock = threading.Lock()
# the v1 trainer's context of the advantage step under way (set by _v1_compute_advantage for the duration of one
# call)
_V1_CALL: contextvars.ContextVar = contextvars.ContextVar("capo_verl_v1", default=None)


def _name(adv_estimator) -> str:
    return adv_estimator.value if isinstance(adv_estimator, Enum) else str(adv_estimator)


def _check_name(name: str) -> None:
    if name.startswith("capo") and name not in ESTIMATORS:
        raise ConfigError(
            f"algorithm.adv_estimator={name!r} is not an estimator the installed capo provides; capo's verl "
            f"estimators: {', '.join(ESTIMATORS)} (core estimators: {', '.join(ADVANTAGES.names())}). Upgrade "
            "capo in the verl environment if the name comes from a newer version."
        )


def _mark(wrapper, original):
    wrapper.__capo_wrapped__ = True
    wrapper.__wrapped__ = original
    wrapper.__doc__ = (original.__doc__ or "") + "\n\n(wrapped by capo.adapters.verl_plugin)"
    return wrapper


def _compute_advantage(original, data, adv_estimator, *args, **kwargs):
    """verl's compute_advantage ``original``, with the batch (and the current run, or a run of this call) shown to
    capo's estimators; the batch metrics go to ``meta_info["capo_metrics"]`` (the legacy trainer does not log
    them)."""
    name = _name(adv_estimator)
    _check_name(name)
    if name not in ESTIMATORS:
        return original(data, adv_estimator, *args, **kwargs)
    ctx, own = _V1_CALL.get(), False
    if ctx is not None:  # inside the v1 trainer's advantage step: its context, its run
        ctx.data = data
    else:
        run = CapoRun.current()
        own = run is None  # outside any run (e.g. called by hand): a run of this call only
        ctx = BatchContext(data, run=run or CapoRun(), temperature=data.meta_info.get("temperature"))
    try:
        with batch_context(ctx):
            out = original(data, adv_estimator, *args, **kwargs)
    finally:
        if own:
            ctx.run.close()
    out.meta_info["capo_metrics"] = dict(ctx.metrics)
    return out


def _wrap(original):
    """verl's compute_advantage wrapped by :func:`_compute_advantage`."""
    if getattr(original, "__capo_wrapped__", False):
        return original

    def compute_advantage(data, adv_estimator, *args, **kwargs):
        return _compute_advantage(original, data, adv_estimator, *args, **kwargs)

    return _mark(compute_advantage, original)


def _wrap_fit(original):
    """The legacy RayPPOTrainer.fit, with the trainer's run current for the whole of training."""
    if getattr(original, "__capo_wrapped__", False):
        return original

    def fit(self, *args, **kwargs):
        with CapoRun.of(self).active():
            return original(self, *args, **kwargs)

    return _mark(fit, original)


def _v1_extra(extra_fields, key: str) -> list:
    """``key`` of each row's ``extra_fields["reward_extra_info"]`` (None where absent)."""
    vals = extra_fields.tolist() if hasattr(extra_fields, "tolist") else list(extra_fields)
    out = []
    for v in vals:
        v = getattr(v, "data", v)
        info = v.get("reward_extra_info", {}) if isinstance(v, dict) else {}
        out.append(info.get(key) if isinstance(info, dict) else None)
    return out


def _v1_compute_advantage(original, self, batch, metrics):
    """verl v1's ``PPOTrainer._compute_advantage`` ``original``: it reads only the tensors it needs from
    TransferQueue, so the reward function's verdicts (``extra_fields``) are fetched here; the trainer owns the run;
    the batch metrics join the step metrics."""
    if _name(self.config.algorithm.adv_estimator) not in ESTIMATORS:
        return original(self, batch, metrics)
    tq = sys.modules[_TARGET_V1].tq
    extra = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    ctx = BatchContext(None, run=CapoRun.of(self), temperature=self.config.actor_rollout_ref.rollout.temperature,
                       extra={k: _v1_extra(extra["extra_fields"], k) for k in REWARD_KEYS})
    token = _V1_CALL.set(ctx)
    try:
        return original(self, batch, metrics)
    finally:
        _V1_CALL.reset(token)
        metrics.update(ctx.metrics)


def _wrap_v1(original):
    """verl v1's ``PPOTrainer._compute_advantage`` wrapped by :func:`_v1_compute_advantage`."""
    if getattr(original, "__capo_wrapped__", False):
        return original

    def _compute_advantage(self, batch, metrics):
        return _v1_compute_advantage(original, self, batch, metrics)

    return _mark(_compute_advantage, original)


def _patch_module(module) -> None:
    if module.__name__ == _TARGET_V1:
        cls = getattr(module, "PPOTrainer", None)
        if cls is None or not hasattr(cls, "_compute_advantage"):
            raise ImportError(f"capo verl plugin: {_TARGET_V1}.PPOTrainer._compute_advantage no longer exists")
        cls._compute_advantage = _wrap_v1(cls._compute_advantage)
        return
    fn, cls = getattr(module, "compute_advantage", None), getattr(module, "RayPPOTrainer", None)
    if fn is None or cls is None or not hasattr(cls, "fit"):
        raise ImportError(f"capo verl plugin: {module.__name__}.compute_advantage or RayPPOTrainer.fit no longer "
                          "exists in this verl")
    module.compute_advantage = _wrap(fn)
    cls.fit = _wrap_fit(cls.fit)
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
    """Register capo's estimators with verl and install the wrappers. Idempotent."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    with _lock:
        for name, fn in ESTIMATOR_FNS.items():
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
