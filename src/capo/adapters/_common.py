"""Engine-independent pieces shared by the TRL and verl adapters.

Everything here works on plain tensors and strings: rewards from verdicts (built on ``capo.verify`` and the core's
``REWARDS``), the presets as an engine can run them, and the checks that turn a bad estimator name or missing input
into a :class:`capo.errors.ConfigError` that says what to enable. Neither engine is imported here. The rules both
adapters share with capo's trainer live below them: the noise mask's in :mod:`capo.core.masks`, which estimators
read scores in :func:`capo.core.needs_scores` (the registry's ``reads=``), the one step in :mod:`capo.rollout.step`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capo.core import ADVANTAGES, POLICY_LOSSES, REWARDS, advantage_kwargs_problem
from capo.errors import ConfigError
from capo.rollout.grading import grade, reads_stated_confidence, reward_answer_format
from capo.verify import DEFAULT_ANSWER_FORMAT

# The core rewards the adapters compute from text (TRL reward functions, verl compute_score_*), in the order
# capo.core.rewards registers them; which of them read a stated confidence (RLCR's <answer>/<confidence> tags, or a
# format that states one: STATED_FORMATS, the stochastic tasks') is the registry's to say
# (capo.rollout.grading.reads_stated_confidence). Every registered reward, each with a verl compute_score_<name>
# (held to the registry by tests/adapters/test_stated_rewards.py).
TEXT_REWARDS = ("correctness", "rlcr", "ppo_c", "log_score", "brier_score")
# Which log-probs feed lpm and PPL_ref: "raw" = temperature-1 log-probs (the paper's, capo's trainer),
# "sampling" = the engine's temperature-scaled ones (identical at temperature 1).
LOGPROB_MODES = ("raw", "sampling")


def check_estimator(name: str, advantage_kwargs: dict | None = None, *, engine: str,
                    key: str = "advantage_kwargs") -> None:
    """Raise ConfigError if ``name`` is not a capo advantage estimator, or ``advantage_kwargs`` holds a knob it does
    not take or a value it refuses (:func:`capo.core.advantage_kwargs_problem`, the check capo's trainer runs too);
    ``key``: how the engine spells the setting."""
    if name not in ADVANTAGES:
        raise ConfigError(
            f"{engine}: advantage estimator {name!r} is not known to the installed capo; allowed values: "
            f"{', '.join(ADVANTAGES.names())}. Upgrade capo if the name comes from a newer version."
        )
    problem = advantage_kwargs_problem(name, dict(advantage_kwargs or {}), key=key)
    if problem:
        raise ConfigError(f"{engine}: {problem}")


# ---------------------------------------------------------------------------------------------------------------
# rewards on text: extraction + verification (capo.verify) + the core's reward formulas (capo.core.REWARDS)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoredBatch:
    """Per-response verdicts of one reward call (:func:`capo.rollout.grade`). All lists have one entry per response.

    correct: the extracted answer is mathematically equivalent to the gold answer.
    confidence: verbalized confidence q in [0, 1] (RLCR), NaN where missing or invalid.
    format_ok: RLCR's format is well formed (as everywhere in capo).
    rewards: the reward values returned to the engine.
    answers: the extracted answers (None = none; SEED-GRPO's clusters are their equivalence classes).
    """

    correct: list[bool]
    confidence: list[float]
    format_ok: list[bool]
    rewards: list[float]
    answers: list[str | None]


def loss_knobs(loss: str, loss_kwargs: dict) -> dict:
    """Every knob of the policy loss ``loss`` as capo's trainer runs it: the loss's own defaults (its signature)
    updated by ``loss_kwargs``; what the TRL and verl presets hand to the engine's clip settings."""
    params = inspect.signature(POLICY_LOSSES.get(loss)).parameters
    return {k: v.default for k, v in params.items() if v.default is not inspect.Parameter.empty} | loss_kwargs


def default_verifier():
    """The verifier the adapters grade with when their caller gives none: one worker interpreter."""
    from capo.verify import Verifier

    return Verifier(workers=1)


def score_texts(
    texts: Sequence[str],
    golds: Sequence[str],
    *,
    kind: str,
    verifier=None,
    answer_format: str = DEFAULT_ANSWER_FORMAT,
    format_failure_reward: float | None = None,
    reward_kwargs: dict | None = None,
) -> ScoredBatch:
    """Score responses against gold answers with the core reward ``kind`` (``TEXT_REWARDS``).

    Grading is capo's one grader (:func:`capo.rollout.grade`). "rlcr" / "ppo_c" / "log_score" / "brier_score": the
    answer and the stated confidence q from the ``<answer>`` / ``<confidence>`` tags, or, with an ``answer_format``
    of :data:`STATED_FORMATS`, from the format itself (``percent``: q = the stated probability of the fixed
    outcome; ``outcome``: q = the stated P(correct) of ``D NN``); rewards c - (q - c)^2, PPO-C's c +- w (q - 0.5),
    the log score or the negative Brier score of q. Format failures get ``format_failure_reward``; None = the
    reward's own default (-1 for rlcr / ppo_c; the worst valid score for log_score / brier_score).
    "correctness": answer by ``answer_format``, reward 1[correct]. ``reward_kwargs``: the reward's other knobs
    (ppo_c: weight, threshold).
    """
    if kind not in TEXT_REWARDS:
        raise ValueError(f"unknown reward kind {kind!r}; allowed: {', '.join(TEXT_REWARDS)}")
    tagged = reads_stated_confidence(kind)
    fmt = reward_answer_format(kind, answer_format)
    g = grade(texts, golds, verifier or default_verifier(), answer_format=fmt)
    fail = {} if format_failure_reward is None else {"format_failure_reward": format_failure_reward}
    kw = dict(confidence=g.confidence, format_ok=g.format_ok, **fail, **(reward_kwargs or {})) if tagged else {}
    r = REWARDS.get(kind)(g.correct, **kw)
    return ScoredBatch(correct=g.correct.tolist(), confidence=[p.confidence if p.confidence is not None else math.nan
                                                               for p in g.parses],
                       format_ok=g.format_ok.tolist(), rewards=[float(x) for x in r], answers=list(g.answers))


def completion_text(completion) -> str:
    """The text of one completion: a string (standard format) or a list of chat messages (conversational)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # [{"role": "assistant", "content": ...}, ...]
        parts = []
        for m in completion:
            c = m.get("content", "") if isinstance(m, dict) else str(m)
            if isinstance(c, list):  # content blocks
                c = "".join(b.get("text", "") for b in c if isinstance(b, dict))
            parts.append(c)
        return "".join(parts)
    raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")


# ---------------------------------------------------------------------------------------------------------------
# algorithm presets (capo.core.presets.ALGORITHMS) as an engine can run them
# ---------------------------------------------------------------------------------------------------------------

# capo's policy losses verl runs -> verl's actor.policy_loss.loss_mode (equal on the same tensors:
# tests/adapters/test_verl.py::test_policy_losses_agree_with_verls); the others are refused by _UNREACHABLE
VERL_LOSS_MODES = {"ppo_clip": "vanilla", "clip_cov": "clip_cov", "kl_cov": "kl_cov", "gspo": "gspo", "cispo": "cispo"}


def _verl_loss_problem(loss: str) -> str | None:
    if loss in VERL_LOSS_MODES:
        return None
    if loss in POLICY_LOSSES and "rewards" in POLICY_LOSSES.reads(loss):
        return (f"policy loss {loss!r}: verl's policy-loss functions receive only log-probs, advantages and the mask, "
                "not the rewards this loss reads")
    return f"policy loss {loss!r} has no verl equivalent"


# Why an engine cannot run a component of a preset (None: it can). Each engine maps the rest to its own settings.
_UNREACHABLE = {
    "trl": {
        "loss": lambda v: None if v == "ppo_clip" else (
            f"policy loss {v!r}: TRL's GRPOTrainer computes its own loss (GRPOConfig.loss_type) and has no hook for "
            "another; the adapter replaces only the advantages. Run it with `capo train` (or verl, where "
            "clip_cov/kl_cov are verl's own loss modes)"),
        "group_filter": lambda v: None if not v else (
            "DAPO's group filter: TRL has no dynamic sampling; run it with `capo train`"),
        "overlong_cache": lambda v: None if not v else (
            "DAPO's overlong shaping: TRL has no soft overlong penalty; run it with `capo train`"),
    },
    "verl": {
        "loss": _verl_loss_problem,
        "group_filter": lambda v: None if not v else (
            "DAPO's group filter: use verl's own algorithm.filter_groups settings"),
        "overlong_cache": lambda v: None if not v else (
            "DAPO's overlong shaping: use verl's own reward.overlong_buffer settings"),
    },
}


def engine_preset(name: str, engine: str) -> dict[str, Any]:
    """``ALGORITHMS[name]`` (with the defaults of the fields it leaves out) after checking that ``engine`` ("trl" or
    "verl") can run every component; ConfigError naming the preset, the component and why otherwise."""
    from capo.core.presets import ALGORITHMS

    if name not in ALGORITHMS:
        raise ConfigError(f"{engine}: unknown algorithm preset {name!r}; allowed values: {', '.join(ALGORITHMS)}")
    p = {"advantage_kwargs": {}, "loss_kwargs": {}, "reward_kwargs": {}, "group_filter": False, "overlong_cache": 0,
         "noise_mask": "off", **ALGORITHMS[name]}
    for key, why in _UNREACHABLE[engine].items():
        reason = why(p.get(key))
        if reason:
            raise ConfigError(f"{engine}: preset {name!r} cannot run here: {reason}")
    if p["reward"] not in TEXT_REWARDS:
        raise ConfigError(f"{engine}: preset {name!r} uses reward {p['reward']!r}, which capo's {engine} reward "
                          f"functions do not compute (they compute {', '.join(TEXT_REWARDS)})")
    return p
