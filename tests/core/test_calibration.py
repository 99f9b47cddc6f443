"""Calibration metrics: hand-computed cases, oracles (sklearn, torchmetrics), slow reference loops, properties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import brier_score_loss, roc_auc_score

from capo.core.calibration import (
    auc_mean,
    aurc,
    auroc,
    bootstrap_ci,
    brier,
    confidence_from_logprob,
    ece,
    paired_difference,
    reliability_curve,
    selective_curve,
    summarize,
)

F64 = torch.float64
HYP = settings(max_examples=75, deadline=None)


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------------------------------------------------------
# slow references
# ---------------------------------------------------------------------------------------------------------------


def ref_pair_auc(s, c) -> float:
    """Pure Python double loop over (correct, incorrect) pairs, ties 1/2."""
    pos = [x for x, y in zip(s, c) if y]
    neg = [x for x, y in zip(s, c) if not y]
    if not pos or not neg:
        return math.nan
    tot = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return tot / (len(pos) * len(neg))


def ref_auc_mean(s, c, g):
    per = {}
    for label in sorted(set(g)):
        idx = [i for i, x in enumerate(g) if x == label]
        per[label] = ref_pair_auc([s[i] for i in idx], [c[i] for i in idx])
    vals = [v for v in per.values() if not math.isnan(v)]
    return (sum(vals) / len(vals) if vals else math.nan), per


def ref_aurc_ties(conf, corr) -> float:
    """Average of the plain (no-tie) AURC over every order of the tied blocks (brute force, small N)."""
    order = sorted(range(len(conf)), key=lambda i: -conf[i])
    blocks = [list(g) for _, g in itertools.groupby(order, key=lambda i: conf[i])]
    vals = []
    for perm in itertools.product(*[list(itertools.permutations(b)) for b in blocks]):
        seq = [i for b in perm for i in b]
        err, risks = 0, []
        for k, i in enumerate(seq, start=1):
            err += 0 if corr[i] else 1
            risks.append(err / k)
        vals.append(sum(risks) / len(risks))
    return sum(vals) / len(vals)


def tm_ece(conf: torch.Tensor, corr: torch.Tensor, n_bins: int) -> float:
    from torchmetrics.classification import BinaryCalibrationError  # imported here: importing torchmetrics is slow

    m = BinaryCalibrationError(n_bins=n_bins, norm="l1")
    return float(m(conf, corr.long()))


# ---------------------------------------------------------------------------------------------------------------
# AUROC
# ---------------------------------------------------------------------------------------------------------------


def test_auroc_hand_cases():
    assert auroc(t([0.1, 0.4, 0.35, 0.8]), t([0, 0, 1, 1])) == 0.75  # 0.35 < 0.4 is the one misranked pair
    assert auroc(t([1.0, 1.0, 2.0]), t([1, 0, 1])) == 0.75  # tie counts 1/2
    assert auroc(t([3.0, 3.0, 3.0, 3.0]), t([1, 0, 1, 0])) == 0.5
    assert auroc(t([-5.0, -1.0, 2.0, 9.0]), t([0, 0, 1, 1])) == 1.0  # perfectly separated
    assert auroc(t([-5.0, -1.0, 2.0, 9.0]), t([1, 1, 0, 0])) == 0.0  # reversed
    assert auroc(t([-math.inf, -1.0, -math.inf]), t([0, 1, 0])) == 1.0  # -inf is a valid (lowest) score
    assert auroc(t([-math.inf, -math.inf]), t([0, 1])) == 0.5


def test_auroc_single_class_is_nan_and_empty_raises():
    assert math.isnan(auroc(t([0.1, 0.2]), t([1, 1])))
    assert math.isnan(auroc(t([0.1, 0.2]), t([0, 0])))
    assert math.isnan(auroc(t([0.3]), t([1])))
    with pytest.raises(ValueError, match="empty"):
        auroc(t([]), torch.tensor([], dtype=torch.bool))


@HYP
@given(
    st.lists(st.tuples(st.integers(-4, 4), st.booleans()), min_size=2, max_size=60).filter(
        lambda xs: len({b for _, b in xs}) == 2
    )
)
def test_auroc_matches_sklearn_with_ties(pairs):
    s = [float(a) for a, _ in pairs]
    c = [b for _, b in pairs]
    assert auroc(s, c) == pytest.approx(roc_auc_score(c, s), abs=1e-12)


def test_auroc_matches_sklearn_random_floats():
    rng = np.random.default_rng(0)
    for n in (2, 17, 1000, 20000):
        s = rng.normal(size=n)
        c = rng.random(n) < 0.3
        c[0], c[1] = True, False
        s[: n // 4] = np.round(s[: n // 4], 1)  # a quarter with ties
        assert abs(auroc(torch.from_numpy(s), torch.from_numpy(c)) - roc_auc_score(c, s)) < 1e-12


@HYP
@given(
    st.lists(st.tuples(st.integers(-20, 20), st.booleans()), min_size=2, max_size=40).filter(
        lambda xs: len({b for _, b in xs}) == 2
    )
)
def test_auroc_invariances(pairs):
    s = t([float(a) for a, _ in pairs])
    c = t([b for _, b in pairs], dtype=torch.bool)
    base = auroc(s, c)
    for f in (lambda x: torch.exp(x / 3), lambda x: x**3, lambda x: 7 * x - 2):  # strictly increasing
        assert auroc(f(s), c) == pytest.approx(base, abs=1e-12)
    assert auroc(-s, c) == pytest.approx(1 - base, abs=1e-12)
    perm = torch.randperm(len(s), generator=torch.Generator().manual_seed(len(s)))
    assert auroc(s[perm], c[perm]) == pytest.approx(base, abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# AUC-mean
# ---------------------------------------------------------------------------------------------------------------


def test_auc_mean_hand_case():
    # question 7: [0.9 c, 0.2 w, 0.5 w] -> 1.0; question -3: [0.1 c, 0.4 w] -> 0.0; question 100: all correct -> NaN
    s = t([0.9, 0.2, 0.1, 0.5, 0.4, 0.3, 0.3])
    c = t([1, 0, 1, 0, 0, 1, 1])
    g = torch.tensor([7, 7, -3, 7, -3, 100, 100])
    r = auc_mean(s, c, g)
    assert r.value == 0.5
    assert r.n_groups_used == 2 and r.n_groups == 3
    assert r.group_labels.tolist() == [-3, 7, 100]
    assert r.per_group[0] == 0.0 and r.per_group[1] == 1.0 and math.isnan(r.per_group[2])


def test_auc_mean_skips_one_class_questions():
    # question 0: [0.9 c, 0.2 w, 0.5 w] -> AUC 1; question 1: [0.3 c, 0.3 c] (one class) -> not used. The right rule
    # gives 1.0; counting the one-class question as 0.5 would give 0.75, as 0 would give 0.5.
    r = auc_mean(t([0.9, 0.2, 0.5, 0.3, 0.3]), t([1, 0, 0, 1, 1]), torch.tensor([0, 0, 0, 1, 1]))
    assert r.value == 1.0 and r.n_groups_used == 1 and r.n_groups == 2
    # question 1 all wrong instead, and question 0 half-right with a tie: (0.5 c, 0.5 w, 0.1 w) -> (1/2 + 1) / 2
    r = auc_mean(t([0.5, 0.5, 0.1, 0.3, 0.3]), t([1, 0, 0, 0, 0]), torch.tensor([0, 0, 0, 1, 1]))
    assert r.value == 0.75 and r.n_groups_used == 1


def test_auc_mean_no_usable_group_is_nan():
    r = auc_mean(t([0.1, 0.2, 0.3]), t([1, 1, 0]), torch.tensor([0, 0, 1]))
    assert math.isnan(r.value) and r.n_groups_used == 0 and r.n_groups == 2
    assert torch.isnan(r.per_group).all()


@pytest.mark.parametrize("seed", range(6))
def test_auc_mean_matches_slow_double_loop(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    labels = rng.choice([-17, 0, 3, 5, 1000, 2**40, 42], size=n)  # arbitrary, non-contiguous
    s = np.round(rng.normal(size=n), 1)  # many ties
    c = rng.random(n) < rng.uniform(0.1, 0.9)
    r = auc_mean(torch.from_numpy(s), torch.from_numpy(c), torch.from_numpy(labels))
    ref, per = ref_auc_mean(s.tolist(), c.tolist(), labels.tolist())
    assert (math.isnan(ref) and math.isnan(r.value)) or abs(r.value - ref) < 1e-12
    assert r.group_labels.tolist() == sorted(per)
    for lab, v in zip(r.group_labels.tolist(), r.per_group.tolist()):
        assert (math.isnan(v) and math.isnan(per[lab])) or abs(v - per[lab]) < 1e-12
    assert r.n_groups_used == sum(not math.isnan(v) for v in per.values())


@HYP
@given(
    st.lists(st.tuples(st.integers(-3, 3), st.booleans(), st.integers(0, 4)), min_size=1, max_size=50),
)
def test_auc_mean_hypothesis_vs_loop_and_permutation(rows):
    s = [float(a) for a, _, _ in rows]
    c = [b for _, b, _ in rows]
    g = [x * 11 - 7 for _, _, x in rows]
    r = auc_mean(s, c, g)
    ref, _ = ref_auc_mean(s, c, g)
    assert (math.isnan(ref) and math.isnan(r.value)) or abs(r.value - ref) < 1e-12
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(1))
    r2 = auc_mean(t(s)[perm], t(c, dtype=torch.bool)[perm], torch.tensor(g)[perm])
    assert torch.allclose(r.per_group, r2.per_group, atol=1e-12, equal_nan=True)


def test_auc_mean_is_vectorised_over_groups():
    """No Python loop over questions: 2,000 questions x 32 samples run exactly the torch operations that 2 questions
    do (counted with a dispatch mode -- a count, not a timing, so a loaded machine cannot fail it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(0)
    n = 2_000 * 32
    s = torch.randn(n, generator=gen, dtype=F64)
    c = torch.rand(n, generator=gen) < 0.5
    counts = {}
    for groups in (2, 2_000):
        with Count() as k:
            r = auc_mean(s, c, torch.arange(groups).repeat_interleave(n // groups))
        counts[groups] = k.ops
        assert r.n_groups == groups and abs(r.value - 0.5) < 0.01
    assert counts[2] == counts[2_000], counts


# ---------------------------------------------------------------------------------------------------------------
# ECE, reliability, Brier
# ---------------------------------------------------------------------------------------------------------------


def test_ece_hand_case_torchmetrics_docstring():
    # bins [0, .5): (.25, .25) acc 0 -> 2/5 * .25; [.5, 1): (.55, .75, .75) acc 1 -> 3/5 * (1 - 2.05/3)
    conf, corr = t([0.25, 0.25, 0.55, 0.75, 0.75]), t([0, 0, 1, 1, 1])
    assert ece(conf, corr, n_bins=2) == pytest.approx(0.29, abs=1e-15)


def test_ece_edges_exact_zero_and_one():
    # n_bins=10: 0.2 -> bin [0.2, 0.3) (left-closed), 1.0 -> its own bin, 0.0 -> first bin
    r = reliability_curve(t([0.0, 0.2, 0.2, 1.0, 1.0, 0.95]), t([0, 1, 0, 1, 0, 1]), n_bins=10)
    assert r.bin_edges.numel() == 12 and r.bin_edges[-1] == 1.0 and r.bin_edges[-2] == 1.0
    assert r.bin_count.tolist() == [1, 0, 2, 0, 0, 0, 0, 0, 0, 1, 2]
    assert r.bin_accuracy[2] == 0.5 and r.bin_confidence[2] == 0.2
    assert r.bin_accuracy[-1] == 0.5 and r.bin_confidence[-1] == 1.0
    assert math.isnan(r.bin_accuracy[1]) and math.isnan(r.bin_confidence[1])
    # ECE = (1/6) (|0 - 0| + 2 |0.5 - 0.2| + |1 - 0.95| + 2 |0.5 - 1|)
    want = (0 + 2 * 0.3 + 0.05 + 2 * 0.5) / 6
    assert ece(t([0.0, 0.2, 0.2, 1.0, 1.0, 0.95]), t([0, 1, 0, 1, 0, 1]), n_bins=10) == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("n_bins", [1, 2, 5, 10, 15, 20])
@pytest.mark.parametrize("seed", range(3))
def test_ece_matches_torchmetrics_random(n_bins, seed):
    gen = torch.Generator().manual_seed(seed)
    n = 2000
    conf = torch.rand(n, generator=gen, dtype=F64) ** 0.5
    corr = torch.rand(n, generator=gen, dtype=F64) < conf
    conf[:20] = 0.0
    conf[20:40] = 1.0
    assert abs(ece(conf, corr, n_bins=n_bins) - tm_ece(conf, corr, n_bins)) < 1e-6
    assert abs(ece(conf.float(), corr, n_bins=n_bins) - tm_ece(conf.float(), corr, n_bins)) < 1e-6


@HYP
@given(st.lists(st.tuples(st.integers(0, 10), st.booleans()), min_size=1, max_size=80))
def test_ece_matches_torchmetrics_on_bin_edges_float32(rows):
    # confidences exactly k/10 (including 0 and 1) in float32, whose torch.linspace edges equal float32(k/10)
    conf = torch.tensor([a / 10 for a, _ in rows], dtype=torch.float32)
    corr = torch.tensor([b for _, b in rows])
    assert abs(ece(conf, corr, n_bins=10) - tm_ece(conf, corr, 10)) < 1e-6
    # each decile is its own bin, so ECE is the count-weighted gap per level
    levels = {}
    for a, b in rows:
        levels.setdefault(a, []).append(b)
    want = sum(abs(sum(v) - len(v) * (a / 10)) for a, v in levels.items()) / len(rows)
    assert ece(torch.tensor([a / 10 for a, _ in rows], dtype=F64), corr, n_bins=10) == pytest.approx(want, abs=1e-12)


def test_ece_float64_edge_uses_exact_k_over_n_not_linspace():
    # torch.linspace(0, 1, 11, float64)[3] == 0.30000000000000004 puts a float64 0.3 in [0.2, 0.3) in torchmetrics;
    # we bin by the intended edge 3/10 (documented deviation, at most one ulp from an edge)
    conf, corr = t([0.3, 0.2]), t([1, 0])
    r = reliability_curve(conf, corr, n_bins=10)
    assert r.bin_count[2] == 1 and r.bin_count[3] == 1
    assert ece(conf, corr, n_bins=10) == pytest.approx((0.7 + 0.2) / 2, abs=1e-15)
    assert tm_ece(conf, corr, 10) == pytest.approx(abs(0.5 - 0.25), abs=1e-12)  # torchmetrics merges them


@HYP
@given(
    st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=60),
    st.integers(1, 12),
    st.sampled_from(["uniform", "quantile"]),
)
def test_reliability_consistent_with_ece(rows, n_bins, strategy):
    conf, corr = t([a for a, _ in rows]), t([b for _, b in rows], dtype=torch.bool)
    r = reliability_curve(conf, corr, n_bins=n_bins, strategy=strategy)
    assert r.bin_edges.numel() == r.bin_count.numel() + 1
    assert int(r.bin_count.sum()) == len(rows)
    ne = r.bin_count > 0
    w = r.bin_count[ne].to(F64) / len(rows)
    want = float((w * (r.bin_accuracy[ne] - r.bin_confidence[ne]).abs()).sum())
    assert ece(conf, corr, n_bins=n_bins, strategy=strategy) == pytest.approx(want, abs=1e-12)
    # every confidence lies inside its bin
    assert torch.isnan(r.bin_confidence[~ne]).all()
    lo, hi = r.bin_edges[:-1][ne], r.bin_edges[1:][ne]
    assert (r.bin_confidence[ne] >= lo - 1e-12).all() and (r.bin_confidence[ne] <= hi + 1e-12).all()
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))
    assert ece(conf[perm], corr[perm], n_bins=n_bins, strategy=strategy) == pytest.approx(want, abs=1e-12)


