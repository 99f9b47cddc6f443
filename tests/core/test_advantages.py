"""Advantage estimators: hand-computed values, identities, reference loops, properties and errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo.core import ADVANTAGES, UnknownNameError, compute_advantages
from capo.core.advantages import capo_advantage, dr_grpo_advantage, grpo_advantage, rloo_advantage

f64 = dict(dtype=torch.float64)


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- hand-computed values
def test_grpo_hand_computed_bessel_and_population():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], **f64)
    # mean 0.25; Bessel std = sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; population std = sqrt(0.75 / 4)
    a1 = grpo_advantage(r, 4, eps=1e-300)
    torch.testing.assert_close(a1, torch.tensor([1.5, -0.5, -0.5, -0.5], **f64), rtol=0, atol=1e-12)
    a0 = grpo_advantage(r, 4, eps=1e-300, std_ddof=0)
    s0 = math.sqrt(0.75 / 4)
    torch.testing.assert_close(a0, torch.tensor([0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0], **f64))
    a_eps = grpo_advantage(r, 4, eps=1e-4)
    torch.testing.assert_close(a_eps, torch.tensor([0.75, -0.25, -0.25, -0.25], **f64) / (0.5 + 1e-4))


def test_grpo_batch_and_none_scaling():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0], **f64)  # two groups of 2
    std_all = torch.tensor([1.0, 0.0, 1.0, 1.0], **f64).std()  # sqrt(0.25)=0.5 (Bessel over 4: sum sq dev 0.75/3)
    a = grpo_advantage(r, 2, scale="batch", eps=1e-300)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, 0.0, 0.0], **f64) / std_all)
    torch.testing.assert_close(grpo_advantage(r, 2, scale="none"), torch.tensor([0.5, -0.5, 0.0, 0.0], **f64))


def test_grpo_batch_scaling_uses_all_rewards_ddof_and_eps():
    # two groups of 2: [1, 0], [0, 0]; group-centred advantages [0.5, -0.5, 0, 0]. The batch std is over all four
    # rewards (mean 1/4, squared deviations 9/16 + 3/16 = 3/4): ddof 0 -> sqrt(3/16), ddof 1 -> sqrt(1/4) = 1/2.
    # The group std would be sqrt(1/4) (ddof 0) or sqrt(1/2) (ddof 1) for the first group, 0 for the second.
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], **f64)
    centred = torch.tensor([0.5, -0.5, 0.0, 0.0], **f64)
    a0 = grpo_advantage(r, 2, scale="batch", std_ddof=0, eps=0.1)
    torch.testing.assert_close(a0, centred / (math.sqrt(3 / 16) + 0.1), rtol=0, atol=1e-12)
    a1 = grpo_advantage(r, 2, scale="batch", std_ddof=1, eps=0.1)
    torch.testing.assert_close(a1, centred / (0.5 + 0.1), rtol=0, atol=1e-12)
    assert grpo_advantage(r, 2, scale="batch", eps=0.1).tolist() == a1.tolist()  # ddof 1 is the default
    # group scaling with ddof 0: the first group's std 1/2, the second group's 0 -> 0 / (0 + eps) = 0
    g0 = grpo_advantage(r, 2, scale="group", std_ddof=0, eps=0.1)
    torch.testing.assert_close(g0, centred / (0.5 + 0.1), rtol=0, atol=1e-12)
    g1 = grpo_advantage(r, 2, std_ddof=1, eps=0.1)
    torch.testing.assert_close(g1, centred / (math.sqrt(0.5) + 0.1), rtol=0, atol=1e-12)
    # the keep mask zeroes dropped responses after the batch scaling
    keep = torch.tensor([True, False, True, True])
    torch.testing.assert_close(grpo_advantage(r, 2, scale="batch", std_ddof=0, eps=0.1, keep=keep),
                               a0 * keep.to(torch.float64), rtol=0, atol=1e-12)


def test_dr_grpo_and_rloo_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0], **f64)  # G = 3
    torch.testing.assert_close(
        dr_grpo_advantage(r, 3), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.5, 0.0, -0.5], **f64)
    )
    # RLOO: R_i - mean of the others
    torch.testing.assert_close(
        rloo_advantage(r, 3), torch.tensor([1.0, -0.5, -0.5, 0.75, 0.0, -0.75], **f64)
    )


def test_capo_hand_computed_logistic():
    r = torch.tensor([1.0, 0.0, 0.0], **f64)
    s = torch.tensor([-1.0, -2.0, -0.5], **f64)
    tau = 0.5
    w1 = sig((-2.0 - -1.0) / tau) / tau  # pair (0 correct, 1 wrong): well ranked
    w2 = sig((-0.5 - -1.0) / tau) / tau  # pair (0 correct, 2 wrong): misranked
    expected = torch.tensor([(w1 + w2) / 3, -w1 / 3, -w2 / 3], **f64)
    torch.testing.assert_close(capo_advantage(r, 3, scores=s, tau=tau), expected, rtol=0, atol=1e-12)
    # 1/(|P||N|) normalisation: |P| = 1, |N| = 2
    torch.testing.assert_close(capo_advantage(r, 3, scores=s, tau=tau, norm="pairs"), expected * 3 / 2)


def test_capo_misranked_pair_gets_larger_weight():
    r = torch.tensor([1.0, 0.0], **f64)
    misranked = capo_advantage(r, 2, scores=torch.tensor([-1.0, -0.5], **f64))
    well_ranked = capo_advantage(r, 2, scores=torch.tensor([-0.5, -1.0], **f64))
    assert (misranked.abs() > well_ranked.abs()).all()
    # the linear surrogate (GRPO) cannot tell them apart
    lin = dict(surrogate="linear")
    torch.testing.assert_close(
        capo_advantage(r, 2, scores=torch.tensor([-1.0, -0.5], **f64), **lin),
        capo_advantage(r, 2, scores=torch.tensor([-0.5, -1.0], **f64), **lin),
    )


# ---------------------------------------------------------------- the whole-sequence variant (capo_sum)
def _expected_push(pi: float, p: float, score: str, tau: float, length: int, keep_rates=(1.0, 1.0)) -> float:
    """E[sum_i A_i d log pi(D_i) / d logit(pi)] for a two-response group on a question of rate p: responses `D`
    + (length - 1) tokens of log-prob -1 each whatever D is (the theory's "uninformative rest"). Only a mixed group
    (D_1 != D_2, probability 2 pi (1 - pi)) has a pair; d log pi(D) / d logit(pi) = D - pi. ``keep_rates`` (k_c,
    k_i): a noise mask keeping a correct response with probability k_c and an incorrect one with k_i, each draw of
    the two rows' keep passed to capo_advantage (masked rows stay partners, its default) and weighted exactly."""
    rest = -(length - 1.0)
    lp1, lp0 = math.log(pi) + rest, math.log(1 - pi) + rest  # log pi(y) of a response predicting 1 / 0
    scores = torch.tensor([lp1, lp0], **f64) / length  # lpm; row 0 predicts 1, row 1 predicts 0
    lengths = torch.tensor([length, length])
    push = 0.0
    for outcome, prob in ((1, p), (0, 1 - p)):
        correct = torch.tensor([outcome == 1, outcome == 0])
        rate = [keep_rates[0] if bool(c) else keep_rates[1] for c in correct]
        for k0, k1 in ((True, True), (True, False), (False, True), (False, False)):
            p_keep = (rate[0] if k0 else 1 - rate[0]) * (rate[1] if k1 else 1 - rate[1])
            if p_keep == 0:
                continue
            a = capo_advantage(correct.to(torch.float64), 2, scores=scores, correct=correct, tau=tau, score=score,
                               lengths=lengths, keep=torch.tensor([k0, k1]))
            push += prob * p_keep * 2 * pi * (1 - pi) * float(a[0] * (1 - pi) + a[1] * (0 - pi))
    return push


def test_capo_sum_two_response_fixed_point_by_hand():
    """p = 0.8, pi = 0.8, score "sum", tau 1: the pair's score gap is log pi(1) - log pi(0) = logit(0.8) = ln 4.
    Outcome 1: w = sigmoid(-ln 4) = 0.2, A = +-0.2 / G = +-0.1, push 0.1 (1 - 0.8) + 0.1 * 0.8 = 0.1;
    outcome 0: w = sigmoid(ln 4) = 0.8, A = +-0.4, push -0.4. Expected 0.8 * 0.1 + 0.2 * (-0.4) = 0: the rate is
    the fixed point (docs/papers.md, "CAPO's fixed point on a stochastic outcome, in general")."""
    s = torch.tensor([math.log(0.8), math.log(0.2)], **f64) / 5  # lpm of 5-token responses, the rest log-prob 0
    n = torch.tensor([5, 5])
    a1 = capo_advantage(torch.tensor([1.0, 0.0], **f64), 2, scores=s, tau=1.0, score="sum", lengths=n)
    a0 = capo_advantage(torch.tensor([0.0, 1.0], **f64), 2, scores=s, tau=1.0, score="sum", lengths=n)
    torch.testing.assert_close(a1, torch.tensor([0.1, -0.1], **f64), rtol=0, atol=1e-12)
    torch.testing.assert_close(a0, torch.tensor([-0.4, 0.4], **f64), rtol=0, atol=1e-12)
    assert 0.8 * (0.1 * 0.2 + 0.1 * 0.8) + 0.2 * (-0.4 * 0.2 - 0.4 * 0.8) == pytest.approx(0, abs=1e-15)
    assert _expected_push(0.8, 0.8, "sum", 1.0, 5) == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.65, 0.9])
