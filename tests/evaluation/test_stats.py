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
