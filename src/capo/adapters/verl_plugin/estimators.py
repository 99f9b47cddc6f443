"""capo's advantage estimators as verl estimator functions (``algorithm.adv_estimator=<name>``).

Each reads its settings from ``algorithm.capo`` (named as capo's trainer names them: ``advantage_kwargs``,
``noise_mask``, ``mask_low``, ...; the estimator itself is verl's ``algorithm.adv_estimator=capo_<advantage>``),
the batch's log-probs and the reward function's per-row values from the
:class:`~capo.adapters.verl_plugin.run.BatchContext` of the ``compute_advantage`` call, puts the real rows in
groups (verl reorders rows and pads the batch), and hands them to capo's one step
(:func:`capo.rollout.step.step_advantages`, shared with capo's trainer and the TRL adapter).
"""

from __future__ import annotations

from typing import Any

import torch

from capo.adapters._common import LOGPROB_MODES, TEXT_REWARDS, check_estimator
from capo.adapters.verl_plugin.run import BatchContext, current_batch
from capo.core import (
    ADVANTAGES, MASK_HIGH, MASK_LOW, MASK_Q_HIGH, MASK_Q_LOW, NOISE_MASKS, hyperparameters, needs_scores,
    noise_mask_problem, resolve_noise_mask,
)
from capo.core.checks import did_you_mean
from capo.errors import ConfigError
from capo.rollout.method_inputs import StepBatch, needed_data
from capo.rollout.step import StepSpec, step_advantages

__all__ = ["ESTIMATORS", "ESTIMATOR_FNS"]

# verl estimator name -> capo core estimator name: every registered estimator, CAPO's first as "capo", the others as
# "capo_<name>" (verl's own grpo, rloo, ... keep their names)
ESTIMATORS = {"capo": "capo"} | {f"capo_{n}": n for n in ADVANTAGES.names() if n != "capo"}
REF_ON = ("set actor_rollout_ref.actor.use_kl_loss=True with actor_rollout_ref.actor.kl_loss_coef=0 so verl "
          "computes ref_log_prob (the KL term then contributes nothing)")
_ENABLE_REF = REF_ON + ", or disable CAPO's noise mask with +algorithm.capo.noise_mask=off"
# how verl supplies each piece of data an estimator input is built from (method_inputs' error hints)
_HINTS = {"ref_token_logp": REF_ON,
          "answers": "use capo's reward function (reward.custom_reward_function.path=<capo/adapters/verl_reward.py>, "
                     "name=compute_score_correctness/_rlcr/_ppo_c): it returns each answer as 'pred'",
          "confidence": "use capo's compute_score_rlcr, which returns 'correct', 'confidence' and 'format_ok'"}
# every key algorithm.capo may hold, with its default: advantage_kwargs = the estimator's hyperparameters; noise_mask
# one of capo.core.NOISE_MASKS for any estimator, None = capo.core.default_noise_mask (fixed for capo, else off)
OPTION_DEFAULTS = {"advantage_kwargs": {}, "noise_mask": None, "mask_low": MASK_LOW, "mask_high": MASK_HIGH,
                   "mask_q_low": MASK_Q_LOW, "mask_q_high": MASK_Q_HIGH, "logprobs": "raw", "reward": "correctness",
                   "format_failure_reward": -1.0}


def _settings(config) -> dict[str, Any]:
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


def _old_key(key: str, value, core_name: str) -> str:
    """What is wrong with a key ``algorithm.capo`` does not hold: an old name says its new spelling."""
    if key in ("advantage", "estimator"):
        return (f"algorithm.capo.{key} is not a setting: in verl the estimator is verl's own "
                f"algorithm.adv_estimator=capo_<advantage> (capo for CAPO), e.g. algorithm.adv_estimator={value}")
    if key == "mask_rule":
        return (f"algorithm.capo.mask_rule is gone: algorithm.capo.noise_mask says the rule now "
                f"({', '.join(NOISE_MASKS)}), e.g. +algorithm.capo.noise_mask={value}")
    if any(key in hyperparameters(name) for name in ADVANTAGES.names()):
        return (f"algorithm.capo.{key} is an estimator hyperparameter: estimator hyperparameters go in "
                f"algorithm.capo.advantage_kwargs now (as capo's algo.advantage_kwargs): "
                f"+algorithm.capo.advantage_kwargs.{key}={value}")
    return (f"algorithm.capo.{key} is not a capo setting{did_you_mean(key, OPTION_DEFAULTS)}; allowed keys: "
            f"{', '.join(OPTION_DEFAULTS)} (estimator {core_name!r}'s hyperparameters go in advantage_kwargs: "
            f"{', '.join(hyperparameters(core_name)) or '(none)'})")


