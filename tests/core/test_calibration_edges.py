"""Defaults and edges of the calibration metrics that the hand-computed tests did not pin (mutation testing:
the ``core.calibration`` survivors, docs/testing.md "Mutation testing")."""

import math

import pytest
import torch

from capo.core.calibration import (
    auc_mean,
    bootstrap_ci,
    bootstrap_draws,
    auroc,
    aurc,
    brier,
    confidence_from_logprob,
    debiased_l2_ce,
    ece,
    mce,
    paired_difference,
    percentile_interval,
    reliability_curve,
    smooth_ece,
    summarize,
)

f64 = dict(dtype=torch.float64)


def test_percentile_interval_default_is_95_percent():
    v = torch.arange(101, **f64)  # quantile q of 0..100 (linear interpolation) is 100 q
    assert percentile_interval(v) == (2.5, 97.5)
    assert percentile_interval(v, 0.2) == (10.0, 90.0)
    assert percentile_interval(torch.tensor([math.nan, 1.0, 3.0, math.nan], **f64), 0.5) == (1.5, 2.5)  # NaN dropped
    lo, hi = percentile_interval(torch.tensor([math.nan], **f64))
    assert math.isnan(lo) and math.isnan(hi)


def _two_models():
    """Ten questions of ten responses (5 right, 5 wrong) with random scores: per-question AUC differences in steps
    of 0.04, where the bootstrap interval moves with the seed and with n_boot (1000 vs 1001)."""
    g = torch.Generator().manual_seed(3)
    gid = torch.arange(10).repeat_interleave(10)
    c = torch.tensor([True, False] * 50)
    sa, sb = torch.rand(100, generator=g, **f64), torch.rand(100, generator=g, **f64)
    return sa, c, gid, sb, c, gid


def test_paired_difference_defaults_are_1000_draws_seeded_0():
    args = _two_models()
    torch.manual_seed(1)
    d = paired_difference(*args)
    torch.manual_seed(2)  # the global RNG is never read: a fresh generator seeded with `seed`
    again = paired_difference(*args)
    explicit = paired_difference(*args, n_boot=1000, alpha=0.05, seed=0)
    assert (d.low, d.high) == (again.low, again.high) == (explicit.low, explicit.high)
    # the checks above can fail: another n_boot or seed moves the interval on this data
    assert paired_difference(*args, n_boot=1001).low != d.low and paired_difference(*args, seed=1).low != d.low
    assert d.value == pytest.approx(float(d.per_group.mean())) and d.n_groups_used == 10


def test_paired_difference_without_common_mixed_questions_is_nan():
    s = torch.tensor([0.1, 0.2, 0.3, 0.4], **f64)
    # model A's question 0 is mixed, B's question 0 is all correct: no question has both classes in both models
    r = paired_difference(s, torch.tensor([True, False, True, True]), torch.tensor([0, 0, 1, 1]),
                          s, torch.tensor([True, True, True, False]), torch.tensor([0, 0, 1, 1]))
    assert math.isnan(r.value) and math.isnan(r.low) and math.isnan(r.high) and r.n_groups_used == 0
    assert r.per_group.dtype == torch.float64 and r.per_group.numel() == 0
    assert r.group_labels.dtype == torch.int64 and r.group_labels.numel() == 0


# summarize: p = exp(lpm) = (0.81, 0.89, 0.3, 0.6), correct (1, 0, 0, 1), questions (0, 0, 1, 1). With 10 bins 0.81 and
# 0.89 share [0.8, 0.9) (|0.85 - 0.5| * 2), 0.3 and 0.6 are alone: ECE (0.7 + 0.3 + 0.4) / 4 = 0.35; with 11 bins
# 0.81 and 0.89 fall apart ([8/11, 9/11) and [9/11, 10/11)); one bin: |0.65 - 0.5| = 0.15.
P = torch.tensor([0.81, 0.89, 0.3, 0.6], **f64)
LPM, C, G = P.log(), torch.tensor([True, False, False, True]), torch.tensor([0, 0, 1, 1])
V = torch.tensor([0.81, 0.89, math.nan, 0.6], **f64)  # verbal: row 2 missing
KEYS = ["n", "n_groups", "accuracy", "auc_mean", "auc_mean_groups", "auroc", "ece", "brier", "aurc",
        "mean_confidence"]
VERBAL_KEYS = ["verbal_missing", "verbal_ece", "verbal_brier", "verbal_auroc", "verbal_aurc", "verbal_auc_mean",
               "verbal_auc_mean_groups", "verbal_mean_confidence"]


