"""Confidence estimators: hand-computed values, slow reference loops (DeepConf's window rules), properties, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import log_softmax as np_log_softmax
from scipy.stats import entropy as np_entropy

from capo.core import CONFIDENCES, ConfidenceInputs, UnknownNameError, compute_confidence, token_statistics

F64 = torch.float64
NAN = math.nan
HYP = settings(max_examples=60, deadline=None)


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# three responses, T = 5: row 0 has 4 tokens, row 1 has 2, row 2 is empty; padding holds NaN/inf on purpose
LOGP = t([[-0.1, -0.2, -0.3, -0.4, NAN], [-1.0, -2.0, math.inf, NAN, 0.0], [NAN, NAN, NAN, NAN, NAN]])
MASK = t([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.int64)
ENT = t([[0.5, 1.5, 1.0, 1.0, NAN], [2.0, 4.0, NAN, NAN, NAN], [1.0, 1.0, 1.0, 1.0, 1.0]])
KL = t([[3.0, 1.0, 2.0, 2.0, -math.inf], [0.5, 1.5, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0, 7.0]])
TOPK = t([[1.0, 2.0, 3.0, 4.0, 99.0], [5.0, 6.0, 99.0, 99.0, 99.0], [9.0, 9.0, 9.0, 9.0, 9.0]])
X = ConfidenceInputs(token_logp=LOGP, mask=MASK, entropy=ENT, kl_uniform=KL, topk_conf=TOPK)
TOKEN_BASED = ["lpm", "sum_logprob", "min_token_prob", "neg_entropy", "self_certainty", "tail", "bottom_group",
               "lowest_group"]


def close(a: torch.Tensor, b) -> None:
    b = t(b)
    assert a.dtype == F64 and a.shape == b.shape
    assert torch.allclose(a, b, rtol=0, atol=1e-12, equal_nan=True), (a, b)


# ---------------------------------------------------------------------------------------------------------------
# per-token statistics
# ---------------------------------------------------------------------------------------------------------------


def test_token_statistics_hand_values():
    # p = (3/4, 1/4): H = -(.75 ln .75 + .25 ln .25) = 0.562335; KL(U||p) = -ln 2 - (ln .75 + ln .25)/2 = 0.143841;
    # top-1 confidence = -ln .75 = 0.287682; top-2 = -(ln .75 + ln .25)/2 = 0.836988
    logits = t([[math.log(3.0), 0.0], [5.0, 5.0]])
    s1 = token_statistics(logits, top_k=1)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    close(s1.entropy, [h, math.log(2)])  # uniform: entropy ln 2
    close(s1.kl_uniform, [-math.log(2) - (math.log(0.75) + math.log(0.25)) / 2, 0.0])  # uniform: KL 0
    close(s1.topk_conf, [-math.log(0.75), math.log(2)])
    close(token_statistics(logits, top_k=2).topk_conf, [-(math.log(0.75) + math.log(0.25)) / 2, math.log(2)])


def test_topk_confidence_from_given_top_logprobs():
    """The engines' shared formula: -mean of the k given log-probs (what the vLLM engine passes: exactly the top k);
    equal to token_statistics' topk_conf when given the top k of the full distribution; DeepConf's default k = 20."""
    from capo.core.confidence import TOPK_CONF_K, topk_confidence

    assert TOPK_CONF_K == 20
    close(topk_confidence(t([[math.log(0.5), math.log(0.25)], [-1.0, -3.0]])), [1.5 * math.log(2), 2.0])
    logp = torch.log_softmax(torch.randn(3, 5, 40, dtype=F64, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.equal(topk_confidence(logp.topk(20, -1).values), token_statistics(logp, normalized=True).topk_conf)
    with pytest.raises(ValueError, match="non-empty last"):
        topk_confidence(torch.zeros(3, 0))


def test_token_statistics_match_scipy():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(4, 7, 50))
    s = token_statistics(torch.from_numpy(logits), top_k=5)
    logp = np_log_softmax(logits, axis=-1)
    p = np.exp(logp)
    assert np.abs(s.entropy.numpy() - np_entropy(p, axis=-1)).max() < 1e-12
    kl = np_entropy(np.full_like(p, 1 / 50), p, axis=-1)  # KL(U || p)
    assert np.abs(s.kl_uniform.numpy() - kl).max() < 1e-12
    top = -np.sort(logp, axis=-1)[..., -5:].mean(-1)
    assert np.abs(s.topk_conf.numpy() - top).max() < 1e-12
    assert s.entropy.shape == (4, 7)


def test_token_statistics_half_precision_and_errors():
    s = token_statistics(torch.zeros(3, 8, dtype=torch.bfloat16), top_k=2)
    assert s.entropy.dtype == torch.float32
    assert torch.allclose(s.entropy, torch.full((3,), math.log(8)))
    with pytest.raises(ValueError, match="top_k"):
        token_statistics(torch.zeros(2, 4), top_k=5)
    with pytest.raises(ValueError, match="top_k"):
        token_statistics(torch.zeros(2, 4), top_k=0)
    with pytest.raises(TypeError, match="floating"):
        token_statistics(torch.zeros(2, 4, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------------------------
# hand-computed estimators (padding holds NaN/inf: it must never leak)
# ---------------------------------------------------------------------------------------------------------------


def test_logprob_estimators_hand_values():
    close(compute_confidence("lpm", X), [-0.25, -1.5, NAN])  # (-0.1-0.2-0.3-0.4)/4, (-1-2)/2, empty
    close(compute_confidence("sum_logprob", X), [-1.0, -3.0, NAN])
    close(compute_confidence("min_token_prob", X), [math.exp(-0.4), math.exp(-2.0), NAN])


def test_distribution_estimators_hand_values():
    close(compute_confidence("neg_entropy", X), [-1.0, -3.0, NAN])  # -(0.5+1.5+1+1)/4, -(2+4)/2
    close(compute_confidence("self_certainty", X), [2.0, 1.0, NAN])  # (3+1+2+2)/4, (0.5+1.5)/2


def test_tail_hand_values():
    close(compute_confidence("tail", X, k=2), [3.5, 5.5, NAN])  # mean of (3, 4); (5, 6)
    close(compute_confidence("tail", X, k=3), [3.0, 5.5, NAN])  # (2+3+4)/3; row 1 is shorter than k: all tokens
    close(compute_confidence("tail", X, k=1, token="logp"), [-0.4, -2.0, NAN])
    close(compute_confidence("tail", X, k=1, token="neg_entropy"), [-1.0, -4.0, NAN])


def test_group_hand_values():
    # C = 4, 1, 3, 2, 5, 6; window 2 -> means 2.5, 2, 2.5, 3.5, 5.5 (W = 5)
    x = ConfidenceInputs(mask=torch.ones(1, 6), topk_conf=t([[4.0, 1.0, 3.0, 2.0, 5.0, 6.0]]))
    close(compute_confidence("lowest_group", x, window=2), [2.0])
    close(compute_confidence("bottom_group", x, window=2, fraction=0.1), [2.0])  # max(1, floor(0.5)) = 1 window
    close(compute_confidence("bottom_group", x, window=2, fraction=0.4), [2.25])  # floor(2.0) = 2: (2 + 2.5) / 2
    close(compute_confidence("bottom_group", x, window=2, fraction=1.0), [3.2])  # mean of all 5 windows
    close(compute_confidence("bottom_group", x, window=3), [2.0])  # means 8/3, 2, 10/3, 13/3 -> 2
    close(compute_confidence("bottom_group", x, window=6), [3.5])  # one window: 21 / 6
    close(compute_confidence("bottom_group", x, window=7), [3.5])  # shorter than the window: all tokens
    # a hole in the mask: the real tokens 4, 1, 3 are consecutive -> windows 2.5, 2
    holed = ConfidenceInputs(mask=t([[1, 0, 1, 1]]), topk_conf=t([[4.0, -50.0, 1.0, 3.0]]))
    close(compute_confidence("lowest_group", holed, window=2), [2.0])
    close(compute_confidence("bottom_group", X, window=2, fraction=1.0), [2.5, 5.5, NAN])  # (1.5+2.5+3.5)/3


def test_verbal_and_consistency_hand_values():
    close(compute_confidence("verbal", ConfidenceInputs(verbal=[0.2, NAN, 1.0])), [0.2, NAN, 1.0])
    # question 7: answers 1, 1, 2, none -> 2/4, 2/4, 1/4, 0; question 3: 5, 5 -> 1, 1
    x = ConfidenceInputs(answer_ids=t([1, 1, 2, -1, 5, 5], torch.int64), group_ids=t([7, 7, 7, 7, 3, 3], torch.int64))
    close(compute_confidence("consistency", x), [0.5, 0.5, 0.25, 0.0, 1.0, 1.0])
    # class ids only need to be unique within a question: id 1 in two questions is two classes
    y = ConfidenceInputs(answer_ids=t([1, 2, 1], torch.int64), group_ids=t([0, 0, 1], torch.int64))
    close(compute_confidence("consistency", y), [0.5, 0.5, 1.0])


# ---------------------------------------------------------------------------------------------------------------
# slow references: DeepConf's per-trace definitions as Python loops
# ---------------------------------------------------------------------------------------------------------------


def ref_bottom(confs: list[float], window: int, fraction: float) -> float:
    if not confs:
        return NAN
    if len(confs) < window:
        return sum(confs) / len(confs)
    means = [sum(confs[i : i + window]) / window for i in range(len(confs) - window + 1)]
    k = max(1, int(len(means) * fraction))
    return sum(sorted(means)[:k]) / k


def ref_tail(confs: list[float], k: int) -> float:
    return sum(confs[-k:]) / len(confs[-k:]) if confs else NAN


rows = st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=12), min_size=1, max_size=5)


@HYP
@given(rows, st.integers(1, 6), st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]), st.integers(1, 8))
def test_group_and_tail_match_loops(data, window, fraction, k):
    width = max(len(r) for r in data) + 2
    vals = torch.full((len(data), width), 1e9, dtype=F64)  # padding that would dominate any leak
    mask = torch.zeros(len(data), width, dtype=torch.bool)
    for i, r in enumerate(data):
        pos = torch.randperm(width, generator=torch.Generator().manual_seed(i))[: len(r)].sort().values
        vals[i, pos] = t([x / 8 for x in r])
        mask[i, pos] = True
    x = ConfidenceInputs(mask=mask, topk_conf=vals)
    confs = [[v / 8 for v in r] for r in data]
    want_b = t([ref_bottom(c, window, fraction) for c in confs])
    want_t = t([ref_tail(c, k) for c in confs])
    assert torch.allclose(compute_confidence("bottom_group", x, window=window, fraction=fraction), want_b,
                          atol=1e-12, rtol=0, equal_nan=True)
    assert torch.allclose(compute_confidence("tail", x, k=k), want_t, atol=1e-12, rtol=0, equal_nan=True)


# ---------------------------------------------------------------------------------------------------------------
# properties and conventions
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOKEN_BASED)
def test_every_token_estimator_is_float64_nan_for_empty_and_ignores_padding(name):
    out = compute_confidence(name, X)
    assert out.dtype == F64 and out.shape == (3,)
    assert torch.isnan(out[2]) and bool(torch.isfinite(out[:2]).all())
    noisy = ConfidenceInputs(**{f: torch.where(MASK.bool(), getattr(X, f), torch.full_like(LOGP, -7.0))
                                for f in ("token_logp", "entropy", "kl_uniform", "topk_conf")}, mask=MASK)
    assert torch.equal(compute_confidence(name, noisy)[:2], out[:2])


def test_group_reductions_agree_with_simple_means():
    rng = np.random.default_rng(3)
    v = torch.from_numpy(rng.normal(size=(6, 30)))
    m = torch.from_numpy(rng.random((6, 30)) < 0.7)
    m[0] = False
    x = ConfidenceInputs(token_logp=v, mask=m, topk_conf=v)
    lpm = compute_confidence("lpm", x)
    # one-token windows, all of them kept: the mean; a window longer than every response: the mean; tail k >= T
    for out in (compute_confidence("bottom_group", x, window=1, fraction=1.0, token="logp"),
                compute_confidence("bottom_group", x, window=31, token="logp"),
                compute_confidence("tail", x, k=30, token="logp")):
        assert torch.allclose(out, lpm, atol=1e-12, rtol=0, equal_nan=True)
    # lowest one-token window = the minimum token log-prob
    low = compute_confidence("lowest_group", x, window=1, token="logp")
    assert torch.allclose(low.exp(), compute_confidence("min_token_prob", x), atol=1e-12, equal_nan=True)


def test_registry_and_errors():
    assert set(TOKEN_BASED + ["verbal", "consistency"]) == set(CONFIDENCES.names())
    with pytest.raises(UnknownNameError, match="allowed values: bottom_group"):
        compute_confidence("perplexity", X)
    with pytest.raises(ValueError, match="`entropy`"):
        compute_confidence("neg_entropy", ConfidenceInputs(token_logp=LOGP, mask=MASK))
    with pytest.raises(ValueError, match="`topk_conf`"):
        compute_confidence("tail", ConfidenceInputs(token_logp=LOGP, mask=MASK))
    with pytest.raises(ValueError, match="`mask`"):
        compute_confidence("lpm", ConfidenceInputs(token_logp=LOGP))
    with pytest.raises(ValueError, match="token="):
        compute_confidence("tail", X, token="prob")
    with pytest.raises(ValueError, match="window"):
        compute_confidence("bottom_group", X, window=0)
    with pytest.raises(ValueError, match="fraction"):
        compute_confidence("bottom_group", X, fraction=1.5)
    with pytest.raises(ValueError, match="k must"):
        compute_confidence("tail", X, k=0)
    with pytest.raises(ValueError, match="same shape|must match"):
        compute_confidence("lpm", ConfidenceInputs(token_logp=LOGP, mask=MASK[:, :3]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        compute_confidence("verbal", ConfidenceInputs(verbal=[0.5, 1.2]))
    with pytest.raises(ValueError, match=">= -1"):
        compute_confidence("consistency", ConfidenceInputs(answer_ids=t([-2], torch.int64), group_ids=t([0], torch.int64)))
    with pytest.raises(ValueError, match="`group_ids`"):
        compute_confidence("consistency", ConfidenceInputs(answer_ids=t([1], torch.int64)))
    with pytest.raises(TypeError, match="ConfidenceInputs"):
        compute_confidence("lpm", {"token_logp": LOGP})


def test_token_statistics_from_log_probs_and_zero_probabilities():
    """normalized=True (the sampler passes its log_softmax) gives the same statistics; a -inf logit (p = 0)
    contributes 0 to the entropy, not NaN."""
    rng = np.random.default_rng(1)
    logits = torch.from_numpy(rng.normal(scale=2.0, size=(3, 30)))
    a = token_statistics(logits, top_k=4)
    b = token_statistics(torch.log_softmax(logits, -1), top_k=4, normalized=True)
    for f in ("entropy", "kl_uniform", "topk_conf"):
        torch.testing.assert_close(getattr(a, f), getattr(b, f), rtol=0, atol=1e-12)
    masked = t([[math.log(3.0), 0.0, -math.inf]])
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    close(token_statistics(masked, top_k=1).entropy, [h])
