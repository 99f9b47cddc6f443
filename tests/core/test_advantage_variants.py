"""ACE, SEED-GRPO, GDPO, unlikeliness reward and NGRPO: hand-computed values, reductions to GRPO, reference loops,
properties and input errors."""

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo.core import ADVANTAGES, compute_advantages
from capo.core.advantage_variants import (
    ace_advantage,
    gdpo_advantage,
    ngrpo_advantage,
    seed_grpo_advantage,
    semantic_entropy,
    unlikeliness_advantage,
)
from capo.core.advantages import grpo_advantage

f64 = dict(dtype=torch.float64)
EXACT = dict(rtol=0, atol=1e-12)


def t(*xs):
    return torch.tensor(xs, **f64)


def binary_groups(max_groups=4, max_g=6):
    return st.integers(2, max_g).flatmap(
        lambda g: st.integers(1, max_groups).flatmap(
            lambda b: st.lists(st.sampled_from([0.0, 1.0]), min_size=b * g, max_size=b * g).map(
                lambda r: (torch.tensor(r, **f64), g))))


def test_all_new_estimators_are_registered():
    for name in ("ace", "seed_grpo", "gdpo", "unlikeliness", "ngrpo"):
        assert name in ADVANTAGES


# ------------------------------------------------------------------------------------------------------- ACE
def test_ace_hand_computed():
    r = t(1, 0, 0, 0)  # GRPO (eps 0): [1.5, -0.5, -0.5, -0.5] (mean 0.25, Bessel std 0.5)
    c = t(5.0, 0.0, math.log(math.e - 1), math.log(3.0))  # softplus: ln(1+e^5), ln 2, 1, ln 4
    a = ace_advantage(r, 4, confidence_shift=c, alpha=1.0, eps=1e-300)
    # the positive advantage is untouched whatever c; negatives scale by 1 + softplus(c)
    want = t(1.5, -0.5 * (1 + math.log(2)), -0.5 * 2.0, -0.5 * (1 + math.log(4)))
    torch.testing.assert_close(a, want, **EXACT)
    a2 = ace_advantage(r, 4, confidence_shift=c, alpha=0.5, eps=1e-300)
    torch.testing.assert_close(a2[1], torch.tensor(-0.5 * (1 + 0.5 * math.log(2)), **f64), **EXACT)


@settings(max_examples=50, deadline=None)
@given(binary_groups(), st.integers(0, 2**31 - 1))
def test_ace_alpha_zero_is_grpo_and_penalty_grows_with_confidence(rg, seed):
    r, g = rg
    c = torch.randn(len(r), generator=torch.Generator().manual_seed(seed), **f64) * 3
    base = grpo_advantage(r, g)
    torch.testing.assert_close(ace_advantage(r, g, confidence_shift=c, alpha=0.0), base, **EXACT)
    a = ace_advantage(r, g, confidence_shift=c, alpha=0.7)
    assert torch.equal(a >= 0, base >= 0)  # signs never flip
    assert torch.equal(a[base >= 0], base[base >= 0])
    assert (a[base < 0] <= base[base < 0]).all()  # errors only ever penalised harder
    a_more = ace_advantage(r, g, confidence_shift=c + 1.0, alpha=0.7)
    assert (a_more[base < 0] < a[base < 0]).all()  # a more confident error is pushed down more


