"""Bad inputs to the policy losses, the KL estimators, ``aggregate`` and the rollout correction are refused with an
error that names the argument and the problem; results keep the log-probs' dtype whatever the mask's; the edges
(one token, no token, a log-ratio past the clamp) have their hand-computed values (mutation testing:
these are the survivors of ``core.losses``, docs/testing.md "Mutation testing")."""

import math

import pytest
import torch

from capo.core.loss_variants import (
    c2gspg_loss,
    clip_cov_loss,
    kl_cov_loss,
    logprob_advantage_covariance,
    token_covariance,
)
from capo.core.losses import aggregate, cispo_loss, gspo_loss, gspo_token_loss, kl_penalty, ppo_clip_loss, \
    sequence_log_ratio
from capo.core.rollout_correction import logprob_mismatch, truncated_is_weights

N, T = 2, 3
LP = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3]])
OLD = torch.tensor([[-0.6, -1.0, -1.5], [-0.1, -0.4, -0.3]])
ADV = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
REWARDS = torch.tensor([1.0, 0.0])

LOSSES = {
    "ppo_clip": ppo_clip_loss,
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "cispo": cispo_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
    "c2gspg": lambda *a: c2gspg_loss(*a, rewards=REWARDS),
}

# (logp, old_logp, advantages, mask) with one argument wrong -> (error type, message); every loss runs the same check
BAD_LOSS_INPUTS = {
    "logp 1-D": ((LP[0], OLD, ADV, MASK), ValueError, r"^logp must have 2 dimension"),
    "logp 3-D": ((LP[None], OLD, ADV, MASK), ValueError, r"^logp must have 2 dimension"),
    "logp int": ((LP.long(), OLD, ADV, MASK), TypeError, r"^logp must have a floating dtype"),
    "old_logp 1-D": ((LP, OLD[0], ADV, MASK), ValueError, r"^old_logp must have 2 dimension"),
    "old_logp int": ((LP, OLD.long(), ADV, MASK), TypeError, r"^old_logp must have a floating dtype"),
    "advantages 2-D": ((LP, OLD, ADV[:, None], MASK), ValueError, r"^advantages must have 1 dimension"),
    "advantages int": ((LP, OLD, ADV.long(), MASK), TypeError, r"^advantages must have a floating dtype"),
    "mask 1-D": ((LP, OLD, ADV, MASK[0]), ValueError, r"^mask must have 2 dimension"),
    "mask 3-D": ((LP, OLD, ADV, MASK[None]), ValueError, r"^mask must have 2 dimension"),
    # same_shape's reference is logp: a logp of another shape is named against it, and so is a mask
    "logp wider": ((torch.zeros(N, T + 1), OLD, ADV, MASK), ValueError,
                   r"^old_logp has shape \(2, 3\) but logp has shape \(2, 4\)"),
    "old_logp wider": ((LP, torch.zeros(N, T + 1), ADV, MASK), ValueError,
                       r"^old_logp has shape \(2, 4\) but logp has shape \(2, 3\)"),
    "mask wider": ((LP, OLD, ADV, torch.ones(N, T + 1)), ValueError,
                   r"^mask has shape \(2, 4\) but logp has shape \(2, 3\)"),
    "advantages rows": ((LP, OLD, ADV[:1], MASK), ValueError, r"^advantages has 1 rows but logp has 2"),
}


@pytest.mark.parametrize("case", list(BAD_LOSS_INPUTS))
@pytest.mark.parametrize("loss", list(LOSSES))
def test_policy_loss_bad_input_names_the_argument(loss, case):
    args, err, match = BAD_LOSS_INPUTS[case]
    with pytest.raises(err, match=match):
        LOSSES[loss](*args)


