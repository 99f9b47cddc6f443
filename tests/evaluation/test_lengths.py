"""The lengths check (capo.evaluation.lengths.length_check): hand-computed values on two questions, what is left out
(unscored responses, unknown lengths, questions of one response), questions of different sizes (padded as the
trainer pads a group), the pair-cell chunking, invariance to the order of the rows, a loop over questions and pairs written from the
definitions against the vectorised check (hypothesis), and the reading drawn by `capo report`."""

import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo.core.presets import ALGORITHMS
from capo.evaluation import lengths
from capo.evaluation.lengths import FEW_VARY, SATURATED_GAP, length_check, length_reading
from capo.evaluation.metrics import compute_metrics
from capo.evaluation.report import RunInfo, render_report


def _row(q, verdict, n, lpm, i=0):
    return {"prompt_id": q, "sample_idx": i, "verdict": verdict, "n_tokens": n, "mean_logprob": lpm}


def _check(rows):
    """length_check of generation rows (as compute_metrics calls it)."""
    ids = {}
    g = torch.tensor([ids.setdefault(r["prompt_id"], len(ids)) for r in rows], dtype=torch.int64)
    c = torch.tensor([r["verdict"] == "correct" for r in rows], dtype=torch.bool)
    lpm = torch.tensor([-math.inf if r["mean_logprob"] is None else r["mean_logprob"] for r in rows],
                       dtype=torch.float64)
    n = torch.tensor([math.nan if r["n_tokens"] is None else r["n_tokens"] for r in rows], dtype=torch.float64)
    return length_check(g, c, lpm, n)


# question a: a short correct response and a long incorrect one; question b: two responses of 5 tokens
ROWS = [_row("a", "correct", 2, -1.0), _row("a", "incorrect", 4, -1.5, 1),
        _row("b", "correct", 5, -0.2), _row("b", "incorrect", 5, -2.5, 1)]


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_hand_computed_values_of_two_questions():
    got = _check(ROWS)
    assert got["questions"] == 2 and got["mean_tokens"] == 4.0
    assert got["len_sd_within"] == pytest.approx(math.sqrt(2) / 2, abs=1e-12)  # sds sqrt(2) and 0
    assert got["len_varies"] == 0.5
    # centred on their question's means: lengths (-1, 1, 0, 0), sums (-2, -6) -> (2, -2) and (-1, -12.5) -> +-5.75
    want_corr = -4 / (math.sqrt(2) * math.sqrt(8 + 2 * 5.75 ** 2))
    assert got["sum_len_corr"] == pytest.approx(want_corr, abs=1e-12)
    capo, capo_sum = got["capo"], got["capo_sum"]
    assert (capo["tau"], capo["score"], capo_sum["tau"], capo_sum["score"]) == (0.6, "mean", 1.0, "sum")
    assert capo["pairs"] == capo_sum["pairs"] == 2
    # lpm gaps / 0.6: 0.83 (a) and 3.83 (b); sum gaps / 1: 4 (a) and 11.5 (b)
    assert capo["saturated"] == 0.5 and capo_sum["saturated"] == 1.0
    # one pair per question: A = +-w / G, w = sigma((s_incorrect - s_correct) / tau); only question a's lengths
    # differ from their mean (-1 for its correct response, +1 for its incorrect one)
    for form, gaps in ((capo, (-0.5 / 0.6, -2.3 / 0.6)), (capo_sum, (-4.0, -11.5))):
        wa, wb = (_sigmoid(x) for x in gaps)
        assert form["length_push"] == pytest.approx(-2 * wa / (2 * wa + 2 * wb), abs=1e-12)


def test_questions_of_different_sizes_are_padded_as_the_trainer_pads_a_group():
    """Question b gets a third response: both groups are scored at G = 3, a's third row a non-partner (A = 0)."""
    got = _check(ROWS + [_row("b", "correct", 5, -0.4, 2)])
    assert got["capo"]["pairs"] == 3
    wa = _sigmoid(-0.5 / 0.6)
    w1, w2 = _sigmoid(-2.3 / 0.6), _sigmoid(-2.1 / 0.6)  # b's pairs; its lengths are all 5: no length term
    assert got["capo"]["length_push"] == pytest.approx(-2 * wa / (2 * wa + 2 * (w1 + w2)), abs=1e-12)


def test_the_saturation_threshold_is_strict_and_counts_each_pair():
    rows = [_row("a", "correct", 1, 0.0), _row("a", "incorrect", 1, -SATURATED_GAP * 0.6 - 1e-9, 1),
            _row("a", "incorrect", 1, -SATURATED_GAP * 0.6 + 1e-9, 2), _row("a", "correct", 1, -0.1, 3)]
    got = _check(rows)
    assert got["capo"]["pairs"] == 4
    # gaps / 0.6 of the four pairs: 3 + eps (saturated), 3 - eps, and from the second correct 2.83 + eps, 2.83 - eps
    assert got["capo"]["saturated"] == 0.25
    at = _check([_row("a", "correct", 1, 0.0), _row("a", "incorrect", 1, -SATURATED_GAP, 1)])
    assert at["capo_sum"]["saturated"] == 0.0  # a gap / tau of exactly 3 (tau 1) is not beyond it


