"""The pure algorithm core: tensor functions with documented shapes, one registry per kind.

Imports only torch and numpy. Nothing here knows about trainers, CLIs, TRL or verl.
"""

from capo.core import advantages, losses, rewards  # noqa: F401  (registers the built-in entries)
from capo.core.advantages import capo_advantage, compute_advantages, dr_grpo_advantage, grpo_advantage, rloo_advantage
from capo.core.dapo import informative_groups, overlong_penalty
from capo.core.losses import AGGREGATIONS, aggregate, kl_penalty, policy_loss
from capo.core.masks import capo_noise_mask, ppl_quantile_thresholds
from capo.core.registry import ADVANTAGES, POLICY_LOSSES, REWARDS, Registry, UnknownNameError
from capo.core.scores import sequence_logprob_mean, sequence_logprob_sum, sequence_perplexity

__all__ = [
    "ADVANTAGES", "POLICY_LOSSES", "REWARDS", "AGGREGATIONS", "Registry", "UnknownNameError",
    "aggregate", "capo_advantage", "capo_noise_mask", "compute_advantages", "dr_grpo_advantage",
    "grpo_advantage", "informative_groups", "kl_penalty", "overlong_penalty", "policy_loss",
    "ppl_quantile_thresholds", "rloo_advantage", "sequence_logprob_mean", "sequence_logprob_sum",
    "sequence_perplexity",
]
