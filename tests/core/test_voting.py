"""Test-time voting: hand cases (ties, no-answer), pass@k against brute force, vectorised voters vs slow loops."""

from __future__ import annotations

import itertools
import math
from math import comb

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo.core.voting import (
    VoteResult,
    confidence_weighted_vote,
    majority_vote,
    max_confidence,
    mean_at_k,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_batch,
    perplexity_consistency,
)

F64 = torch.float64
HYP = settings(max_examples=100, deadline=None)


def t(x, dtype=None):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------------------------------------------------------
# mean@k, pass@k
# ---------------------------------------------------------------------------------------------------------------


def test_mean_at_k_is_per_question_mean():
    # question 5: 1/4 correct, question 2: 2/2 correct -> (0.25 + 1) / 2 (pooled accuracy would be 3/6)
    c = t([1, 0, 0, 0, 1, 1])
    g = t([5, 5, 5, 5, 2, 2])
    assert mean_at_k(c, g) == 0.625
    assert mean_at_k(t([True, False]), t([0, 0])) == 0.5


def brute_pass_at_k(n, c, k):
    """Fraction of k-subsets of n samples (c correct) containing at least one correct sample."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = brute_pass_at_k(n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12), (n, c, k)


def test_pass_at_k_large_n_stable_and_batched():
    for n, c, k in [(200, 3, 10), (1000, 1, 1), (1000, 0, 50), (64, 63, 64), (500, 17, 100)]:
        want = 1 - comb(n - c, k) / comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)
    n = torch.tensor([8, 8, 8, 16, 16, 3, 200])
    c = torch.tensor([0, 1, 8, 5, 15, 2, 3])
    for k in (1, 2, 3):
        got = pass_at_k_batch(n, c, k)
        assert got.dtype == F64
        want = [pass_at_k(int(a), int(b), k) for a, b in zip(n, c)]
        assert torch.allclose(got, torch.tensor(want, dtype=F64), atol=1e-12, rtol=0)
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8, abs=1e-15)  # pass@1 = c/n


def test_mean_pass_at_k():
    c = t([1, 0, 0, 0, 0, 0, 1, 1])
    g = t([1, 1, 1, 1, 9, 9, 9, 9])
    assert mean_pass_at_k(c, g, 2) == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 2, 2)) / 2, abs=1e-15)
    assert mean_pass_at_k(c, g, 1) == mean_at_k(c, g)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: pass_at_k(4, 5, 1), ValueError, r"c must be in \[0, n=4\]"),
        (lambda: pass_at_k(4, 1, 5), ValueError, "k must be <= n=4"),
        (lambda: pass_at_k(4, 1, 0), ValueError, "k must be >= 1"),
        (lambda: pass_at_k(0, 0, 1), ValueError, "n must be >= 1"),
        (lambda: pass_at_k(4.0, 1, 1), TypeError, "n must be an int"),
        (lambda: pass_at_k_batch(t([4, 2]), t([1, 1]), 3), ValueError, "question 1 has n=2"),
        (lambda: pass_at_k_batch(t([4, 2]), t([1, 3]), 1), ValueError, r"c must be in \[0, n\]"),
        (lambda: pass_at_k_batch(t([4.0]), t([1]), 1), TypeError, "n must have an integer dtype"),
        (lambda: mean_pass_at_k(t([1, 0]), t([0, 1]), 2), ValueError, "n must be >= k=2"),
        (lambda: mean_at_k(t([1, 0]), t([0])), ValueError, "group_ids has shape"),
        (lambda: mean_at_k(t([]), t([], dtype=torch.int64)), ValueError, "empty"),
    ],
)
def test_pass_at_k_checks(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------------------------------------------------------
# voters: hand cases
# ---------------------------------------------------------------------------------------------------------------


def test_majority_vote_hand_cases():
    # q 3: answers [1, 2, 2, -1, -1, -1]: -1 is the most frequent but never wins; class 2 wins (correct)
    # q 0: answers [4, 7, 7, 4]: tie 2-2 -> class 4 occurs first (row 6) -> wrong
    # q 8: answers [-1, -1]: no answer -> wrong, chosen -1
    a = t([1, 2, 2, -1, -1, -1, 4, 7, 7, 4, -1, -1])
    c = t([0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0])
    g = t([3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 8, 8])
    r = majority_vote(a, c, g)
    assert isinstance(r, VoteResult)
    assert r.group_labels.tolist() == [0, 3, 8]
    assert r.chosen_answer.tolist() == [4, 2, -1]
    assert r.chosen_index.tolist() == [6, 1, 10]
    assert r.correct.tolist() == [False, True, False]
    assert r.accuracy == pytest.approx(1 / 3, abs=1e-15)


def test_tie_break_is_first_occurrence_not_class_id():
    c = t([1, 0, 1, 0])
    g = t([0, 0, 0, 0])
    # class 9 first, class 2 second, tie 2-2 -> 9 wins, whatever the numbering
    assert majority_vote(t([9, 2, 9, 2]), c, g).chosen_answer.tolist() == [9]
    assert majority_vote(t([2, 9, 2, 9]), c, g).chosen_answer.tolist() == [2]
    assert majority_vote(t([2, 9, 2, 9]), c, g).correct.tolist() == [True]
    # class ids are arbitrary non-negative ints (no dense numbering assumed)
    r = majority_vote(t([2**62, 7, 2**62, -1]), t([1, 0, 1, 0]), t([2**40, 2**40, 2**40, 2**40]))
    assert r.chosen_answer.tolist() == [2**62] and r.group_labels.tolist() == [2**40] and r.accuracy == 1.0


def test_no_answer_never_wins_even_when_flagged_correct():
    r = majority_vote(t([-1, -1]), t([1, 1]), t([0, 0]))
    assert r.chosen_answer.tolist() == [-1] and r.correct.tolist() == [False] and r.accuracy == 0.0
    r = max_confidence(t([-1, 5]), t([0, 1]), t([0, 0]), t([0.99, 0.01], dtype=F64))
    assert r.chosen_answer.tolist() == [5] and r.chosen_index.tolist() == [1]


def test_perplexity_consistency_hand_case():
    # class 1: two paths exp(-0.1) + exp(-3.0) = 0.954; class 2: one path exp(-0.01) = 0.990 -> class 2 wins
    # (majority vote would pick class 1)
    a = t([1, 2, 1])
    c = t([0, 1, 0])
    g = t([0, 0, 0])
    lpm = t([-0.1, -0.01, -3.0], dtype=F64)
    assert majority_vote(a, c, g).chosen_answer.tolist() == [1]
    r = perplexity_consistency(a, c, g, lpm)
    assert r.chosen_answer.tolist() == [2] and r.correct.tolist() == [True]


def test_perplexity_consistency_counts_identical_paths_once():
    # class 1 = the same text sampled 3 times (path 0) with p = 0.5 each; class 2 = two distinct paths with
    # p = 0.4 each. Without dedupe 1.5 vs 0.8 -> class 1; unique paths: 0.5 vs 0.8 -> class 2
    a = t([1, 1, 2, 1, 2])
    c = t([0, 0, 1, 0, 1])
    g = t([4, 4, 4, 4, 4])
    lpm = torch.log(t([0.5, 0.5, 0.4, 0.5, 0.4], dtype=F64))
    paths = t([0, 0, 1, 0, 2])
    assert perplexity_consistency(a, c, g, lpm).chosen_answer.tolist() == [1]
    r = perplexity_consistency(a, c, g, lpm, path_ids=paths)
    assert r.chosen_answer.tolist() == [2] and r.chosen_index.tolist() == [2] and r.accuracy == 1.0
    # path ids are per question: the same id in another question is a different path
    a2, c2 = torch.cat([a, t([3, 3])]), torch.cat([c, t([1, 1])])
    g2, p2 = torch.cat([g, t([5, 5])]), torch.cat([paths, t([0, 1])])
    lpm2 = torch.cat([lpm, t([-0.1, -0.2], dtype=F64)])
    r2 = perplexity_consistency(a2, c2, g2, lpm2, path_ids=p2)
    assert r2.chosen_answer.tolist() == [2, 3]
    with pytest.raises(ValueError, match="must share one answer id"):
        perplexity_consistency(a, c, g, lpm, path_ids=t([0, 0, 0, 1, 2]))


def test_confidence_weighted_vote_hand_case():
    # class 1: 0.2 + 0.3 + 0.1 = 0.6; class 2: 0.9; NaN counts 0 -> class 2 wins (majority would pick 1)
    a = t([1, 1, 2, 1, 2])
    c = t([0, 0, 1, 0, 1])
    g = t([0, 0, 0, 0, 0])
    q = t([0.2, 0.3, 0.9, 0.1, math.nan], dtype=F64)
    r = confidence_weighted_vote(a, c, g, q)
    assert r.chosen_answer.tolist() == [2] and r.correct.tolist() == [True]
    # all-zero weights: tie -> first occurrence
    r = confidence_weighted_vote(t([3, 1]), t([0, 1]), t([0, 0]), t([0.0, math.nan], dtype=F64))
    assert r.chosen_answer.tolist() == [3]
    with pytest.raises(ValueError, match=r"confidence must lie in \[0, 1\]"):
        confidence_weighted_vote(a, c, g, t([0.2, 0.3, 1.9, 0.1, 0.0], dtype=F64))


def test_max_confidence_hand_case():
    a = t([1, 2, 3, -1, 4, 5])
    c = t([0, 1, 0, 0, 1, 0])
    g = t([0, 0, 0, 0, 1, 1])
    q = t([0.7, 0.9, 0.9, 1.0, math.nan, -math.inf], dtype=F64)
    r = max_confidence(a, c, g, q)
    # q0: tie 0.9 between rows 1 and 2 -> lowest row (1); the -1 row with 1.0 is ignored
    # q1: NaN (missing) ranks below -inf -> row 5
    assert r.chosen_index.tolist() == [1, 5]
    assert r.chosen_answer.tolist() == [2, 5]
    assert r.correct.tolist() == [True, False]


# ---------------------------------------------------------------------------------------------------------------
# voters: vectorised vs slow reference loops
# ---------------------------------------------------------------------------------------------------------------


def ref_class_vote(a, c, g, w):
    out = {}
    for label in sorted(set(g)):
        rows = [i for i in range(len(a)) if g[i] == label]
        classes = {}
        for i in rows:
            if a[i] < 0:
                continue
            s, first = classes.get(a[i], (0.0, i))
            classes[a[i]] = (s + w[i], first)
        if not classes:
            out[label] = (-1, False)
            continue
        best = min(classes.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
        out[label] = (best[0], bool(c[best[1][1]]))
    return out


def ref_max_conf(a, c, g, q):
    out = {}
    for label in sorted(set(g)):
        rows = [i for i in range(len(a)) if g[i] == label and a[i] >= 0]
        if not rows:
            out[label] = (-1, False)
            continue
        best = min(rows, key=lambda i: (math.isnan(q[i]), -q[i] if not math.isnan(q[i]) else 0.0, i))
        out[label] = (a[best], bool(c[best]))
    return out


def _check(r: VoteResult, ref):
    assert r.group_labels.tolist() == list(ref)
    assert r.chosen_answer.tolist() == [v[0] for v in ref.values()]
    assert r.correct.tolist() == [v[1] for v in ref.values()]
    assert r.accuracy == pytest.approx(sum(v[1] for v in ref.values()) / len(ref), abs=1e-15)


@HYP
@given(
    st.lists(
        st.tuples(st.integers(-1, 3), st.integers(0, 3), st.sampled_from([0.1, 0.25, 0.5, 1.0])),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 2**31),
)
def test_voters_match_slow_loops(rows, seed):
    a = [x for x, _, _ in rows]
    g = [x * 5 - 3 for _, x, _ in rows]
    q = [x for _, _, x in rows]  # coarse values -> many ties
    rng = np.random.default_rng(seed)
    truth = {label: int(rng.integers(0, 4)) for label in set(g)}  # the correct class of each question
    c = [a[i] >= 0 and a[i] == truth[g[i]] for i in range(len(a))]
    at, ct, gt, qt = t(a), t(c), t(g), t(q, dtype=F64)
    _check(majority_vote(at, ct, gt), ref_class_vote(a, c, g, [1.0] * len(a)))
    _check(confidence_weighted_vote(at, ct, gt, qt), ref_class_vote(a, c, g, q))
    lpm = torch.log(qt)
    _check(perplexity_consistency(at, ct, gt, lpm), ref_class_vote(a, c, g, torch.exp(lpm).tolist()))
    _check(max_confidence(at, ct, gt, qt), ref_max_conf(a, c, g, q))
    # each voter is invariant to how the questions are ordered, not to the order within a question (tie-breaks)
    perm = torch.argsort(gt, stable=True)
    assert majority_vote(at[perm], ct[perm], gt[perm]).correct.tolist() == majority_vote(at, ct, gt).correct.tolist()


def test_voting_on_realistic_batch():
    gen = torch.Generator().manual_seed(0)
    b, k = 200, 16
    g = torch.arange(b).repeat_interleave(k)
    a = torch.randint(-1, 4, (b * k,), generator=gen)
    c = a == 0
    lpm = -torch.rand(b * k, generator=gen, dtype=F64)
    ref = ref_class_vote(a.tolist(), c.tolist(), g.tolist(), torch.exp(lpm).tolist())
    _check(perplexity_consistency(a, c, g, lpm, path_ids=torch.arange(b * k)), ref)
    assert 0 <= mean_at_k(c, g) <= mean_pass_at_k(c, g, 4) <= 1


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: majority_vote(t([0, 1]), t([1, 0]), t([0])), ValueError, "group_ids has shape"),
        (lambda: majority_vote(t([0.0, 1.0]), t([1, 0]), t([0, 0])), TypeError, "answer_ids must have an integer"),
        (lambda: majority_vote(t([0, -2]), t([1, 0]), t([0, 0])), ValueError, "answer_ids must be >= -1"),
        (lambda: majority_vote(t([0, 1]), t([1, 3]), t([0, 0])), ValueError, "correct must contain only 0/1"),
        (lambda: majority_vote(t([], dtype=torch.int64), t([]), t([], dtype=torch.int64)), ValueError, "empty"),
        (lambda: perplexity_consistency(t([0]), t([1]), t([0]), t([0.5])), ValueError, "mean_logprob must be <= 0"),
        (lambda: perplexity_consistency(t([0]), t([1]), t([0]), t([math.nan])), ValueError, "mean_logprob contains"),
        (lambda: perplexity_consistency(t([0, 1]), t([1, 0]), t([0, 0]), t([-0.1])), ValueError, "mean_logprob has"),
        (lambda: max_confidence(t([0, 1]), t([1, 0]), t([0, 0]), t([0.1])), ValueError, "confidence has shape"),
    ],
)
def test_voting_checks(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
