"""The one grader: response texts + gold answers -> extracted answers, verdicts, verbal confidences, format flags.

Used by the trainer, ``capo eval`` and the TRL/verl adapters, so "correct" and "format ok" mean the same thing
everywhere:

- ``answers``: :func:`capo.verify.extract_answer` with ``answer_format`` (auto, rlcr, boxed, gsm8k, last_number);
- ``correct``: the verifier's verdict is CORRECT (math-verify equivalence to the gold answer);
- ``confidence``: the verbalized ``<confidence>q</confidence>`` (RLCR), NaN where missing or not in [0, 1];
- ``format_ok``: RLCR's format is well formed (an ``<answer>`` and a valid ``<confidence>``;
  :func:`capo.verify.extract_rlcr`).

With ``answer_format="percent"`` (stochastic outcomes, :mod:`capo.tasks.stochastic`) the response *is* a stated
probability and the gold is the question's fixed outcome ("1" / "0"): ``correct`` = the outcome (whatever the response
says: it is the event a probability is stated for), ``confidence`` = the stated probability (two digits / 100, NaN when
the strict parse fails, :func:`capo.verify.extract_percent`), ``format_ok`` = it parsed; verdicts are CORRECT /
INCORRECT by the outcome, so every verbal-confidence metric measures the stated probability against the outcome.

With ``answer_format="outcome"`` (the binary variant, ``stochastic_binary``) the response predicts the outcome and
states a confidence that the prediction is right, ``D NN`` (:func:`capo.verify.extract_outcome`): ``answers`` = the
digit D, ``correct`` = D equals the gold outcome, ``confidence`` = NN / 100 (the stated P(correct), RLCR's
``confidence``), ``format_ok`` = it parsed (an unparsed response is UNPARSABLE, never correct); no verifier call.

With ``answer_format="short"`` / ``"rlcr_short"`` (facts, :mod:`capo.tasks.facts`) the answer is a short free text
(the first line, or RLCR's ``<answer>`` tag) judged against the gold's ``|``-separated alternatives by normalised text
match (:mod:`capo.verify.short`; no verifier call): ``correct`` = it matches, UNPARSABLE where the response gives no
answer (a refusal, a long sentence, a cut one); ``confidence`` = RLCR's ``<confidence>`` (``rlcr_short``; NaN for
``short``); ``format_ok`` = an answer was found (and, for ``rlcr_short``, RLCR's tags are well formed).

For ``percent`` and ``outcome`` ``Graded`` also carries the stochastic-outcome columns the per-question measures read
(:func:`capo.tasks.stochastic.stochastic_summary`): ``outcome`` (the fixed outcome a), ``stated`` (the probability of
a = 1 the response states: the percent, or NN / 100 for D = 1 and 1 - NN / 100 for D = 0) and, for ``outcome``,
``chosen`` (the predicted outcome D as 1.0 / 0.0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from capo.core import REWARDS
from capo.verify import (DEFAULT_ANSWER_FORMAT, STATED_FORMATS, RlcrParse, Verdict, Verifier, extract_answer,
                         extract_outcome, extract_percent, extract_rlcr)
from capo.verify.short import SHORT_FORMATS, judge_short, normalize_short

__all__ = ["Graded", "answer_classes", "gold_problem", "grade", "reads_stated_confidence", "reward_answer_format"]


@dataclass
class Graded:
    """Per-response verdicts, N rows. confidence is NaN where the response has no valid <confidence>."""

    answers: list[str | None]
    verdicts: list[Verdict]
    parses: list[RlcrParse]  # RLCR tags as parsed (exact Python-float confidences, for rows written to disk)
    correct: torch.Tensor  # [N] bool
    confidence: torch.Tensor  # [N] float32
    format_ok: torch.Tensor  # [N] bool (RLCR tags well formed)
    reward_errors: int = 0  # user reward function failures scored 0 (algo.reward_errors=zero)
    # stochastic outcomes only (answer formats percent / outcome; None otherwise), [N] each:
    outcome: torch.Tensor | None = None  # bool, the question's fixed outcome a
    stated: torch.Tensor | None = None  # float64, the stated probability of a = 1 (NaN where invalid)
    chosen: torch.Tensor | None = None  # float64, the predicted outcome D (1.0 / 0.0, NaN where invalid; outcome only)


def grade(texts: Sequence[str], golds: Sequence[str], verifier: Verifier, *, answer_format: str = DEFAULT_ANSWER_FORMAT,
          fallback_last_number: bool = False, device: torch.device | str | None = None) -> Graded:
    """Extract each response's answer and judge it against its gold (``len(texts) == len(golds)``).

    ``device``: where the verdict tensors (``correct``, ``confidence``, ``format_ok``) are made; the CPU when None.
    The trainer passes its rollout's device, so the step's tensors all live where the step runs."""
    if len(texts) != len(golds):
        raise ValueError(f"got {len(texts)} responses but {len(golds)} gold answers; they must match")
    if answer_format == "percent":
        return _grade_stated(texts, golds, device)
    if answer_format == "outcome":
        return _grade_outcome(texts, golds, device)
    if answer_format in SHORT_FORMATS:
        return _grade_short(texts, golds, answer_format, device)
    parses = [extract_rlcr(t) for t in texts]
    answers = [extract_answer(t, answer_format, fallback_last_number=fallback_last_number) for t in texts]
    verdicts = verifier.verify_batch(answers, [str(g) for g in golds])
    correct = torch.tensor([v == Verdict.CORRECT for v in verdicts], dtype=torch.bool, device=device)
    conf = torch.tensor([float("nan") if p.confidence is None else p.confidence for p in parses], dtype=torch.float32,
                        device=device)
    fmt = torch.tensor([p.format_ok for p in parses], dtype=torch.bool, device=device)
    return Graded(answers, verdicts, parses, correct, conf, fmt)


def reads_stated_confidence(reward: str) -> bool:
    """Whether the core reward ``reward`` (``REWARDS``) reads a stated confidence (RLCR, PPO-C, the log and Brier
    scores), as its registration says."""
    return "confidence" in REWARDS.reads(reward)


def reward_answer_format(reward: str, answer_format: str) -> str:
    """The answer format the reward ``reward`` grades in: ``answer_format`` as it is for a reward on the verdicts
    alone, or for a stated-probability format (:data:`capo.verify.STATED_FORMATS`: it states its own); for a reward
    that reads a stated confidence, a short free-text format (facts) as ``rlcr_short`` (its judge inside RLCR's
    tags) and any other as ``rlcr`` (math-verify inside the tags). The TRL and verl reward functions grade in it;
    ``capo train`` trains in it, or in ``auto`` (the ``<answer>`` tag first), and refuses any other format."""
    if not reads_stated_confidence(reward) or answer_format in STATED_FORMATS:
        return answer_format
    return "rlcr_short" if answer_format in SHORT_FORMATS else "rlcr"


def answer_classes(groups: Sequence[Sequence[str | None]], verifier: Verifier,
                   answer_format: str | None = None) -> list[list[int]]:
    """Each group's answers' equivalence classes, numbered by first occurrence (-1 = no answer): for the short
    free-text formats (``short``, ``rlcr_short``: facts) answers are equal when their normal forms are
    (:func:`capo.verify.short.normalize_short`, the judge's normalisation; the judge also accepts an answer's part
    before its first comma and the gold's aliases, which classes made without the gold do not: "Paris" and
    "Paris, France", "Kyiv" and "Kiev" are two classes, both correct), for any other math-verify's
    (:meth:`Verifier.equivalence_classes_batch`). The one rule behind the votes of ``capo eval`` and SEED-GRPO's
    clusters in training."""
    if answer_format not in SHORT_FORMATS:
        return verifier.equivalence_classes_batch([list(g) for g in groups])
    out = []
    for answers in groups:
        seen: dict[str, int] = {}
        out.append([-1 if a is None else seen.setdefault(normalize_short(a), len(seen)) for a in answers])
    return out


def gold_problem(golds: Sequence, answer_format: str) -> str | None:
    """Why ``golds`` cannot be graded with ``answer_format``, or None: a stated-probability format
    (:data:`capo.verify.STATED_FORMATS`) grades against a fixed outcome, so each gold must be "1" or "0". Callers
    check before anything is written; :func:`grade` refuses them too."""
    if answer_format not in STATED_FORMATS:
        return None
    bad = next((g for g in golds if str(g) not in ("0", "1")), None)
    return None if bad is None else (f"answer_format {answer_format!r} grades against a fixed outcome, so every gold "
                                     f"answer must be '1' or '0'; got {bad!r}")


def _outcomes(golds: Sequence[str], fmt: str) -> list[bool]:
    problem = gold_problem(golds, fmt)
    if problem:
        raise ValueError(problem)
    return [str(g) == "1" for g in golds]


def _nan_tensor(values, dtype, device) -> torch.Tensor:
    """[N] of ``dtype``: the values, NaN where None."""
    return torch.tensor([float("nan") if v is None else v for v in values], dtype=dtype, device=device)


def _grade_stated(texts: Sequence[str], golds: Sequence[str], device) -> Graded:
    """The ``percent`` format: a stated probability against a fixed outcome (module docstring). No verifier call."""
    outcome = _outcomes(golds, "percent")
    answers = [extract_percent(t) for t in texts]
    stated = [None if a is None else int(a) / 100 for a in answers]
    parses = [RlcrParse(a, q, a is not None) for a, q in zip(answers, stated)]
    verdicts = [Verdict.CORRECT if o else Verdict.INCORRECT for o in outcome]
    a = torch.tensor(outcome, dtype=torch.bool, device=device)
    return Graded(answers, verdicts, parses, a,
                  _nan_tensor(stated, torch.float32, device),
                  torch.tensor([p.format_ok for p in parses], dtype=torch.bool, device=device),
                  outcome=a, stated=_nan_tensor(stated, torch.float64, device))


def _grade_outcome(texts: Sequence[str], golds: Sequence[str], device) -> Graded:
    """The ``outcome`` format: a predicted outcome and the stated confidence that it is right (module docstring)."""
    outcome = _outcomes(golds, "outcome")
    parsed = [extract_outcome(t) for t in texts]
    answers = [None if p is None else p[0] for p in parsed]
    conf = [None if p is None else int(p[1]) / 100 for p in parsed]
    parses = [RlcrParse(d, q, d is not None) for d, q in zip(answers, conf)]
    verdicts = [Verdict.UNPARSABLE if d is None else Verdict.CORRECT if (d == "1") == o else Verdict.INCORRECT
                for d, o in zip(answers, outcome)]
    stated = [None if p is None else (int(p[1]) if p[0] == "1" else 100 - int(p[1])) / 100 for p in parsed]
    return Graded(answers, verdicts, parses,
                  torch.tensor([v == Verdict.CORRECT for v in verdicts], dtype=torch.bool, device=device),
                  _nan_tensor(conf, torch.float32, device),
                  torch.tensor([p.format_ok for p in parses], dtype=torch.bool, device=device),
                  outcome=torch.tensor(outcome, dtype=torch.bool, device=device), stated=_nan_tensor(stated, torch.float64, device),
                  chosen=_nan_tensor([None if d is None else float(d == "1") for d in answers], torch.float64, device))


def _grade_short(texts: Sequence[str], golds: Sequence[str], fmt: str, device) -> Graded:
    """The ``short`` / ``rlcr_short`` formats: a short free-text answer against the gold's alternatives (module
    docstring). No verifier call."""
    answers = [extract_answer(t, fmt) for t in texts]
    judged = [judge_short(a, str(g)) for a, g in zip(answers, golds)]
    verdicts = [Verdict.UNPARSABLE if j is None else Verdict.CORRECT if j else Verdict.INCORRECT for j in judged]
    tags = [extract_rlcr(t) if fmt == "rlcr_short" else RlcrParse(a, None, a is not None)
            for t, a in zip(texts, answers)]
    parses = [RlcrParse(a, p.confidence, p.format_ok and a is not None) for a, p in zip(answers, tags)]
    return Graded(answers, verdicts, parses,
                  torch.tensor([v == Verdict.CORRECT for v in verdicts], dtype=torch.bool, device=device),
                  _nan_tensor([p.confidence for p in parses], torch.float32, device),
                  torch.tensor([p.format_ok for p in parses], dtype=torch.bool, device=device))
