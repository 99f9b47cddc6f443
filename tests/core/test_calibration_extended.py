"""MCE, adaptive ECE, debiased L2 CE, smooth ECE, E-AURC, PRR: hand values, library oracles, properties, errors.

Oracles: netcal (ECE/MCE, equal-width and equal-mass bins), torchmetrics (MCE, debiased L2), Kumar et al.'s own
``calibration`` package (debiased L2), relplot (smooth ECE; its grid discretisation differs from the exact integral
by up to ~5e-4, so the tight check is against scipy quadrature of the definition), and a loop transcription of
lm-polygraph's prediction-rejection area for PRR.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from capo.core.calibration import aurc, bootstrap_ci, debiased_l2_ce, e_aurc, ece, mce, prr, smooth_ece

F64 = torch.float64
HYP = settings(max_examples=60, deadline=None)


def data(seed: int, n: int, power: float = 1.3):
    """Confidences in (0.01, 0.99) (never on a bin edge or at 1.0, where libraries bin differently), overconfident."""
    rng = np.random.default_rng(seed)
    f = rng.random(n) * 0.98 + 0.01
    return f, (rng.random(n) < f**power).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------------
# MCE and adaptive (equal-mass) ECE
# ---------------------------------------------------------------------------------------------------------------


def test_mce_hand_values():
    # bin [0.1, 0.2): conf (0.1 + 0.15)/2 = 0.125, acc 1/2 -> 0.375; bin [0.9, 1): |1 - 0.9| = 0.1 -> max 0.375
    assert mce([0.1, 0.15, 0.9], [0, 1, 1]) == pytest.approx(0.375, abs=1e-15)
    assert mce([0.7, 0.7, 0.7], [1, 0, 1]) == pytest.approx(0.7 - 2 / 3, abs=1e-15)  # one non-empty bin
    assert mce([1.0, 0.0], [1, 0]) == 0.0  # perfectly calibrated extremes; empty bins do not count


def test_mce_and_ece_match_netcal_and_torchmetrics():
    from netcal.metrics import ECE, MCE
    from torchmetrics.functional.classification import binary_calibration_error

    worst = 0.0
    for seed, n, bins in [(0, 50, 10), (1, 500, 10), (2, 3000, 15), (3, 7, 5)]:
        f, y = data(seed, n)
        for strategy, equal in (("uniform", True), ("quantile", False)):
            worst = max(worst, abs(mce(f, y, bins, strategy) - MCE(bins, equal_intervals=equal).measure(f, y)))
            worst = max(worst, abs(ece(f, y, bins, strategy) - ECE(bins, equal_intervals=equal).measure(f, y)))
        tm = float(binary_calibration_error(torch.from_numpy(f), torch.from_numpy(y), n_bins=bins, norm="max"))
        worst = max(worst, abs(mce(f, y, bins) - tm))
    assert worst < 1e-12


def test_adaptive_ece_is_equal_mass():
    # 8 distinct confidences, 4 quantile bins -> 2 per bin: |(0+1)/2 - (.1+.2)/2| = .35, |1 - .35| = .65,
    # |0 - .55| = .55, |1 - .85| = .15 (pairs (.1,.2),(.3,.4),(.5,.6),(.8,.9)) -> ECE = (.35+.65+.55+.15)/4 = 0.425
    f = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9]
    y = [0, 1, 1, 1, 0, 0, 1, 1]
    assert ece(f, y, n_bins=4, strategy="quantile") == pytest.approx(0.425, abs=1e-12)
    assert mce(f, y, n_bins=4, strategy="quantile") == pytest.approx(0.65, abs=1e-12)



def test_equal_mass_bins_hold_n_over_bins_where_a_quantile_lands_on_a_value():
    """31 distinct confidences, 10 bins: quantile k sits at position 3k exactly, so every bin but the last holds 3
    (the last closed: 4). At linspace's level 0.30000000000000004 the 4th edge landed past q[9] and moved it down: bins
    [3, 3, 4, 2, ...], ECE 0.2923 for 0.2480 (found by an audit, 2026-12-02)."""
    from capo.core.calibration import reliability_curve

    q = np.arange(1, 32) / 32.0
    c = (np.arange(31) % 3 == 0).astype(int)
    assert reliability_curve(q, c, n_bins=10, strategy="quantile").bin_count.tolist() == [3] * 9 + [4]
    idx = np.minimum(np.arange(31) // 3, 9)
    want = sum(abs(c[idx == b].sum() - q[idx == b].sum()) for b in range(10)) / 31
    assert ece(q, c, n_bins=10, strategy="quantile") == pytest.approx(want, abs=1e-15)
    assert debiased_l2_ce(q, c, n_bins=10, strategy="quantile") == 0.0  # every bin's gap under its noise (was 0.0376)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 400), st.sampled_from([2, 3, 5, 7, 10, 15, 20]), st.integers(0, 2**31 - 1))
def test_equal_mass_edges_are_the_exact_quantiles(n, bins, seed):
    """Edge k is the k / bins quantile with linear interpolation, computed in exact rationals: the sorted value at
    position k (n - 1) / bins where that is whole, else the interpolation between its neighbours (to 1 ulp)."""
    from fractions import Fraction

    from capo.core.calibration import reliability_curve

    q = np.random.default_rng(seed).integers(0, 64, n) / 64.0  # ties included
    edges = reliability_curve(q, np.zeros(n, int), n_bins=bins, strategy="quantile").bin_edges.tolist()
    v = sorted(q.tolist())
    for k, got in enumerate(edges):
        pos = Fraction(k * (n - 1), bins)
        lo = int(pos)
        want = Fraction(v[lo]) + (pos - lo) * (Fraction(v[min(lo + 1, n - 1)]) - Fraction(v[lo]))
        assert got == float(want) if pos.denominator == 1 else abs(got - float(want)) <= 1e-15, (k, got, want)

# ---------------------------------------------------------------------------------------------------------------
# debiased L2 calibration error
# ---------------------------------------------------------------------------------------------------------------


def test_debiased_l2_hand_values():
    # one bin [0.6, 0.7) with 4 responses: conf 0.65, acc 3/4: plug-in 0.1^2 = 0.01, variance term
    # (3/4)(1/4)/3 = 0.0625 -> 0.01 - 0.0625 < 0 -> CE = 0
    assert debiased_l2_ce([0.65] * 4, [1, 1, 1, 0]) == 0.0
    # 20 responses at 0.15, all correct: plug-in 0.85^2 = 0.7225, variance 0 -> CE = 0.85
    assert debiased_l2_ce([0.15] * 20, [1] * 20) == pytest.approx(0.85, abs=1e-12)
    # bins [0.1,0.2): 10 at 0.15 with 5 correct: (0.5-0.15)^2 - 0.25/9 = 0.1225 - 0.0277778 = 0.0947222;
    # [0.9, 1): 10 at 0.95, all correct: 0.05^2 = 0.0025; a lone response at 0.55 contributes 0 (n_b = 1)
    f = [0.15] * 10 + [0.95] * 10 + [0.55]
    y = [1] * 5 + [0] * 5 + [1] * 10 + [0]
    want = math.sqrt(10 / 21 * (0.1225 - 0.25 / 9) + 10 / 21 * 0.0025)
    assert debiased_l2_ce(f, y) == pytest.approx(want, abs=1e-12)


def test_debiased_l2_matches_kumar_package_and_torchmetrics():
    from calibration import bin as kumar_bin
    from calibration import unbiased_l2_ce
    from torchmetrics.functional.classification.calibration_error import _ce_compute

    worst_k = worst_tm = 0.0
    for seed, n, bins in [(0, 40, 10), (1, 500, 10), (2, 3000, 15), (4, 200, 4)]:
        f, y = data(seed, n)
        # the package bins by upper edges, (e_{k-1}, e_k]; continuous data never sits on an edge
        uniform_edges = [k / bins for k in range(1, bins)] + [1.0]
        worst_k = max(worst_k, abs(debiased_l2_ce(f, y, bins) - unbiased_l2_ce(kumar_bin(list(zip(f, y)), uniform_edges))))
        q_edges = list(np.quantile(f, np.linspace(0, 1, bins + 1))[1:-1]) + [1.0]
        got = debiased_l2_ce(f, y, bins, "quantile")
        worst_k = max(worst_k, abs(got - unbiased_l2_ce(kumar_bin(list(zip(f, y)), q_edges))))
        if n >= 200:  # every bin holds >= 2 responses, where torchmetrics' debias agrees
            ft, yt = torch.from_numpy(f), torch.from_numpy(y).to(F64)
            tm = float(_ce_compute(ft, yt, torch.linspace(0, 1, bins + 1, dtype=F64), norm="l2", debias=True))
            worst_tm = max(worst_tm, abs(debiased_l2_ce(f, y, bins) - tm))
    assert worst_k < 1e-12 and worst_tm < 1e-12


# ---------------------------------------------------------------------------------------------------------------
# smooth ECE
# ---------------------------------------------------------------------------------------------------------------


def exact_smece(f: np.ndarray, y: np.ndarray, sigma: float) -> float:
    """The definition, integrated by adaptive quadrature: int_0^1 |mean_i K(t, f_i)(y_i - f_i)| dt, K reflected."""
    r = y - f

    def kern(s):
        images = sum(np.exp(-0.5 * ((s - f - 2 * k) / sigma) ** 2) + np.exp(-0.5 * ((s + f - 2 * k) / sigma) ** 2)
                     for k in range(-8, 9))
        return images / (sigma * math.sqrt(2 * math.pi))

    return integrate.quad(lambda s: abs(np.mean(kern(s) * r)), 0, 1, limit=400, epsabs=1e-12)[0]


def test_smooth_ece_matches_the_integral():
    worst = 0.0
    for seed, n in [(0, 7), (1, 60), (2, 300)]:
        f, y = data(seed, n)
        for sigma in (0.01, 0.05, 0.2, 1.0):
            worst = max(worst, abs(smooth_ece(f, y, sigma=sigma) - exact_smece(f, y.astype(float), sigma)))
    assert worst < 1e-5  # measured 4.8e-6 (grid h <= sigma/40, linear splitting of each confidence)


def test_smooth_ece_with_confidences_at_both_ends():
    """q = 0 and q = 1 are the grid's end nodes (all their weight on that node), and the reflected kernel reaches
    across the whole interval for a large sigma: within the documented ~5e-6 of the integral, here where the
    residuals change sign close to each end (+1 at 0, -0.1 at 0.1; -1 at 1, +0.1 at 0.9)."""
    f, y = np.array([0.0, 0.1, 1.0, 0.9]), np.array([1.0, 0.0, 0.0, 1.0])
    for sigma in (0.02, 0.05, 1.0):  # measured 1.4e-6, 8e-7, 3e-9; the kernel cut one node short there: 6e-5
        assert abs(smooth_ece(f, y, sigma=sigma) - exact_smece(f, y, sigma)) < 5e-6


def test_smooth_ece_automatic_bandwidth_is_the_fixed_point():
    """Without sigma: the sigma* with smECE_sigma* = sigma*, found by bisection on [0.001, 1] to 1e-5 (measured
    fixed-point gaps <= 1.5e-6; stopping at the first midpoint or returning twice or 2/3 of it: >= 4e-3)."""
    for seed, n in [(0, 7), (1, 60), (2, 300)]:
        f, y = data(seed, n)
        s = smooth_ece(f, y)
        assert abs(smooth_ece(f, y, sigma=s) - s) < 1e-5


def test_smooth_ece_matches_relplot():
    import relplot

    worst_fixed = worst_auto = 0.0
    for seed, n in [(0, 50), (1, 1000), (2, 20000)]:
        f, y = data(seed, n, power=1.5)
        for sigma in (0.02, 0.05, 0.1):
            worst_fixed = max(worst_fixed, abs(smooth_ece(f, y, sigma=sigma) - relplot.smECE_sigma(f, y.astype(float), sigma)))
        worst_auto = max(worst_auto, abs(smooth_ece(f, y) - relplot.smECE(f, y.astype(float))))
    assert worst_fixed < 1e-3 and worst_auto < 1e-3  # measured 4.5e-4 and 3.0e-4: relplot's 200-point Riemann sum


def test_smooth_ece_hand_values():
    # residuals all of one sign: int |mean_i K r_i| = |mean r| int K = |mean r| for every sigma, so the fixed point
    # is sigma* = |mean r|: here r = (1 - 0.3, 1 - 0.6, 1 - 0.9) -> mean 0.4
    for sigma in (0.01, 0.1, 0.7):
        assert smooth_ece([0.3, 0.6, 0.9], [1, 1, 1], sigma=sigma) == pytest.approx(0.4, abs=1e-9)
    assert smooth_ece([0.3, 0.6, 0.9], [1, 1, 1]) == pytest.approx(0.4, abs=2e-5)  # bisection tolerance 1e-5
    # perfectly calibrated at each value: residuals cancel at every t
    assert smooth_ece([0.5, 0.5, 0.25, 0.25, 0.25, 0.25], [1, 0, 1, 0, 0, 0]) == pytest.approx(0.0, abs=1e-12)


@HYP
@given(st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=1, max_size=30))
def test_smooth_ece_permutation_invariant_and_bounded(pairs):
    f = torch.tensor([a / 20 for a, _ in pairs], dtype=F64)
    y = torch.tensor([b for _, b in pairs])
    v = smooth_ece(f, y)
    perm = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(len(pairs)))
    assert smooth_ece(f[perm], y[perm]) == pytest.approx(v, abs=1e-12)
    assert 0.0 <= v <= float((y.to(F64) - f).abs().mean()) + 1e-9  # |int K r| <= mean |r|


# ---------------------------------------------------------------------------------------------------------------
# E-AURC and PRR
# ---------------------------------------------------------------------------------------------------------------


def test_e_aurc_and_prr_hand_values():
    # reversed ranking of 2 right, 2 wrong: risks 1, 1, 2/3, 2/4 -> AURC = 19/24; perfect: 0, 0, 1/3, 2/4 -> 5/24;
    # random = 1/2. E-AURC = 14/24, PRR = (12/24 - 19/24) / (12/24 - 5/24) = -1
    conf, corr = [0.2, 0.3, 0.8, 0.9], [1, 1, 0, 0]
    assert aurc(conf, corr) == pytest.approx(19 / 24, abs=1e-15)
    assert e_aurc(conf, corr) == pytest.approx(14 / 24, abs=1e-15)
    assert prr(conf, corr) == pytest.approx(-1.0, abs=1e-15)
    assert e_aurc(conf, [0, 0, 1, 1]) == pytest.approx(0.0, abs=1e-15)
    assert prr(conf, [0, 0, 1, 1]) == pytest.approx(1.0, abs=1e-15)
    # one error in the middle of 3: risks 0, 1/2, 1/3 -> 5/18; perfect 0, 0, 1/3 -> 2/18; random 1/3 = 6/18
    assert prr([3.0, 2.0, 1.0], [1, 0, 1]) == pytest.approx((6 / 18 - 5 / 18) / (6 / 18 - 2 / 18), abs=1e-15)
    assert prr([0.5] * 4, [1, 0, 1, 0]) == pytest.approx(0.0, abs=1e-15)  # all tied: exactly random
    assert math.isnan(prr([0.1, 0.2], [1, 1])) and math.isnan(prr([0.1, 0.2], [0, 0]))
    assert e_aurc([0.1, 0.2], [1, 1]) == 0.0


def pra(estimator: np.ndarray, target: np.ndarray) -> float:
    """lm-polygraph's prediction-rejection area, transcribed: sort by uncertainty ascending, mean of running means."""
    order = np.argsort(estimator, kind="stable")
    srt = target[order]
    return float(np.mean(np.cumsum(srt) / np.arange(1, len(srt) + 1)))


