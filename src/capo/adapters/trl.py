"""TRL adapter: capo's advantage estimators, CAPO's noise mask, RLCR rewards and calibration metrics inside TRL.

Install with ``pip install 'capo[trl]'`` (TRL pinned to 1.16.x: the internals used here change between minors).

Use :class:`CapoGRPOTrainer` in place of ``trl.GRPOTrainer``::

    trainer = CapoGRPOTrainer(
        model="Qwen/Qwen2.5-Math-1.5B",
        reward_funcs=CorrectnessReward(answer_key="answer"),
        args=GRPOConfig(..., beta=0.0, num_generations=8),
        train_dataset=ds,                      # columns "prompt" and "answer"
        capo=CapoAdvantageConfig(estimator="capo", estimator_kwargs={"tau": 0.6}),
    )

What it changes in TRL, and nothing else: after TRL's ``_generate_and_score_completions`` has generated, scored and
computed its own GRPO advantages, the advantages are recomputed on the full gathered batch with the capo estimator
named in :class:`CapoAdvantageConfig` and this process's slice replaces ``out["advantages"]``. TRL's rollout, loss,
clipping, aggregation and optimizer loop are untouched.

Costs (per generation batch, this process's rows):
- CAPO (and the calibration metrics) need the mean token log-prob of each completion under the rollout policy.
  TRL keeps old log-probs only when it needs them (``num_iterations > 1``, misaligned generation, vLLM importance
  sampling); otherwise this adapter runs one extra no-grad forward pass of the policy -- about a third of the
  cost of a training forward+backward on the same batch (``time/capo_extra_forward_s`` logs it).
- CAPO's noise mask needs reference-model log-probs. TRL computes them only when ``beta != 0``; with ``beta = 0``
  (the paper's setting) this adapter runs one no-grad forward of a frozen reference: the disabled-adapter base of a
  PEFT model, a ``ref_model`` you pass, or a copy loaded from the same path when ``model`` is a string.

Departures from TRL's own GRPO: rows for which every reward function returned ``None`` get reward 0 and are
masked (advantage 0) instead of being excluded from their group's mean; ``multi_objective_aggregation`` must be
"sum_then_normalize" (the reward is the weighted sum of the reward functions, as TRL's default).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from capo.adapters._common import (
    SCORE_ESTIMATORS,
    ScoredBatch,
    check_estimator,
    completion_text,
    score_texts,
)
from capo.core import MASK_HIGH, MASK_LOW, capo_noise_mask, compute_advantages, sequence_logprob_mean
from capo.errors import CapoError, ConfigError

try:
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("capo.adapters.trl needs TRL: pip install 'capo[trl]' (trl>=1.16,<1.17)") from e

__all__ = ["CapoAdvantageConfig", "CapoGRPOTrainer", "CorrectnessReward", "RLCRReward", "TRL_INTERNALS"]

# The TRL internals this adapter relies on (checked by tests/adapters/test_trl_internals.py).
TRL_INTERNALS = {
    "methods": ("_generate_and_score_completions", "_calculate_rewards", "_get_per_token_logps_and_entropies"),
    "attributes": ("num_generations", "num_generations_eval", "reward_weights", "reward_funcs", "beta",
                   "ref_model", "temperature", "accelerator", "_metrics", "multi_objective_aggregation"),
    "output_keys": ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"),
    "optional_output_keys": ("old_per_token_logps", "ref_per_token_logps", "tool_mask"),
}


@dataclass
class CapoAdvantageConfig:
    """How :class:`CapoGRPOTrainer` computes advantages and what it logs."""

    estimator: str = "capo"
    """capo advantage estimator name (``capo.core.ADVANTAGES``): capo, grpo, dr_grpo, rloo."""
    estimator_kwargs: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the estimator, e.g. {"tau": 0.6} for capo, {"eps": 1e-4} for grpo (TRL's eps)."""
    noise_mask: bool = True
    """CAPO's reference-perplexity noise mask (only read when estimator == "capo"); needs reference log-probs."""
    mask_low: float = MASK_LOW
    """Keep an incorrect response only if PPL_ref >= mask_low (paper value for Qwen2.5-Math)."""
    mask_high: float = MASK_HIGH
    """Keep a correct response only if PPL_ref <= mask_high (paper value for Qwen2.5-Math)."""
    correct_threshold: float = 0.5
    """A response counts as correct (CAPO's P set, the mask's label) iff its total reward > this."""
    calibration_metrics: bool = True
    """Log calib/* metrics each generation batch (needs the rollout log-probs: may cost the extra forward)."""

    def uses_mask(self) -> bool:
        return self.estimator == "capo" and self.noise_mask

    def needs_scores(self) -> bool:
        return self.estimator in SCORE_ESTIMATORS or self.calibration_metrics