def test_capo_fixed_points_mean_sharpens_sum_at_tau_1_is_the_rate(p):
    """The expected push on logit(pi) vanishes at logit(pi) = L tau logit(p) with lpm ("mean", L = 5, tau 0.6:
    3x the logit) and at logit(pi) = tau logit(p) with "sum" (tau 1: pi = p); it points towards that point from
    either side (a stable fixed point)."""
    def at(k):
        return 1 / (1 + ((1 - p) / p) ** k)

    for score, tau, k in (("mean", 0.6, 3.0), ("sum", 1.0, 1.0), ("sum", 0.5, 0.5)):
        assert _expected_push(at(k), p, score, tau, 5) == pytest.approx(0, abs=1e-12)
        assert _expected_push(at(k * 0.8), p, score, tau, 5) * (p - 0.5) > 0  # below the point: pushed outwards
        assert _expected_push(at(k * 1.25), p, score, tau, 5) * (p - 0.5) < 0  # beyond it: pushed back
    assert _expected_push(p, p, "mean", 0.6, 5) * (p - 0.5) > 0  # the rate is not CAPO-as-shipped's fixed point


@pytest.mark.parametrize("score,tau,k0", [("sum", 1.0, 1.0), ("mean", 0.6, 3.0)])
@pytest.mark.parametrize("rho", [0.2, 0.5])
def test_an_asymmetric_mask_moves_the_fixed_point_as_derived(score, tau, k0, rho):
    """docs/papers.md, item 4 of "CAPO's fixed point ... in general": with the mask keeping incorrect responses at
    rho times the rate of correct ones, the push vanishes where logit(pi) / k0 + log((pi + rho (1 - pi)) / ((1 - pi)
    + rho pi)) = logit(p) (k0 = L tau: 1 for the sum at tau 1, 3 for lpm over 5 tokens at tau 0.6), which lies
    between 1/2 and the mask-free point: the mask pulls towards 1/2. The keep rates' scale does not matter."""
    p = 0.8

    def balance(logit_pi):  # the derivation's condition, solved by bisection (increasing in logit(pi))
        q = 1 / (1 + math.exp(-logit_pi))
        return logit_pi / k0 + math.log((q + rho * (1 - q)) / ((1 - q) + rho * q)) - math.log(p / (1 - p))

    lo, hi = 0.0, 20.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if balance(mid) < 0 else (lo, mid)
    pi = 1 / (1 + math.exp(-lo))
    free = 1 / (1 + ((1 - p) / p) ** k0)  # the fixed point without the mask
    assert 0.5 < pi < free
    for k_c in (1.0, 0.6):
        assert _expected_push(pi, p, score, tau, 5, (k_c, rho * k_c)) == pytest.approx(0, abs=1e-12)
        assert _expected_push(free, p, score, tau, 5, (k_c, rho * k_c)) < 0  # at the mask-free point: pulled back
        assert _expected_push(pi, p, score, tau, 5) > 0  # without the mask pi is short of the fixed point