REF = torch.tensor([[-0.4, -1.1, -2.5], [0.0, -0.2, -0.9]])
BAD_KL_INPUTS = {
    "logp 1-D": ((LP[0], REF), ValueError, r"^logp must have 2 dimension"),
    "logp int": ((LP.long(), REF), TypeError, r"^logp must have a floating dtype"),
    "ref_logp 1-D": ((LP, REF[0]), ValueError, r"^ref_logp must have 2 dimension"),
    "ref_logp 3-D": ((LP, REF[None]), ValueError, r"^ref_logp must have 2 dimension"),
    "ref_logp int": ((LP, REF.long()), TypeError, r"^ref_logp must have a floating dtype"),
    "ref_logp wider": ((LP, torch.zeros(N, T + 1)), ValueError,
                       r"^ref_logp has shape \(2, 4\) but logp has shape \(2, 3\)"),
    "logp wider": ((torch.zeros(N, T + 1), REF), ValueError,
                   r"^ref_logp has shape \(2, 3\) but logp has shape \(2, 4\)"),
}


@pytest.mark.parametrize("case", list(BAD_KL_INPUTS))
@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty_bad_input_names_the_argument(kind, case):
    args, err, match = BAD_KL_INPUTS[case]
    with pytest.raises(err, match=match):
        kl_penalty(*args, kind=kind)


BAD_AGG_INPUTS = {
    "per_token_loss 1-D": ((LP[0], MASK), ValueError, r"^per_token_loss must have 2 dimension"),
    "per_token_loss 3-D": ((LP[None], MASK), ValueError, r"^per_token_loss must have 2 dimension"),
    "per_token_loss int": ((LP.long(), MASK), TypeError, r"^per_token_loss must have a floating dtype"),
    "mask 1-D": ((LP, MASK[0]), ValueError, r"^mask must have 2 dimension"),
    "mask 3-D": ((LP, MASK[None]), ValueError, r"^mask must have 2 dimension"),
    "mask wider": ((LP, torch.ones(N, T + 1)), ValueError,
                   r"^mask has shape \(2, 4\) but per_token_loss has shape \(2, 3\)"),
    "per_token_loss wider": ((torch.zeros(N, T + 1), MASK), ValueError,
                             r"^mask has shape \(2, 3\) but per_token_loss has shape \(2, 4\)"),
}


@pytest.mark.parametrize("case", list(BAD_AGG_INPUTS))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_aggregate_bad_input_names_the_argument(mode, case):
    args, err, match = BAD_AGG_INPUTS[case]
    with pytest.raises(err, match=match):
        aggregate(*args, mode)


ENG = torch.tensor([[-0.7, -1.0, -9.0], [-0.1, -0.5, -0.3]])
BAD_ROLLOUT_INPUTS = {
    "old_logp 1-D": ((OLD[0], ENG, MASK), ValueError, r"^old_logp must have 2 dimension"),
    "old_logp 3-D": ((OLD[None], ENG, MASK), ValueError, r"^old_logp must have 2 dimension"),
    "old_logp int": ((OLD.long(), ENG, MASK), TypeError, r"^old_logp must have a floating dtype"),
    "rollout_logp 1-D": ((OLD, ENG[0], MASK), ValueError, r"^rollout_logp must have 2 dimension"),
    "rollout_logp 3-D": ((OLD, ENG[None], MASK), ValueError, r"^rollout_logp must have 2 dimension"),
    "rollout_logp int": ((OLD, ENG.long(), MASK), TypeError, r"^rollout_logp must have a floating dtype"),
    "mask 1-D": ((OLD, ENG, MASK[0]), ValueError, r"^mask must have 2 dimension"),
    "mask 3-D": ((OLD, ENG, MASK[None]), ValueError, r"^mask must have 2 dimension"),
    "old_logp wider": ((torch.zeros(N, T + 1), ENG, MASK), ValueError,
                       r"^rollout_logp has shape \(2, 3\) but old_logp has shape \(2, 4\)"),
    "mask wider": ((OLD, ENG, torch.ones(N, T + 1)), ValueError,
                   r"^mask has shape \(2, 4\) but old_logp has shape \(2, 3\)"),
}
ROLLOUT = {"truncated_is_weights": lambda *a: truncated_is_weights(*a, cap=2.0), "logprob_mismatch": logprob_mismatch}