def test_ace_errors():
    r = t(1, 0, 0, 0)
    with pytest.raises(ValueError, match="confidence_shift is required"):
        ace_advantage(r, 4)
    with pytest.raises(ValueError, match="confidence_shift has shape"):
        ace_advantage(r, 4, confidence_shift=t(1, 2))
    with pytest.raises(ValueError, match="confidence_shift contains NaN"):
        ace_advantage(r, 4, confidence_shift=t(0, float("nan"), 0, 0))
    with pytest.raises(TypeError, match="confidence_shift must have a floating dtype"):
        ace_advantage(r, 4, confidence_shift=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        ace_advantage(r, 4, confidence_shift=t(0, 0, 0, 0), alpha=-1.0)


# ------------------------------------------------------------------------------------------------ SEED-GRPO
def test_semantic_entropy_hand_computed():
    ids = torch.tensor([0, 0, 0, 1,   7, 7, 3, 3,   -1, -1, 0, 0,   0, 1, 2, 3])
    plugin = semantic_entropy(ids, 4)
    # p = (3/4, 1/4); (1/2, 1/2); singletons: (1/4, 1/4, 1/2); all distinct: four times 1/4
    want = [-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), math.log(2),
            -(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5)), math.log(4)]
    torch.testing.assert_close(plugin, t(*want), **EXACT)
    cl = semantic_entropy(ids, 4, unanswered="cluster")  # the two -1 answers now form one cluster: (1/2, 1/2)
    torch.testing.assert_close(cl[2], torch.tensor(math.log(2), **f64), **EXACT)
    ml = semantic_entropy(ids, 4, estimator="mean_log")  # -(1/K) sum_k log p_k
    want_ml = [-(math.log(0.75) + math.log(0.25)) / 2, math.log(2),
               -(2 * math.log(0.25) + math.log(0.5)) / 3, math.log(4)]
    torch.testing.assert_close(ml, t(*want_ml), **EXACT)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 7).flatmap(lambda g: st.tuples(st.just(g), st.lists(st.integers(-1, 3), min_size=2 * g,
                                                                          max_size=2 * g))))
def test_semantic_entropy_matches_a_reference_loop(gi):
    g, raw = gi
    ids = torch.tensor(raw)
    for estimator in ("plugin", "mean_log"):
        for unanswered in ("singleton", "cluster"):
            got = semantic_entropy(ids, g, estimator=estimator, unanswered=unanswered)
            for b in range(2):
                labels = [(x, i) if (x < 0 and unanswered == "singleton") else x
                          for i, x in enumerate(raw[b * g:(b + 1) * g])]
                p = [n / g for n in Counter(labels).values()]
                ref = (-sum(q * math.log(q) for q in p) if estimator == "plugin"
                       else -sum(math.log(q) for q in p) / len(p))
                assert abs(float(got[b]) - ref) < 1e-12
                assert -1e-12 <= float(got[b]) <= math.log(g) + 1e-12


def test_seed_grpo_hand_computed_and_limits():
    r = t(1, 1, 1, 0)  # GRPO (eps 0): mean .75, Bessel std 0.5 -> [0.5, 0.5, 0.5, -1.5]
    ids = torch.tensor([0, 0, 0, 1])
    se = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    a = seed_grpo_advantage(r, 4, cluster_ids=ids, alpha=1.0, eps=1e-300)
    torch.testing.assert_close(a, t(0.5, 0.5, 0.5, -1.5) * (1 - se / math.log(4)), **EXACT)
    a_exp = seed_grpo_advantage(r, 4, cluster_ids=ids, alpha=0.5, modulation="exp", eps=1e-300)
    torch.testing.assert_close(a_exp, t(0.5, 0.5, 0.5, -1.5) * math.exp(-0.5 * se / math.log(4)), **EXACT)
    # all answers distinct: SE = SE_max, the linear form with alpha 1 switches the prompt off (no NaN)
    a0 = seed_grpo_advantage(r, 4, cluster_ids=torch.tensor([0, 1, 2, 3]), alpha=1.0)
    assert torch.equal(a0, torch.zeros(4, **f64))
    # one answer (SE = 0): GRPO exactly; equal rewards: 0 without NaN
    r2 = t(1, 0, 1, 0, 1, 1, 1, 1)
    ids2 = torch.tensor([4, 4, 4, 4, 0, 0, 0, 0])
    torch.testing.assert_close(seed_grpo_advantage(r2, 4, cluster_ids=ids2), grpo_advantage(r2, 4), **EXACT)
    assert torch.equal(seed_grpo_advantage(r2, 4, cluster_ids=ids2)[4:], torch.zeros(4, **f64))


@settings(max_examples=50, deadline=None)
@given(binary_groups(), st.integers(0, 2**31 - 1))
def test_seed_grpo_alpha_zero_is_grpo_and_never_amplifies(rg, seed):
    r, g = rg
    ids = torch.randint(-1, 3, (len(r),), generator=torch.Generator().manual_seed(seed))
    base = grpo_advantage(r, g)
    torch.testing.assert_close(seed_grpo_advantage(r, g, cluster_ids=ids, alpha=0.0), base, **EXACT)
    a = seed_grpo_advantage(r, g, cluster_ids=ids, alpha=0.8)
    assert (a.abs() <= base.abs() + 1e-12).all() and (a * base >= 0).all()