def test_capo_sum_mixed_lengths_by_hand():
    """G = 3, lengths 2, 4, 1, lpm -0.5, -0.25, -2.0 -> sums -1, -1, -2; row 0 correct. tau 1:
    "sum": w_01 = sigmoid(-1 - (-1)) = 0.5, w_02 = sigmoid(-2 - (-1)) = sigmoid(-1);
    "mean": w_01 = sigmoid(-0.25 + 0.5) = sigmoid(0.25), w_02 = sigmoid(-1.5). The long row 1 is the most
    confident per token but only as likely as row 0 as a whole, so the sum weighs the pair more (0.5 > 0.438)."""
    r = torch.tensor([1.0, 0.0, 0.0], **f64)
    s, n = torch.tensor([-0.5, -0.25, -2.0], **f64), torch.tensor([2, 4, 1])
    w01, w02 = 0.5, sig(-1.0)
    want = torch.tensor([w01 + w02, -w01, -w02], **f64) / 3
    torch.testing.assert_close(capo_advantage(r, 3, scores=s, tau=1.0, score="sum", lengths=n), want,
                               rtol=0, atol=1e-12)
    m01, m02 = sig(0.25), sig(-1.5)
    torch.testing.assert_close(capo_advantage(r, 3, scores=s, tau=1.0, lengths=n),
                               torch.tensor([m01 + m02, -m01, -m02], **f64) / 3, rtol=0, atol=1e-12)