def _options(settings: dict, core_name: str, config,
             engine: str = "verl") -> tuple[dict[str, Any], dict[str, Any]]:
    """``algorithm.capo`` -> (the plugin's settings with their defaults, the noise mask resolved; the estimator's
    hyperparameters). ConfigError prefixed with ``engine`` for a key or value not allowed."""
    for key in settings:
        if key not in OPTION_DEFAULTS:
            raise ConfigError(f"{engine}: {_old_key(key, settings[key], core_name)}")
    opts = {**OPTION_DEFAULTS, **settings}
    hp = dict(opts.pop("advantage_kwargs") or {})
    opts["noise_mask"] = resolve_noise_mask(core_name, opts["noise_mask"])
    problem = noise_mask_problem(opts["noise_mask"], key="algorithm.capo.noise_mask")
    if problem:
        raise ConfigError(f"{engine}: {problem}")
    if opts["reward"] not in TEXT_REWARDS:
        raise ConfigError(f"algorithm.capo.reward={opts['reward']!r} is not allowed; allowed values (the core reward "
                          f"your reward function computes): {', '.join(TEXT_REWARDS)}")
    if opts["logprobs"] not in LOGPROB_MODES:
        raise ConfigError(f"algorithm.capo.logprobs={opts['logprobs']!r} is not allowed; allowed values: "
                          f"{', '.join(LOGPROB_MODES)}")
    if "scale" in hyperparameters(core_name) and "scale" not in hp and config is not None:
        hp["scale"] = "group" if (config.get("norm_adv_by_std_in_grpo", True) if hasattr(config, "get")
                                  else True) else "none"
    return opts, hp


def _padding_rows(index, n: int) -> torch.Tensor:
    """[N] bool: verl's synthetic padding rows (``upsample_batch_to_divisible_size`` gives them one ``pad...``
    uid; verl's own uids are uuid4 strings, which never start with "pad")."""
    if index is None:
        raise ConfigError("capo's verl estimators need the batch's uid (verl's `index`) to form groups; it is missing")
    uids = [str(u) for u in list(index)]
    if len(uids) != n:
        raise ValueError(f"index has {len(uids)} entries but the batch has {n} responses")
    return torch.tensor([u.startswith("pad") for u in uids], dtype=torch.bool)


def _grouped_rows(index, n: int) -> tuple[torch.Tensor, int]:
    """The real (non-padding) rows in an order that puts rows of the same uid next to each other (stable), and the
    common group size G."""
    rows = torch.nonzero(~_padding_rows(index, n)).squeeze(1)  # [N_real]
    uids = list(index)
    first: dict[Any, int] = {}
    gid = torch.tensor([first.setdefault(uids[i], len(first)) for i in rows.tolist()], dtype=torch.long)
    sizes = torch.bincount(gid)
    if not bool((sizes == sizes[0]).all()):
        raise ConfigError(
            f"capo's estimators need every prompt to have the same number of responses (actor_rollout_ref.rollout.n);"
            f" got group sizes {sorted(set(sizes.tolist()))}"
        )
    return rows[torch.sort(gid, stable=True).indices], int(sizes[0])


def _ctx_values(ctx: BatchContext | None, key: str, n: int) -> list | None:
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


def _verdicts(ctx, rewards: torch.Tensor, need: bool, who: str) -> torch.Tensor | None:
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


def _check_temperature(ctx, opts) -> None:
    t = None if ctx is None else ctx.temperature
    if opts["logprobs"] == "raw" and t is not None and float(t) != 1.0:
        raise ConfigError(
            f"verl computes old_log_probs and ref_log_prob from logits divided by the rollout temperature ({t}), "
            "but CAPO's lpm and PPL_ref are temperature-1 log-probs (the paper's): set "
            "actor_rollout_ref.rollout.temperature=1.0, or accept the scaled ones with +algorithm.capo.logprobs=sampling"
        )


def _log_probs(ctx, name: str) -> torch.Tensor | None:
    if ctx is None:
        return None
    batch = ctx.data.batch
    x = batch[name] if name in batch.keys() else None
    if x is None and name == "old_log_probs" and "rollout_log_probs" in batch.keys():
        x = batch["rollout_log_probs"]  # bypass mode: the rollout's log-probs are the old policy's
    return None if x is None else x.double()