def test_seed_grpo_errors():
    r = t(1, 0, 0, 0)
    with pytest.raises(ValueError, match="cluster_ids is required"):
        seed_grpo_advantage(r, 4)
    with pytest.raises(TypeError, match="cluster_ids must have an integer dtype"):
        seed_grpo_advantage(r, 4, cluster_ids=t(0, 0, 1, 1))
    with pytest.raises(ValueError, match="alpha must be <= 1"):
        seed_grpo_advantage(r, 4, cluster_ids=torch.tensor([0, 0, 1, 1]), alpha=1.5)
    with pytest.raises(ValueError, match="modulation="):
        seed_grpo_advantage(r, 4, cluster_ids=torch.tensor([0, 0, 1, 1]), modulation="focal")
    with pytest.raises(ValueError, match="cluster_ids has shape"):
        seed_grpo_advantage(r, 4, cluster_ids=torch.tensor([0, 0, 1]))


# ----------------------------------------------------------------------------------------------------- GDPO
def test_gdpo_hand_computed_keeps_what_grpo_collapses():
    # two prompts, G = 2; components (correctness, -Brier)
    comp = torch.tensor([[1.0, -0.04], [0.0, -0.64], [1.0, -0.01], [1.0, -0.25]], **f64)
    # per-component z-scores with G = 2 are +-1/sqrt(2) (Bessel std of two values is |a - b| / sqrt 2), 0 if equal:
    # correctness: [+, -], [0, 0]; Brier: [+, -], [+, -]  ->  S = [sqrt2, -sqrt2, 1/sqrt2, -1/sqrt2]
    # batch: mean 0, Bessel std sqrt((2 + 2 + .5 + .5) / 3) = sqrt(5/3)
    s = math.sqrt(2)
    want = t(s, -s, 1 / s, -1 / s) / math.sqrt(5 / 3)
    a = gdpo_advantage(comp.sum(1), 2, components=comp, eps=1e-12)  # eps 0 would make 0/0 in the equal group
    torch.testing.assert_close(a, want, rtol=0, atol=1e-10)
    # GRPO on the summed reward gives both prompts the same +-1/sqrt2: the collapse GDPO is about
    g = grpo_advantage(comp.sum(1), 2, eps=1e-300)
    torch.testing.assert_close(g[:2], g[2:], **EXACT)
    # weights and no batch normalisation: S = 2 * corr_z + 1 * brier_z
    a_w = gdpo_advantage(comp.sum(1), 2, components=comp, weights=[2.0, 1.0], batch_norm=False, eps=1e-12)
    torch.testing.assert_close(a_w, t(3 / s, -3 / s, 1 / s, -1 / s), rtol=0, atol=1e-10)


def test_gdpo_batch_statistics_use_only_kept_rows():
    comp = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [5.0, 3.0], [0.0, -9.0]], **f64)
    keep = torch.tensor([True, True, True, True, False, False])
    a = gdpo_advantage(comp[:, 0], 2, components=comp, keep=keep, eps=1e-12)
    # kept pre-normalisation sums: [1/sqrt2, -1/sqrt2] twice (the all-zero column adds 0) -> mean 0,
    # Bessel std sqrt(4 * .5 / 3); the dropped rows' large values must not enter the statistics
    z = (1 / math.sqrt(2)) / math.sqrt(2 / 3)
    torch.testing.assert_close(a, t(z, -z, z, -z, 0.0, 0.0), rtol=0, atol=1e-10)


def test_gdpo_rows_left_out_unevenly_shift_every_kept_row():
    """docs/papers.md (GDPO, batch statistics): each group's S sums to 0 over its rows, so dropping one row of the
    second group moves the kept rows' mean off 0 and the all-correct group gets -mean/std instead of 0."""
    r = t(1, 1, 1, 1, 1, 0, 0, 0)
    keep = torch.tensor([True, True, True, True, True, False, True, True])
    a = gdpo_advantage(r, 4, components=r[:, None], keep=keep, eps=1e-300)
    # S: group 1 all 0; group 2 [1.5, -0.5, -0.5, -0.5] (mean 1/4, Bessel std 1/2); kept: 0 x4, 1.5, -0.5, -0.5
    kept = [0.0] * 4 + [1.5, -0.5, -0.5]
    mean = sum(kept) / 7
    sd = math.sqrt(sum((v - mean) ** 2 for v in kept) / 6)
    expect = [(v - mean) / sd for v in kept[:5]] + [0.0] + [(v - mean) / sd for v in kept[5:]]
    torch.testing.assert_close(a, t(*expect), rtol=0, atol=1e-12)
    assert round(a[0].item(), 3) == -0.106  # the figure papers.md quotes


