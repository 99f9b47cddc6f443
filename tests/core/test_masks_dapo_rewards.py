"""CAPO noise mask, DAPO filter and overlong shaping, rewards, registry."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from capo.core import (
    REWARDS,
    Registry,
    UnknownNameError,
    capo_noise_mask,
    informative_groups,
    overlong_penalty,
    ppl_quantile_thresholds,
    sequence_logprob_mean,
    sequence_perplexity,
)


def test_noise_mask_hand_computed():
    ppl = torch.tensor([1.0, 3.0, 1.02, 2.0, 2.5, 1.05, float("nan")])
    correct = torch.tensor([True, True, False, False, True, False, True])
    keep = capo_noise_mask(ppl, correct, low=1.05, high=2.5)
    # correct: keep iff ppl <= 2.5 ; incorrect: keep iff ppl >= 1.05 ; NaN never kept
    assert keep.tolist() == [True, False, False, True, True, True, False]


def test_quantile_thresholds():
    ppl = torch.arange(1, 102, dtype=torch.float64)  # 1..101
    lo, hi = ppl_quantile_thresholds(ppl, 0.25, 0.75)
    assert (lo, hi) == (26.0, 76.0)
    lo, hi = ppl_quantile_thresholds(torch.tensor([1.0, 2.0, float("inf")]), 0.0, 1.0)
    assert (lo, hi) == (1.0, 2.0)
    with pytest.raises(ValueError, match="q_low <= q_high"):
        ppl_quantile_thresholds(ppl, 0.8, 0.2)
    with pytest.raises(ValueError, match="at least 2 finite"):
        ppl_quantile_thresholds(torch.tensor([1.0]))


def test_noise_mask_errors():
    with pytest.raises(ValueError, match="low=3.0 must be <= high=2.0"):
        capo_noise_mask(torch.ones(2), torch.ones(2, dtype=torch.bool), low=3.0, high=2.0)
    with pytest.raises(TypeError, match="correct must be a bool tensor"):
        capo_noise_mask(torch.ones(2), torch.ones(2), low=1.0, high=2.0)


def test_sequence_scores():
    lp = torch.tensor([[-1.0, -3.0, -100.0], [-0.5, float("-inf"), 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(sequence_logprob_mean(lp, mask), torch.tensor([-2.0, -0.5, 0.0]))
    torch.testing.assert_close(sequence_perplexity(lp, mask), torch.exp(torch.tensor([2.0, 0.5, 0.0])))


def test_informative_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.5, 1.0])
    assert informative_groups(r, 3).tolist() == [True, False, True]


def test_overlong_penalty_hand_computed():
    lengths = torch.tensor([10, 12, 14, 16, 17])
    # L_max = 16, L_cache = 4: zero up to 12, linear to -1 at 16, -1 beyond
    torch.testing.assert_close(overlong_penalty(lengths, 16, 4), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="0 < cache_len <= max_len"):
        overlong_penalty(lengths, 4, 8)


def test_rlcr_reward_hand_computed():
    rlcr = REWARDS.get("rlcr")
    correct = torch.tensor([True, True, False, False, True, True])
    q = torch.tensor([1.0, 0.3, 0.0, 0.8, float("nan"), 1.5])
    got = rlcr(correct, confidence=q)
    want = torch.tensor([1.0, 1 - 0.49, 0.0, -0.64, -1.0, -1.0])
    torch.testing.assert_close(got, want)
    fmt = torch.tensor([True, False, True, True, True, True])
    assert rlcr(correct, confidence=q, format_ok=fmt, format_failure_reward=-2.0)[1].item() == -2.0
    with pytest.raises(ValueError, match="needs confidence"):
        rlcr(correct)


def test_rlcr_expected_reward_maximised_at_true_probability():
    """Proper scoring: E[R] over c ~ Bernoulli(p) is maximised by q = p."""
    rlcr = REWARDS.get("rlcr")
    for p in (0.1, 0.37, 0.8):
        qs = torch.linspace(0, 1, 101)
        exp_r = p * rlcr(torch.ones(101, dtype=torch.bool), confidence=qs) + (1 - p) * rlcr(
            torch.zeros(101, dtype=torch.bool), confidence=qs
        )
        assert abs(qs[exp_r.argmax()].item() - p) <= 0.005


@given(st.lists(st.floats(0.0, 1.0, width=32), min_size=1, max_size=16))
def test_rlcr_margin_for_being_right_is_2q(qs):
    """The reward pays a correct answer 2q - q^2 and a wrong one -q^2: the margin is 2q, and 0 at q = 0 (the nearly
    absorbing state of docs/papers.md, RLCR)."""
    rlcr = REWARDS.get("rlcr")
    q = torch.tensor(qs, dtype=torch.float32)
    right = rlcr(torch.ones(len(qs), dtype=torch.bool), confidence=q)
    wrong = rlcr(torch.zeros(len(qs), dtype=torch.bool), confidence=q)
    torch.testing.assert_close(right - wrong, 2 * q, atol=1e-6, rtol=0)
    torch.testing.assert_close(wrong, -q.square(), atol=1e-6, rtol=0)


def test_correctness_reward():
    assert REWARDS.get("correctness")(torch.tensor([True, False])).tolist() == [1.0, 0.0]
    with pytest.raises(TypeError, match="correct must be a bool tensor"):
        REWARDS.get("correctness")(torch.tensor([1.0, 0.0]))


def test_registry_duplicate_and_unknown():
    reg = Registry("widget")
    reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="duplicate widget name 'a'"):
        reg.register("a")(lambda: 2)
    with pytest.raises(UnknownNameError, match="unknown widget 'b'; allowed values: a"):
        reg.get("b")
    assert REWARDS.names() == ["brier_score", "correctness", "log_score", "ppo_c", "rlcr"]


def test_registry_says_which_estimators_read_scores():
    """Which estimators need per-response scores is declared once, at registration; engines read it there."""
    from capo.core import ADVANTAGES

    assert {n for n in ADVANTAGES.names() if "scores" in ADVANTAGES.reads(n)} == {"capo", "unlikeliness"}
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        ADVANTAGES.reads("nope")


# ---------------------------------------------------------------- input errors name the argument
def test_noise_mask_and_quantile_errors_name_the_argument():
    from capo.core import capo_noise_mask, ppl_quantile_thresholds

    ppl, c = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([True, False])
    cases = [
        (lambda: capo_noise_mask(ppl[None], c, low=1.0, high=2.0), ValueError, r"ref_ppl must have 1 dimension"),
        (lambda: capo_noise_mask(torch.tensor([1, 2]), c, low=1.0, high=2.0), TypeError, r"ref_ppl must have a floating"),
        (lambda: capo_noise_mask(ppl, c[None], low=1.0, high=2.0), ValueError, r"correct must have 1 dimension"),
        (lambda: capo_noise_mask(ppl, c[:1], low=1.0, high=2.0), ValueError,
         r"correct has shape \(1,\) but ref_ppl has shape \(2,\)"),
        (lambda: capo_noise_mask(ppl, c, low=0.0, high=2.0), ValueError, r"^low must be > 0"),
        (lambda: capo_noise_mask(ppl, c, low=1.0, high=-1.0), ValueError, r"^high must be > 0"),
        (lambda: ppl_quantile_thresholds(ppl[None]), ValueError, r"base_ppl must have 1 dimension"),
        (lambda: ppl_quantile_thresholds(torch.tensor([1, 2])), TypeError, r"base_ppl must have a floating"),
        (lambda: ppl_quantile_thresholds(ppl, 0.2, 1.5), ValueError, r"q_high"),
    ]
    for fn, err, match in cases:
        with pytest.raises(err, match=match):
            fn()
    # q_low == q_high is allowed: both thresholds are that quantile (median of 1, 2 = 1.5)
    assert ppl_quantile_thresholds(ppl, 0.5, 0.5) == (1.5, 1.5)


def test_overlong_penalty_edges():
    from capo.core.dapo import overlong_penalty

    # cache_len = 1 and cache_len = max_len are allowed; the result is float32 even for integer lengths
    out = overlong_penalty(torch.tensor([3, 4, 5]), max_len=4, cache_len=1)
    assert out.dtype == torch.float32 and out.tolist() == [0.0, -1.0, -1.0]
    assert overlong_penalty(torch.tensor([0, 2, 4]), max_len=4, cache_len=4).tolist() == [0.0, -0.5, -1.0]
    with pytest.raises(ValueError, match="0 < cache_len <= max_len"):
        overlong_penalty(torch.tensor([1]), max_len=4, cache_len=0)
    with pytest.raises(ValueError, match="lengths must have 1 dimension"):
        overlong_penalty(torch.tensor([[1]]), max_len=4, cache_len=2)


def test_rlcr_components_respect_the_format_flag():
    from capo.core.rewards import rlcr_components

    got = rlcr_components(torch.tensor([True, False, True]), confidence=torch.tensor([0.8, 0.3, 0.6]),
                          format_ok=torch.tensor([True, True, False]), format_failure_reward=-2.0)
    want = torch.tensor([[1.0, -0.04], [0.0, -0.09], [1.0, -2.0]])  # the malformed row gets the failure reward
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
