"""The stochastic task's own measures, per question, of stated probabilities (``stated_question_means``,
``stated_means_summary``, ``stochastic_summary`` in capo.tasks.stochastic) on hand-computed cases (written for the
mutation testing of these functions, docs/testing.md "Mutation testing"; test_stochastic_task.py and
test_stochastic_binary.py test them through the task's graded responses)."""

import math

import pytest
import torch

from capo.tasks.stochastic import (
    ANSWER_KEYS,
    STATED_KEYS,
    stated_means_summary,
    stated_probability_summary,
    stated_question_means,
    stochastic_summary,
)

nan = math.nan
f64 = dict(dtype=torch.float64)
# question 0: stated 0.2, 0.4 and one invalid (m = 0.3, a = 0, p = 0.3); question 3: 0.9 (m = 0.9, a = 1, p = 0.8);
# question 5: nothing valid (no question); ids 1, 2, 4 have no row (no question)
STATED = torch.tensor([0.2, 0.4, nan, 0.9, nan], **f64)
OUTCOME = torch.tensor([False, False, False, True, True])
GID = torch.tensor([0, 0, 0, 3, 5])
RATE = torch.tensor([0.3, 0.3, 0.3, 0.8, 0.1], **f64)


def test_keys():
    assert STATED_KEYS == ("stochastic_questions", "stochastic_ece", "stochastic_rate_error", "stochastic_auroc",
                           "stochastic_mean_stated")
    assert ANSWER_KEYS == ("answer_questions", "answer_ece", "answer_rate_error", "answer_auroc",
                           "answer_mean_stated")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_question_means_hand_computed(dtype):
    m, a, p = stated_question_means(STATED.to(dtype), OUTCOME, GID, RATE.to(dtype))
    assert m.dtype == torch.float64 and p.dtype == torch.float64 and a.dtype == torch.bool
    assert m.tolist() == pytest.approx([0.3, 0.9], rel=1e-6) and a.tolist() == [False, True]
    assert p.tolist() == pytest.approx([0.3, 0.8], rel=1e-6)
    # lists and 0/1 outcomes are accepted; the same question means
    m2, a2, p2 = stated_question_means(STATED.tolist(), [0, 0, 0, 1, 1], GID.tolist(), RATE.tolist())
    assert m2.tolist() == pytest.approx([0.3, 0.9]) and a2.tolist() == [False, True] and p2.tolist() == [0.3, 0.8]


def test_question_means_with_no_valid_stated_probability():
    m, a, p = stated_question_means(torch.tensor([nan, nan], **f64), torch.tensor([True, True]), torch.tensor([0, 1]),
                                    torch.tensor([0.5, 0.5], **f64))
    assert m.numel() == 0 and a.numel() == 0 and p.numel() == 0