@settings(max_examples=50, deadline=None)
@given(binary_groups(), st.integers(-3, 3), st.sampled_from([0.25, 0.5, 2.0, 8.0]))
def test_gdpo_single_component_is_grpo_and_is_affine_invariant(rg, shift, scale):
    # exact binary scales and integer shifts: equal rewards stay exactly equal (no 1e-16 spread that any z-score,
    # GRPO's included, would blow up)
    r, g = rg
    torch.testing.assert_close(gdpo_advantage(r, g, components=r[:, None], batch_norm=False), grpo_advantage(r, g),
                               **EXACT)
    comp = torch.stack([r, torch.roll(r, 1)], dim=1)
    a = gdpo_advantage(r, g, components=comp, eps=1e-9)
    assert torch.isfinite(a).all()
    b = gdpo_advantage(r, g, components=comp * scale + shift, eps=1e-9)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # each component's z-score ignores its units


def test_gdpo_errors():
    r = t(1, 0, 0, 0)
    with pytest.raises(ValueError, match="components is required"):
        gdpo_advantage(r, 2)
    with pytest.raises(ValueError, match="components must have 2 dimension"):
        gdpo_advantage(r, 2, components=r)
    with pytest.raises(ValueError, match="weights must be 2 numbers"):
        gdpo_advantage(r, 2, components=torch.zeros(4, 2, **f64), weights=[1.0])
    with pytest.raises(ValueError, match="components has shape"):
        gdpo_advantage(r, 2, components=torch.zeros(3, 2, **f64))


# ----------------------------------------------------------------------------------------------- unlikeliness
def test_unlikeliness_hand_computed():
    r = t(1, 1, 0, 1)
    s = t(-0.1, -2.0, -0.5, -1.0)  # likelihood order (most likely first): 0, 2, 3, 1 -> G - rank = 3, 0, 2, 1
    # beta .25: factors 1 - .25 * (3, 0, 2, 1) / 4 -> R' = [0.8125, 1, 0, 0.9375]
    # mean 0.6875, deviations [.125, .3125, -.6875, .25], sum of squares 0.6484375, Bessel std sqrt(0.6484375 / 3)
    a = unlikeliness_advantage(r, 4, scores=s, beta=0.25, eps=1e-300)
    torch.testing.assert_close(a, t(0.125, 0.3125, -0.6875, 0.25) / math.sqrt(0.6484375 / 3), **EXACT)
    # the rare correct answer (row 1) now gets the largest advantage
    assert int(a.argmax()) == 1


def test_unlikeliness_ties_by_row_order():
    r = t(1, 1, 1, 0)
    a = unlikeliness_advantage(r, 4, scores=t(-1, -1, -1, -1), beta=0.5, eps=1e-300)
    # equal scores rank by row: factors 1 - .5 * (0, 1, 2, 3) / 4 = [1, .875, .75, .625]; R' = [1, .875, .75, 0]
    rp = t(1.0, 0.875, 0.75, 0.0)
    torch.testing.assert_close(a, (rp - rp.mean()) / rp.std(), **EXACT)


@settings(max_examples=50, deadline=None)
@given(binary_groups(), st.integers(0, 2**31 - 1), st.floats(-5, 5))
def test_unlikeliness_beta_zero_is_grpo_and_depends_only_on_ranks(rg, seed, shift):
    r, g = rg
    s = torch.randn(len(r), generator=torch.Generator().manual_seed(seed), **f64)
    torch.testing.assert_close(unlikeliness_advantage(r, g, scores=s, beta=0.0), grpo_advantage(r, g), **EXACT)
    a = unlikeliness_advantage(r, g, scores=s, beta=0.3)
    torch.testing.assert_close(unlikeliness_advantage(r, g, scores=torch.exp(s) + shift, beta=0.3), a, **EXACT)