def polygraph_prr(conf: np.ndarray, correct: np.ndarray) -> float:
    target = correct.astype(float)
    random = np.mean([pra(np.array(p, dtype=float), target) for p in itertools.permutations(range(len(conf)))])
    oracle = pra(-target, target)
    return (pra(-conf, target) - random) / (oracle - random)


def test_prr_matches_polygraph_procedure():
    rng = np.random.default_rng(5)
    worst = 0.0
    for n in (2, 4, 6, 7):
        for _ in range(20):
            conf = rng.permutation(n).astype(float)  # distinct: the procedure's order is then unambiguous
            corr = rng.random(n) < 0.5
            corr[0], corr[1] = True, False
            worst = max(worst, abs(prr(conf, corr) - polygraph_prr(conf, corr)))
    assert worst < 1e-12


def test_e_aurc_close_to_the_continuous_formula_for_large_n():
    f, y = data(0, 20000)
    r = 1 - y.mean()
    continuous_opt = r + (1 - r) * math.log(1 - r)
    assert abs((aurc(f, y) - e_aurc(f, y)) - continuous_opt) < 1e-3


@HYP
@given(st.lists(st.tuples(st.integers(-10, 10), st.booleans()), min_size=2, max_size=30).filter(
    lambda xs: len({b for _, b in xs}) == 2))
