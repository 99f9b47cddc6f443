"""TRL adapter: capo's advantage estimators, CAPO's noise mask, RLCR rewards and calibration metrics inside TRL.

Install with ``pip install -e '.[trl]'`` in capo's clone (TRL pinned to 1.16.x: the internals used here change
between minors).

Use :class:`CapoGRPOTrainer` in place of ``trl.GRPOTrainer``::

    trainer = CapoGRPOTrainer(
        model="Qwen/Qwen2.5-Math-1.5B",
        reward_funcs=CorrectnessReward(answer_key="answer"),
        args=GRPOConfig(..., beta=0.0, num_generations=8),
        train_dataset=ds,                      # columns "prompt" and "answer"
        capo=CapoAdvantageConfig(advantage="capo", advantage_kwargs={"tau": 0.6}),
    )

What it changes in TRL, and nothing else: after TRL's ``_generate_and_score_completions`` has generated, scored and
computed its own GRPO advantages, the advantages are recomputed on the full gathered batch by capo's one step
(:func:`capo.rollout.step.step_advantages`, shared with capo's trainer and the verl plugin: numerical guard, CAPO's
noise mask, the extra inputs of ACE, SEED-GRPO and GDPO, the estimator, ``calib/*``) with the estimator named in
:class:`CapoAdvantageConfig` (whose settings are spelled as capo's trainer spells them: ``advantage``,
``advantage_kwargs``, ``noise_mask``, ``mask_low``, ...); this process's slice replaces ``out["advantages"]`` and
the completions table shows capo's values. Presets by name: :func:`capo_preset` (a policy loss other than TRL's own -- c2gspg, clip_cov, kl_cov -- is refused with the reason). TRL's rollout,
loss, clipping, aggregation and optimizer loop are untouched. Correct/incorrect is the verifier's verdict (capo's
reward functions, or ``verdict_reward``), never a thresholded reward.

Costs (per generation batch, this process's rows):
- CAPO (and the calibration metrics) need the mean token log-prob of each completion under the rollout policy.
  TRL keeps old log-probs only when it needs them (``num_iterations > 1``, misaligned generation, vLLM importance
  sampling); otherwise this adapter runs one extra no-grad forward pass of the policy -- about a third of the
  cost of a training forward+backward on the same batch (``time/capo_extra_forward_s`` logs it).
- CAPO's noise mask needs reference-model log-probs. TRL computes them only when ``beta != 0``; with ``beta = 0``
  (the paper's setting) this adapter runs one no-grad forward of a frozen reference through TRL's chunked per-token
  log-prob head: for a PEFT model TRL's "ref" adapter (else adapters disabled), a ``ref_model`` you pass, or a copy
  loaded from the same path (with ``args.model_init_kwargs``) when ``model`` is a string.
- lpm and PPL_ref are raw temperature-1 log-probs (``logprobs="raw"``); at a TRL temperature other than 1 that
  costs own forwards at temperature 1 (``logprobs="sampling"`` takes TRL's scaled ones instead).

Departures from TRL's own GRPO: rows for which every reward function returned ``None``, and rows without a real
token (``mask_truncated_completions``), get advantage 0 and are no CAPO pair partner (grpo/dr_grpo/rloo still count
them with reward 0 in the group mean); ``multi_objective_aggregation`` must be "sum_then_normalize" (the reward is
the weighted sum of the reward functions, as TRL's default).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from capo.adapters._common import (
    LOGPROB_MODES,
    ScoredBatch,
    check_estimator,
    completion_text,
    engine_preset,
    loss_knobs,
    score_texts,
)
from capo.core import (
    MASK_HIGH, MASK_LOW, MASK_Q_HIGH, MASK_Q_LOW, REWARDS, checks, needs_scores, resolve_noise_mask,
    reward_kwargs_problem,
)
from capo.errors import CapoError, ConfigError
from capo.processes import leave_process_group as _leave
from capo.rollout.grading import reads_stated_confidence
from capo.rollout.method_inputs import advantage_inputs, needed_data, needs_reference, summed_reward_unread
from capo.rollout.step import MaskThresholds, StepBatch, StepSpec, noise_mask_thresholds, step_advantages
from capo.verify import DEFAULT_ANSWER_FORMAT

try:
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("capo.adapters.trl needs TRL: pip install 'trl>=1.16,<1.17' (capo's extra `trl`)") from e

__all__ = ["BrierScoreReward", "CapoAdvantageConfig", "CapoGRPOTrainer", "CorrectnessReward", "LogScoreReward",
           "PPOCReward", "RLCRReward", "TRL_INTERNALS", "capo_preset", "leave_process_group"]

# The TRL internals this adapter relies on (checked by tests/adapters/test_trl_internals.py).
TRL_INTERNALS = {
    "methods": ("_generate_and_score_completions", "_calculate_rewards", "_get_per_token_logps_and_entropies"),
    "attributes": ("num_generations", "num_generations_eval", "reward_weights", "reward_funcs", "beta",
                   "ref_model", "temperature", "accelerator", "_metrics", "_logs", "multi_objective_aggregation"),
    "output_keys": ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"),
    "optional_output_keys": ("old_per_token_logps", "ref_per_token_logps", "tool_mask"),
    "functions": ("add_fused_lm_head", "create_model_from_path", "disable_dropout_in_model", "use_adapter"),
}


# CapoAdvantageConfig's old keyword names -> the names capo's trainer uses (algo.advantage, ...)
_RENAMED = {"estimator": "advantage", "estimator_kwargs": "advantage_kwargs", "mask_rule": "noise_mask"}


@dataclass
class CapoAdvantageConfig:
    """How :class:`CapoGRPOTrainer` computes advantages and what it logs. The settings have the names (and values)
    of capo's trainer's ``algo.*`` keys; the old names (``estimator``, ``estimator_kwargs``, ``mask_rule``) raise a
    TypeError naming the new ones."""

    advantage: str = "capo"
    """capo advantage estimator name (``capo.core.ADVANTAGES``): capo, grpo, dr_grpo, rloo, ace, seed_grpo, gdpo,
    unlikeliness, ngrpo. ace needs reference log-probs (as the noise mask; see ``ref_model``), seed_grpo the
    extracted answers of a capo reward function, gdpo reads RLCR's two terms (RLCRReward alone) or one component
    per reward function (weighted by ``reward_weights`` unless advantage_kwargs gives ``weights``)."""
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the estimator, e.g. {"tau": 0.6} for capo, {"eps": 1e-4} for grpo (TRL's eps)."""
    noise_mask: str | None = None
    """CAPO's reference-perplexity noise mask on the estimator's advantages (A_i * keep_i), for any estimator (GRPO +
    mask is the paper's ablation): "off"; "fixed" (mask_low/mask_high); "quantile" (the mask_q_low/mask_q_high
    quantiles of the reference perplexities of the first training generation batch, i.e. the base model's own
    rollouts at step 0, then frozen); None = the default, "fixed" for capo and "off" otherwise
    (``capo.core.default_noise_mask``). Needs reference log-probs."""
    mask_low: float = MASK_LOW
    """Keep an incorrect response only if PPL_ref >= mask_low (paper value for Qwen2.5-Math)."""
    mask_high: float = MASK_HIGH
    """Keep a correct response only if PPL_ref <= mask_high (paper value for Qwen2.5-Math)."""
    mask_q_low: float = MASK_Q_LOW
    """Quantile giving mask_low under noise_mask="quantile"."""
    mask_q_high: float = MASK_Q_HIGH
    """Quantile giving mask_high under noise_mask="quantile"."""
    verdict_reward: str | None = None
    """Where correct/incorrect comes from when no capo reward function (CorrectnessReward, RLCRReward) is used:
    the name of the reward function whose values are the verifier's 0/1 verdicts (default: the first one). Its
    values must be 0 or 1 (None for unscored rows); a reward is never thresholded."""
    logprobs: str = "raw"
    """Log-probs for lpm and PPL_ref: "raw" = temperature-1 (the paper's, capo's trainer; with TRL temperature != 1
    this costs capo its own forward passes), "sampling" = TRL's temperature-scaled ones."""
    calibration_metrics: bool = True
    """Log calib/* metrics each generation batch (needs the rollout log-probs: may cost the extra forward)."""

    def __new__(cls, *args, **kwargs):
        checks.renamed("CapoAdvantageConfig", {k: v for k, v in kwargs.items() if k in _RENAMED}, _RENAMED)
        return super().__new__(cls)

    def uses_mask(self) -> bool:
        return resolve_noise_mask(self.advantage, self.noise_mask) != "off"

    def needs_reference(self) -> bool:
        """Reference log-probs: CAPO's noise mask, or an estimator input built from them (ACE)."""
        return needs_reference(self.advantage, resolve_noise_mask(self.advantage, self.noise_mask))

    def needs_scores(self) -> bool:
        return needs_scores(self.advantage) or "token_logp" in needed_data(self.advantage) or self.calibration_metrics