def test_unlikeliness_needs_scores():
    with pytest.raises(TypeError, match="required keyword-only argument: 'scores'"):
        unlikeliness_advantage(t(1, 0), 2)
    with pytest.raises(ValueError, match="scores .* are required"):
        unlikeliness_advantage(t(1, 0), 2, scores=None)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        unlikeliness_advantage(t(1, 0), 2, scores=t(0, 0), beta=-0.1)


# ---------------------------------------------------------------------------------------------------- NGRPO
def test_ngrpo_reproduces_the_papers_worked_example():
    # G = 8, one correct: GRPO gives 2.47 / -0.35, NGRPO 1.76 / -0.50 (paper's advantage case study)
    # augmented rewards: 2 ones, 7 zeros; mean 2/9; Bessel var (2 (7/9)^2 + 7 (2/9)^2) / 8 = 126/648
    r = t(1, 0, 0, 0, 0, 0, 0, 0)
    a = ngrpo_advantage(r, 8, eps=1e-300)
    sd = math.sqrt(126 / 648)
    torch.testing.assert_close(a, t(7 / 9, *[-2 / 9] * 7) / sd, **EXACT)
    assert round(float(a[0]), 2) == 1.76 and round(float(a[1]), 2) == -0.50
    g = grpo_advantage(r, 8, eps=1e-300)
    assert round(float(g[0]), 2) == 2.47 and round(float(g[1]), 2) == -0.35


def test_ngrpo_homogeneous_groups():
    # all wrong: augmented [0,0,0,0,1], mean .2, Bessel std sqrt(.8/4) -> every answer -0.2/sqrt(.2) = -1/sqrt5
    # all r_max: 0 exactly (0 / (0 + eps), no NaN with the default eps)
    a = ngrpo_advantage(t(0, 0, 0, 0, 1, 1, 1, 1), 4)
    torch.testing.assert_close(a, t(*[-0.2 / (math.sqrt(0.2) + 1e-6)] * 4, 0, 0, 0, 0), **EXACT)
    assert torch.equal(a[4:], torch.zeros(4, **f64))
    # two virtual samples, r_max 2: augmented [0,0,2,2], mean 1, Bessel std sqrt(4/3)
    a2 = ngrpo_advantage(t(0, 0), 2, n_virtual=2, max_reward=2.0, eps=1e-300)
    torch.testing.assert_close(a2, t(-1, -1) / math.sqrt(4 / 3), **EXACT)


@settings(max_examples=50, deadline=None)
@given(binary_groups())
def test_ngrpo_properties(rg):
    r, g = rg
    a = ngrpo_advantage(r, g)
    assert torch.isfinite(a).all()
    assert (a <= 1e-12).all() or (r.view(-1, g).max(1).values == 1).any()  # positive only where something is right
    wrong_only = (r.view(-1, g) == 0).all(1)
    assert (a.view(-1, g)[wrong_only] < 0).all()  # all-wrong groups are no longer silent
    correct = r.view(-1, g) == 1
    assert (a.view(-1, g)[correct] >= -1e-12).all()


def test_ngrpo_errors():
    with pytest.raises(ValueError, match="n_virtual must be an int >= 1"):
        ngrpo_advantage(t(1, 0), 2, n_virtual=0)
    with pytest.raises(ValueError, match="group_size"):
        ngrpo_advantage(t(1, 0, 1), 2)


# ------------------------------------------------------------------------------------------- uniform calling
def test_every_new_estimator_honours_keep_and_the_dispatcher():
    r = t(1, 0, 0, 1)
    keep = torch.tensor([True, False, True, True])
    extra = {"ace": {"confidence_shift": t(0, 1, 2, 3)}, "seed_grpo": {"cluster_ids": torch.tensor([0, 1, 1, 0])},
             "gdpo": {"components": r[:, None]}, "unlikeliness": {"scores": t(-1, -2, -3, -4)}, "ngrpo": {}}
    for name, kw in extra.items():
        a = compute_advantages(name, r, 2, scores=kw.pop("scores", t(0, 0, 0, 0)), keep=keep, **kw)
        assert a.shape == (4,) and a.dtype == torch.float64 and float(a[1]) == 0.0, name
    with pytest.raises(TypeError, match="'ngrpo'.*unexpected keyword argument 'cluster_ids'"):
        compute_advantages("ngrpo", r, 2, cluster_ids=torch.tensor([0, 0, 0, 0]))