def test_summarize_hand_computed_with_its_default_and_given_bins():
    s = summarize(LPM, C, G)
    assert list(s) == KEYS
    assert s["ece"] == pytest.approx(0.35) and ece(P, C, n_bins=11) != pytest.approx(0.35)
    assert s["mean_confidence"] == pytest.approx(0.65) and s["accuracy"] == 0.5 and s["n"] == 4
    assert summarize(LPM, C, G, n_bins=1)["ece"] == pytest.approx(0.15)


def test_summarize_verbal_hand_computed():
    s = summarize(LPM, C, G, verbal_conf=V)
    assert list(s) == KEYS + VERBAL_KEYS
    # present rows 0, 1, 3: (0.81, 1), (0.89, 0), (0.6, 1); 10 bins: (0.7 + 0.4) / 3; one bin: |0.7667 - 0.6667|
    assert s["verbal_missing"] == 1.0 and s["verbal_ece"] == pytest.approx(1.1 / 3)
    assert s["verbal_brier"] == pytest.approx((0.19**2 + 0.89**2 + 0.4**2) / 3)
    assert s["verbal_auroc"] == 0.0  # both correct answers are less confident than the wrong one
    assert s["verbal_aurc"] == aurc(torch.tensor([0.81, 0.89, 0.6]), torch.tensor([True, False, True]))
    assert s["verbal_auc_mean"] == 0.0 and s["verbal_auc_mean_groups"] == 1.0  # question 1 has one class left
    assert s["verbal_mean_confidence"] == pytest.approx(2.3 / 3)
    assert summarize(LPM, C, G, verbal_conf=V, n_bins=1)["verbal_ece"] == pytest.approx(0.1)
    # verbal confidences in float32: the ECE bins follow that precision, the values are the same here
    assert summarize(LPM, C, G, verbal_conf=V.float())["verbal_ece"] == pytest.approx(1.1 / 3)


def test_summarize_with_every_verbal_confidence_missing():
    s = summarize(LPM, C, G, verbal_conf=[math.nan] * 4)
    assert sorted(s) == sorted(KEYS + VERBAL_KEYS)
    assert s["verbal_missing"] == 4.0 and s["verbal_auc_mean_groups"] == 0.0
    assert all(math.isnan(s[k]) for k in VERBAL_KEYS if k not in ("verbal_missing", "verbal_auc_mean_groups"))


SUMMARIZE_BAD = {
    "scores_lpm NaN": ((torch.tensor([-0.1, math.nan, -0.3, -0.4]), C, G), {}, ValueError, r"^scores_lpm contains NaN"),
    "scores_lpm str": ((["a", "b", "c", "d"], C, G), {}, TypeError, r"^scores_lpm must "),
    "correct 2": ((LPM, [1, 0, 2, 1], G), {}, ValueError, r"^correct must contain only 0/1"),
    "group_ids float": ((LPM, C, G.double()), {}, TypeError, r"^group_ids must have an integer dtype"),
    "correct short": ((LPM, C[:3], G), {}, ValueError, r"^correct has shape \(3,\) but scores_lpm has shape \(4,\)"),
    "group_ids short": ((LPM, C, G[:3]), {}, ValueError,
                        r"^group_ids has shape \(3,\) but scores_lpm has shape \(4,\)"),
    "empty": ((torch.zeros(0), torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long)), {}, ValueError,
              r"^scores_lpm is empty"),
    "verbal_conf str": ((LPM, C, G), {"verbal_conf": ["a", "b", "c", "d"]}, TypeError, r"^verbal_conf must "),
    "verbal_conf dict": ((LPM, C, G), {"verbal_conf": {}}, TypeError, r"^verbal_conf must be a torch.Tensor"),
    "verbal_conf > 1": ((LPM, C, G), {"verbal_conf": V + 1}, ValueError, r"^verbal_conf must lie in \[0, 1\]"),
    "verbal_conf short": ((LPM, C, G), {"verbal_conf": V[:3]}, ValueError,
                          r"^verbal_conf has shape \(3,\) but scores_lpm has shape \(4,\)"),
}


@pytest.mark.parametrize("case", list(SUMMARIZE_BAD))
def test_summarize_bad_input_names_the_argument(case):
    args, kw, err, match = SUMMARIZE_BAD[case]
    with pytest.raises(err, match=match):
        summarize(*args, **kw)