def test_e_aurc_and_prr_invariant_under_increasing_transforms(pairs):
    s = torch.tensor([float(a) for a, _ in pairs], dtype=F64)
    c = torch.tensor([b for _, b in pairs])
    for fn in (e_aurc, prr):
        base = fn(s, c)
        for g in (lambda x: torch.exp(x / 4), lambda x: x**3 + 2):
            assert fn(g(s), c) == pytest.approx(base, abs=1e-12)
    assert -1e-12 <= e_aurc(s, c) and prr(s, c) <= 1 + 1e-12


# ---------------------------------------------------------------------------------------------------------------
# bootstrap and errors
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", [mce, debiased_l2_ce, smooth_ece, e_aurc, prr,
                                    lambda q, c: ece(q, c, strategy="quantile")])
def test_every_new_metric_goes_through_bootstrap(metric):
    f, y = data(7, 240)
    g = np.repeat(np.arange(60), 4)
    lo, hi = bootstrap_ci(metric, f, y, group_ids=g, n_boot=40, seed=1)
    point = metric(f, y)
    assert math.isfinite(lo) and lo <= point <= hi and hi > lo


@pytest.mark.parametrize("metric", [mce, debiased_l2_ce, smooth_ece])
def test_probability_metrics_reject_bad_inputs(metric):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        metric([0.5, 1.5], [1, 0])
    with pytest.raises(ValueError, match="NaN"):
        metric([0.5, math.nan], [1, 0])
    with pytest.raises(ValueError, match="empty"):
        metric([], [])
    with pytest.raises(ValueError, match="0/1"):
        metric([0.5, 0.5], [1, 2])


def test_argument_errors():
    with pytest.raises(ValueError, match="n_bins"):
        mce([0.5], [1], n_bins=0)
    with pytest.raises(ValueError, match="strategy"):
        debiased_l2_ce([0.5], [1], strategy="equal")
    with pytest.raises(ValueError, match="sigma"):
        smooth_ece([0.5], [1], sigma=0)
    for fn in (e_aurc, prr):
        with pytest.raises(ValueError, match="NaN"):
            fn([0.5, math.nan], [1, 0])
        with pytest.raises(ValueError, match="must match"):
            fn([0.5, 0.2], [1])