def test_equal_lengths_have_no_correlation_and_read_as_the_derivations_case():
    rows = [_row(q, v, 5, lp, i) for q in "ab" for i, (v, lp) in enumerate((("correct", -0.3), ("incorrect", -0.9)))]
    got = _check(rows)
    assert got["len_sd_within"] == 0 and got["len_varies"] == 0 and got["sum_len_corr"] is None
    assert got["capo_sum"]["length_push"] == 0
    assert length_reading(got).startswith("Responses to a question have one length: the case capo_sum's derivation")
    assert "if the rest of a response does not depend on its answer" in length_reading(got)


def test_what_is_left_out():
    assert _check([]) == {} and length_reading({}) == ""
    assert _check([_row("a", "correct", 3, -1.0), _row("b", "incorrect", 3, -1.0)]) == {}  # one per question
    want = _check(ROWS)
    assert _check(ROWS + [_row("a", "incorrect", 0, None, 2)]) == want  # an empty response: no mean log-prob
    assert _check(ROWS + [_row("a", "incorrect", 3, -math.inf, 2)]) == want  # a token of probability 0
    assert _check(ROWS + [_row("b", "incorrect", None, -1.0, 2)]) == want  # no token count
    assert _check(ROWS + [_row("c", "incorrect", 3, -1.0)]) == want  # the only response of its question


def test_chunks_of_questions_give_the_one_pass_values(monkeypatch):
    rng = random.Random(3)
    rows = [_row(f"q{q}", rng.choice(("correct", "incorrect")), rng.randint(1, 40), -rng.random() * 3, i)
            for q in range(25) for i in range(rng.randint(2, 7))]
    whole = _check(rows)
    monkeypatch.setattr(lengths, "_CELLS", 50)  # one question of up to 7 rows per chunk
    chunked = _check(rows)
    for form in ("capo", "capo_sum"):
        assert chunked[form]["pairs"] == whole[form]["pairs"] > 0
        assert chunked[form]["saturated"] == pytest.approx(whole[form]["saturated"], abs=1e-12)
        assert chunked[form]["length_push"] == pytest.approx(whole[form]["length_push"], abs=1e-12)


def test_the_order_of_the_rows_changes_nothing():
    rng = random.Random(7)
    rows = [_row(f"q{q}", rng.choice(("correct", "incorrect")), rng.randint(1, 40), -rng.random() * 2, i)
            for q in range(30) for i in range(6)]
    want = _check(rows)
    shuffled = rows[:]
    rng.shuffle(shuffled)
    got = _check(shuffled)
    for key in ("questions", "mean_tokens", "len_sd_within", "len_varies", "sum_len_corr"):
        assert got[key] == pytest.approx(want[key], abs=1e-12)
    for form in ("capo", "capo_sum"):
        assert got[form]["pairs"] == want[form]["pairs"]
        assert got[form]["saturated"] == pytest.approx(want[form]["saturated"], abs=1e-12)
        assert got[form]["length_push"] == pytest.approx(want[form]["length_push"], abs=1e-12)


def test_the_reading_of_nearly_equal_lengths_a_zero_correlation_and_no_pairs():
    # one question in 40 with a longer response: within FEW_VARY, read as one length "in all but 2%"
    rows = [_row(f"q{q}", v, 5 + (q == 0 and i == 0), -0.5 - i, i) for q in range(40)
            for i, v in enumerate(("correct", "incorrect"))]
    assert _check(rows)["len_varies"] == 1 / 40 <= FEW_VARY
    assert "one length in all but 2% of the questions" in length_reading(_check(rows))
    assert "one length in all but 5% of the questions" in length_reading(_check(rows[:40]))  # 1 in 20: the bound
    # a correlation that shows as +0.00 says nothing of long responses; all correct: no pair to weigh
    flat = {"len_varies": 0.5, "len_sd_within": 1.0, "sum_len_corr": 0.004,
            "capo": {"pairs": 0, "saturated": None, "length_push": None},
            "capo_sum": {"pairs": 0, "saturated": None, "length_push": None}}
    text = length_reading(flat)
    assert "ranks long responses" not in text
    assert text.endswith("No question has both a correct and an incorrect response, so there is no pair to weigh.")


def test_capo_eval_metrics_carry_the_check_and_the_report_draws_it():
    rows = [{**r, "answer_id": 0, "text": "x"} for r in ROWS]
    curves = compute_metrics(rows, n_boot=0)["curves"]
    assert curves["lengths"] == _check(ROWS)
    page = render_report([RunInfo("base", Path("base"), "eval", {}, curves, {}, [])])
    assert "<h2>Response lengths and CAPO's score</h2>" in page
    assert "Lengths vary within 50% of the questions (sd 0.7 tokens)" in page
    assert "ranks long responses low (correlation -0.33)" in page
    assert "100% of its (correct, incorrect) pairs are saturated, against 50% of CAPO&#x27;s" in page
    assert "towards shorter responses" in page
    equal = length_check(torch.tensor([0, 0]), torch.tensor([True, False]), torch.tensor([-0.1, -0.2],
                                                                                          dtype=torch.float64),
                         torch.tensor([3.0, 3.0], dtype=torch.float64))
    two = render_report([RunInfo("base", Path("base"), "eval", {}, curves, {}, []),
                         RunInfo("other", Path("other"), "eval", {}, {**curves, "lengths": equal}, {}, [])])
    assert "<p class='lengths-reading'>base: Lengths vary within 50%" in two
    assert "<p class='lengths-reading'>other: Responses to a question have one length" in two
    bare = render_report([RunInfo("base", Path("base"), "eval", {}, {**curves, "lengths": {}}, {}, [])])
    assert "Response lengths and CAPO" not in bare


