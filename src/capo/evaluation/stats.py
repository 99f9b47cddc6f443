"""Intervals the evaluation layer draws and reports, from the libraries that maintain them.

- Proportions (a reliability bin's accuracy, an accuracy): :func:`proportion_interval`, statsmodels'
  ``proportion_confint`` (Wilson score by default, Clopper-Pearson ``"beta"`` on request), then put in order and
  clipped so that ``0 <= low <= p <= high <= 1`` holds exactly: the score formulas can put a bound a rounding error on
  the wrong side of ``p`` at k = 0 or k = n, and a plot's error bar ``p - low`` must never be negative.
- Intervals over training seeds (the unit when methods are compared): :func:`seed_paired_interval`, a t-interval
  (scipy) of the per-seed differences, same seeds for both models; :func:`two_sample_interval`, Welch's t-interval
  (scipy) of a difference of two independent samples' means (a method's seeds against repeated evaluation draws of
  one fixed model, e.g. the initial one).
- How many seeds a paired comparison needs: :func:`seeds_for_power`, the smallest n whose two-sided paired t-test
  has the power asked for (:func:`paired_t_power`: statsmodels' ``TTestPower``, checked where it fails).
- Bootstrap intervals over prompts come from :func:`capo.core.calibration.bootstrap_ci` (the core stays torch-only;
  tests check it against ``scipy.stats.bootstrap``); ``capo eval``'s from :class:`capo.evaluation.bootstrap.
  QuestionBootstrap`, the same draws and percentile rule computed from per-question sums (tested against it).
"""

from __future__ import annotations

import math

PROPORTION_METHODS = ("wilson", "beta")  # statsmodels names: Wilson score, Clopper-Pearson ("beta")


def proportion_interval(k: float, n: int, *, alpha: float = 0.05, method: str = "wilson") -> tuple[float, float]:
    """(low, high) of a 1 - alpha interval for the proportion k/n, with 0 <= low <= k/n <= high <= 1.

    ``k`` may be a float that is an integer up to rounding (accuracy * count); n >= 1."""
    from statsmodels.stats.proportion import proportion_confint

    if method not in PROPORTION_METHODS:
        raise ValueError(f"method must be one of {PROPORTION_METHODS}, got {method!r}")
    if not n >= 1 or not 0 <= k <= n * (1 + 1e-9):
        raise ValueError(f"need n >= 1 and 0 <= k <= n, got k={k}, n={n}")
    k = min(float(round(k)), float(n))
    lo, hi = proportion_confint(k, n, alpha=alpha, method=method)
    p = k / n
    lo = 0.0 if math.isnan(lo) else min(max(float(lo), 0.0), p)
    hi = 1.0 if math.isnan(hi) else max(min(float(hi), 1.0), p)
    return lo, hi


def usable(x) -> bool:
    """A number a seed statistic can use: not None, NaN or inf."""
    return x is not None and math.isfinite(float(x))


def finite_values(values) -> list[float]:
    """The finite numbers of ``values`` as floats, in order: None, NaN and inf left out (a measure a seed or an
    evaluation draw could not compute counts in no seed statistic; :func:`usable`)."""
    return [float(x) for x in values if usable(x)]


def seed_paired_interval(diffs, *, alpha: float = 0.05) -> dict | None:
    """Per-training-seed differences (model - reference, the same seeds) -> {"mean", "sd", "low", "high", "p", "n"}:
    the mean, its 1 - alpha t-interval with n - 1 degrees of freedom, and the two-sided one-sample t-test p-value.
    None for fewer than 2 finite differences."""
    from scipy import stats

    d = finite_values(diffs)
    n = len(d)
    if n < 2:
        return None
    mean = sum(d) / n
    # equal differences have sd 0 exactly (their float mean can differ from them by an ulp, and a t-test would divide
    # by that rounding error)
    sd = 0.0 if len(set(d)) == 1 else math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    mean = d[0] if sd == 0.0 else mean
    half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if sd > 0 else (0.0 if mean != 0 else 1.0)
    return {"mean": mean, "sd": sd, "low": mean - half, "high": mean + half, "p": p, "n": n}