def test_capo_score_errors():
    r, s = torch.tensor([1.0, 0.0], **f64), torch.tensor([-1.0, -2.0], **f64)
    with pytest.raises(ValueError, match="score='sum' needs lengths"):
        capo_advantage(r, 2, scores=s, score="sum")
    with pytest.raises(ValueError, match="score"):
        capo_advantage(r, 2, scores=s, score="max", lengths=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="lengths"):
        capo_advantage(r, 2, scores=s, score="sum", lengths=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        capo_advantage(r, 2, scores=s, score="sum", lengths=torch.tensor([1, -1]))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(1, 50), tau=st.floats(0.05, 3.0), g=st.integers(2, 8))
def test_capo_sum_equals_mean_at_l_tau_when_lengths_are_equal(seed, length, tau, g):
    """With every response L tokens long, sum scores at temperature L tau give lpm's weights at tau divided by L:
    w = sigmoid(L (lpm_j - lpm_i) / (L tau)) / (L tau). The variant differs from CAPO only where lengths differ."""
    gen = torch.Generator().manual_seed(seed)
    r = (torch.rand(3 * g, generator=gen) < 0.5).to(torch.float64)
    s = -torch.rand(3 * g, generator=gen, dtype=torch.float64) * 3
    n = torch.full((3 * g,), length)
    a_sum = capo_advantage(r, g, scores=s, tau=length * tau, score="sum", lengths=n)
    torch.testing.assert_close(a_sum * length, capo_advantage(r, g, scores=s, tau=tau), rtol=1e-10, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    gap=st.floats(0.01, 5.0), base=st.floats(-5.0, 0.0), tau=st.floats(0.05, 3.0)
)
def test_capo_misranked_property(gap, base, tau):
    r = torch.tensor([1.0, 0.0], **f64)
    mis = capo_advantage(r, 2, scores=torch.tensor([base - gap, base], **f64), tau=tau)
    ok = capo_advantage(r, 2, scores=torch.tensor([base, base - gap], **f64), tau=tau)
    assert (mis.abs() > ok.abs()).all()


# ---------------------------------------------------------------- identities
@settings(max_examples=60, deadline=None)
@given(g=st.integers(2, 9), b=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_capo_linear_group_norm_equals_dr_grpo(g, b, seed):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 2, (b * g,), generator=gen).to(torch.float64)
    s = torch.randn(b * g, generator=gen, dtype=torch.float64)
    a = capo_advantage(r, g, scores=s, surrogate="linear", norm="group")
    torch.testing.assert_close(a, r - r.view(b, g).mean(1).repeat_interleave(g), rtol=0, atol=1e-12)


