"""capo's rewards as verl custom reward functions: ``compute_score(data_source, solution_str, ground_truth,
extra_info)`` in verl's dict form (``score`` plus the keys verl keeps per row as reward_extra_info)."""

from __future__ import annotations

import inspect
import threading
import warnings
from typing import Any

from capo.adapters._common import score_texts
from capo.rollout.grading import reads_stated_confidence
from capo.verify import DEFAULT_ANSWER_FORMAT

__all__ = ["compute_score", "compute_score_brier_score", "compute_score_correctness", "compute_score_log_score",
           "compute_score_ppo_c", "compute_score_rlcr"]


class _Verifier:
    """The verifier of this process's reward calls, started on first use. verl calls reward functions with no run
    object (in its reward workers), and the verifier is a pool of checking processes whose answers never depend on
    earlier calls, so one per process is enough; the advantage step's own state is :class:`CapoRun`'s."""

    def __init__(self):
        self._lock, self._verifier = threading.Lock(), None

    def __call__(self):
        with self._lock:
            if self._verifier is None:
                from capo.verify import Verifier

                self._verifier = Verifier(workers=1)
            return self._verifier


get_verifier = _Verifier()


# what verl's reward loop passes to every custom reward function when a reward model serves (not a knob of capo's)
VERL_CALL_KEYS = frozenset({"reward_router_address", "reward_model_tokenizer"})
_ROW_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


def _warn_unread(fn, kwargs: dict) -> None:
    """Say (a Python warning, once per key and function) which keyword arguments ``fn`` ignores: a misspelt knob in
    ``reward.custom_reward_function.reward_kwargs`` (``wieght``) was dropped without a word. The functions keep
    taking any keyword, as verl may pass keys of its own (:data:`VERL_CALL_KEYS`, and later versions' others)."""
    if unread := sorted(set(kwargs) - VERL_CALL_KEYS):
        knobs = [n for n, p in inspect.signature(fn).parameters.items()
                 if n not in _ROW_ARGS and p.kind is p.POSITIONAL_OR_KEYWORD]
        warnings.warn(f"{fn.__name__} ignores {', '.join(unread)}: not one of its knobs ({', '.join(knobs)}); "
                      "check reward.custom_reward_function.reward_kwargs", UserWarning, stacklevel=3)


def _score(kind: str, solution_str: str, ground_truth, **kw) -> dict[str, Any]:
    b = score_texts([solution_str], [str(ground_truth)], kind=kind, verifier=get_verifier(), **kw)
    # answer_format: the format "pred" was read in, so SEED-GRPO's clusters (the estimator) use the same rule
    out = {"score": b.rewards[0], "correct": float(b.correct[0]), "pred": b.answers[0] or "",
           "answer_format": kw.get("answer_format", DEFAULT_ANSWER_FORMAT)}
    if reads_stated_confidence(kind):
        out |= {"confidence": b.confidence[0], "format_ok": float(b.format_ok[0])}
    return out


def compute_score_rlcr(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                       format_failure_reward: float = -1.0, answer_format: str = "rlcr", **kwargs) -> dict[str, Any]:
    """RLCR reward (arXiv 2507.16806, eq. 2) for verl: c - (q - c)^2 from ``<answer>``/``<confidence>`` tags,
    answers compared by mathematical equivalence, or with ``answer_format`` "rlcr_short" (facts) by the short-answer
    judge. Returns verl's dict form: ``score`` plus ``correct``,
    ``confidence`` (NaN if missing), ``format_ok`` and ``pred`` (the extracted answer, "" if none; verl's name for
    it, SEED-GRPO's clusters are its equivalence classes); verl keeps the extra keys as reward_extra_info."""
    _warn_unread(compute_score_rlcr, kwargs)
    return _score("rlcr", solution_str, ground_truth, format_failure_reward=format_failure_reward,
                  answer_format=answer_format)


def compute_score_ppo_c(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                        format_failure_reward: float = -1.0, weight: float = 0.5, threshold: float = 0.5,
                        answer_format: str = "rlcr", **kwargs) -> dict[str, Any]:
    """PPO-C's calibrated reward in its verifiable form (arXiv 2410.09724, Sec. 4.2; ``capo.core.ppo_c_reward``) for
    verl: c +- w (q - 0.5) from ``<answer>``/``<confidence>`` tags; ``answer_format`` and the extra keys as
    :func:`compute_score_rlcr`. ``weight``/``threshold`` via ``reward.custom_reward_function.reward_kwargs``."""
    _warn_unread(compute_score_ppo_c, kwargs)
    return _score("ppo_c", solution_str, ground_truth, format_failure_reward=format_failure_reward,
                  reward_kwargs={"weight": weight, "threshold": threshold}, answer_format=answer_format)


def compute_score_correctness(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                              answer_format: str = DEFAULT_ANSWER_FORMAT, **kwargs) -> dict[str, Any]:
    """Binary verifiable reward 1[answer equivalent to gold] for verl (answer by ``capo.verify.extract_answer``);
    extra keys ``correct`` and ``pred``."""
    _warn_unread(compute_score_correctness, kwargs)
    return _score("correctness", solution_str, ground_truth, answer_format=answer_format)


def compute_score_log_score(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                            answer_format: str = "percent", format_failure_reward: float | None = None,
                            **kwargs) -> dict[str, Any]:
    """The log score of a stated probability (arXiv 2508.11800, Sec. 3; ``capo.core.log_score_reward``) for verl:
    ``answer_format`` "percent" (default: the response states the probability of a fixed outcome as two digits,
    ``ground_truth`` "1" / "0"), "outcome" (``D NN``: the stated P(correct)) or another (the RLCR tags). The same
    extra keys as :func:`compute_score_rlcr`; ``format_failure_reward`` None = log 0.01."""
    _warn_unread(compute_score_log_score, kwargs)
    return _score("log_score", solution_str, ground_truth, answer_format=answer_format,
                  format_failure_reward=format_failure_reward)


def compute_score_brier_score(data_source=None, solution_str: str = "", ground_truth: str = "", extra_info=None,
                              answer_format: str = "percent", format_failure_reward: float | None = None,
                              **kwargs) -> dict[str, Any]:
    """The negative Brier score of a stated probability (``capo.core.brier_score_reward``) for verl; as
    :func:`compute_score_log_score` (``format_failure_reward`` None = -(0.99)^2)."""
    _warn_unread(compute_score_brier_score, kwargs)
    return _score("brier_score", solution_str, ground_truth, answer_format=answer_format,
                  format_failure_reward=format_failure_reward)


compute_score = compute_score_rlcr  # verl's default custom reward function name