def two_sample_interval(a, b, *, alpha: float = 0.05) -> dict | None:
    """Two independent samples -> {"mean", "low", "high", "p", "df", "n_a", "n_b"}: mean(a) - mean(b), its 1 - alpha
    Welch t-interval (unequal variances, Welch-Satterthwaite degrees of freedom) and the two-sided Welch t-test
    p-value, from ``scipy.stats.ttest_ind(equal_var=False)``. None when either sample has fewer than 2 finite values or
    both have zero variance (no interval exists)."""
    from scipy import stats

    xa, xb = finite_values(a), finite_values(b)
    if len(xa) < 2 or len(xb) < 2 or (len(set(xa)) == 1 and len(set(xb)) == 1):
        return None
    r = stats.ttest_ind(xa, xb, equal_var=False)
    if not math.isfinite(float(r.statistic)):
        return None
    ci = r.confidence_interval(confidence_level=1 - alpha)
    return {"mean": sum(xa) / len(xa) - sum(xb) / len(xb), "low": float(ci.low), "high": float(ci.high),
            "p": float(r.pvalue), "df": float(r.df), "n_a": len(xa), "n_b": len(xb)}


def paired_t_power(effect_size: float, n: int, *, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample (paired) t-test at level ``alpha`` with ``n`` differences whose mean is
    ``effect_size`` standard deviations from 0: P(|T| > t_crit) with T noncentral t (n - 1 df, noncentrality
    ``effect_size * sqrt(n)``). statsmodels' ``TTestPower.power``; where that is not finite (scipy's noncentral t gives
    NaN for large noncentralities: effect sizes above ~4, i.e. an sd a quarter of the effect or less) the same
    probability by integrating the normal tail over the chi-square of the sd (scipy ``quad``)."""
    from statsmodels.stats.power import TTestPower

    p = float(TTestPower().power(effect_size=effect_size, nobs=n, alpha=alpha))
    return p if math.isfinite(p) else power_by_integral(effect_size, n, alpha=alpha)


def power_by_integral(effect_size: float, n: int, *, alpha: float = 0.05) -> float:
    """:func:`paired_t_power` computed as E_V[P(|Z + nc| > t_crit sqrt(V / df))], V ~ chi2(df), Z standard normal:
    the noncentral t's tail without scipy's noncentral t (tested equal to statsmodels where that is finite). The
    integral runs over the chi-square's central 1 - 2e-12 with a break at its mode region (V = df): over [0, inf)
    ``quad`` missed the narrow peak of a large df and returned ~0 from 200 seeds on (an audit, 2026-12-02)."""
    from scipy import integrate, stats

    df, nc = n - 1, effect_size * math.sqrt(n)
    tc = float(stats.t.ppf(1 - alpha / 2, df))

    def given_chi2(v: float) -> float:
        c = tc * math.sqrt(v / df)
        return (stats.norm.sf(c - nc) + stats.norm.cdf(-c - nc)) * stats.chi2.pdf(v, df)

    lo, hi = float(stats.chi2.ppf(1e-12, df)), float(stats.chi2.isf(1e-12, df))
    return float(integrate.quad(given_chi2, lo, hi, points=[float(df)], limit=200)[0])


SEEDS_MOST = 100_000  # the most seeds :func:`seeds_for_power` searches


def seeds_for_power(effect: float, sd: float, *, power: float = 0.8, alpha: float = 0.05,
                    most: int = SEEDS_MOST) -> int | None:
    """The fewest training seeds n >= 2 whose paired t-test detects a true mean difference ``effect`` with power at
    least ``power``, when per-seed differences have standard deviation ``sd`` (> 0). The power grows with n, so a
    bisection on whole seeds between one without the power and one with it, bracketed from statsmodels'
    ``solve_power`` (its root can be off: 2.000005 where 2 seeds have power 0.55, NaN for effects over ~4 sd where 2
    seeds may still fall short). None when more than ``most`` seeds are needed."""
    import warnings

    from statsmodels.stats.power import TTestPower

    if not sd > 0 or not effect > 0:
        raise ValueError(f"need effect > 0 and sd > 0, got effect={effect}, sd={sd}")
    es = effect / sd

    def enough(n: int) -> bool:
        return paired_t_power(es, n, alpha=alpha) >= power

    with warnings.catch_warnings(record=True):  # the solver warns where it fails to converge; the search decides
        guess = float(TTestPower().solve_power(effect_size=es, alpha=alpha, power=power))
    hi = min(max(2, math.ceil(guess)), most) if math.isfinite(guess) else 2
    lo = 1  # no test with one seed
    while not enough(hi):  # bracket: lo lacks the power, hi has it
        if hi >= most:
            return None
        lo, hi = hi, min(2 * hi, most)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return max(hi, 2)
