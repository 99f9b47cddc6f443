"""capo's one grader on a hand-checked batch: verdicts, verbal confidences, format flags, and where its tensors live."""

from __future__ import annotations

import math

import pytest
import torch

from capo.rollout import grade
from capo.verify import Verdict, Verifier

TEXTS = [
    "<answer>4</answer><confidence>0.9</confidence>",  # right, well formed
    "<answer>5</answer><confidence>.25</confidence>",  # wrong, well formed
    "<answer>4</answer>",  # right, no confidence: a format failure
    "<answer>4</answer><confidence>1.5</confidence>",  # right, confidence outside [0, 1]: a format failure
    "no tags at all",  # no answer
]
GOLDS = ["4"] * 5


@pytest.fixture(scope="module")
def verifier():
    with Verifier(workers=1) as v:
        yield v


def test_grade_hand_checked(verifier):
    g = grade(TEXTS, GOLDS, verifier, answer_format="rlcr")
    assert g.answers == ["4", "5", "4", "4", None]
    assert g.correct.tolist() == [True, False, True, True, False]
    assert g.verdicts[0] == Verdict.CORRECT and g.verdicts[1] != Verdict.CORRECT
    assert g.format_ok.tolist() == [True, True, False, False, False]
    conf = g.confidence.tolist()
    assert conf[:2] == pytest.approx([0.9, 0.25], abs=1e-7) and all(math.isnan(c) for c in conf[2:])
    assert (g.correct.dtype, g.confidence.dtype, g.format_ok.dtype) == (torch.bool, torch.float32, torch.bool)
    assert all(t.device.type == "cpu" for t in (g.correct, g.confidence, g.format_ok))


def test_grade_makes_its_tensors_on_the_device_asked(verifier):
    # "meta" stands in for an accelerator on a CPU-only machine: the tensors must be made there, not moved later
    g = grade(TEXTS, GOLDS, verifier, answer_format="rlcr", device="meta")
    assert all(t.device.type == "meta" for t in (g.correct, g.confidence, g.format_ok))
    assert [p.confidence for p in g.parses][:2] == [0.9, 0.25]  # the exact parses stay Python floats


def test_grade_refuses_mismatched_golds(verifier):
    with pytest.raises(ValueError, match="got 5 responses but 4 gold answers"):
        grade(TEXTS, GOLDS[:4], verifier)


@pytest.mark.parametrize("reward, fmt, want", [
    ("correctness", "auto", "auto"), ("correctness", "short", "short"), ("correctness", "rlcr", "rlcr"),
    ("rlcr", "auto", "rlcr"), ("rlcr", "boxed", "rlcr"), ("rlcr", "rlcr", "rlcr"),
    ("rlcr", "short", "rlcr_short"), ("ppo_c", "rlcr_short", "rlcr_short"),
    ("log_score", "percent", "percent"), ("brier_score", "outcome", "outcome"), ("brier_score", "gsm8k", "rlcr"),
])
def test_the_format_a_reward_grades_in(reward, fmt, want):
    """The one rule (capo.rollout.grading.reward_answer_format): a reward on the verdicts grades in the format given;
    one on a stated confidence inside RLCR's tags (the short-answer judge inside them for a short format), unless the
    format states its own probability (percent, outcome). Which rewards read a confidence is their registration's."""
    from capo.core import REWARDS
    from capo.rollout.grading import reads_stated_confidence, reward_answer_format

    assert reward_answer_format(reward, fmt) == want
    assert [r for r in REWARDS.names() if reads_stated_confidence(r)] == ["brier_score", "log_score", "ppo_c", "rlcr"]