@pytest.mark.parametrize("case", list(BAD_ROLLOUT_INPUTS))
@pytest.mark.parametrize("fn", list(ROLLOUT))
def test_rollout_correction_bad_input_names_the_argument(fn, case):
    args, err, match = BAD_ROLLOUT_INPUTS[case]
    with pytest.raises(err, match=match):
        ROLLOUT[fn](*args)


@pytest.mark.parametrize("cap", [0.0, -1.0, float("nan"), "2"])
def test_tis_cap_must_be_positive_and_is_named(cap):
    with pytest.raises(ValueError, match=r"^cap must be > 0"):
        truncated_is_weights(OLD, ENG, MASK, cap=cap)


def test_tis_log_ratio_is_clamped_at_20_even_under_a_larger_cap():
    # old - engine = 30 -> exp(min(30, 20)) = e^20 = 4.85e8, below the cap 1e10 (a clamp at 21 would give e^21)
    w = truncated_is_weights(torch.tensor([[0.0, 0.0]], dtype=torch.float64),
                             torch.tensor([[-30.0, -20.5]], dtype=torch.float64), torch.ones(1, 2), cap=1e10)
    assert w[0].tolist() == pytest.approx([math.exp(20.0), math.exp(20.0)], rel=1e-12)


def test_tis_weights_have_the_trainers_dtype():
    # engine log-probs in float64 are cast to old_logp's float32 before the ratio: the weights are float32
    w = truncated_is_weights(OLD, ENG.double(), MASK, cap=2.0)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, truncated_is_weights(OLD, ENG, MASK, cap=2.0), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(0, 3), (2, 0), (0, 0)])
def test_logprob_mismatch_of_an_empty_batch_is_zero(shape):
    s = logprob_mismatch(torch.zeros(shape), torch.zeros(shape), torch.ones(shape))
    assert {k: (v.item(), v.dtype, v.shape) for k, v in s.items()} == {
        "sum": (0.0, torch.float64, ()), "count": (0.0, torch.float64, ()), "max": (0.0, torch.float64, ())}


def test_logprob_mismatch_count_is_float64():
    s = logprob_mismatch(OLD, ENG, MASK)
    assert s["count"].dtype == torch.float64 and s["count"].item() == 5.0


def test_token_covariance_of_one_token_is_zero():
    # one real token: its advantage and log-prob are their own means, so (A - mean A)(logp - mean logp) = 0
    lp, adv = torch.tensor([[-1.0, -3.0]]), torch.tensor([2.0])
    for mask in (torch.tensor([[1, 0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[True, False]])):
        assert token_covariance(lp, adv, mask).tolist() == [[0.0, 0.0]]
        assert logprob_advantage_covariance(lp, adv, mask).item() == 0.0
    # two tokens of one row, same advantage: covariance 0 again; two rows, one token each: hand value
    assert token_covariance(lp, adv, torch.ones(1, 2)).tolist() == [[0.0, 0.0]]
    cov = token_covariance(torch.tensor([[-1.0], [-3.0]]), torch.tensor([2.0, 0.0]), torch.ones(2, 1))
    assert cov.tolist() == [[1.0], [1.0]]  # means 1 and -2: (2 - 1)(-1 + 2) = 1, (0 - 1)(-3 + 2) = 1


@pytest.mark.parametrize("mask_dtype", [torch.float64, torch.int64, torch.bool])
def test_results_keep_the_logprobs_dtype_whatever_the_masks(mask_dtype):
    mask = MASK.to(mask_dtype)
    assert token_covariance(LP, ADV, mask).dtype == torch.float32
    assert logprob_advantage_covariance(LP, ADV, mask).dtype == torch.float32
    assert sequence_log_ratio(LP, OLD, mask).dtype == torch.float32
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert aggregate(LP, mask, mode).dtype == torch.float32
    # and the values do not depend on the mask's dtype
    torch.testing.assert_close(sequence_log_ratio(LP, OLD, mask), torch.tensor([0.1 / 2, 0.2 / 3]))
    torch.testing.assert_close(aggregate(LP, mask), torch.tensor(-2.1 / 5))
