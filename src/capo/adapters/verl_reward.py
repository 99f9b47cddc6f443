"""capo's verl reward functions in a file verl can import by path (``reward.custom_reward_function.path=<this file>``,
``.name=compute_score_correctness`` / ``compute_score_rlcr`` / ``compute_score_ppo_c`` / ``compute_score_log_score`` /
``compute_score_brier_score``): verl loads that file as a
module outside ``sys.modules``, so it only re-exports the installed capo's functions
(:mod:`capo.adapters.verl_plugin`). :func:`capo.adapters.verl_plugin.preset_overrides` points here.
"""

from capo.adapters.verl_plugin.rewards import *  # noqa: F403 - the installed capo's reward functions
from capo.adapters.verl_plugin.rewards import __all__  # noqa: F401 - one list of their names