def test_ece_quantile_hand_case():
    # 8 distinct confidences, 4 quantile bins of 2 each
    conf = t([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    corr = t([0, 0, 0, 1, 1, 0, 1, 1])
    r = reliability_curve(conf, corr, n_bins=4, strategy="quantile")
    assert r.bin_count.tolist() == [2, 2, 2, 2]
    want = (abs(0 - 0.3) + abs(1 - 0.7) + abs(1 - 1.1) + abs(2 - 1.5)) / 8
    assert ece(conf, corr, n_bins=4, strategy="quantile") == pytest.approx(want, abs=1e-12)
    # ties always share a bin: all-equal confidences -> one non-empty bin
    r = reliability_curve(t([0.6] * 5), t([1, 1, 1, 0, 0]), n_bins=3, strategy="quantile")
    assert r.bin_count.tolist() == [0, 0, 5]
    assert ece(t([0.6] * 5), t([1, 1, 1, 0, 0]), n_bins=3, strategy="quantile") == pytest.approx(0.0, abs=1e-15)


@HYP
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=60))
def test_brier_matches_sklearn(rows):
    conf = [a for a, _ in rows]
    corr = [int(b) for _, b in rows]
    assert brier(conf, corr) == pytest.approx(brier_score_loss(corr, conf, pos_label=1), abs=1e-12)


