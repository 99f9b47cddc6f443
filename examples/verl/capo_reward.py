"""verl custom reward functions from capo, for `reward.custom_reward_function.path=<this file>`.

verl imports this file by path, so it only re-exports the functions of the installed capo:
- compute_score (= compute_score_rlcr): RLCR, correctness minus the Brier score of the verbalized confidence;
- compute_score_correctness: binary 1[answer equivalent to gold] (what CAPO trains on);
- compute_score_ppo_c: PPO-C's calibrated reward in its verifiable form (the ``ppo_c`` preset).
Select one with reward.custom_reward_function.name=<function>.
"""

from capo.adapters.verl_plugin import compute_score, compute_score_correctness, compute_score_ppo_c, compute_score_rlcr

__all__ = ["compute_score", "compute_score_correctness", "compute_score_ppo_c", "compute_score_rlcr"]