def mask_thresholds(cfg: CapoAdvantageConfig) -> MaskThresholds | None:
    """The run's noise-mask state (quantile thresholds freeze on its first batch), or None when the mask is off
    (:func:`capo.rollout.step.noise_mask_thresholds`, as the verl plugin; ConfigError for a value not allowed)."""
    return noise_mask_thresholds(cfg.advantage, cfg.noise_mask, engine="CapoGRPOTrainer", mask_low=cfg.mask_low,
                                 mask_high=cfg.mask_high, mask_q_low=cfg.mask_q_low, mask_q_high=cfg.mask_q_high)


# ---------------------------------------------------------------------------------------------------------------
# reward functions with TRL's signature: fn(prompts, completions, completion_ids, **dataset_columns) -> list[float]
# ---------------------------------------------------------------------------------------------------------------


class _TextReward:
    kind = ""

    def __init__(self, answer_key: str = "answer", *, verifier=None, answer_format: str = DEFAULT_ANSWER_FORMAT,
                 format_failure_reward: float | None = None, reward_kwargs: dict | None = None):
        self.answer_key = answer_key
        self.reward_kwargs = dict(reward_kwargs or {})  # the core reward's other knobs (PPO-C: weight, threshold)
        if self.kind in REWARDS.names():  # checked now, as the trainer checks algo.reward_kwargs, not at the 1st step
            problem = reward_kwargs_problem(self.kind, self.reward_kwargs, key="reward_kwargs")
            if problem:
                raise ConfigError(f"{type(self).__name__}: {problem}")
        self.verifier = verifier
        self.answer_format = answer_format
        self.format_failure_reward = format_failure_reward
        self.last: ScoredBatch | None = None  # verdicts of the latest call (read by CapoGRPOTrainer for metrics)

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        if self.answer_key not in kwargs:
            cols = sorted(k for k in kwargs if k not in ("trainer_state", "log_extra", "log_metric", "environments"))
            raise ConfigError(
                f"{self.__name__}: the dataset has no column {self.answer_key!r} with the gold answers; "
                f"columns: {', '.join(cols) or '(none)'}. Pass answer_key=<column>."
            )
        if self.verifier is None:
            from capo.adapters._common import default_verifier

            self.verifier = default_verifier()
        self.last = score_texts(
            [completion_text(c) for c in completions], kwargs[self.answer_key], kind=self.kind,
            verifier=self.verifier, answer_format=self.answer_format,
            format_failure_reward=self.format_failure_reward, reward_kwargs=self.reward_kwargs,
        )
        return self.last.rewards


