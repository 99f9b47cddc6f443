"""The lengths check (capo.evaluation.lengths.length_check): hand-computed values on two questions, the degenerate
cases (equal lengths, one response per question, an empty response, unequal groups, no token counts), invariance to
the order of the rows, and the report's section and reading."""

import math
import random
from pathlib import Path

import pytest

from capo.evaluation.lengths import SATURATED_GAP, length_check
from capo.evaluation.metrics import compute_metrics
from capo.evaluation.report import RunInfo, length_reading, render_report


def _row(q, verdict, n, lpm, i=0):
    return {"prompt_id": q, "sample_idx": i, "verdict": verdict, "n_tokens": n, "mean_logprob": lpm}


# question a: a short correct response, a long incorrect one; question b: two responses of 3 tokens
ROWS = [_row("a", "correct", 2, -1.0), _row("a", "incorrect", 4, -1.5, 1),
        _row("b", "correct", 3, -0.2), _row("b", "incorrect", 3, -2.5, 1)]


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_hand_computed_values_of_two_questions():
    got = length_check(ROWS)
    assert got["questions"] == 2 and got["mean_tokens"] == 3.0
    assert got["len_sd_within"] == pytest.approx(math.sqrt(2) / 2, abs=1e-12)  # sds sqrt(2) and 0
    assert got["len_varies"] == 0.5
    # within-question centred: lengths (-1, 1, 0, 0), sums (-2, -6) -> (2, -2) and (-0.6, -7.5) -> (3.45, -3.45)
    want_corr = -4 / (math.sqrt(2) * math.sqrt(8 + 2 * 3.45 ** 2))
    assert got["sum_len_corr"] == pytest.approx(want_corr, abs=1e-12)
    capo, capo_sum = got["capo"], got["capo_sum"]
    assert (capo["tau"], capo["score"], capo_sum["tau"], capo_sum["score"]) == (0.6, "mean", 1.0, "sum")
    assert capo["pairs"] == capo_sum["pairs"] == 2
    # lpm gaps / 0.6: 0.83 (a) and 3.83 (b); sum gaps / 1: 4 (a) and 6.9 (b)
    assert capo["saturated"] == 0.5 and capo_sum["saturated"] == 1.0
    # one pair per question: A = +-w with w proportional to sigma((s_incorrect - s_correct) / tau); only question a's
    # lengths differ from their mean (-1 for its correct response, +1 for its incorrect one)
    for form, gaps in ((capo, (-0.5 / 0.6, -2.3 / 0.6)), (capo_sum, (-4.0, -6.9))):
        wa, wb = (_sigmoid(x) for x in gaps)
        assert form["length_push"] == pytest.approx(-2 * wa / (2 * wa + 2 * wb), abs=1e-12)


def test_the_saturation_threshold_is_strict_and_counts_each_pair():
    rows = [_row("a", "correct", 1, 0.0), _row("a", "incorrect", 1, -SATURATED_GAP * 0.6 - 1e-9, 1),
            _row("a", "incorrect", 1, -SATURATED_GAP * 0.6 + 1e-9, 2), _row("a", "correct", 1, -0.1, 3)]
    got = length_check(rows)
    assert got["capo"]["pairs"] == 4
    # gaps / 0.6 of the four pairs: 3 + eps (saturated), 3 - eps, and from the second correct 2.83 + eps, 2.83 - eps
    assert got["capo"]["saturated"] == 0.25
    at = length_check([_row("a", "correct", 1, 0.0), _row("a", "incorrect", 1, -SATURATED_GAP, 1)])
    assert at["capo_sum"]["saturated"] == 0.0  # a gap / tau of exactly 3 (tau 1) is not beyond it


def test_equal_lengths_have_no_correlation_and_say_the_variant_is_at_the_rate():
    rows = [_row(q, v, 5, lp, i) for q in "ab" for i, (v, lp) in enumerate((("correct", -0.3), ("incorrect", -0.9)))]
    got = length_check(rows)
    assert got["len_sd_within"] == 0 and got["len_varies"] == 0 and got["sum_len_corr"] is None
    assert got["capo_sum"]["length_push"] == 0
    assert "one length" in length_reading(got) and "the outcome's rate" in length_reading(got)


def test_what_is_left_out():
    assert length_check([]) == {}
    assert length_check([_row("a", "correct", 3, -1.0), _row("b", "incorrect", 3, -1.0)]) == {}  # one per question
    no_count = [{k: v for k, v in r.items() if k != "n_tokens"} for r in ROWS]
    assert length_check(no_count) == {}  # generations from before n_tokens was written
    empty = ROWS + [_row("a", "incorrect", 0, None, 2)]  # an empty response: no mean log-prob, left out
    assert length_check(empty) == length_check(ROWS)
    uneven = ROWS + [_row("b", "correct", 3, -0.4, 2)]
    assert length_check(uneven)["capo"]["length_push"] is None and length_check(uneven)["capo"]["pairs"] == 3


def test_the_order_of_the_rows_changes_nothing():
    rng = random.Random(7)
    rows = [_row(f"q{q}", rng.choice(("correct", "incorrect")), rng.randint(1, 40), -rng.random() * 2, i)
            for q in range(30) for i in range(6)]
    want = length_check(rows)
    shuffled = rows[:]
    rng.shuffle(shuffled)
    got = length_check(shuffled)
    for key in ("questions", "mean_tokens", "len_sd_within", "len_varies", "sum_len_corr"):
        assert got[key] == pytest.approx(want[key], abs=1e-12)
    for form in ("capo", "capo_sum"):
        assert got[form]["pairs"] == want[form]["pairs"]
        assert got[form]["saturated"] == pytest.approx(want[form]["saturated"], abs=1e-12)
        assert got[form]["length_push"] == pytest.approx(want[form]["length_push"], abs=1e-12)


def test_capo_eval_metrics_carry_the_check_and_the_report_draws_it():
    rows = [{**r, "answer_id": 0, "text": "x"} for r in ROWS]
    curves = compute_metrics(rows, n_boot=0)["curves"]
    assert curves["lengths"] == length_check(ROWS)
    page = render_report([RunInfo("base", Path("base"), "eval", {}, curves, {}, [])])
    assert "<h2>Response lengths and CAPO's score</h2>" in page
    assert "Lengths vary within 50% of the questions (sd 0.7 tokens)" in page
    assert "ranks long responses low (correlation -0.50)" in page
    assert "100% of its (correct, incorrect) pairs are saturated, against 50% of CAPO&#x27;s" in page
    assert "towards shorter responses" in page
    right = length_check([{**r, "verdict": "correct"} for r in ROWS])
    assert right["capo"]["pairs"] == 0 and right["capo"]["saturated"] is None
    assert "no question has both a correct and an incorrect response, so no pair to weigh." in length_reading(right)
    bare = render_report([RunInfo("base", Path("base"), "eval", {}, {**curves, "lengths": {}}, {}, [])])
    assert "Response lengths and CAPO" not in bare
