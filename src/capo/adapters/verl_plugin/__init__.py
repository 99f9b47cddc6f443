"""verl plugin: capo's advantage estimators (CAPO with its noise mask, GRPO family) and RLCR rewards inside verl.

Install in the verl environment (``sh scripts/engine-env.sh verl``, or ``pip install -e '.[verl]'`` in capo's
clone). verl imports every entry point of the ``verl.plugins`` group when ``verl`` itself is imported
(``verl/__init__.py``: ``ep.load()``, governed by ``VERL_USE_EXTERNAL_PLUGINS``, default "auto"; a plugin that
fails to import is skipped with only a debug log). Loading ``capo.adapters.verl_plugin:register`` imports this package, and importing it registers
everything: verl never *calls* the entry point, so registration cannot wait for a call. ``register()`` is
idempotent and may also be called by hand.

One module per concern:
- :mod:`~capo.adapters.verl_plugin.estimators`: the estimators registered in verl's ``ADV_ESTIMATOR_REGISTRY``
  (``algorithm.adv_estimator=<name>``): ``capo`` (CAPO, arXiv 2604.12632) and ``capo_grpo``, ``capo_dr_grpo``,
  ``capo_rloo`` (capo core's versions of the GRPO family, prefixed so they never clash with verl's own
  ``grpo``/``rloo``), and ``capo_ace``, ``capo_seed_grpo``, ``capo_gdpo``, ``capo_unlikeliness``, ``capo_ngrpo``.
  Each hands the batch to capo's one step (:func:`capo.rollout.step.step_advantages`, shared with capo's trainer and
  the TRL adapter), so the advantage equals the core's on the very tensors verl holds (tested to 1e-6).
- :mod:`~capo.adapters.verl_plugin.patch`: the narrow wrappers of verl's advantage step that show capo's estimators
  the batch (``old_log_probs``, ``ref_log_prob``, the reward function's verdicts), and :func:`register`.
- :mod:`~capo.adapters.verl_plugin.run`: the run's state (:class:`CapoRun`: mask thresholds, the verifier), owned by
  verl's trainer object, and one call's :class:`BatchContext`. The modules keep no state.
- :mod:`~capo.adapters.verl_plugin.presets`: :func:`preset_overrides`, an ``algo.name`` preset as verl overrides.
- :mod:`~capo.adapters.verl_plugin.rewards`: verl custom reward functions (``compute_score_rlcr``,
  ``compute_score_correctness``, ``compute_score_ppo_c``, ``compute_score_log_score``, ``compute_score_brier_score``; by path: ``capo/adapters/verl_reward.py``).

Settings come from ``algorithm.capo``, named as capo's trainer names them (add with ``+algorithm.capo.<key>=...`` on
verl's command line); the estimator itself is verl's ``algorithm.adv_estimator=capo_<advantage>`` (``capo`` for CAPO):
  advantage_kwargs: the estimator's hyperparameters, e.g. ``+algorithm.capo.advantage_kwargs.tau=0.6`` (CAPO: tau,
  surrogate, norm, masked_partners, score, see ``capo.core.capo_advantage``; capo_grpo: eps, std_ddof, scale, where
  scale defaults to "group" or "none" following ``algorithm.norm_adv_by_std_in_grpo``);
  noise_mask: off, fixed or quantile (``capo.core.NOISE_MASKS``) for any estimator, e.g. capo_grpo + mask, the
  paper's ablation; unset: fixed for capo, off otherwise (``capo.core.default_noise_mask``); quantile takes the
  mask_q_low/mask_q_high quantiles of the first batch's reference perplexities, then freezes them;
  mask_low, mask_high, mask_q_low, mask_q_high (defaults and ranges: ``capo.core.masks``);
  logprobs ("raw": refuse verl's temperature-scaled log-probs at a rollout temperature != 1; "sampling": accept
  them); reward (the core reward the reward function computes: GDPO's components); format_failure_reward.
Any other key is refused with its new spelling where it has one (an estimator hyperparameter given flat, e.g. the
old ``algorithm.capo.tau``; the old ``mask_rule``; ``noise_mask=true/false``).

Correct/incorrect is the reward function's ``correct`` (legacy trainer: ``non_tensor_batch``; v1 trainer: each
row's ``extra_fields``), never a thresholded reward. verl's padding rows (uid ``pad...``) get advantage 0. Rows are
grouped by verl's ``uid``; every group except the padding rows must have the same size (verl's ``rollout.n``).
"""

from __future__ import annotations

from capo.adapters.verl_plugin.estimators import ESTIMATOR_FNS, ESTIMATORS
from capo.adapters.verl_plugin.patch import register
from capo.adapters.verl_plugin.presets import preset_overrides
from capo.adapters.verl_plugin import rewards as _rewards
from capo.adapters.verl_plugin.rewards import *  # noqa: F403 - compute_score and every compute_score_* (rewards.__all__)
from capo.adapters.verl_plugin.run import BatchContext, CapoRun, batch_context

__all__ = ["ESTIMATORS", "ESTIMATOR_FNS", "BatchContext", "CapoRun", "batch_context", *_rewards.__all__,
           "preset_overrides", "register"]

try:  # importing this package (what verl's plugin loader does) registers everything
    register()
except ImportError:  # verl is not installed: the reward functions and presets stay usable
    pass