class RLCRReward(_TextReward):
    """RLCR reward (arXiv 2507.16806, eq. 2) as a TRL reward function: c - (q - c)^2 from the ``<answer>`` and
    ``<confidence>`` tags; answers are compared by mathematical equivalence (``capo.verify.Verifier``). Malformed
    output gets ``format_failure_reward`` (default -1). Gold answers come from the dataset column ``answer_key``."""

    kind = "rlcr"
    __name__ = "rlcr"


class PPOCReward(_TextReward):
    """PPO-C's calibrated reward in its verifiable form (arXiv 2410.09724, Sec. 4.2; ``capo.core.ppo_c_reward``) as a
    TRL reward function: c + w (q - 0.5) for a correct answer, c - w (q - 0.5) otherwise, from the ``<answer>`` and
    ``<confidence>`` tags; ``reward_kwargs``: weight (0.5), threshold (0.5). Malformed output gets
    ``format_failure_reward`` (default -1)."""

    kind = "ppo_c"
    __name__ = "ppo_c"


class LogScoreReward(_TextReward):
    """The log score of a stated probability (arXiv 2508.11800, Sec. 3; ``capo.core.log_score_reward``) as a TRL
    reward function: a log q + (1 - a) log(1 - q), a = the verdict. ``answer_format`` (default "percent": the
    response is two digits 01-99 stating the probability of a fixed outcome, the gold "1" / "0"; "outcome": ``D NN``
    and q = the stated P(correct); otherwise the RLCR tags). An invalid answer gets ``format_failure_reward``
    (default: log 0.01, the worst score of a valid two-digit answer)."""

    kind = "log_score"
    __name__ = "log_score"

    def __init__(self, answer_key: str = "answer", *, answer_format: str = "percent", **kw):
        super().__init__(answer_key, answer_format=answer_format, **kw)


