"""Clip-Cov, KL-Cov and C2GSPG: hand-computed losses and gradients, reductions, agreement with verl (skipped when
verl is not importable), and input errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo.core import POLICY_LOSSES, aggregate, policy_loss
from capo.core.loss_variants import (
    c2gspg_loss, clip_cov_loss, kl_cov_loss, logprob_advantage_covariance, token_covariance,
)
from capo.core.losses import gspo_loss, ppo_clip_loss

f64 = dict(dtype=torch.float64)
EXACT = dict(rtol=0, atol=1e-12)

# a 2 x 3 batch, last token of row 1 is padding; A = [1, -1]
LOGP = [[-0.1, -2.0, -0.6], [-3.0, -0.9, -7.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -1.0], **f64)
# token-weighted means over the 5 real tokens: A: (3 - 2)/5 = 0.2; logp: (-0.1-2-0.6-3-0.9)/5 = -1.32
# Cov = (A - 0.2)(logp + 1.32): row 0 (0.8): [0.976, -0.544, 0.576]; row 1 (-1.2): [2.016, -0.504, pad 0]
COV = [[0.8 * 1.22, 0.8 * -0.68, 0.8 * 0.72], [-1.2 * -1.68, -1.2 * 0.42, 0.0]]


def leaf(x):
    return torch.tensor(x, **f64, requires_grad=True)


def test_new_losses_are_registered():
    for name in ("clip_cov", "kl_cov", "c2gspg"):
        assert name in POLICY_LOSSES


def test_token_covariance_hand_computed():
    torch.testing.assert_close(token_covariance(leaf(LOGP), ADV, MASK), torch.tensor(COV, **f64), **EXACT)


def test_logprob_advantage_covariance_hand_computed():
    # the sum of COV over the 5 real tokens: 0.976 - 0.544 + 0.576 + 2.016 - 0.504 = 2.52; / 5 = 0.504
    got = logprob_advantage_covariance(leaf(LOGP), ADV, MASK)
    torch.testing.assert_close(got, torch.tensor(0.504, **f64), **EXACT)
    assert not got.requires_grad
    # = the population covariance of the (logp, A) pairs of the real tokens
    lp = torch.tensor([-0.1, -2.0, -0.6, -3.0, -0.9], **f64)
    a = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0], **f64)
    torch.testing.assert_close(got, ((lp - lp.mean()) * (a - a.mean())).mean(), **EXACT)
    assert float(logprob_advantage_covariance(leaf(LOGP), ADV, torch.zeros(2, 3))) == 0.0


# ------------------------------------------------------------------------------------------------- Clip-Cov
def test_clip_cov_removes_the_in_band_tokens_hand_computed():
    logp = leaf(LOGP)
    # on-policy (ratio 1): PPO loss -A per token. Cov in (0.5, 5): (0,0) .976, (0,2) .576, (1,0) 2.016;
    # clip_ratio 0.8 -> floor(0.8 * 5) = 4 tokens to remove >= 3 candidates, so all three go, whatever the order
    loss, m = clip_cov_loss(logp, logp.detach(), ADV, MASK, clip_ratio=0.8, cov_low=0.5, cov_high=5.0)
    torch.testing.assert_close(loss, torch.tensor([[0.0, -1.0, 0.0], [0.0, 1.0, 0.0]], **f64), **EXACT)
    assert float(m["cov_clip_frac"]) == pytest.approx(3 / 5, abs=1e-12)
    loss.sum().backward()  # d(-A r)/dlogp = -A r = -A on the kept tokens, 0 on the removed ones
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.0, 0.0], [0.0, 1.0, 0.0]], **f64), **EXACT)


def test_clip_cov_skips_tokens_ppo_already_clips():
    logp = leaf(LOGP)
    old = logp.detach().clone()
    old[1, 0] += 0.5  # ratio e^-0.5 < 0.8 with A < 0: PPO's clipped branch, so never a Clip-Cov candidate
    loss, m = clip_cov_loss(logp, old, ADV, MASK, clip_ratio=0.8, cov_low=1.0, cov_high=5.0)
    # candidates in (1, 5): only (1, 0) (2.016), which PPO clips -> nothing removed; loss is plain PPO-clip
    want, _ = ppo_clip_loss(logp, old, ADV, MASK)
    torch.testing.assert_close(loss, want, **EXACT)
    assert float(m["cov_clip_frac"]) == 0.0 and float(m["clip_frac"]) == pytest.approx(1 / 5, abs=1e-12)


def test_clip_cov_random_choice_is_seeded_not_global():
    logp = leaf(LOGP)
    # default clip_ratio: floor(2e-4 * 5) = 0 -> at least 1 token of the 3 in-band candidates is removed
    removed = set()
    for seed in range(30):
        torch.manual_seed(1234)  # the global RNG must not matter
        a, _ = clip_cov_loss(logp, logp.detach(), ADV, MASK, cov_low=0.5, seed=seed)
        torch.manual_seed(999)
        b, _ = clip_cov_loss(logp, logp.detach(), ADV, MASK, cov_low=0.5, seed=seed)
        assert torch.equal(a, b)
        zero = ((a == 0) & MASK.bool()).nonzero().tolist()
        assert len(zero) == 1 and zero[0] in ([0, 0], [0, 2], [1, 0])
        removed.add(tuple(zero[0]))
        gen = torch.Generator().manual_seed(seed)
        c, _ = clip_cov_loss(logp, logp.detach(), ADV, MASK, cov_low=0.5, generator=gen)
        assert torch.equal(a, c)
    assert removed == {(0, 0), (0, 2), (1, 0)}  # every candidate gets picked by some seed


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_clip_cov_with_an_empty_band_is_ppo_clip(seed):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(4, 6, generator=g, **f64) - 1
    old = logp + 0.3 * torch.randn(4, 6, generator=g, **f64)
    adv = torch.randn(4, generator=g, **f64)
    mask = (torch.rand(4, 6, generator=g) > 0.2).long()
    a, _ = clip_cov_loss(logp, old, adv, mask, cov_low=1e6, cov_high=2e6)
    b, _ = ppo_clip_loss(logp, old, adv, mask)
    torch.testing.assert_close(a, b, **EXACT)


def test_clip_cov_errors():
    logp = leaf(LOGP)
    with pytest.raises(ValueError, match="cov_low < cov_high"):
        clip_cov_loss(logp, logp.detach(), ADV, MASK, cov_low=5.0, cov_high=1.0)
    with pytest.raises(ValueError, match="clip_ratio must be > 0"):
        clip_cov_loss(logp, logp.detach(), ADV, MASK, clip_ratio=0.0)
    with pytest.raises(ValueError, match="advantages has 3 rows"):
        clip_cov_loss(logp, logp.detach(), torch.zeros(3, **f64), MASK)


# --------------------------------------------------------------------------------------------------- KL-Cov
def test_kl_cov_hand_computed():
    logp = leaf(LOGP)
    old = logp.detach() - 0.1  # every ratio e^0.1, |log-ratio| 0.1
    # kl_ratio 0.4 -> floor(0.4 * 5) = 2 tokens with the largest Cov: (1, 0) 2.016 and (0, 0) 0.976
    loss, m = kl_cov_loss(logp, old, ADV, MASK, kl_ratio=0.4, kl_coef=2.0)
    e = math.exp(0.1)
    want = torch.tensor([[-e + 2 * 0.1, -e, -e], [e + 2 * 0.1, e, 0.0]], **f64)
    torch.testing.assert_close(loss, want, **EXACT)
    assert float(m["kl_cov_frac"]) == pytest.approx(2 / 5, abs=1e-12)
    loss.sum().backward()  # d/dlogp: -A r, plus coef * sign(logp - old) = +2 on the two penalised tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[-e + 2, -e, -e], [e + 2, e, 0.0]], **f64), **EXACT)


def test_kl_cov_penalises_at_least_one_token_and_never_clips():
    logp = leaf(LOGP)
    old = logp.detach() - 2.0  # ratio e^2, far outside any clip range
    loss, m = kl_cov_loss(logp, old, ADV, MASK)  # default 2e-4 * 5 tokens -> 1 token: (1, 0)
    e = math.exp(2.0)
    torch.testing.assert_close(loss, torch.tensor([[-e, -e, -e], [e + 2.0, e, 0.0]], **f64), **EXACT)


def test_kl_cov_errors():
    logp = leaf(LOGP)
    with pytest.raises(ValueError, match="kl_ratio must be > 0"):
        kl_cov_loss(logp, logp.detach(), ADV, MASK, kl_ratio=0)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        kl_cov_loss(logp, logp.detach(), ADV, MASK, kl_coef=-1.0)


# --------------------------------------------------------------------------------------------------- C2GSPG
def test_c2gspg_hand_computed():
    logp = leaf([[math.log(0.5), math.log(0.5)], [math.log(0.25), 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])  # row 1 has one real token
    adv = torch.tensor([1.0, -1.0], **f64)
    rewards = torch.tensor([1.0, 0.0], **f64)
    # on-policy: GSPO term -s_i A_i = -A_i; confidences c = exp(mean logp): 0.5 and 0.25
    # BCE: row 0 (R = 1): -log 0.5 = log 2; row 1 (R = 0): -log(1 - 0.25) = log(4/3)
    loss, m = c2gspg_loss(logp, logp.detach(), adv, mask, rewards=rewards, lam=0.5)
    want = torch.tensor([[-1 + 0.5 * math.log(2)] * 2, [1 + 0.5 * math.log(4 / 3), 0.0]], **f64)
    torch.testing.assert_close(loss, want, **EXACT)
    assert float(m["bce"]) == pytest.approx((math.log(2) + math.log(4 / 3)) / 2, abs=1e-12)
    aggregate(loss, mask, "seq-mean-token-mean").backward()
    # (1/N) d/dlogp: GSPO gives -A_i s_i / |o_i|; BCE gives lam * (-1/|o|) for R = 1, lam * c/(1-c)/|o| for R = 0
    g0 = (-1.0 + 0.5 * -1.0) / 2 / 2
    g1 = (1.0 + 0.5 * (0.25 / 0.75)) / 1 / 2
    torch.testing.assert_close(logp.grad, torch.tensor([[g0, g0], [g1, 0.0]], **f64), **EXACT)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_c2gspg_lam_zero_is_gspo_and_gradients_agree_for_binary_rewards(seed):
    g = torch.Generator().manual_seed(seed)
    logp = (torch.rand(4, 5, generator=g, **f64) * -2).requires_grad_()
    mask = torch.ones(4, 5, dtype=torch.long)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], **f64)
    adv = rewards - 0.5
    a, _ = c2gspg_loss(logp, logp.detach(), adv, mask, rewards=rewards, lam=0.0)
    b, _ = gspo_loss(logp, logp.detach(), adv, mask)
    torch.testing.assert_close(a, b, **EXACT)
    # the paper's collaboration claim for binary rewards: the BCE gradient points where the PG gradient points
    pg_grad = torch.autograd.grad(aggregate(b, mask, "seq-mean-token-mean"), logp)[0]
    only_bce = c2gspg_loss(logp, logp.detach(), torch.zeros(4, **f64), mask, rewards=rewards, lam=1.0)[0]
    bce_grad = torch.autograd.grad(aggregate(only_bce, mask, "seq-mean-token-mean"), logp)[0]
    assert (pg_grad * bce_grad > 0).all()


def test_c2gspg_errors_and_dispatch():
    logp = leaf([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    adv = torch.zeros(1, **f64)
    with pytest.raises(ValueError, match="c2gspg needs rewards"):
        c2gspg_loss(logp, logp.detach(), adv, mask)
    with pytest.raises(ValueError, match=r"rewards must lie in \[0, 1\]"):
        c2gspg_loss(logp, logp.detach(), adv, mask, rewards=torch.tensor([2.0], **f64))
    with pytest.raises(ValueError, match="rewards has 2 rows"):
        c2gspg_loss(logp, logp.detach(), adv, mask, rewards=torch.tensor([1.0, 0.0], **f64))
    with pytest.raises(TypeError, match="rewards must have a floating dtype"):
        c2gspg_loss(logp, logp.detach(), adv, mask, rewards=torch.tensor([1]))
    loss, _ = policy_loss("c2gspg", logp, logp.detach(), adv, mask, rewards=torch.tensor([1.0], **f64))
    assert loss.shape == (1, 2)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_a_loss_depends_on_the_rows_it_is_called_with_exactly_when_registered_batch_dependent(name):
    """`batch_dependent` (what tells a sweep that micro-batches change a run's result) is checked against the
    functions themselves: called on a batch's two halves, a loss gives each row the per-token loss it gives it on
    the whole batch unless it is registered batch-dependent; a batch-dependent one gives another (Clip-Cov's and
    KL-Cov's token selection takes at least one token per call, so two halves select at least two)."""
    g = torch.Generator().manual_seed(3)
    n, t = 8, 5
    logp = -torch.rand(n, t, generator=g, **f64) * 3
    old = logp + 0.3 * torch.randn(n, t, generator=g, **f64)
    adv = torch.randn(n, generator=g, **f64)
    mask = torch.ones(n, t, dtype=torch.long)
    mask[1, 3:] = 0
    mask[6, 4:] = 0
    extra = {"rewards": (torch.rand(n, generator=g, **f64) > 0.5).to(torch.float64)} if name == "c2gspg" else {}
    kw = {"cov_low": -1e3, "cov_high": 1e3} if name == "clip_cov" else {}  # every token in Clip-Cov's band
    fn = POLICY_LOSSES.get(name)

    def call(rows):
        return fn(logp[rows], old[rows], adv[rows], mask[rows], **{k: v[rows] for k, v in extra.items()}, **kw)[0]

    whole = call(slice(0, n))
    halves = torch.cat([call(slice(0, n // 2)), call(slice(n // 2, n))])
    assert torch.equal(whole, halves) != POLICY_LOSSES.batch_dependent(name)
