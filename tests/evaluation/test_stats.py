"""Intervals from the libraries: proportion intervals are statsmodels' (ordered and clipped), the core's cluster
bootstrap agrees with scipy.stats.bootstrap."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from capo.core import calibration as cal
from capo.evaluation.stats import proportion_interval


def test_wilson_hand_computed():
    # Wilson 95%, k = 3, n = 10: centre (0.3 + z^2/20) / (1 + z^2/10), z = 1.959963984540054
    z = 1.959963984540054
    den = 1 + z * z / 10
    mid = (0.3 + z * z / 20) / den
    half = z * math.sqrt(0.3 * 0.7 / 10 + z * z / 400) / den
    assert proportion_interval(3, 10) == pytest.approx((mid - half, mid + half), abs=1e-12)
    # Clopper-Pearson: beta quantiles
    assert proportion_interval(3, 10, method="beta") == pytest.approx(
        (sps.beta.ppf(0.025, 3, 8), sps.beta.ppf(0.975, 4, 7)), abs=1e-12)


@given(n=st.integers(1, 5000), frac=st.floats(0, 1), method=st.sampled_from(["wilson", "beta"]))
@settings(max_examples=300, deadline=None)
def test_interval_is_ordered_and_contains_the_proportion(n, frac, method):
    k = round(frac * n)
    # the bin accuracy as plots see it: a float that is k/n up to rounding, times n
    acc = k / n
    lo, hi = proportion_interval(acc * n, n, method=method)
    assert 0.0 <= lo <= acc <= hi <= 1.0
    assert acc - lo >= 0 and hi - acc >= 0  # a matplotlib error bar is never negative


def test_edge_proportions_all_right_all_wrong():
    assert proportion_interval(0, 7)[0] == 0.0 and proportion_interval(7, 7)[1] == 1.0
    assert proportion_interval(7 * (1 - 1e-16), 7)[1] == 1.0
    with pytest.raises(ValueError, match="0 <= k <= n"):
        proportion_interval(8, 7)
    with pytest.raises(ValueError, match="method"):
        proportion_interval(1, 7, method="wald")


def test_core_cluster_bootstrap_agrees_with_scipy():
    """The core's percentile cluster bootstrap (torch only) vs scipy.stats.bootstrap resampling the same prompts:
    different random draws, so they agree up to Monte Carlo error. The bootstrap distribution of a mean over 60 prompts
    has sd ~0.03 here; the Monte Carlo sd of its 2.5% quantile with 4000 replicates is ~0.0013
    (sqrt(0.025 * 0.975 / 4000) / density), ~0.002 for the difference of two such estimates: 0.01 is ~5 of them."""
    gen = np.random.default_rng(0)
    n_prompts, k = 60, 4
    p_prompt = gen.uniform(0.1, 0.9, n_prompts)
    correct = (gen.uniform(size=(n_prompts, k)) < p_prompt[:, None]).astype(float)
    g = np.repeat(np.arange(n_prompts), k)
    c = correct.reshape(-1)
    lo, hi = cal.bootstrap_ci(lambda cc: float(cc.mean()), torch.tensor(c), group_ids=torch.tensor(g), n_boot=4000,
                              seed=1)
    per_prompt = correct.mean(axis=1)  # equal group sizes: the mean of resampled rows = mean of prompt means
    ref = sps.bootstrap((per_prompt,), np.mean, n_resamples=4000, method="percentile", random_state=2)
    assert lo == pytest.approx(ref.confidence_interval.low, abs=0.01)
    assert hi == pytest.approx(ref.confidence_interval.high, abs=0.01)


def test_seed_paired_interval_hand_computed():
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(0.975, 2) = 4.302652729911275 -> 0.2 +- 0.248414
    from capo.evaluation.stats import seed_paired_interval

    r = seed_paired_interval([0.1, 0.2, 0.3])
    half = 4.302652729911275 * 0.1 / 3 ** 0.5
    assert (r["mean"], r["sd"], r["n"]) == (pytest.approx(0.2, abs=1e-12), pytest.approx(0.1, abs=1e-12), 3)
    # 0.1, 0.2, 0.3 are not exact in binary: the sample sd is 0.1 to ~1e-16 relative, the half-width to ~1e-11
    assert (r["low"], r["high"]) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-10)
    assert r["p"] == pytest.approx(sps.ttest_1samp([0.1, 0.2, 0.3], 0.0).pvalue, abs=1e-12)
    assert seed_paired_interval([0.1]) is None and seed_paired_interval([0.1, float("nan")]) is None


def test_equal_seed_differences_have_sd_zero_exactly():
    from capo.evaluation.stats import seed_paired_interval

    r = seed_paired_interval([0.5 - 0.3] * 3)  # three equal floats whose mean rounds an ulp away from them
    assert (r["sd"], r["low"], r["high"], r["mean"]) == (0.0, 0.5 - 0.3, 0.5 - 0.3, 0.5 - 0.3)


def test_two_sample_interval_hand_computed_and_against_statsmodels():
    # a = 0.70, 0.75, 0.65 (mean 0.70, variance 0.0025); b = 0.80, 0.82, 0.78, 0.80 (mean 0.80, variance 0.0008/3):
    # se = sqrt(0.0025/3 + 0.0008/12) = 0.03, Welch df = 0.0009^2 / ((0.0025/3)^2/2 + (0.0008/12)^2/3) = 2.322889
    from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

    from capo.evaluation.stats import two_sample_interval

    a, b = [0.70, 0.75, 0.65], [0.80, 0.82, 0.78, 0.80]
    r = two_sample_interval(a, b)
    assert (r["mean"], r["df"], r["n_a"], r["n_b"]) == (pytest.approx(-0.1, abs=1e-12),
                                                        pytest.approx(2.322889007, abs=1e-8), 3, 4)
    half = float(sps.t.ppf(0.975, r["df"])) * 0.03
    assert (r["low"], r["high"]) == pytest.approx((-0.1 - half, -0.1 + half), abs=1e-10)
    cm = CompareMeans(DescrStatsW(np.array(a)), DescrStatsW(np.array(b)))
    assert (r["low"], r["high"]) == pytest.approx(cm.tconfint_diff(usevar="unequal"), abs=1e-10)
    assert r["p"] == pytest.approx(cm.ttest_ind(usevar="unequal")[1], abs=1e-10)
    assert two_sample_interval(a, [0.8]) is None and two_sample_interval([0.5, 0.5], [0.3, 0.3]) is None


def test_comparison_pairs_runs_by_training_seed():
    """Comparison.seed_diff pairs runs by their -seedN (not by position) and subtracts a one-run reference from
    every seed."""
    from types import SimpleNamespace as NS

    from capo.evaluation.compare import Comparison, Model

    def run(name, auc):
        return NS(name=name, metrics={"auc_mean": auc})

    capo = Model("capo", runs=[run("capo-seed2", 0.73), run("capo-seed0", 0.70), run("capo-seed1", 0.76)])
    grpo = Model("grpo", runs=[run("grpo-seed0", 0.60), run("grpo-seed1", 0.56), run("grpo-seed2", 0.43)])
    base = Model("base", runs=[run("base", 0.50)])
    cmp = Comparison([capo, grpo, base], "grpo", 10, 0, {})
    d = cmp.seed_diff("capo", "grpo", "auc_mean")  # per seed: 0.10, 0.20, 0.30
    assert d["n"] == 3 and d["mean"] == pytest.approx(0.2) and d["sd"] == pytest.approx(0.1)
    b = cmp.seed_diff("capo", "base", "auc_mean")  # 0.20, 0.26, 0.23
    assert b["mean"] == pytest.approx((0.20 + 0.26 + 0.23) / 3)
    r = cmp.seed_diff("base", "grpo", "auc_mean")  # the base stands for every seed on either side: -0.10, -0.06, 0.07
    assert r["n"] == 3 and r["mean"] == pytest.approx(0.50 - (0.60 + 0.56 + 0.43) / 3)
    cmp.models[1] = Model("grpo", runs=grpo.runs[:2])  # seeds 0 and 1 against capo's 0-2: no interval beside a mean
    assert cmp.seed_diff("capo", "grpo", "auc_mean") is None  # over all of capo's seeds (found by an audit)
    assert cmp.seed_diff("capo", "capo", "auc_mean")["n"] == 3


def test_one_resampling_scheme_same_draws_as_before():
    """bootstrap_draws is the one resampling scheme (core bootstrap_ci and the model comparison): its [n_boot, G]
    draw equals n_boot sequential [G] draws from the same generator, the scheme both used before, so no interval
    moved when they were made one."""
    gen = torch.Generator().manual_seed(7)
    before = torch.stack([torch.randint(13, (13,), generator=gen) for _ in range(50)])
    assert torch.equal(cal.bootstrap_draws(13, 50, 7), before)
    v = torch.tensor([3.0, 1.0, 2.0, float("nan"), 4.0], dtype=torch.float64)
    lo, hi = cal.percentile_interval(v, 0.5)  # quartiles of 1, 2, 3, 4 (linear): 1.75, 3.25
    assert (lo, hi) == pytest.approx((1.75, 3.25), abs=1e-12)


# ---------------------------------------------------------------- edges found by mutation testing
def test_wilson_at_another_alpha_hand_computed():
    # 90% Wilson, k = 3, n = 10: z = Phi^-1(0.95) = 1.6448536269514722 (alpha reaches statsmodels)
    z = 1.6448536269514722
    den = 1 + z * z / 10
    mid, half = (0.3 + z * z / 20) / den, z * math.sqrt(0.3 * 0.7 / 10 + z * z / 400) / den
    assert proportion_interval(3, 10, alpha=0.1) == pytest.approx((mid - half, mid + half), abs=1e-12)


def test_k_at_the_rounding_tolerance_is_accepted():
    assert proportion_interval(1 + 1e-9, 1) == (pytest.approx(proportion_interval(1, 1)[0], abs=0), 1.0)


@pytest.mark.parametrize("raw, want", [((math.nan, math.nan), (0.0, 1.0)), ((-0.1, 1.2), (0.0, 1.0)),
                                       ((0.35, 0.2), (0.3, 0.3))])
def test_library_bounds_are_repaired(monkeypatch, raw, want):
    # older statsmodels returned NaN at k = 0 / k = n, and a bound can fall an ulp outside [0, 1] or on the wrong side
    # of p: the interval is repaired to 0 <= low <= p <= high <= 1 (p = 3/10 here)
    import statsmodels.stats.proportion as smp

    monkeypatch.setattr(smp, "proportion_confint", lambda *a, **k: raw)
    assert proportion_interval(3, 10) == pytest.approx(want, abs=1e-15)


def test_seed_paired_interval_two_seeds_and_zero_spread_p_values():
    from capo.evaluation.stats import seed_paired_interval

    # two seeds are enough: differences 0.1, 0.3 -> mean 0.2, sd sqrt(0.02), t(0.975, 1) = 12.706204736174707
    r = seed_paired_interval([0.1, 0.3])
    half = 12.706204736174707 * math.sqrt(0.02) / math.sqrt(2)
    assert r["n"] == 2 and (r["low"], r["high"]) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-10)
    # equal differences: no t-test exists; p = 0 when they are not 0 (a sure difference), 1 when they are all 0
    r = seed_paired_interval([0.25, 0.25, 0.25])
    assert (r["mean"], r["sd"], r["p"]) == (0.25, 0.0, 0.0)
    r = seed_paired_interval([0.0, 0.0])
    assert (r["mean"], r["sd"], r["p"]) == (0.0, 0.0, 1.0)


def test_two_sample_interval_edges():
    from capo.evaluation.stats import two_sample_interval

    # a constant sample is fine when the other varies: Welch df = n - 1 of the varying one, se from it alone
    for a, b in [([0.1, 0.2], [0.5, 0.5]), ([0.5, 0.5, 0.5], [0.1, 0.2])]:
        r = two_sample_interval(a, b)
        varying = a if len(set(a)) > 1 else b
        n = len(varying)
        m = sum(varying) / n
        se = math.sqrt(sum((x - m) ** 2 for x in varying) / (n - 1) / n)
        diff = sum(a) / len(a) - sum(b) / len(b)
        half = float(sps.t.ppf(0.975, n - 1)) * se
        assert r["df"] == pytest.approx(n - 1, abs=1e-9)
        assert (r["mean"], r["low"], r["high"]) == pytest.approx((diff, diff - half, diff + half), abs=1e-9)
    # None and non-finite values are dropped before counting
    r = two_sample_interval([0.1, None, 0.2, math.nan], [0.5, math.inf, 0.5, 0.6])
    assert (r["n_a"], r["n_b"]) == (2, 3)
    assert two_sample_interval([0.1, None], [0.5, 0.6]) is None and two_sample_interval([0.1, 0.2], [None, 0.6]) is None


def test_paired_t_power_is_statsmodels_where_finite_and_the_integral_where_not():
    """Where statsmodels' power is finite the chi-square integral gives the same number (checked on a grid); at
    effect sizes where scipy's noncentral t gives NaN it still gives one: 6 sd with 2 seeds is 0.4944 (a t with 1 df
    needs |t| > 12.71 and the noncentrality is 8.49); and power rises with n."""
    import warnings

    from statsmodels.stats.power import TTestPower

    from capo.evaluation import stats as st

    compared = 0
    for es in (0.05, 0.1, 0.3, 1.0, 2.0, 3.0, 4.5, 6.0):
        for n in (2, 3, 5, 20, 100, 200, 1000, 10_000):
            with warnings.catch_warnings(record=True):
                want = float(TTestPower().power(effect_size=es, nobs=n, alpha=0.05))
            got = st.paired_t_power(es, n)
            assert math.isfinite(got) and 0 < got <= 1 + 1e-9, (es, n)
            if math.isfinite(want):
                compared += 1
                assert got == want and st.power_by_integral(es, n) == pytest.approx(want, abs=1e-7), (es, n)
    assert compared >= 20
    assert math.isnan(float(TTestPower().power(effect_size=6.0, nobs=2, alpha=0.05)))  # the gap this fills
    assert st.paired_t_power(6.0, 2) == pytest.approx(0.4944, abs=5e-4)
    assert st.paired_t_power(6.0, 2) < st.paired_t_power(6.0, 3) < 1
    # large samples where statsmodels is NaN: the integral over [0, inf) missed the chi-square's narrow peak (4e-11)
    for es, n in ((0.5, 300), (0.3, 1000), (0.05, 100_000)):
        assert st.paired_t_power(es, n) == pytest.approx(1.0, abs=1e-9), (es, n)


@pytest.mark.parametrize("effect, sd, want", [
    (0.03, 0.1, 90),  # 89 seeds: power 0.7993, 90: 0.8038 (tests/test_sweep.py)
    (0.05, 0.0073079591032949465, 3),  # the solver said 2.000005; 2 seeds have power 0.55
    (0.05, 0.05 / 6.0, 3),  # the solver gives NaN (effect 6 sd), which was read as "2 suffice": 2 give 0.49
    (0.05, 0.05 / 12.0, 2),  # 2 seeds do suffice at 12 sd
    (0.02, 0.02, 10),  # 1 sd: 10 seeds have power 0.803, 9 fewer
])
def test_seeds_for_power_is_the_fewest_seeds_with_the_power(effect, sd, want):
    from capo.evaluation.stats import paired_t_power, seeds_for_power

    n = seeds_for_power(effect, sd)
    assert n == want
    assert paired_t_power(effect / sd, n) >= 0.8 and (n == 2 or paired_t_power(effect / sd, n - 1) < 0.8)


def test_more_seeds_than_the_search_takes_are_said_so_not_read_as_two(tmp_path):
    """An effect of 0.0036 sd needs ~600,000 seeds: seeds_for_power says None (above SEEDS_MOST) at once, and the
    summary table prints "> 100000", not the "<= 2" of an sd of 0 (it printed "<= 2" after walking seed by seed)."""
    from capo.evaluation.stats import SEEDS_MOST, paired_t_power, seeds_for_power
    from capo.sweep.analysis import seed_paired
    from capo.sweep.tables import _n

    assert seeds_for_power(0.002, 0.55) is None and paired_t_power(0.002 / 0.55, SEEDS_MOST) < 0.8
    assert seeds_for_power(0.002, 0.55, most=10**7) == pytest.approx(593_700, rel=0.01)
    d = seed_paired([0.5, -0.5, 0.6, -0.61], 0.002)
    assert d["seeds_needed"] is None and _n(d) == f"> {SEEDS_MOST}"
    assert _n(seed_paired([0.1, 0.1, 0.1], 0.002)) == "<= 2"  # sd 0


def test_seeds_for_power_refuses_an_sd_of_zero():
    from capo.evaluation.stats import seeds_for_power

    with pytest.raises(ValueError, match="sd > 0"):
        seeds_for_power(0.05, 0.0)
