"""Policy losses, KL estimators and aggregation: hand values, gradients, equivalences, errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo.core import AGGREGATIONS, POLICY_LOSSES, aggregate, kl_penalty, policy_loss
from capo.core.losses import cispo_loss, gspo_loss, gspo_token_loss, ppo_clip_loss

f64 = dict(dtype=torch.float64)


def test_ppo_clip_hand_computed():
    # one response, 4 tokens with ratios 0.5, 0.9, 1.1, 1.5; eps_low = 0.2, eps_high = 0.28
    ratios = torch.tensor([[0.5, 0.9, 1.1, 1.5]], **f64)
    old = torch.zeros(1, 4, **f64)
    logp = ratios.log()
    mask = torch.ones(1, 4)
    lp, mp = ppo_clip_loss(logp, old, torch.tensor([2.0], **f64), mask, eps_low=0.2, eps_high=0.28)
    # A > 0: -min(rA, clip(r)A) = -A * min(r, clip(r)) -> r clipped from above at 1.28 only
    torch.testing.assert_close(lp, -2.0 * torch.tensor([[0.5, 0.9, 1.1, 1.28]], **f64))
    ln, mn = ppo_clip_loss(logp, old, torch.tensor([-1.0], **f64), mask, eps_low=0.2, eps_high=0.28)
    # A < 0: -min(-r, -clip(r)) = max(r, clip(r)) -> r clipped from below at 0.8 only
    torch.testing.assert_close(ln, torch.tensor([[0.8, 0.9, 1.1, 1.5]], **f64))
    assert mp["clip_frac"].item() == pytest.approx(0.25)
    assert mp["high_clip_frac"].item() == pytest.approx(0.25)
    assert mn["low_clip_frac"].item() == pytest.approx(0.25)
    assert mn["clip_frac"].item() == pytest.approx(0.25)
    assert mp["ratio_mean"].item() == pytest.approx((0.5 + 0.9 + 1.1 + 1.5) / 4)
    # dual clip caps the negative-advantage loss at -c * A = 3 * 1
    big = torch.tensor([[5.0]], **f64).log()
    ld, _ = ppo_clip_loss(big, torch.zeros(1, 1, **f64), torch.tensor([-1.0], **f64), torch.ones(1, 1), dual_clip=3.0)
    assert ld.item() == pytest.approx(3.0)


def test_ppo_clip_on_policy_gradient_is_reinforce():
    torch.manual_seed(0)
    logp = torch.randn(3, 4, **f64).requires_grad_()
    adv = torch.tensor([1.0, -2.0, 0.5], **f64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = ppo_clip_loss(logp, logp.detach(), adv, mask)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    torch.testing.assert_close(g, -adv[:, None].expand(3, 4) * mask)
    torch.testing.assert_close(loss.detach(), -adv[:, None] * mask)


def test_padding_never_contributes_even_if_garbage():
    logp = torch.tensor([[-1.0, -float("inf")]], **f64)
    old = torch.tensor([[-1.0, 3.0]], **f64)
    mask = torch.tensor([[1, 0]])
    for name in POLICY_LOSSES.names():
        extra = {"rewards": torch.tensor([1.0], **f64)} if name == "c2gspg" else {}  # the one loss with an input
        loss, _ = policy_loss(name, logp, old, torch.tensor([1.0], **f64), mask, **extra)
        val = aggregate(loss, mask, "token-mean")
        assert torch.isfinite(val), name


def test_a_losss_metrics_pool_over_rows_by_the_count_its_registration_declares():
    """Every row-local loss's metrics are means over real tokens, or over responses with a token for the keys its
    registration declares per_response (GSPO's sequence clip fraction): so the two halves of a batch, weighted by
    those counts, give the whole batch's value -- what a trainer combining micro-batches relies on. A declared key
    that is no metric, or a per-response metric left undeclared, fails here."""
    torch.manual_seed(3)
    n, t = 8, 6
    logp = torch.randn(n, t, **f64) * 0.3 - 1
    old = logp + 0.4 * torch.randn(n, t, **f64)
    adv = torch.randn(n, **f64)
    mask = (torch.arange(t)[None, :] < torch.tensor([6, 1, 3, 6, 2, 5, 1, 4])[:, None]).long()
    rewards = torch.rand(n, **f64)
    halves = (torch.arange(0, 3), torch.arange(3, n))  # 10 and 25 tokens, 3 and 5 responses: unequal shares
    for name in POLICY_LOSSES.names():
        if POLICY_LOSSES.batch_dependent(name):
            continue  # its token selection reads the other rows: no split gives the whole batch's value
        extra = (lambda ix: {"rewards": rewards[ix]}) if name == "c2gspg" else (lambda ix: {})
        _, whole = policy_loss(name, logp, old, adv, mask, **extra(slice(None)))
        per_response = POLICY_LOSSES.per_response(name)
        assert per_response <= set(whole), name
        parts = [(policy_loss(name, logp[ix], old[ix], adv[ix], mask[ix], **extra(ix))[1], mask[ix]) for ix in halves]
        for key, v in whole.items():
            w = [float((m.sum(-1) > 0).sum()) if key in per_response else float(m.sum()) for _, m in parts]
            pooled = sum(float(mt[key]) * wi for (mt, _), wi in zip(parts, w)) / sum(w)
            assert pooled == pytest.approx(float(v), rel=1e-12, abs=1e-12), (name, key)


def test_gspo_hand_computed_and_token_variant_equivalence():
    torch.manual_seed(1)
    logp = torch.randn(4, 5, **f64).requires_grad_()
    old = (logp.detach() + 1e-4 * torch.randn(4, 5, **f64))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3], **f64)
    seq, m_seq = gspo_loss(logp, old, adv, mask)
    tok, m_tok = gspo_token_loss(logp, old, adv, mask)
    # hand formula for row 1
    s1 = math.exp(((logp[1, :3] - old[1, :3]).sum() / 3).item())
    c1 = min(max(s1, 1 - 3e-4), 1 + 4e-4)
    assert seq[1, 0].item() == pytest.approx(-min(s1 * -1.0, c1 * -1.0), rel=1e-12)
    torch.testing.assert_close(seq.detach(), tok.detach())
    g_seq = torch.autograd.grad(aggregate(seq, mask, "seq-mean-token-mean"), logp)[0]
    g_tok = torch.autograd.grad(aggregate(tok, mask, "seq-mean-token-mean"), logp)[0]
    torch.testing.assert_close(g_seq, g_tok, rtol=1e-10, atol=1e-12)
    assert m_seq["clip_frac"].item() == pytest.approx(m_tok["clip_frac"].item())


def test_cispo_hand_computed_and_gradient():
    ratios = torch.tensor([[0.5, 1.0, 6.0]], **f64)
    old = torch.log(torch.tensor([[0.2, 0.3, 0.01]], **f64))
    logp = (old + ratios.log()).requires_grad_()
    mask = torch.ones(1, 3)
    loss, m = cispo_loss(logp, old, torch.tensor([2.0], **f64), mask, eps_high=4.0)
    w = torch.tensor([[0.5, 1.0, 5.0]], **f64)  # only the upper bound 1 + 4 = 5 clips
    torch.testing.assert_close(loss.detach(), -w * 2.0 * logp.detach())
    (g,) = torch.autograd.grad(loss.sum(), logp)
    torch.testing.assert_close(g, -w * 2.0)  # stop-gradient on the weight
    assert m["clip_frac"].item() == pytest.approx(1 / 3)
    loss_lo, _ = cispo_loss(logp, old, torch.tensor([2.0], **f64), mask, eps_low=0.2, eps_high=4.0)
    torch.testing.assert_close(loss_lo.detach(), -torch.tensor([[0.8, 1.0, 5.0]], **f64) * 2.0 * logp.detach())


def test_kl_estimators_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]], **f64)
    ref = torch.tensor([[-1.5, -1.0]], **f64)
    d = ref - logp  # [-0.5, 1.0]
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), -d)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * d**2)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(d) - d - 1)
    assert kl_penalty(logp, ref, "k3", clamp=0.5).max().item() == pytest.approx(0.5)
    assert (kl_penalty(logp, logp, "k3") == 0).all()


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_k3_non_negative(seed):
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64) * 3
    assert (kl_penalty(a, b, "k3") >= 0).all()


def test_aggregation_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], **f64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 3))
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=10).item() == pytest.approx(10 / 20)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregation_of_a_batch_without_tokens_is_zero(mode):
    # every row empty, with or without the global counts a micro-batched update passes (0 tokens, 2 sequences)
    loss, mask = torch.ones(2, 3, **f64), torch.zeros(2, 3)
    assert aggregate(loss, mask, mode).item() == 0.0
    assert aggregate(loss, mask, mode, num_seqs=2, num_tokens=0.0).item() == 0.0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(AGGREGATIONS), chunks=st.integers(1, 4))
def test_aggregation_microbatch_invariance(seed, mode, chunks):
    """Summing micro-batch losses with global denominators equals the full-batch loss (grad accumulation)."""
    gen = torch.Generator().manual_seed(seed)
    n, t = 8, 6
    loss = torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=gen) > 0.3).long()
    full = aggregate(loss, mask, mode)
    parts = sum(
        aggregate(lc, mc, mode, num_seqs=n, num_tokens=int(mask.sum()), max_len=t)
        for lc, mc in zip(loss.chunk(chunks), mask.chunk(chunks))
    )
    torch.testing.assert_close(parts, full, rtol=1e-12, atol=1e-12)


def test_loss_errors():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_logp has shape"):
        ppo_clip_loss(lp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages has 3 rows but logp has 2"):
        ppo_clip_loss(lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(TypeError, match="logp must have a floating dtype"):
        ppo_clip_loss(torch.zeros(2, 3, dtype=torch.long), lp, torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mode='mean' is not allowed; allowed values: 'token-mean'"):
        aggregate(lp, torch.ones(2, 3), "mean")
    with pytest.raises(ValueError, match="kind='k4'"):
        kl_penalty(lp, lp, "k4")
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'; allowed values: c2gspg, cispo, clip_cov, gspo, gspo_token, kl_cov, ppo_clip"):
        policy_loss("ppo", lp, lp, torch.zeros(2), torch.ones(2, 3))


def test_documented_defaults():
    """The defaults the docstrings name, each where it changes a value: PPO-clip eps 0.2 / 0.2 and no dual clip,
    GSPO eps 3e-4 / 4e-4, CISPO's upper bound 1 + 4 and no lower bound, KL estimator k3 without a clamp,
    token-mean aggregation, log-ratios clamped at 20."""
    one, A = torch.ones(1, 3), lambda a: torch.tensor([a], **f64)
    logp = torch.tensor([[0.7, 1.0, 1.3]], **f64).log()
    old = torch.zeros(1, 3, **f64)
    torch.testing.assert_close(ppo_clip_loss(logp, old, A(1.0), one)[0], torch.tensor([[-0.7, -1.0, -1.2]], **f64))
    torch.testing.assert_close(ppo_clip_loss(logp, old, A(-1.0), one)[0], torch.tensor([[0.8, 1.0, 1.3]], **f64))
    big = torch.tensor([[5.0]], **f64).log()
    assert ppo_clip_loss(big, torch.zeros(1, 1, **f64), A(-1.0), torch.ones(1, 1))[0].item() == pytest.approx(5.0)
    # a log-ratio of 25 counts as 20: loss e^20 (not e^25) for A = -1, and ratio_mean e^20
    huge, m = ppo_clip_loss(torch.full((1, 1), 25.0, **f64), torch.zeros(1, 1, **f64), A(-1.0), torch.ones(1, 1))
    assert huge.item() == pytest.approx(math.exp(20)) and m["ratio_mean"].item() == pytest.approx(math.exp(20))
    # GSPO: s = e^{mean log-ratio} = 1.001 is clipped to 1 + 4e-4 for A > 0; s = 0.999 to 1 - 3e-4 for A < 0
    for fn in (gspo_loss, gspo_token_loss):
        up, _ = fn(torch.full((1, 3), math.log(1.001), **f64), old, A(2.0), one)
        torch.testing.assert_close(up, torch.full((1, 3), -2.0 * (1 + 4e-4), **f64))
        down, _ = fn(torch.full((1, 3), math.log(0.999), **f64), old, A(-1.0), one)
        torch.testing.assert_close(down, torch.full((1, 3), 1 - 3e-4, **f64))
    # CISPO: weights min(r, 5), no lower bound: r = 0.01, 1, 6 -> 0.01, 1, 5
    lr = torch.tensor([[0.01, 1.0, 6.0]], **f64).log()
    torch.testing.assert_close(cispo_loss(lr, old, A(1.0), one)[0], -torch.tensor([[0.01, 1.0, 5.0]], **f64) * lr)
    # KL: k3 by default, unclamped (d = 15: e^15 - 16)
    lp, ref = torch.tensor([[-1.0, -20.0]], **f64), torch.tensor([[-1.5, -5.0]], **f64)
    torch.testing.assert_close(kl_penalty(lp, ref), torch.tensor([[math.exp(-0.5) - 0.5, math.exp(15) - 16]], **f64))
    loss, mask = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], **f64), torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask).item() == pytest.approx(10 / 4)


def test_one_token_and_one_sequence_edges():
    """Counts of 1 are divided by 1 (the clamps only guard 0); a log-ratio below -20 counts as -20; a KL clamp
    bounds both sides."""
    one = torch.ones(1, 1)
    three = torch.tensor([[3.0]], **f64)
    for mode in AGGREGATIONS:  # one sequence of one token: every aggregation gives the token's loss
        assert aggregate(three, one, mode).item() == pytest.approx(3.0), mode
    _, m = ppo_clip_loss(torch.tensor([[math.log(1.1)]], **f64), torch.zeros(1, 1, **f64), torch.tensor([1.0], **f64),
                         one)
    assert m["ratio_mean"].item() == pytest.approx(1.1)
    low, m = ppo_clip_loss(torch.full((1, 1), -25.0, **f64), torch.zeros(1, 1, **f64), torch.tensor([1.0], **f64), one)
    assert low.item() == pytest.approx(-math.exp(-20), rel=1e-9) and m["ratio_mean"].item() == pytest.approx(
        math.exp(-20), rel=1e-9)
    lp, ref = torch.tensor([[-1.0, -2.0]], **f64), torch.tensor([[-2.0, -1.8]], **f64)  # k1 = 1.0, -0.2
    torch.testing.assert_close(kl_penalty(lp, ref, "k1", clamp=0.5), torch.tensor([[0.5, -0.2]], **f64))
    torch.testing.assert_close(kl_penalty(-lp, -ref, "k1", clamp=0.5), torch.tensor([[-0.5, 0.2]], **f64))