def test_grpo_gradient_equals_linear_pairwise_ranking_loss():
    """The GRPO (Dr. GRPO advantage) policy gradient equals the gradient of sum_{i in P, j in N} phi(lpm_i - lpm_j)
    with phi(t) = -t, up to the positive constant 1/G^2 (arXiv 2604.12632, Sec. 3)."""
    from capo.core import aggregate, policy_loss, sequence_logprob_mean

    torch.manual_seed(0)
    g, t, v = 6, 5, 7
    logits = torch.randn(g, t, v, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, v, (g, t))
    mask = torch.ones(g, t)
    mask[1, 3:] = 0
    mask[4, 2:] = 0
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], **f64)

    def token_logp():
        return torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)

    lp = token_logp()
    adv = dr_grpo_advantage(r, g)
    loss, _ = policy_loss("ppo_clip", lp, lp.detach(), adv, mask)
    (grad_grpo,) = torch.autograd.grad(aggregate(loss, mask, "seq-mean-token-mean"), logits)

    lpm = sequence_logprob_mean(token_logp(), mask)
    pos, neg = r > 0.5, r < 0.5
    pair_loss = -(lpm[pos][:, None] - lpm[neg][None, :]).sum()
    (grad_pair,) = torch.autograd.grad(pair_loss, logits)
    torch.testing.assert_close(grad_grpo, grad_pair / g**2, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- reference loop vs vectorised
def capo_reference(r, s, g, tau, surrogate, norm, keep, masked_partners, thr=0.5):
    n = len(r)
    out = [0.0] * n
    for start in range(0, n, g):
        idx = range(start, start + g)
        P = [i for i in idx if r[i] > thr]
        Nn = [j for j in idx if r[j] <= thr]

        def partner(i):
            return keep is None or masked_partners == "keep" or bool(keep[i])

        def w(i, j):
            return 1.0 if surrogate == "linear" else sig((s[j] - s[i]) / tau) / tau

        z = g if norm == "group" else max(sum(partner(i) and partner(j) for i in P for j in Nn), 1)
        for i in P:
            out[i] = sum(w(i, j) for j in Nn if partner(j) and partner(i)) / z
        for j in Nn:
            out[j] = -sum(w(i, j) for i in P if partner(i) and partner(j)) / z
    if keep is not None:
        out = [o * float(k) for o, k in zip(out, keep)]
    return torch.tensor(out, dtype=torch.float64)


@settings(max_examples=80, deadline=None)
@given(
    g=st.integers(2, 8),
    b=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    tau=st.sampled_from([0.1, 0.5, 0.6, 1.0, 3.0]),
    surrogate=st.sampled_from(["logistic", "linear"]),
    norm=st.sampled_from(["group", "pairs"]),
    use_keep=st.booleans(),
    masked_partners=st.sampled_from(["keep", "drop"]),
)
def test_capo_vectorised_matches_reference_loop(g, b, seed, tau, surrogate, norm, use_keep, masked_partners):
    gen = torch.Generator().manual_seed(seed)
    n = b * g
    r = torch.randint(0, 2, (n,), generator=gen).to(torch.float64)
    s = torch.randn(n, generator=gen, dtype=torch.float64).round(decimals=1)  # rounding creates ties
    keep = (torch.rand(n, generator=gen) > 0.3) if use_keep else None
    got = capo_advantage(r, g, scores=s, keep=keep, tau=tau, surrogate=surrogate, norm=norm,
                         masked_partners=masked_partners)
    want = capo_reference(r.tolist(), s.tolist(), g, tau, surrogate, norm,
                          None if keep is None else keep.tolist(), masked_partners)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_grpo_matches_reference_loop():
    gen = torch.Generator().manual_seed(3)
    r = torch.rand(40, generator=gen, dtype=torch.float64)
    got = grpo_advantage(r, 8, eps=1e-6)
    want = []
    for k in range(0, 40, 8):
        grp = r[k:k + 8].tolist()
        mu = sum(grp) / 8
        sd = math.sqrt(sum((x - mu) ** 2 for x in grp) / 7)
        want += [(x - mu) / (sd + 1e-6) for x in grp]
    torch.testing.assert_close(got, torch.tensor(want, **f64), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- invariants
ESTIMATORS = ["grpo", "dr_grpo", "rloo", "capo"]


@pytest.mark.parametrize("name", ESTIMATORS)
def test_all_equal_groups_give_zero_and_no_nan(name):
    r = torch.tensor([1.0] * 4 + [0.0] * 4 + [0.5] * 4)
    s = torch.randn(12)
    kw = {"correct": r == 1.0} if name == "capo" else {}  # capo takes verdicts when rewards are not 0/1
    a = compute_advantages(name, r, 4, scores=s, **kw)
    assert torch.isfinite(a).all()
    assert (a == 0).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.floats(-10, 10), name=st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_reward_shift_invariance(seed, shift, name):
    gen = torch.Generator().manual_seed(seed)
    r = torch.rand(24, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(
        compute_advantages(name, r + shift, 6), compute_advantages(name, r, 6), rtol=1e-9, atol=1e-9
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(ESTIMATORS), g=st.integers(2, 8))
def test_permutation_equivariance_within_group(seed, name, g):
    gen = torch.Generator().manual_seed(seed)
    b = 3
    r = torch.randint(0, 2, (b * g,), generator=gen).to(torch.float64)
    s = torch.randn(b * g, generator=gen, dtype=torch.float64)
    keep = torch.rand(b * g, generator=gen) > 0.2
    perm = torch.cat([torch.randperm(g, generator=gen) + k * g for k in range(b)])
    a = compute_advantages(name, r, g, scores=s, keep=keep)
    a_perm = compute_advantages(name, r[perm], g, scores=s[perm], keep=keep[perm])
    torch.testing.assert_close(a_perm, a[perm], rtol=1e-12, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.floats(-20, 20))
def test_capo_invariant_to_score_shift(seed, shift):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 2, (16,), generator=gen).to(torch.float64)
    s = torch.randn(16, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(capo_advantage(r, 8, scores=s + shift), capo_advantage(r, 8, scores=s),
                               rtol=1e-9, atol=1e-12)


def test_capo_zero_sum_with_group_norm_and_keep_zeroes():
    gen = torch.Generator().manual_seed(1)
    r = torch.randint(0, 2, (64,), generator=gen).to(torch.float64)
    s = torch.randn(64, generator=gen, dtype=torch.float64)
    a = capo_advantage(r, 8, scores=s)
    # every pair weight is added to one correct response and subtracted from one incorrect one
    torch.testing.assert_close(a.view(8, 8).sum(1), torch.zeros(8, **f64), rtol=0, atol=1e-12)
    keep = torch.ones(64, dtype=torch.bool)
    keep[::3] = False
    assert (capo_advantage(r, 8, scores=s, keep=keep)[~keep] == 0).all()


def test_keep_mask_applies_to_every_estimator():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    keep = torch.tensor([True, False, True, True])
    for name in ESTIMATORS:
        a = compute_advantages(name, r, 4, scores=torch.zeros(4), keep=keep)
        full = compute_advantages(name, r, 4, scores=torch.zeros(4))
        torch.testing.assert_close(a, full * keep)


# ---------------------------------------------------------------- errors
def test_errors_name_the_problem():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="group_size=3 does not divide"):
        grpo_advantage(r, 3)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        grpo_advantage(r, 1)
    with pytest.raises(TypeError, match="rewards must have a floating dtype"):
        grpo_advantage(torch.tensor([1, 0, 1, 0]), 2)
    with pytest.raises(ValueError, match="scores has shape"):
        capo_advantage(r, 2, scores=torch.zeros(3))
    with pytest.raises(ValueError, match="tau must be > 0"):
        capo_advantage(r, 2, scores=torch.zeros(4), tau=0.0)
    with pytest.raises(ValueError, match="tau must be > 0"):
        capo_advantage(r, 2, scores=torch.zeros(4), tau=-1.0)
    with pytest.raises(TypeError, match="required keyword-only argument: 'scores'"):
        capo_advantage(r, 2)
    with pytest.raises(ValueError, match="scores .* are required"):
        capo_advantage(r, 2, scores=None)
    with pytest.raises(ValueError, match="NaN"):
        grpo_advantage(torch.tensor([1.0, float("nan")]), 2)
    with pytest.raises(ValueError, match="allowed values: 'group', 'batch', 'none'"):
        grpo_advantage(r, 2, scale="global")
    with pytest.raises(ValueError, match="rewards must have 1 dimension"):
        grpo_advantage(r.view(2, 2), 2)
    with pytest.raises(UnknownNameError, match=r"unknown advantage estimator 'grpoo' \(did you mean 'grpo'\?\); allowed values: ace, capo, dr_grpo"):
        compute_advantages("grpoo", r, 2)
    with pytest.raises(TypeError, match="advantage estimator 'grpo'.*tau"):
        compute_advantages("grpo", r, 2, tau=0.5)


def test_registry_lists_all_estimators():
    variants = ["ace", "seed_grpo", "gdpo", "unlikeliness", "ngrpo"]  # tests/core/test_advantage_variants.py
    assert ADVANTAGES.names() == sorted(ESTIMATORS + variants)