def test_binned_metrics_default_to_10_bins():
    # mce on P, C: 10 bins: max(|0.5 - 0.85|, 0.3, |1 - 0.6|) = 0.4; 11 bins would give |0 - 0.89| = 0.89
    assert mce(P, C) == pytest.approx(0.4) and mce(P, C, n_bins=11) == pytest.approx(0.89)
    assert reliability_curve(P, C).bin_edges.numel() == 12  # 0, 0.1, ..., 1 and the repeated 1 of the [1, 1] bin
    # four correct answers 0.81, 0.82, 0.88, 0.89: 10 bins: one bin, gap 1 - 0.85, no variance: CE 0.15;
    # 11 bins: 0.81 alone (no estimate), the other three at 0.8633: CE sqrt(3/4 (1 - 0.8633)^2) = 0.118
    q, ok = torch.tensor([0.81, 0.82, 0.88, 0.89], **f64), torch.ones(4, dtype=torch.bool)
    assert debiased_l2_ce(q, ok) == pytest.approx(0.15)
    assert debiased_l2_ce(q, ok, n_bins=11) == pytest.approx(math.sqrt(0.75 * (1 - 2.59 / 3) ** 2))


def test_binned_metrics_put_a_float32_confidence_on_its_own_precisions_edge():
    # float32 0.7 is 0.699999988 < 0.7: on the float32 edge 0.7 it is in bin 7 (as ECE), not bin 6
    q = torch.tensor([0.7, 0.7, 0.65, 0.65], dtype=torch.float32)
    c = torch.tensor([True, True, False, False])
    assert reliability_curve(q, c).bin_count.tolist() == [0] * 6 + [2, 2] + [0] * 3
    assert mce(q, c) == pytest.approx(0.65)  # bins {0.7, 0.7} (gap 0.3) and {0.65, 0.65} (gap 0.65)
    assert debiased_l2_ce(q, c) == pytest.approx(math.sqrt(0.5 * 0.3**2 + 0.5 * 0.65**2), rel=1e-6)
    assert ece(q, c) == pytest.approx(0.5 * 0.3 + 0.5 * 0.65, rel=1e-6)