def test_brier_hand_case():
    assert brier(t([1.0, 0.0, 0.5, 0.8]), t([1, 0, 1, 0])) == pytest.approx((0 + 0 + 0.25 + 0.64) / 4, abs=1e-15)


def test_confidence_from_logprob():
    lpm = t([0.0, -math.log(2), -math.inf])
    assert confidence_from_logprob(lpm).tolist() == [1.0, pytest.approx(0.5, abs=1e-15), 0.0]
    assert confidence_from_logprob(torch.tensor([-0.5], dtype=torch.float32)).dtype == F64
    with pytest.raises(ValueError, match="mean_logprob must be <= 0"):
        confidence_from_logprob(t([-0.1, 0.2]))
    with pytest.raises(ValueError, match="mean_logprob contains NaN"):
        confidence_from_logprob(t([math.nan]))


# ---------------------------------------------------------------------------------------------------------------
# selective prediction
# ---------------------------------------------------------------------------------------------------------------


def test_selective_curve_hand_case_with_ties():
    conf = t([0.9, 0.5, 0.9, 0.2, 0.5])
    corr = t([1, 1, 0, 0, 1])
    sc = selective_curve(conf, corr)
    assert sc.threshold.tolist() == [0.9, 0.5, 0.2]  # one point per distinct confidence
    assert sc.n_answered.tolist() == [2, 4, 5]
    assert sc.coverage.tolist() == [0.4, 0.8, 1.0]
    assert sc.precision.tolist() == [0.5, 0.75, 0.6]
    assert sc.risk.tolist() == [0.5, 0.25, 0.4]