def _loop_check(rows):
    """length_check written from its definitions (docs/metrics.md) as a loop over questions and pairs: the
    reference for the vectorised one. CAPO's weight w_ij = sigma((s_j - s_i) / tau) / tau over a group padded to the
    largest question's size G (A_i = +sum_j w_ij / G for a correct i, -sum_i w_ij / G for an incorrect j)."""
    used = {}
    for r in rows:
        lpm, n = r["mean_logprob"], r["n_tokens"]
        if lpm is not None and math.isfinite(lpm) and n is not None and math.isfinite(n) and n >= 0:
            used.setdefault(r["prompt_id"], []).append((r["verdict"] == "correct", lpm, float(n)))
    qs = [q for q in used.values() if len(q) >= 2]
    if not qs:
        return {}
    g_max = max(len(q) for q in qs)
    out = {"questions": len(qs), "mean_tokens": sum(n for q in qs for _, _, n in q) / sum(map(len, qs))}
    sds, dn, ds = [], [], []
    for q in qs:
        mn, mt = sum(n for _, _, n in q) / len(q), sum(s * n for _, s, n in q) / len(q)
        sds.append(math.sqrt(sum((n - mn) ** 2 for _, _, n in q) / (len(q) - 1)))
        dn += [n - mn for _, _, n in q]
        ds += [s * n - mt for _, s, n in q]
    den = math.sqrt(sum(x * x for x in dn)) * math.sqrt(sum(x * x for x in ds))
    out |= {"len_sd_within": sum(sds) / len(sds), "len_varies": sum(sd > 0 for sd in sds) / len(sds),
            "sum_len_corr": sum(a * b for a, b in zip(dn, ds)) / den if den > 0 else None}
    for form in lengths.CAPO_SCORE_FORMS:
        kw = ALGORITHMS[form].get("advantage_kwargs", {})
        tau, total = kw["tau"], kw.get("score") == "sum"
        pairs = sat = num = absum = 0.0
        for q in qs:
            s = [lpm * n if total else lpm for _, lpm, n in q]
            mn = sum(n for _, _, n in q) / len(q)
            a = [0.0] * len(q)
            for i, (ci, _, _) in enumerate(q):
                for j, (cj, _, _) in enumerate(q):
                    if ci and not cj:
                        pairs += 1
                        sat += abs(s[i] - s[j]) / tau > SATURATED_GAP
                        w = _sigmoid((s[j] - s[i]) / tau) / tau / g_max
                        a[i] += w
                        a[j] -= w
            num += sum(ai * (n - mn) for ai, (_, _, n) in zip(a, q))
            absum += sum(abs(ai) for ai in a)
        out[form] = {"tau": float(tau), "score": kw.get("score", "mean"), "pairs": int(pairs),
                     "saturated": sat / pairs if pairs else None, "length_push": num / absum if absum > 0 else None}
    return out


def _close(got, want):
    if want is None or got is None:
        return got is want
    return got == pytest.approx(want, rel=1e-9, abs=1e-12)


# (question, correct, length, lpm); one value in ten of a length or an lpm is missing (None: left out)
_ROW = st.tuples(st.integers(0, 4), st.booleans(),
                 st.tuples(st.integers(0, 9), st.integers(0, 30)).map(lambda t: t[1] if t[0] else None),
                 st.tuples(st.integers(0, 9), st.floats(-6.0, 0.0)).map(lambda t: t[1] if t[0] else None))


@settings(max_examples=150, deadline=None)
@given(st.lists(_ROW, min_size=0, max_size=24))
def test_a_loop_over_questions_and_pairs_gives_the_vectorised_values(drawn):
    rows = [_row(f"q{q}", "correct" if ok else "incorrect", n, lpm, i) for i, (q, ok, n, lpm) in enumerate(drawn)]
    got, want = _check(rows), _loop_check(rows)
    assert got.keys() == want.keys()
    for key in ("questions", "mean_tokens", "len_sd_within", "len_varies", "sum_len_corr"):
        if key in want:
            assert _close(got[key], want[key]), key
    for form in lengths.CAPO_SCORE_FORMS:
        if form in want:
            assert got[form]["tau"] == want[form]["tau"] and got[form]["score"] == want[form]["score"]
            assert got[form]["pairs"] == want[form]["pairs"]
            assert _close(got[form]["saturated"], want[form]["saturated"]), form
            assert _close(got[form]["length_push"], want[form]["length_push"]), form