def test_empty_inputs_and_positive_logprobs_are_named():
    with pytest.raises(ValueError, match=r"^scores is empty"):
        auroc(torch.zeros(0), torch.zeros(0, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^scores is empty"):
        auc_mean(torch.zeros(0), torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got 0\.5 at index 1$"):  # the first positive one, not the first >= 0
        confidence_from_logprob(torch.tensor([0.0, 0.5, 2.0], **f64))


AUC_MEAN_BAD = {
    "scores NaN": ((torch.tensor([0.1, math.nan, 0.3, 0.4]), C, G), ValueError, r"^scores contains NaN"),
    "correct 2": ((LPM, [1, 0, 2, 1], G), ValueError, r"^correct must contain only 0/1"),
    "scores short": ((LPM[:3], C, G), ValueError, r"^correct has shape \(4,\) but scores has shape \(3,\)"),
    "correct short": ((LPM, C[:3], G), ValueError, r"^correct has shape \(3,\) but scores has shape \(4,\)"),
    "group_ids short": ((LPM, C, G[:3]), ValueError, r"^group_ids has shape \(3,\) but scores has shape \(4,\)"),
}


@pytest.mark.parametrize("case", list(AUC_MEAN_BAD))
def test_auc_mean_bad_input_names_the_argument(case):
    args, err, match = AUC_MEAN_BAD[case]
    with pytest.raises(err, match=match):
        auc_mean(*args)


def test_reliability_bin_edges_are_float64_for_float32_confidences():
    r = reliability_curve(torch.tensor([0.7, 0.65], dtype=torch.float32), torch.tensor([True, False]))
    assert r.bin_edges.dtype == torch.float64
    assert r.bin_edges[7].item() == torch.tensor(0.7, dtype=torch.float32).item()  # the float32 0.7, as float64


def _boot_data():
    g = torch.Generator().manual_seed(3)
    return torch.rand(30, generator=g, **f64), torch.arange(10).repeat_interleave(3)


def _mean(x):
    return float(x.mean())


def test_bootstrap_defaults_are_1000_draws_seeded_0():
    x, gid = _boot_data()
    torch.manual_seed(1)
    ci = bootstrap_ci(_mean, x, group_ids=gid)
    assert ci == bootstrap_ci(_mean, x, group_ids=gid, n_boot=1000, alpha=0.05, seed=0)
    # on this data another n_boot or seed moves the interval, so the line above pins both defaults
    assert bootstrap_ci(_mean, x, group_ids=gid, n_boot=1001)[0] != ci[0]
    assert bootstrap_ci(_mean, x, group_ids=gid, seed=1)[0] != ci[0]
    assert torch.equal(bootstrap_draws(5, 3), bootstrap_draws(5, 3, 0))
    assert not torch.equal(bootstrap_draws(5, 3, 1), bootstrap_draws(5, 3, 0))


def test_bootstrap_keeps_each_drawn_questions_own_rows():
    # every question's rows sum to 4 (q0: 1 + 3, q1: 0 + 4, q2: 2 + 2): any draw of 3 questions sums to 12
    x, gid = torch.tensor([1.0, 0.0, 3.0, 2.0, 4.0, 2.0], **f64), torch.tensor([0, 1, 0, 2, 1, 2])
    assert bootstrap_ci(lambda v: float(v.sum()), x, group_ids=gid, n_boot=50) == (12.0, 12.0)


def test_bootstrap_edges_of_n_boot_and_alpha():
    x, gid = _boot_data()
    lo, hi = bootstrap_ci(_mean, x, group_ids=gid, n_boot=1)  # one replicate: a point interval
    assert lo == hi
    for bad in (0, True, 1.5, "10"):
        with pytest.raises(ValueError, match=r"^n_boot must be an int >= 1"):
            bootstrap_ci(_mean, x, group_ids=gid, n_boot=bad)
    for bad in (0, 0.0, 1, -0.1, "0.05"):
        with pytest.raises(ValueError, match=r"^alpha must be in \(0, 1\)"):
            bootstrap_ci(_mean, x, group_ids=gid, alpha=bad)


def test_bootstrap_bad_inputs_name_the_argument():
    x, gid = _boot_data()
    with pytest.raises(TypeError, match=r"^group_ids must have an integer dtype"):
        bootstrap_ci(_mean, x, group_ids=gid.double())
    with pytest.raises(ValueError, match=r"^group_ids is empty"):
        bootstrap_ci(_mean, x[:0], group_ids=gid[:0])
    with pytest.raises(TypeError, match=r"^arrays\[1\] must be a torch.Tensor"):
        bootstrap_ci(_mean, x, {}, group_ids=gid)
    with pytest.raises(ValueError, match=r"^arrays\[0\] has shape \(29,\) but group_ids has shape \(30,\)"):
        bootstrap_ci(_mean, x[:29], group_ids=gid)


def test_ranking_metrics_name_bad_labels():
    from capo.core.calibration import aurc as aurc_, e_aurc, prr, selective_curve

    for fn in (selective_curve, aurc_, e_aurc, prr):
        with pytest.raises(ValueError, match=r"^correct must contain only 0/1"):
            fn(torch.tensor([0.9, 0.1]), [1, 2])


def test_paired_difference_interval_is_an_interval_of_replicate_means():
    d = paired_difference(*_two_models())
    assert d.low < d.value < d.high  # the mean of all draws at once would give low == high


@pytest.mark.parametrize("metric", [ece, mce, debiased_l2_ce, reliability_curve, brier, smooth_ece])
def test_probability_metrics_name_bad_labels_and_sigma(metric):
    with pytest.raises(ValueError, match=r"^correct must contain only 0/1 or True/False, got 2"):
        metric([0.5, 0.5], [1, 2])
    with pytest.raises(ValueError, match=r"^sigma must be > 0, got 0"):
        smooth_ece([0.5, 0.5], [1, 0], sigma=0)


def test_bootstrap_keeps_each_questions_rows_in_their_order():
    """Votes break ties by first occurrence, so a replicate must hand a question's rows over in their order: 100
    questions (200 rows: enough for torch's unstable CPU sort to reorder ties) of a right answer then a wrong one,
    one vote each: the tie goes to the first row, every replicate's accuracy is 1."""
    from capo.core.voting import majority_vote

    a, c = torch.tensor([0, 1] * 100), torch.tensor([True, False] * 100)
    g = torch.arange(100).repeat_interleave(2)
    acc = lambda a, c, g: majority_vote(a, c, g).accuracy  # noqa: E731
    assert bootstrap_ci(acc, a, c, group_ids=g, n_boot=20, pass_group_ids=True) == (1.0, 1.0)