def test_aurc_hand_cases():
    # no ties: sorted correctness [1, 0, 1, 0]: risks 0, 1/2, 1/3, 2/4
    assert aurc(t([4.0, 3.0, 2.0, 1.0]), t([1, 0, 1, 0])) == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4, abs=1e-15)
    # a tie of one right and one wrong at the top: expected risks 1/2 (k=1), 1/2 (k=2)
    assert aurc(t([1.0, 1.0]), t([1, 0])) == pytest.approx(0.5, abs=1e-15)
    assert aurc(t([0.3, 0.7]), t([1, 1])) == 0.0
    assert aurc(t([0.3, 0.7]), t([0, 0])) == 1.0


@HYP
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=7))
def test_aurc_equals_average_over_tie_orders(rows):
    conf = [float(a) for a, _ in rows]
    corr = [b for _, b in rows]
    assert aurc(conf, corr) == pytest.approx(ref_aurc_ties(conf, corr), abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_aurc_consistent_with_selective_curve(seed):
    gen = torch.Generator().manual_seed(seed)
    conf = torch.randint(0, 20, (300,), generator=gen).to(F64)
    corr = torch.rand(300, generator=gen) < 0.6
    # without ties: mean of the exact risks; with ties the curve's points are the block-end risks
    sc = selective_curve(conf, corr)
    order = torch.argsort(conf, descending=True, stable=True)
    errs = torch.cumsum((~corr[order]).to(F64), 0)
    assert torch.allclose(sc.risk, errs[sc.n_answered - 1] / sc.n_answered.to(F64), atol=1e-15)
    distinct = torch.randn(300, generator=gen, dtype=F64)
    r_plain = (torch.cumsum((~corr[torch.argsort(distinct, descending=True)]).to(F64), 0) / torch.arange(1, 301)).mean()
    assert aurc(distinct, corr) == pytest.approx(float(r_plain), abs=1e-12)
    perm = torch.randperm(300, generator=gen)
    assert aurc(conf[perm], corr[perm]) == pytest.approx(aurc(conf, corr), abs=1e-12)
    assert aurc(conf, corr) == pytest.approx(aurc(torch.exp(conf / 5), corr), abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# bootstrap and paired differences
# ---------------------------------------------------------------------------------------------------------------


def _toy(seed=0, b=40, g=8):
    gen = torch.Generator().manual_seed(seed)
    gid = torch.arange(b).repeat_interleave(g) * 3 + 5
    s = torch.randn(b * g, generator=gen, dtype=F64)
    c = torch.rand(b * g, generator=gen) < torch.sigmoid(2 * s)
    return s, c, gid


def test_bootstrap_resamples_whole_questions_and_is_reproducible():
    s, c, gid = _toy()
    seen = []

    def fn(s_, c_, g_):
        # each draw keeps all 8 responses of a question, and new labels are 0..G-1 (duplicates stay distinct)
        assert torch.bincount(g_).tolist() == [8] * 40
        seen.append(s_.numel())
        return auc_mean(s_, c_, g_).value

    lo, hi = bootstrap_ci(fn, s, c, group_ids=gid, n_boot=50, seed=3, pass_group_ids=True)
    assert seen == [320] * 50
    point = auc_mean(s, c, gid).value
    assert lo < point < hi
    assert bootstrap_ci(fn, s, c, group_ids=gid, n_boot=50, seed=3, pass_group_ids=True) == (lo, hi)
    assert bootstrap_ci(fn, s, c, group_ids=gid, n_boot=50, seed=4, pass_group_ids=True) != (lo, hi)
    gen = torch.Generator().manual_seed(3)
    assert bootstrap_ci(fn, s, c, group_ids=gid, n_boot=50, seed=gen, pass_group_ids=True) == (lo, hi)


def test_bootstrap_percentile_matches_manual_resampling():
    # per-question constant values: the statistic is the mean over drawn questions
    vals = t([0.0, 1.0, 2.0, 10.0])
    gid = torch.tensor([9, 9, 2, 2, 4, 7, 7, 7])
    x = vals[torch.tensor([0, 0, 1, 1, 2, 3, 3, 3])]  # one constant value per question
    # manual replicate of the generator stream
    gen = torch.Generator().manual_seed(11)
    labels = gid.unique()
    per_label = {int(k): float(x[gid == k][0]) for k in labels}
    manual = []
    for _ in range(200):
        draw = torch.randint(len(labels), (len(labels),), generator=gen)
        manual.append(sum(per_label[int(labels[d])] for d in draw) / len(labels))
    want = torch.quantile(t(manual), t([0.025, 0.975]))

    def stat(x_, g_):
        firsts = [x_[g_ == k][0] for k in range(int(g_.max()) + 1)]
        return float(torch.stack(firsts).mean())

    lo, hi = bootstrap_ci(stat, x, group_ids=gid, n_boot=200, seed=11, pass_group_ids=True)
    assert (lo, hi) == pytest.approx((float(want[0]), float(want[1])), abs=1e-12)


def test_bootstrap_single_question_and_all_nan():
    s, c = t([0.1, 0.9, 0.5]), t([0, 1, 1])
    g = torch.tensor([4, 4, 4])
    v = auroc(s, c)
    assert bootstrap_ci(auroc, s, c, group_ids=g, n_boot=20) == (v, v)
    assert all(math.isnan(x) for x in bootstrap_ci(auroc, s, t([1, 1, 1]), group_ids=g, n_boot=5))


def test_bootstrap_checks():
    s, c, gid = _toy()
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci(auroc, s, c, group_ids=gid, n_boot=0)
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci(auroc, s, c, group_ids=gid, alpha=1.0)
    with pytest.raises(ValueError, match=r"arrays\[1\]"):
        bootstrap_ci(auroc, s, c[:-1], group_ids=gid)
    with pytest.raises(TypeError, match="seed"):
        bootstrap_ci(auroc, s, c, group_ids=gid, seed=1.5)


def test_paired_difference():
    s, c, gid = _toy(1)
    same = paired_difference(s, c, gid, s.flip(0), c.flip(0), gid.flip(0), n_boot=100)
    assert same.value == 0.0 and (same.low, same.high) == (0.0, 0.0)
    assert same.n_groups_used == auc_mean(s, c, gid).n_groups_used
    # hand case: q1 (label 1): A = 1.0, B = 0.0; q2: A = 0.5, B undefined (all correct) -> dropped;
    # q3 only in A -> dropped
    a = paired_difference(
        t([2.0, 1.0, 1.0, 1.0, 0.0, 5.0]), t([1, 0, 1, 0, 1, 0]), torch.tensor([1, 1, 2, 2, 3, 3]),
        t([1.0, 2.0, 0.3, 0.4]), t([1, 0, 1, 1]), torch.tensor([1, 1, 2, 2]), n_boot=10,
    )
    assert a.value == 1.0 and a.n_groups_used == 1 and a.group_labels.tolist() == [1]
    assert (a.low, a.high) == (1.0, 1.0)
    # a strictly better ranking (correct responses boosted) has a positive difference, interval above 0
    better = paired_difference(s + 3.0 * c.to(F64), c, gid, s, c, gid, n_boot=300, seed=0)
    assert better.value > 0 and better.low > 0


# ---------------------------------------------------------------------------------------------------------------
# summarize and input checks
# ---------------------------------------------------------------------------------------------------------------


def test_summarize_matches_individual_metrics():
    s, c, gid = _toy(2)
    lpm = -torch.rand(s.numel(), generator=torch.Generator().manual_seed(0), dtype=F64) * 2
    verbal = torch.rand(s.numel(), generator=torch.Generator().manual_seed(1), dtype=F64)
    verbal[::7] = math.nan
    out = summarize(lpm, c, gid, verbal_conf=verbal, n_bins=10)
    p = torch.exp(lpm)
    assert out["accuracy"] == float(c.to(F64).mean())
    assert out["n"] == 320 and out["n_groups"] == 40
    assert out["auc_mean"] == auc_mean(lpm, c, gid).value
    assert out["auc_mean_groups"] == auc_mean(lpm, c, gid).n_groups_used
    assert out["auroc"] == auroc(lpm, c) == pytest.approx(auroc(p, c), abs=1e-15)
    assert out["ece"] == ece(p, c, n_bins=10)
    assert out["brier"] == brier(p, c)
    assert out["aurc"] == aurc(lpm, c)
    present = ~torch.isnan(verbal)
    assert out["verbal_missing"] == float((~present).sum()) == 46.0
    assert out["verbal_ece"] == ece(verbal[present], c[present])
    assert out["verbal_brier"] == brier(verbal[present], c[present])
    assert out["verbal_auroc"] == auroc(verbal[present], c[present])
    assert out["verbal_aurc"] == aurc(verbal[present], c[present])
    assert out["verbal_auc_mean"] == auc_mean(verbal[present], c[present], gid[present]).value
    assert all(isinstance(v, float) for v in out.values())
    assert "verbal_ece" not in summarize(lpm, c, gid)


def test_summarize_all_verbal_missing_and_float32_verbal_edges():
    lpm, c, g = t([-0.1, -2.0, -0.5]), t([1, 0, 1]), torch.tensor([0, 0, 1])
    out = summarize(lpm, c, g, verbal_conf=t([math.nan] * 3))
    assert out["verbal_missing"] == 3.0 and math.isnan(out["verbal_ece"]) and out["verbal_auc_mean_groups"] == 0.0
    v32 = torch.tensor([0.7, 0.7, math.nan], dtype=torch.float32)
    assert summarize(lpm, c, g, verbal_conf=v32)["verbal_ece"] == ece(v32[:2], c[:2])
    with pytest.raises(ValueError, match="verbal_conf must lie in"):
        summarize(lpm, c, g, verbal_conf=t([0.5, 1.5, 0.2]))


def test_accepts_numpy_and_lists_in_float64():
    conf = [0.1 + 1e-12, 0.9]
    assert brier(conf, [0, 1]) == pytest.approx(((0.1 + 1e-12) ** 2 + 0.01) / 2, abs=1e-16)
    assert auroc(np.array([0.2, 0.1]), np.array([True, False])) == 1.0
    assert auc_mean([0.2, 0.1], [1, 0], np.array([3, 3], dtype=np.int32)).value == 1.0


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: auroc(t([0.1, 0.2]), t([1, 0, 1])), ValueError, "correct has shape"),
        (lambda: auroc(t([0.1, math.nan]), t([1, 0])), ValueError, "scores contains NaN"),
        (lambda: auroc(t([0.1, 0.2]), t([1, 2])), ValueError, "correct must contain only 0/1"),
        (lambda: auroc("abc", t([1])), TypeError, "scores must be"),
        (lambda: auroc(t([[0.1]]), t([1])), ValueError, "scores must have 1 dimension"),
        (lambda: auc_mean(t([0.1]), t([1]), t([0.0])), TypeError, "group_ids must have an integer dtype"),
        (lambda: auc_mean(t([0.1, 0.2]), t([1, 0]), torch.tensor([0])), ValueError, "group_ids has shape"),
        (lambda: ece(t([0.1, 1.2]), t([1, 0])), ValueError, r"confidence must lie in \[0, 1\]"),
        (lambda: ece(t([0.1, -0.2]), t([1, 0])), ValueError, r"confidence must lie in \[0, 1\]"),
        (lambda: ece(t([0.1, math.nan]), t([1, 0])), ValueError, "confidence contains NaN"),
        (lambda: ece(t([0.1]), t([1]), n_bins=0), ValueError, "n_bins must be >= 1"),
        (lambda: ece(t([0.1]), t([1]), n_bins=2.0), TypeError, "n_bins must be an int"),
        (lambda: ece(t([0.1]), t([1]), strategy="equal"), ValueError, "strategy='equal' is not allowed"),
        (lambda: ece(t([]), t([])), ValueError, "confidence is empty"),
        (lambda: ece(torch.tensor([True]), t([1])), TypeError, "confidence must be a probability"),
        (lambda: brier(t([0.1, 0.2]), t([1])), ValueError, "correct has shape"),
        (lambda: reliability_curve(t([0.1]), t([1]), n_bins=-1), ValueError, "n_bins must be >= 1"),
        (lambda: selective_curve(t([]), t([])), ValueError, "confidence is empty"),
        (lambda: aurc(t([math.nan]), t([1])), ValueError, "confidence contains NaN"),
        (lambda: summarize(t([-0.1]), t([1]), torch.tensor([0]), n_bins=0), ValueError, "n_bins"),
    ],
)
def test_input_checks(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