class BrierScoreReward(LogScoreReward):
    """The negative Brier score -(q - a)^2 of a stated probability (``capo.core.brier_score_reward``) as a TRL
    reward function; answer formats and failures as :class:`LogScoreReward` (default failure: -(0.99)^2)."""

    kind = "brier_score"
    __name__ = "brier_score"


class CorrectnessReward(_TextReward):
    """Binary verifiable reward 1[answer equivalent to gold] as a TRL reward function. The answer is extracted with
    ``capo.verify.extract_answer(text, answer_format)`` (default "auto": RLCR tag, else last ``\\boxed{}``, else
    ``#### N``)."""

    kind = "correctness"
    __name__ = "correctness"


# how CapoGRPOTrainer gets each piece of data an estimator input is built from (method_inputs' error hints)
_HINTS = {"answers": "use capo's CorrectnessReward, RLCRReward or PPOCReward as a reward function (they record the "
                     "extracted answers)",
          "confidence": "use one of capo's reward functions on a stated confidence (RLCRReward, PPOCReward, "
                        "LogScoreReward, BrierScoreReward): they record the verbal confidences",
          "ref_token_logp": "pass ref_model=<model or path>, or pass `model` as a path, or set beta != 0"}
_REWARD_CLASSES = {"correctness": CorrectnessReward, "rlcr": RLCRReward, "ppo_c": PPOCReward,
                   "log_score": LogScoreReward, "brier_score": BrierScoreReward}
# capo's aggregation -> TRL's loss_type with the same normaliser (TRL's "dapo" divides by the global token count)
_LOSS_TYPES = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo"}


def capo_preset(name: str, *, answer_key: str = "answer", verifier=None) -> tuple[CapoAdvantageConfig, dict, Any]:
    """An ``algo.name`` preset (``capo.core.presets.ALGORITHMS``) for TRL: (CapoAdvantageConfig, the GRPOConfig
    settings it implies -- loss_type, epsilon, epsilon_high, beta 0 --, the reward function). ConfigError for a
    preset TRL cannot run (a policy loss other than PPO-clip: c2gspg, clip_cov, kl_cov, gspo, cispo; DAPO's group
    filter and overlong shaping), saying why. The preset's ``noise_mask`` is taken as it is (CAPO's: "quantile")."""
    p = engine_preset(name, "trl")
    lk = loss_knobs(p["loss"], p["loss_kwargs"])  # the trainer's bounds: each given, else ppo_clip's default
    grpo = {"loss_type": _LOSS_TYPES[p["aggregation"]], "beta": 0.0, "epsilon": lk["eps_low"],
            "epsilon_high": lk["eps_high"]}
    cfg = CapoAdvantageConfig(advantage=p["advantage"], advantage_kwargs=dict(p["advantage_kwargs"]),
                              noise_mask=p["noise_mask"])
    reward = _REWARD_CLASSES[p["reward"]](answer_key, verifier=verifier, reward_kwargs=p["reward_kwargs"])
    return cfg, grpo, reward


# ---------------------------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------------------------


def _with_trl_scale(cfg: CapoAdvantageConfig, scale_rewards) -> CapoAdvantageConfig:
    """TRL's ``scale_rewards`` (its GRPO std normalisation: "group", "batch", "none"; True/False the old spellings)
    is the ``scale`` of capo's estimators that take one (grpo, ace, seed_grpo, unlikeliness) unless
    ``advantage_kwargs`` gives one (capo's own setting wins, as on verl's path); for another estimator anything but
    the default is refused. It was ignored, so a TRL run with ``scale_rewards="none"`` trained with group-std
    scaling unseen."""
    from dataclasses import replace

    from capo.core import hyperparameters

    sr = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)
    if "scale" in hyperparameters(cfg.advantage):
        if "scale" in cfg.advantage_kwargs:
            return cfg
        return replace(cfg, advantage_kwargs={**cfg.advantage_kwargs, "scale": sr})
    if sr != "group":
        raise ConfigError(f"CapoGRPOTrainer: GRPOConfig.scale_rewards={sr!r} is TRL's GRPO normalisation; capo's "
                          f"{cfg.advantage!r} computes the advantages and has no scale to pass it to")
    return cfg


class CapoGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with capo's advantages (see the module docstring). Extra arguments:

    capo: :class:`CapoAdvantageConfig` (default: CAPO with the noise mask and calibration metrics).
    ref_model: frozen reference for CAPO's noise mask when ``beta == 0`` -- a model or a path (loaded with
        ``args.model_init_kwargs``, as TRL loads its own reference); default: loaded from ``model`` when that is a
        path; ignored when TRL has its own reference (``beta != 0``) or for PEFT models (TRL's convention: the
        "ref" adapter if the model has one, else the base model with adapters disabled).

    Debug/test attribute: ``capo_last_batch`` holds the full gathered tensors of the latest generation batch
    (rewards_per_func, rewards, correct, valid, scores, keep, ref_ppl, mask_thresholds, advantages,
    trl_advantages_local, process_slice).
    """

    def __init__(self, model, reward_funcs=None, args=None, *pos, capo: CapoAdvantageConfig | None = None,
                 ref_model=None, **kwargs):
        self.capo = capo or CapoAdvantageConfig()
        check_estimator(self.capo.advantage, self.capo.advantage_kwargs, engine="CapoGRPOTrainer")
        if self.capo.logprobs not in LOGPROB_MODES:
            raise ConfigError(f"CapoGRPOTrainer: logprobs={self.capo.logprobs!r} is not allowed; allowed values: "
                              f"{', '.join(LOGPROB_MODES)}")
        self._capo_thresholds = mask_thresholds(self.capo)
        super().__init__(model, reward_funcs, args, *pos, **kwargs)
        self.capo = _with_trl_scale(self.capo, getattr(self.args, "scale_rewards", "group"))
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ConfigError(
                "CapoGRPOTrainer: multi_objective_aggregation must be 'sum_then_normalize' (capo's estimators take "
                f"the weighted sum of the reward functions), got {self.multi_objective_aggregation!r}"
            )
        names = list(self.reward_func_names)
        if self.capo.verdict_reward is not None and self.capo.verdict_reward not in names:
            raise ConfigError(f"CapoGRPOTrainer: verdict_reward={self.capo.verdict_reward!r} is not one of the reward "
                              f"functions: {', '.join(names)}")
        self._capo_note_unread_rewards(names)
        self.capo_last_batch: dict[str, Any] | None = None
        self._capo_rewards_per_func: torch.Tensor | None = None
        self._capo_ref = None  # own frozen reference model (beta == 0, not PEFT)
        if self.capo.needs_reference() and self.beta == 0.0 and not self._capo_is_peft():
            if ref_model is None and isinstance(model, str):
                ref_model = model
            if ref_model is None:
                what = ("CAPO's noise mask" if self.capo.uses_mask() else
                        f"estimator {self.capo.advantage!r} (an input it reads is built from them)")
                off = (", or set CapoAdvantageConfig(noise_mask='off')" if self.capo.uses_mask() else "")
                raise ConfigError(
                    f"CapoGRPOTrainer: {what} needs reference-model log-probs, and nothing supplies them: "
                    "TRL computes them only when beta != 0, and `model` was passed as an instance. Pass "
                    f"ref_model=<model or path> (the frozen base model), or pass `model` as a path{off}."
                )
            self._capo_ref = self._capo_prepare_ref(ref_model)

    def _capo_note_unread_rewards(self, names: list[str]) -> None:
        """Warn when reward functions beside the verdicts' cannot change the update (CAPO ranks the verdicts:
        :func:`capo.rollout.method_inputs.summed_reward_unread`), as ``capo train`` notes its own reward's shaping;
        legal, since TRL's logged rewards still show them, but training with and without them is the same."""
        why = summed_reward_unread(self.capo.advantage, None, "correctness")
        own = [n for n, f in zip(names, self.reward_funcs) if isinstance(f, _TextReward)]
        source = own[:1] or [self.capo.verdict_reward or names[0]]
        others = [n for n in names if n not in source]
        if why is not None and others:
            warnings.warn(f"CapoGRPOTrainer: reward function(s) {', '.join(others)} do not change the update: {why} "
                          f"(the verdicts come from {source[0]}); they show in TRL's logged rewards only",
                          stacklevel=3)

    # -- reference model ----------------------------------------------------------------------------------------
    def _capo_is_peft(self) -> bool:
        from accelerate.utils import is_peft_model

        return is_peft_model(self.accelerator.unwrap_model(self.model))

    def _capo_prepare_ref(self, ref_model):
        from trl.trainer.utils import add_fused_lm_head, create_model_from_path, disable_dropout_in_model

        if isinstance(ref_model, str):  # as TRL builds its own reference: args.model_init_kwargs, policy dtype
            init = dict(self.args.model_init_kwargs or {})
            if self.args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
                init["device_map"] = None
            init.setdefault("trust_remote_code", self.args.trust_remote_code)
            init.setdefault("dtype", self.model.dtype)
            ref_model = create_model_from_path(ref_model, **init)
        ref_model.eval().requires_grad_(False)
        if self.args.disable_dropout:
            disable_dropout_in_model(ref_model)
        # TRL's chunked per-token log-prob head (no full-vocabulary logits), at the temperature capo reads
        add_fused_lm_head(ref_model, temperature=self._capo_temperature(),
                          cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        if getattr(self, "is_deepspeed_enabled", False):
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(ref_model, self.accelerator)
        if getattr(self, "is_fsdp_enabled", False):
            from trl.models import prepare_fsdp

            return prepare_fsdp(ref_model, self.accelerator)
        return ref_model.to(self.accelerator.device)

    def _capo_temperature(self) -> float:
        """The temperature of the log-probs capo reads: 1 ("raw", the paper's) or TRL's sampling temperature."""
        return 1.0 if self.capo.logprobs == "raw" else float(self.temperature)

    @contextlib.contextmanager
    def _capo_policy_head(self):
        """The policy's fused log-prob head at capo's temperature for the duration (TRL's is at its own)."""
        if self._capo_temperature() == float(self.temperature):
            yield
            return
        from trl.trainer.utils import add_fused_lm_head

        base = self.accelerator.unwrap_model(self.model)
        base = base.get_base_model() if self._capo_is_peft() else base
        saved = base.__dict__.get("forward")
        add_fused_lm_head(base, temperature=self._capo_temperature(),
                          cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        try:
            yield
        finally:
            if saved is None:
                del base.forward
            else:
                base.forward = saved

    def _capo_token_logps(self, model, out: dict, batch_size: int) -> torch.Tensor:
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(model, ids, attn, out["completion_ids"].size(1),
                                                                  batch_size=batch_size)
        return logps

    def _capo_ref_token_logps(self, out: dict, batch_size: int) -> torch.Tensor:
        """Reference per-token log-probs of this process's completions: [n_local, T]."""
        if out.get("ref_per_token_logps") is not None and self._capo_temperature() == float(self.temperature):
            return out["ref_per_token_logps"]  # TRL computed them (beta != 0) at the temperature capo reads
        if self._capo_ref is not None:
            return self._capo_token_logps(self._capo_ref, out, batch_size)
        if self.ref_model is not None:  # TRL's own reference (beta != 0), its head at TRL's temperature
            raise CapoError("CapoGRPOTrainer: with beta != 0 and temperature != 1, logprobs='raw' needs a reference "
                            "scored at temperature 1; set CapoAdvantageConfig(logprobs='sampling')")
        from trl.trainer.utils import use_adapter

        model = self.accelerator.unwrap_model(self.model)  # PEFT, as TRL: the "ref" adapter, else adapters off
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None), self._capo_policy_head():
            return self._capo_token_logps(self.model, out, batch_size)

    # -- the override ------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._capo_rewards_per_func = rewards_per_func  # [N_all, F], already gathered across processes by TRL
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        rpf, self._capo_rewards_per_func = self._capo_rewards_per_func, None  # [N, F] gathered; this batch's only
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        if g < 2:  # TRL allows one generation per prompt in evaluation, advantage 0: no group to rank within
            self.capo_last_batch = None
            return out
        cfg, acc = self.capo, self.accelerator
        bs = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        if rpf is None:
            raise CapoError("CapoGRPOTrainer: TRL scored no rewards for this batch (its _calculate_rewards was not "
                            "called): this TRL version calls its hooks in another order than the adapter was written "
                            "for (TRL 1.16.x)")
        scored = ~torch.isnan(rpf).all(dim=1).cpu()  # [N]: rows some reward function scored
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1).double().cpu()  # [N]
        correct, conf = self._capo_verdicts(rpf)
        n_local = out["completion_ids"].size(0)
        sl = slice(acc.process_index * n_local, (acc.process_index + 1) * n_local)  # as TRL slices
        # truncated rows under mask_truncated_completions have an all-zero mask: the step drops them as partners
        mask = out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
        timings: dict[str, float] = {}  # time/*
        lp = self._capo_old_logps(out, bs, timings) if cfg.needs_scores() else None
        ref = None
        if cfg.needs_reference():
            t0 = time.perf_counter()
            self._capo_check_text_only(out)
            ref = self._capo_ref_token_logps(out, bs)
            timings["time/capo_ref_forward_s"] = time.perf_counter() - t0
        lp, full_mask, ref = (self._capo_gather_rows(x) for x in (lp, mask, ref))
        batch = StepBatch(rewards=rewards, group_size=g, mask=full_mask, correct=correct, token_logp=lp,
                          ref_token_logp=ref, valid=scored, confidence=conf)
        step = step_advantages(*self._capo_step_inputs(rpf, batch, mode))
        res = step.result
        trl_local = out["advantages"]
        out["advantages"] = res.advantages[sl].to(device=trl_local.device, dtype=trl_local.dtype)
        self._capo_log_table_advantages(res.advantages)
        self.capo_last_batch = {
            "rewards_per_func": rpf, "rewards": rewards, "correct": correct, "valid": res.valid, "scores": res.scores,
            "keep": res.keep,
            "advantages": res.advantages, "trl_advantages_local": trl_local, "process_slice": sl, "group_size": g,
            "mask_thresholds": step.thresholds, "ref_ppl": res.ref_ppl,
        }
        for k, v in {**step.metrics, **timings}.items():
            if not math.isnan(v):  # e.g. AUC-mean when no prompt has both classes: absent rather than NaN
                self._metrics[mode][k].append(v)
        return out

    def _capo_step_inputs(self, rpf: torch.Tensor, batch: StepBatch, mode: str = "train"
                          ) -> tuple[StepBatch, StepSpec]:
        """``batch`` (the gathered verdicts, rewards and log-probs) with what the estimator's extra inputs are built
        from, and the step's spec. Answers and format flags come from capo's reward function; GDPO's components are
        RLCR's two terms with RLCRReward alone, else one per reward function (``rpf`` [N, F]; unscored = 0), weighted
        by TRL's ``reward_weights`` unless ``weights`` is given. An eval batch (``mode``) before the first training
        batch never freezes the quantile mask's thresholds: it reads its own, and the first training batch sets the
        run's (``eval_on_start`` had frozen them on the eval prompts)."""
        cfg = self.capo
        hp = dict(cfg.advantage_kwargs)
        funcs = [f for f in self.reward_funcs if isinstance(f, _TextReward) and f.last is not None]
        f = funcs[0] if funcs else None
        rlcr = len(self.reward_funcs) == 1 and isinstance(f, RLCRReward)
        need = needed_data(cfg.advantage, reward="rlcr" if rlcr else "terms")  # gather only what is read
        if f is not None and "answers" in need:
            from accelerate.utils import gather_object

            batch.answers = gather_object(list(f.last.answers))
            batch.answer_format = f.answer_format  # SEED-GRPO's clusters by the rule the reward graded with
        if f is not None and "format_ok" in need:
            batch.format_ok = self.accelerator.gather(torch.tensor(f.last.format_ok,
                                                                   device=self.accelerator.device)).cpu()
        batch.verifier = f.verifier if f is not None else None
        batch.reward_terms = torch.nan_to_num(rpf.double().cpu())
        if "components" in advantage_inputs(cfg.advantage) and not rlcr:
            hp.setdefault("weights", [float(w) for w in self.reward_weights])
        mask = self._capo_thresholds
        if mode == "eval" and mask is not None and mask.value is None:  # not yet set: read, never frozen, here
            mask = copy.copy(mask)
        spec = StepSpec(cfg.advantage, advantage_kwargs=hp, reward="rlcr" if rlcr else "terms",
                        reward_kwargs={"format_failure_reward": f.format_failure_reward}
                        if rlcr and f.format_failure_reward is not None else {},
                        mask=mask, calibration=cfg.calibration_metrics, engine="CapoGRPOTrainer",
                        hints=_HINTS)
        return batch, spec

    def _capo_gather_rows(self, x):
        """This process's [n_local, T] rows -> the whole batch's [N, T_max] (completions are padded per process)."""
        if x is None:
            return None
        x = self.accelerator.pad_across_processes(x.double() if x.is_floating_point() else x, dim=1, pad_index=0)
        return self.accelerator.gather(x).cpu()

    def _capo_log_table_advantages(self, adv: torch.Tensor) -> None:
        """TRL's completions table logs the advantages the loss uses: capo's, not the GRPO ones TRL computed."""
        logged = self._logs["advantages"]
        for _ in range(min(adv.numel(), len(logged))):
            logged.pop()
        logged.extend(adv.tolist())

    def _capo_old_logps(self, out: dict, batch_size: int, timings: dict) -> torch.Tensor:
        """Rollout-policy per-token log-probs of this process's rows [n_local, T] at capo's temperature."""
        old = out.get("old_per_token_logps")
        if old is not None and self._capo_temperature() == float(self.temperature):
            return old  # TRL kept them (num_iterations > 1, steps_per_generation > 1, vLLM IS correction)
        t0 = time.perf_counter()  # TRL did not keep them: one extra no-grad forward of the rollout policy
        self._capo_check_text_only(out)
        with self._capo_policy_head():
            old = self._capo_token_logps(self.model, out, batch_size)
        timings["time/capo_extra_forward_s"] = time.perf_counter() - t0
        return old

    def _capo_check_text_only(self, out: dict) -> None:
        if "pixel_values" in out or "num_images" in out:
            raise CapoError("CapoGRPOTrainer: multimodal inputs are not supported by capo's extra log-prob forward")

    # -- verdicts and calibration metrics -------------------------------------------------------------------------
    def _capo_verdicts(self, rpf: torch.Tensor):
        """(correct [N] bool, verbal confidence [N] float64 or None), gathered across processes: from capo's reward
        functions' latest call (the confidence from the first that reads a stated one: RLCR, PPO-C, the log and Brier
        scores), else from the verdict reward function's 0/1 values (never a thresholded reward)."""
        funcs = [f for f in self.reward_funcs if isinstance(f, _TextReward) and f.last is not None]
        dev = self.accelerator.device
        if funcs:
            correct = self.accelerator.gather(torch.tensor(funcs[0].last.correct, dtype=torch.bool, device=dev))
            rl = [f for f in funcs if reads_stated_confidence(f.kind)]
            conf = None if not rl else \
                self.accelerator.gather(torch.tensor(rl[0].last.confidence, dtype=torch.float64, device=dev))
            return correct.cpu(), None if conf is None else conf.cpu()
        names = list(self.reward_func_names)
        name = self.capo.verdict_reward or names[0]
        v = rpf[:, names.index(name)].double().cpu()
        if not bool((torch.isnan(v) | (v == 0) | (v == 1)).all()):
            raise CapoError(
                f"CapoGRPOTrainer: the reward function {name!r} returned values other than 0/1, so it cannot serve "
                "as the verifier's verdicts; use capo's CorrectnessReward/RLCRReward, or name a 0/1 verifier "
                "reward function with CapoAdvantageConfig(verdict_reward=...)"
            )
        return v == 1, None


def leave_process_group(trainer) -> bool:
    """Call at the end of a script run with ``accelerate launch`` on several processes, after the last save: waits
    for every process, leaves the process group and frees DDP before the group, so that the process can neither hang
    in torch's teardown nor be aborted with its threads live (:func:`capo.processes.leave_process_group` says why).
    The trainer cannot train on several processes afterwards. On one process: nothing. Returns whether DDP was freed
    before the group."""
    return _leave(trainer.accelerator, trainer.model_wrapped, lambda: setattr(trainer, "model_wrapped", trainer.model))
