"""DeepConf-style voting: confidence-filtered and confidence-weighted votes (hand cases, a numpy reference, properties)."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo.core.voting import confidence_weighted_vote, filtered_vote, majority_vote, weighted_vote

F64 = torch.float64
HYP = settings(max_examples=80, deadline=None)


def t(x, dtype=None):
    return torch.tensor(x, dtype=dtype)


# question 0: answers 0, 1, 1, 2 (row 0 is the only right one); question 1: 0, 0, 1, none (row 6 wrong)
A = t([0, 1, 1, 2, 0, 0, 1, -1])
C = t([1, 0, 0, 0, 1, 1, 0, 0])
G = t([0, 0, 0, 0, 1, 1, 1, 1])
S = t([0.9, 0.1, 0.2, 0.3, 0.1, 0.2, 0.9, 0.95], dtype=F64)


def test_filtered_vote_hand_cases():
    # q0: p = 3 * (1 - .25) = 2.25 -> threshold v_3 = 0.9 (numpy percentile 75 = 0.45): only row 0 votes -> answer 0
    # q1: the 3 answered rows (row 7 has no answer): p = 1.5 -> v_2 = 0.9: only row 6 -> answer 1 (wrong)
    r = filtered_vote(A, C, G, S, keep_fraction=0.25)
    assert r.chosen_answer.tolist() == [0, 1] and r.chosen_index.tolist() == [0, 6] and r.accuracy == 0.5
    # keep 0.5: q0 keeps 0.3 (answer 2) and 0.9 (answer 0): a 1-1 tie goes to the first occurrence (row 0);
    # q1 keeps 0.2 and 0.9 (answers 0 and 1): tie -> row 5's answer 0 (first occurrence among kept)
    r = filtered_vote(A, C, G, S, keep_fraction=0.5)
    assert r.chosen_answer.tolist() == [0, 0] and r.chosen_index.tolist() == [0, 5] and r.accuracy == 1.0
    # weighted, keep 0.5: q0: 0.9 vs 0.3 -> 0; q1: answer 0 has 0.2, answer 1 has 0.9 -> 1
    r = filtered_vote(A, C, G, S, keep_fraction=0.5, weighted=True)
    assert r.chosen_answer.tolist() == [0, 1] and r.accuracy == 0.5
    # plain majority would pick answer 1 in q0 (two votes)
    assert majority_vote(A, C, G).chosen_answer.tolist() == [1, 0]


def test_filtered_vote_missing_confidence_and_no_candidates():
    # q0: row 0 (answer 0) has NaN confidence: it never votes, so answer 1 wins even at keep 1.0
    r = filtered_vote(t([0, 0, 1]), t([1, 1, 0]), t([0, 0, 0]), t([math.nan, math.nan, 0.1], dtype=F64), 1.0)
    assert r.chosen_answer.tolist() == [1] and not bool(r.correct[0])
    # a question where no response has both an answer and a confidence counts as wrong
    r = filtered_vote(t([-1, 3]), t([0, 1]), t([4, 4]), t([0.5, math.nan], dtype=F64), 0.5)
    assert r.chosen_answer.tolist() == [-1] and r.accuracy == 0.0


def test_weighted_vote_any_non_negative_score():
    # DeepConf token confidences are unbounded above: q0: 0 -> 5.0, 1 -> 2 + 2.5 = 4.5, 2 -> 0.5
    w = t([5.0, 2.0, 2.5, 0.5], dtype=F64)
    r = weighted_vote(t([0, 1, 1, 2]), t([1, 0, 0, 0]), t([0, 0, 0, 0]), w)
    assert r.chosen_answer.tolist() == [0]
    # the verbal vote is the same function with weights in [0, 1]
    q = t([0.9, 0.5, 0.5, math.nan], dtype=F64)
    a, c, g = t([0, 1, 1, 2]), t([1, 0, 0, 0]), t([0, 0, 0, 0])
    assert weighted_vote(a, c, g, q).chosen_answer.tolist() == confidence_weighted_vote(a, c, g, q).chosen_answer.tolist() == [1]


def test_errors():
    with pytest.raises(ValueError, match="finite and >= 0"):
        weighted_vote(A, C, G, -S)
    with pytest.raises(ValueError, match="finite and >= 0"):
        weighted_vote(A, C, G, torch.where(S > 0.5, math.inf, S))
    with pytest.raises(ValueError, match="finite and >= 0"):
        filtered_vote(A, C, G, S - 0.5, keep_fraction=0.5, weighted=True)
    filtered_vote(A, C, G, S - 0.5, keep_fraction=0.5)  # unweighted: signed scores are fine (only the order counts)
    for bad in (0, 0.0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match="keep_fraction"):
            filtered_vote(A, C, G, S, keep_fraction=bad)
    with pytest.raises(ValueError, match="must match"):
        filtered_vote(A, C, G, S[:3])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        confidence_weighted_vote(A, C, G, t([0.5] * 7 + [1.5], dtype=F64))


# ---------------------------------------------------------------------------------------------------------------
# against a per-question numpy transcription of DeepConf's offline filter
# ---------------------------------------------------------------------------------------------------------------


def ref_filtered(a, c, g, s, frac, weighted):
    out = {}
    for q in sorted(set(g)):
        rows = [i for i in range(len(a)) if g[i] == q and a[i] >= 0 and not math.isnan(s[i])]
        if not rows:
            out[q] = (-1, False)
            continue
        thr = np.percentile([s[i] for i in rows], (1 - frac) * 100)
        kept = [i for i in rows if s[i] >= thr]
        score, first = defaultdict(float), {}
        for i in kept:
            score[a[i]] += s[i] if weighted else 1.0
            first.setdefault(a[i], i)
        best = max(score, key=lambda k: (score[k], -first[k]))  # highest score, then earliest first response
        out[q] = (best, bool(c[first[best]]))
    return out


responses = st.lists(
    st.tuples(st.integers(0, 3), st.integers(-1, 3), st.integers(0, 8) | st.just(-99)), min_size=1, max_size=30
)


@HYP
@given(responses, st.sampled_from([0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0]), st.booleans())
def test_filtered_vote_matches_reference(rows, frac, weighted):
    g = [r[0] for r in rows]
    a = [r[1] for r in rows]
    s = [math.nan if r[2] == -99 else r[2] / 4 for r in rows]
    c = [x % 2 == 0 for x in a]  # a class's responses agree on correctness
    got = filtered_vote(t(a), t(c), t(g), t(s, dtype=F64), keep_fraction=frac, weighted=weighted)
    want = ref_filtered(a, c, g, s, frac, weighted)
    assert got.group_labels.tolist() == sorted(want)
    assert got.chosen_answer.tolist() == [want[q][0] for q in sorted(want)]
    assert got.correct.tolist() == [want[q][1] for q in sorted(want)]


@HYP
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 3), st.integers(0, 20)), min_size=1, max_size=30))
def test_keep_everything_equals_majority_and_weighted_votes(rows):
    g = t([r[0] for r in rows])
    a = t([r[1] for r in rows])
    s = t([r[2] / 7 for r in rows], dtype=F64)
    c = a % 2 == 0
    for got, want in ((filtered_vote(a, c, g, s, 1.0), majority_vote(a, c, g)),
                      (filtered_vote(a, c, g, s, 1.0, weighted=True), weighted_vote(a, c, g, s))):
        assert got.chosen_answer.tolist() == want.chosen_answer.tolist()
        assert got.correct.tolist() == want.correct.tolist()
    # filtering uses only the order of the confidences: a strictly increasing transform changes nothing
    for frac in (0.1, 0.5):
        f1 = filtered_vote(a, c, g, s, frac)
        f2 = filtered_vote(a, c, g, torch.exp(3 * s) - 5, frac)
        assert f1.chosen_answer.tolist() == f2.chosen_answer.tolist()


def test_a_filtered_vote_tie_goes_to_the_first_kept_response():
    """Answers [0, 1, 0, 2], confidences [.1, .9, .8, .2], keep half: rows 1 and 2 are kept and tie 1-1; class 1's
    kept response comes first, so class 1 (wrong) wins, though class 0's first response (row 0) is earlier."""
    r = filtered_vote(t([0, 1, 0, 2]), t([True, False, True, False]), t([0, 0, 0, 0]), t([0.1, 0.9, 0.8, 0.2], F64),
                      keep_fraction=0.5)
    assert r.chosen_answer.tolist() == [1] and r.accuracy == 0.0
