"""The strict answer formats of the stochastic task, ``percent`` (``NN``) and ``outcome`` (``D NN``), in the verifier's
own test subset (mutation testing of ``verify.extract``; tests/tasks/ tests them through the task)."""

import pytest

from capo.verify.extract import extract_answer, extract_outcome, extract_percent


@pytest.mark.parametrize("text, want", [
    ("1 73", ("1", "73")), ("0 01", ("0", "01")), (" 1 99\n", ("1", "99")), ("0 10", ("0", "10")),
    ("x <answer>0 50</answer>", ("0", "50")), ("<answer> 1 09 </answer>", ("1", "09")),
    ("<answer>1 10</answer> then <answer>0 20</answer>", ("0", "20")),  # the last tag
    ("<answer>1 10</answer> 0 20", ("1", "10")),  # a tag wins over the whole text
])
def test_outcome_parses_a_digit_a_space_and_two_digits(text, want):
    assert extract_outcome(text) == want
    assert extract_answer(text, "outcome") == want[0]
    assert extract_answer(text, "outcome", fallback_last_number=True) == want[0]


@pytest.mark.parametrize("text", ["173", "1 7", "2 50", "1 00", "1  73", "1 100", "1 0.7", "1 73%", "10 73", "", None,
                                  "<answer>1 73", "1\t73", "the answer is 1 73", "<answer>1 73 x</answer>", "a1 73"])
def test_outcome_refuses_anything_else(text):
    assert extract_outcome(text) is None
    assert extract_answer(text, "outcome") is None
    assert extract_answer(text, "outcome", fallback_last_number=True) is None  # strict: no last-number fallback


@pytest.mark.parametrize("text, want", [
    ("73", "73"), ("01", "01"), ("99", "99"), (" 10\n", "10"), ("so <answer>37</answer>", "37"),
    ("<answer>12</answer> <answer> 34 </answer>", "34"), ("<answer>12</answer> 34", "12"),
])
def test_percent_parses_two_digits(text, want):
    assert extract_percent(text) == want
    assert extract_answer(text, "percent") == want


@pytest.mark.parametrize("text", ["7", "00", "100", "0.37", "37%", "about 37", "", None, "<answer>37", "3 7", "x37"])
def test_percent_refuses_anything_else(text):
    assert extract_percent(text) is None
    assert extract_answer(text, "percent") is None
    assert extract_answer(text, "percent", fallback_last_number=True) is None


def test_rlcr_format_and_the_last_number_fallback():
    # "rlcr" reads the <answer> tag only (no box); an empty tag is no answer; the fallback replaces only a missing one
    assert extract_answer("<answer>5</answer> \\boxed{3}", "rlcr") == "5"
    assert extract_answer("\\boxed{3}", "rlcr") is None and extract_answer("\\boxed{3}", "auto") == "3"
    assert extract_answer("<answer></answer>", "rlcr") is None
    assert extract_answer("<answer>5</answer> 7", "rlcr", fallback_last_number=True) == "5"
    assert extract_answer("<answer></answer> 7", "rlcr", fallback_last_number=True) == "7"