BAD = {
    "stated 2-D": ((STATED[None], OUTCOME, GID, RATE), ValueError, r"^stated must have 1 dimension"),
    "stated > 1": ((STATED + 0.5, OUTCOME, GID, RATE), ValueError, r"^stated must lie in \[0, 1\]"),
    "stated bool": ((OUTCOME, OUTCOME, GID, RATE), TypeError, r"^stated must be a probability"),
    "outcome 2": ((STATED, torch.tensor([0, 0, 0, 2, 1]), GID, RATE), ValueError, r"^outcome must contain only 0/1"),
    "outcome 2-D": ((STATED, OUTCOME[None], GID, RATE), ValueError, r"^outcome must have 1 dimension"),
    "group_ids float": ((STATED, OUTCOME, GID.double(), RATE), TypeError, r"^group_ids must have an integer dtype"),
    "rate 2-D": ((STATED, OUTCOME, GID, RATE[None]), ValueError, r"^rate must have 1 dimension"),
    "outcome short": ((STATED, OUTCOME[:4], GID, RATE), ValueError,
                      r"^outcome has shape \(4,\) but stated has shape \(5,\)"),
    "group_ids short": ((STATED, OUTCOME, GID[:4], RATE), ValueError,
                        r"^group_ids has shape \(4,\) but stated has shape \(5,\)"),
    "rate short": ((STATED, OUTCOME, GID, RATE[:4]), ValueError, r"^rate has shape \(4,\) but stated has shape \(5,\)"),
    "empty": ((torch.zeros(0), torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long), torch.zeros(0)),
              ValueError, r"^stated is empty"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("fn", [stated_question_means, stated_probability_summary, stochastic_summary])
def test_bad_inputs_name_the_argument(fn, case):
    args, err, match = BAD[case]
    with pytest.raises(err, match=match):
        fn(*args)


def test_summary_hand_computed_and_n_bins_passed_on():
    # m = (0.3, 0.9), a = (0, 1), p = (0.3, 0.8): 10 bins: ECE (0.3 + 0.1) / 2 = 0.2; one bin: |0.6 - 0.5| = 0.1
    want = {"stochastic_questions": 2.0, "stochastic_ece": 0.2, "stochastic_rate_error": 0.05,
            "stochastic_auroc": 1.0, "stochastic_mean_stated": 0.6}
    for got in (stated_probability_summary(STATED, OUTCOME, GID, RATE),
                stochastic_summary(STATED, OUTCOME, GID, RATE),
                stated_means_summary(*stated_question_means(STATED, OUTCOME, GID, RATE))):
        assert list(got) == list(STATED_KEYS) and got == pytest.approx(want)
    assert stated_probability_summary(STATED, OUTCOME, GID, RATE, n_bins=1)["stochastic_ece"] == pytest.approx(0.1)
    assert stochastic_summary(STATED, OUTCOME, GID, RATE, n_bins=1)["stochastic_ece"] == pytest.approx(0.1)
    m, a, p = stated_question_means(STATED, OUTCOME, GID, RATE)
    assert stated_means_summary(m, a, p, n_bins=1)["stochastic_ece"] == pytest.approx(0.1)
    assert stated_means_summary(m, a, p, 1, "answer") == pytest.approx(
        {"answer_questions": 2.0, "answer_ece": 0.1, "answer_rate_error": 0.05, "answer_auroc": 1.0,
         "answer_mean_stated": 0.6})


@pytest.mark.parametrize("prefix,keys", [("stochastic", STATED_KEYS), ("answer", ANSWER_KEYS)])
def test_summary_of_no_question_is_nan(prefix, keys):
    e = torch.zeros(0, **f64)
    got = stated_means_summary(e, torch.zeros(0, dtype=torch.bool), e, prefix=prefix)
    assert list(got) == list(keys) and got[keys[0]] == 0.0 and all(math.isnan(got[k]) for k in keys[1:])


def test_stochastic_summary_reads_the_answers_from_chosen():
    # chosen (the predicted outcome, 1.0 / 0.0, NaN invalid): question 0 predicts 1 once in 2 valid (0.5), question 3
    # predicts 0 (0.0), question 5 predicts 1 (1.0, its stated probability is invalid but its answer is not)
    chosen = torch.tensor([1.0, 0.0, nan, 0.0, 1.0], **f64)
    s = stochastic_summary(STATED, OUTCOME, GID, RATE, chosen=chosen)
    assert list(s) == list(STATED_KEYS) + list(ANSWER_KEYS)
    assert s["stochastic_questions"] == 2 and s["stochastic_ece"] == pytest.approx(0.2)
    # m = (0.5, 0.0, 1.0), a = (0, 1, 1), p = (0.3, 0.8, 0.1): ECE (0.5 + 1.0 + 0.0) / 3, rate error
    # (0.2 + 0.8 + 0.9) / 3, AUROC: correct 0.0 and 1.0 against incorrect 0.5 -> 1/2
    assert s["answer_questions"] == 3 and s["answer_ece"] == pytest.approx(0.5)
    assert s["answer_rate_error"] == pytest.approx(1.9 / 3) and s["answer_auroc"] == pytest.approx(0.5)
    assert s["answer_mean_stated"] == pytest.approx(0.5)
    s1 = stochastic_summary(STATED, OUTCOME, GID, RATE, chosen=chosen, n_bins=1)
    # one bin: mean 0.5 against accuracy 2/3
    assert s1["answer_ece"] == pytest.approx(1 / 6) and s1["stochastic_ece"] == pytest.approx(0.1)


def test_summaries_default_to_10_bins():
    # one stated mean per question, 0.81 (a = 1) and 0.89 (a = 0): with 10 bins they share [0.8, 0.9):
    # ECE |0.85 - 0.5| = 0.35; with 11 bins they fall apart: (0.19 + 0.89) / 2 = 0.54
    stated, outcome = torch.tensor([0.81, 0.89], **f64), torch.tensor([True, False])
    gid, rate = torch.tensor([0, 1]), torch.tensor([0.5, 0.5], **f64)
    m, a, p = stated_question_means(stated, outcome, gid, rate)
    assert stated_means_summary(m, a, p)["stochastic_ece"] == pytest.approx(0.35)
    assert stated_means_summary(m, a, p, n_bins=11)["stochastic_ece"] == pytest.approx(0.54)
    assert stated_probability_summary(stated, outcome, gid, rate)["stochastic_ece"] == pytest.approx(0.35)
    s = stochastic_summary(stated, outcome, gid, rate, chosen=stated)
    assert s["stochastic_ece"] == pytest.approx(0.35) and s["answer_ece"] == pytest.approx(0.35)