# ---------------------------------------------------------------------------------------------------------------
# reward functions with TRL's signature: fn(prompts, completions, completion_ids, **dataset_columns) -> list[float]
# ---------------------------------------------------------------------------------------------------------------


class _TextReward:
    kind = ""

    def __init__(self, answer_key: str = "answer", *, verifier=None, answer_format: str = "auto",
                 format_failure_reward: float = -1.0):
        self.answer_key = answer_key
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
            from capo.adapters._common import _default_verifier

            self.verifier = _default_verifier()
        self.last = score_texts(
            [completion_text(c) for c in completions], kwargs[self.answer_key], kind=self.kind,
            verifier=self.verifier, answer_format=self.answer_format,
            format_failure_reward=self.format_failure_reward,
        )
        return self.last.rewards


class RLCRReward(_TextReward):
    """RLCR reward (arXiv 2507.16806, eq. 2) as a TRL reward function: c - (q - c)^2 from the ``<answer>`` and
    ``<confidence>`` tags; answers are compared by mathematical equivalence (``capo.verify.Verifier``). Malformed
    output gets ``format_failure_reward`` (default -1). Gold answers come from the dataset column ``answer_key``."""

    kind = "rlcr"
    __name__ = "rlcr"


class CorrectnessReward(_TextReward):
    """Binary verifiable reward 1[answer equivalent to gold] as a TRL reward function. The answer is extracted with
    ``capo.verify.extract_answer(text, answer_format)`` (default "auto": RLCR tag, else last ``\\boxed{}``, else
    ``#### N``)."""

    kind = "correctness"
    __name__ = "correctness"


# ---------------------------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------------------------


class CapoGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with capo's advantages (see the module docstring). Extra arguments:

    capo: :class:`CapoAdvantageConfig` (default: CAPO with the noise mask and calibration metrics).
    ref_model: frozen reference for CAPO's noise mask when ``beta == 0`` -- a model or a path; default: loaded from
        ``model`` when that is a path; ignored when TRL has its own reference (``beta != 0``) or for PEFT models
        (the base model with adapters disabled is the reference).

    Debug/test attribute: ``capo_last_batch`` holds the full gathered tensors of the latest generation batch
    (rewards, scores, keep, advantages, trl_advantages, process_slice).
    """

    def __init__(self, model, reward_funcs=None, args=None, *pos, capo: CapoAdvantageConfig | None = None,
                 ref_model=None, **kwargs):
        self.capo = capo or CapoAdvantageConfig()
        check_estimator(self.capo.estimator, self.capo.estimator_kwargs, engine="CapoGRPOTrainer")
        super().__init__(model, reward_funcs, args, *pos, **kwargs)
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ConfigError(
                "CapoGRPOTrainer: multi_objective_aggregation must be 'sum_then_normalize' (capo's estimators take "
                f"the weighted sum of the reward functions), got {self.multi_objective_aggregation!r}"
            )
        self.capo_last_batch: dict[str, Any] | None = None
        self._capo_rewards_per_func: torch.Tensor | None = None
        self._capo_ref = None  # own frozen reference model (beta == 0, not PEFT)
        if self.capo.uses_mask() and self.beta == 0.0 and not self._capo_is_peft():
            if ref_model is None and isinstance(model, str):
                ref_model = model
            if ref_model is None:
                raise ConfigError(
                    "CapoGRPOTrainer: CAPO's noise mask needs reference-model log-probs, and nothing supplies them: "
                    "TRL computes them only when beta != 0, and `model` was passed as an instance. Pass "
                    "ref_model=<model or path> (the frozen base model), or pass `model` as a path, or set "
                    "CapoAdvantageConfig(noise_mask=False)."
                )
            self._capo_ref = self._capo_prepare_ref(ref_model)

    # -- reference model ----------------------------------------------------------------------------------------
    def _capo_is_peft(self) -> bool:
        from accelerate.utils import is_peft_model

        return is_peft_model(self.accelerator.unwrap_model(self.model))

    def _capo_prepare_ref(self, ref_model):
        if isinstance(ref_model, str):
            from transformers import AutoModelForCausalLM

            ref_model = AutoModelForCausalLM.from_pretrained(ref_model, dtype=self.model.dtype)
        ref_model.eval().requires_grad_(False)
        if getattr(self, "is_deepspeed_enabled", False):
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(ref_model, self.accelerator)
        if getattr(self, "is_fsdp_enabled", False):
            from trl.models import prepare_fsdp

            return prepare_fsdp(ref_model, self.accelerator)
        return ref_model.to(self.accelerator.device)

    def _capo_ref_token_logps(self, out: dict) -> torch.Tensor:
        """Reference per-token log-probs of this process's completions: [n_local, T]."""
        if out.get("ref_per_token_logps") is not None:  # TRL computed them (beta != 0)
            return out["ref_per_token_logps"]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        t = out["completion_ids"].size(1)
        if self._capo_ref is None:  # PEFT: the base model with adapters disabled
            model = self.accelerator.unwrap_model(self.model)
            with torch.no_grad(), model.disable_adapter():
                logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, t)
            return logps
        chunks = []
        bs = self.args.per_device_train_batch_size
        with torch.no_grad(), self.accelerator.autocast():
            for s in range(0, ids.size(0), bs):
                logits = self._capo_ref(input_ids=ids[s:s + bs], attention_mask=attn[s:s + bs]).logits
                logits = logits[:, -t - 1:-1, :].float() / self.temperature  # [b, T, V]: logits predicting token t
                lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[s:s + bs, -t:, None]).squeeze(-1)
                chunks.append(lp)
        return torch.cat(chunks, dim=0)

    # -- the override ------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._capo_rewards_per_func = rewards_per_func  # [N_all, F], already gathered across processes by TRL
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        acc = self.accelerator
        cfg = self.capo

        rpf = self._capo_rewards_per_func  # [N, F] gathered
        unscorable = torch.isnan(rpf).all(dim=1)  # [N]
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
        rewards = rewards.masked_fill(unscorable, 0.0).double()  # [N] float64 for the core
        n_local = out["completion_ids"].size(0)
        sl = slice(acc.process_index * n_local, (acc.process_index + 1) * n_local)  # as TRL slices
        mask = out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
        timings: dict[str, float] = {}  # time/* and train/masked_frac

        scores = self._capo_scores(out, mask, mode, timings) if cfg.needs_scores() else None
        correct = rewards > cfg.correct_threshold  # [N]: CAPO's P set and the mask's label
        keep = ~unscorable
        if cfg.uses_mask():
            keep = keep & self._capo_noise_keep(out, mask, correct, timings)

        adv = compute_advantages(
            cfg.estimator, rewards, g,
            scores=scores if cfg.estimator in SCORE_ESTIMATORS else None,
            keep=keep, **cfg.estimator_kwargs,
        )  # [N] float64
        trl_local = out["advantages"]
        out["advantages"] = adv[sl].to(device=trl_local.device, dtype=trl_local.dtype)
        self.capo_last_batch = {
            "rewards": rewards, "scores": scores, "keep": keep, "correct": correct, "advantages": adv,
            "trl_advantages_local": trl_local, "process_slice": sl, "group_size": g,
        }

        metrics = self._capo_metrics(correct, scores, g, cfg)
        metrics.update(timings)
        for k, v in metrics.items():
            if not math.isnan(v):  # e.g. AUC-mean when no prompt has both classes: absent rather than NaN
                self._metrics[mode][k].append(v)
        return out

    def _capo_scores(self, out: dict, mask, mode: str, timings: dict) -> torch.Tensor:
        """CAPO's scores: lpm of each completion under the rollout policy [N], gathered across processes."""
        old = out.get("old_per_token_logps")
        if old is None:  # TRL did not keep them: one extra no-grad forward of the rollout policy
            t0 = time.perf_counter()
            self._capo_check_text_only(out)
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad():
                old, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, ids, attn, out["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size if mode == "train"
                    else self.args.per_device_eval_batch_size,
                )
            timings["time/capo_extra_forward_s"] = time.perf_counter() - t0
        return self.accelerator.gather(sequence_logprob_mean(old.double(), mask))  # [N]

    def _capo_noise_keep(self, out: dict, mask, correct, timings: dict) -> torch.Tensor:
        """CAPO's reference-perplexity noise mask [N] bool (reference log-probs of the local rows, gathered)."""
        t0 = time.perf_counter()
        self._capo_check_text_only(out)
        ref = self._capo_ref_token_logps(out)
        timings["time/capo_ref_forward_s"] = time.perf_counter() - t0
        ppl = self.accelerator.gather(torch.exp(-sequence_logprob_mean(ref.double(), mask)))
        noise_keep = capo_noise_mask(ppl, correct, low=self.capo.mask_low, high=self.capo.mask_high)
        timings["train/masked_frac"] = float((~noise_keep).double().mean())
        return noise_keep

    def _capo_check_text_only(self, out: dict) -> None:
        if "pixel_values" in out or "num_images" in out:
            raise CapoError("CapoGRPOTrainer: multimodal inputs are not supported by capo's extra log-prob forward")

    # -- calibration metrics --------------------------------------------------------------------------------------
    def _capo_verdicts(self):
        """(correct [N] bool, verbal confidence [N] float64 or None) gathered across processes, from the capo
        reward functions' latest call; None if no capo reward function is used."""
        funcs = [f for f in self.reward_funcs if isinstance(f, _TextReward) and f.last is not None]
        if not funcs:
            return None, None
        dev = self.accelerator.device
        correct = self.accelerator.gather(torch.tensor(funcs[0].last.correct, dtype=torch.bool, device=dev))
        rl = [f for f in funcs if isinstance(f, RLCRReward)]
        conf = None
        if rl:
            conf = self.accelerator.gather(torch.tensor(rl[0].last.confidence, dtype=torch.float64, device=dev))
        return correct, conf

    def _capo_metrics(self, correct_by_reward, scores, g, cfg) -> dict[str, float]:
        from capo.core import calibration

        m: dict[str, float] = {}
        if not cfg.calibration_metrics:
            return m
        correct, conf = self._capo_verdicts()
        if correct is None:
            correct = correct_by_reward
        correct = correct.cpu()
        group_ids = torch.arange(correct.numel()) // g
        s = calibration.summarize(scores.cpu(), correct, group_ids, verbal_conf=None if conf is None else conf.cpu())
        keys = ("accuracy", "auc_mean", "auc_mean_groups", "auroc", "ece", "brier")
        vkeys = ("verbal_ece", "verbal_brier", "verbal_auroc", "verbal_auc_mean", "verbal_missing")
        for k in keys + (vkeys if conf is not None else ()):
            m[f"calib/{k}"] = float(s[k])
        return m