def _step_batch(ctx, verl_name: str, opts, token_level_rewards, response_mask, index) -> tuple[StepBatch, torch.Tensor]:
    """The real rows, grouped, as capo's step takes them, and which rows of verl's batch they are; ConfigError
    naming the verl setting for missing data."""
    core_name, n = ESTIMATORS[verl_name], token_level_rewards.shape[0]
    rows, g = _grouped_rows(index, n)
    need = needed_data(core_name, reward=opts["reward"])
    rewards = token_level_rewards.sum(dim=-1).double()  # [N] outcome reward (verl puts it on the last token)
    reads_verdicts = "correct" in ADVANTAGES.reads(core_name)  # CAPO; the mask too
    mask_on = opts["noise_mask"] != "off"
    correct = _verdicts(ctx, rewards, need=reads_verdicts or "confidence" in need or mask_on, who=verl_name)
    _check_temperature(ctx, opts)
    lp, ref = _log_probs(ctx, "old_log_probs"), _log_probs(ctx, "ref_log_prob")
    if (needs_scores(core_name) or "token_logp" in need) and lp is None:
        raise ConfigError(f"verl estimator {verl_name!r} needs old_log_probs (or rollout_log_probs) in the "
                          "batch: keep verl's actor log-prob recomputation on")
    if mask_on and ref is None:
        raise ConfigError(f"verl estimator {verl_name!r} with CAPO's noise mask needs ref_log_prob in the batch: "
                          f"{_ENABLE_REF}")
    preds = _ctx_values(ctx, "pred", n)
    answers = None if preds is None else [None if preds[i] is None or str(preds[i]) == "" else str(preds[i])
                                          for i in rows.tolist()]
    fmt = _floats(_ctx_values(ctx, "format_ok", n), rows)
    answer_format = _answer_format(ctx, n) if answers else None
    batch = StepBatch(rewards=rewards[rows], group_size=g, mask=response_mask[rows],
                      correct=None if correct is None else correct[rows], token_logp=None if lp is None else lp[rows],
                      ref_token_logp=None if ref is None else ref[rows], answers=answers,
                      confidence=_floats(_ctx_values(ctx, "confidence", n), rows),
                      format_ok=None if fmt is None else fmt > 0.5,
                      verifier=ctx.run.verifier() if answers else None, answer_format=answer_format)
    return batch, rows


def _answer_format(ctx, n: int) -> str | None:
    """The answer format capo's reward function read "pred" in (its ``answer_format`` key; None: another reward
    function, math-verify classes). One batch, one format: rows graded in several formats are refused."""
    formats = {str(f) for f in _ctx_values(ctx, "answer_format", n) or [] if f is not None}
    if len(formats) > 1:
        raise ConfigError(f"the batch's answers were read in several formats ({', '.join(sorted(formats))}): "
                          "SEED-GRPO's clusters need one rule per batch; use one answer_format for every data source")
    return formats.pop() if formats else None


def _estimate(verl_name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
              config) -> torch.Tensor:
    """The body of the verl estimator ``verl_name`` (:func:`_make_estimator`): [N, T] advantages."""
    core_name = ESTIMATORS[verl_name]
    engine = f"verl estimator {verl_name!r} (algorithm.capo)"
    opts, hp = _options(_settings(config), core_name, config, engine)
    check_estimator(core_name, hp, engine=engine, key="algorithm.capo.advantage_kwargs")
    ctx = current_batch()
    if ctx is None and (needs_scores(core_name) or needed_data(core_name, reward=opts["reward"])
                        or opts["noise_mask"] != "off"):
        raise ConfigError(
            f"verl estimator {verl_name!r} was called outside verl's compute_advantage, so it cannot see the "
            "batch's old_log_probs/ref_log_prob: load the plugin through verl (entry point group verl.plugins, "
            "VERL_USE_EXTERNAL_PLUGINS not 'none') or call capo.adapters.verl_plugin.register() before "
            "importing verl.trainer.ppo.ray_trainer"
        )
    batch, rows = _step_batch(ctx, verl_name, opts, token_level_rewards, response_mask, index)
    spec = StepSpec(core_name, advantage_kwargs=hp, reward=opts["reward"],
                    reward_kwargs={"format_failure_reward": opts["format_failure_reward"]},
                    mask=ctx.run.mask(opts, engine) if opts["noise_mask"] != "off" else None, engine=engine,
                    hints=_HINTS)
    step = step_advantages(batch, spec)
    if ctx is not None:
        ctx.metrics.update(step.metrics)
    out = torch.zeros(token_level_rewards.shape[0], dtype=step.result.advantages.dtype)
    out[rows] = step.result.advantages
    return out.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask  # [N, T]


def _make_estimator(verl_name: str):
    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None, config=None,
                  **unused) -> tuple[torch.Tensor, torch.Tensor]:
        """capo core's advantage on verl's batch: [N, T] rewards and mask -> ([N, T] advantages, [N, T] returns).
        Padding rows (uid ``pad...``) get advantage 0 and take no part."""
        advantages = _estimate(verl_name, token_level_rewards, response_mask, index, config)
        return advantages, advantages

    estimator.__capo_verl__ = True
    estimator.__name__ = f"capo_verl_{verl_name}"
    estimator.__qualname__ = estimator.__name__
    return estimator


ESTIMATOR_FNS = {name: _make_estimator(name) for name in ESTIMATORS}
