"""The pure algorithm core: tensor functions with documented shapes, one registry per kind.

Imports only torch and numpy. Nothing here knows about trainers, CLIs, TRL or verl.
"""

from capo.core import advantage_variants, advantages, confidence, loss_variants, losses, rewards  # noqa: F401
from capo.core.advantages import capo_advantage, compute_advantages, dr_grpo_advantage, grpo_advantage, rloo_advantage
from capo.core.advantage_variants import (
    ace_advantage, gdpo_advantage, ngrpo_advantage, seed_grpo_advantage, semantic_entropy, unlikeliness_advantage,
)
from capo.core.dapo import GROUP_FILTER_BY, informative_groups, overlong_penalty
from capo.core.loss_variants import (
    c2gspg_loss, clip_cov_loss, kl_cov_loss, logprob_advantage_covariance, token_covariance,
)
from capo.core.losses import AGGREGATIONS, aggregate, kl_penalty, policy_loss
from capo.core.confidence import ConfidenceInputs, TokenStatistics, compute_confidence, token_statistics
from capo.core.masks import (
    MASK_HIGH, MASK_LOW, MASK_Q_HIGH, MASK_Q_LOW, MASK_RULES, NOISE_MASKS, capo_noise_mask, default_noise_mask,
    mask_knob_problem, noise_mask_problem, ppl_quantile_thresholds, resolve_noise_mask,
)
from capo.core.registry import ADVANTAGES, CONFIDENCES, POLICY_LOSSES, REWARDS, Registry, UnknownNameError
from capo.core.rewards import REWARD_COMPONENTS, ppo_c_reward, rlcr_components
from capo.core.rollout_correction import logprob_mismatch, truncated_is_weights
from capo.core.scores import sequence_logprob_mean, sequence_logprob_sum, sequence_perplexity
from capo.core.step import (
    RENAMED, STEP_INPUTS, StepResult, advantage_kwargs_problem, advantage_step, calibration_metrics, estimate,
    guard_batch, hyperparameters, loss_kwargs_problem, needs_scores, reward_kwargs_problem,
)

__all__ = [
    "ADVANTAGES", "CONFIDENCES", "POLICY_LOSSES", "REWARDS", "AGGREGATIONS", "MASK_HIGH", "MASK_LOW", "MASK_Q_HIGH",
    "MASK_Q_LOW", "MASK_RULES", "NOISE_MASKS", "default_noise_mask", "mask_knob_problem", "noise_mask_problem",
    "resolve_noise_mask", "Registry", "UnknownNameError", "ConfidenceInputs", "TokenStatistics", "compute_confidence", "token_statistics",
    "aggregate", "capo_advantage", "capo_noise_mask", "compute_advantages", "dr_grpo_advantage",
    "grpo_advantage", "GROUP_FILTER_BY", "informative_groups", "kl_penalty", "overlong_penalty", "policy_loss",
    "ppl_quantile_thresholds", "rloo_advantage", "sequence_logprob_mean", "sequence_logprob_sum",
    "sequence_perplexity", "RENAMED", "STEP_INPUTS", "StepResult", "advantage_kwargs_problem", "advantage_step",
    "loss_kwargs_problem", "reward_kwargs_problem", "calibration_metrics", "estimate", "guard_batch",
    "hyperparameters", "needs_scores",
    "ace_advantage", "c2gspg_loss", "clip_cov_loss", "gdpo_advantage", "kl_cov_loss", "logprob_advantage_covariance",
    "ngrpo_advantage",
    "ppo_c_reward", "REWARD_COMPONENTS", "rlcr_components", "seed_grpo_advantage", "semantic_entropy",
    "token_covariance",
    "unlikeliness_advantage", "logprob_mismatch", "truncated_is_weights",
]
