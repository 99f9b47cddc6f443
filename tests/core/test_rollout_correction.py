"""Truncated importance sampling weights and the log-prob mismatch statistics, against hand-computed values."""

import math

import pytest
import torch

from capo.core import logprob_mismatch, truncated_is_weights


def test_tis_weights_hand_computed():
    old = torch.tensor([[0.0, -1.0, -0.5], [-2.0, -0.3, 0.0]])
    eng = torch.tensor([[-math.log(1.5), -1.0, -3.0], [0.0, -0.3 - math.log(4.0), -7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w = truncated_is_weights(old, eng, mask, cap=2.0)
    # exp(0 + log 1.5) = 1.5; exp(0) = 1; exp(2.5) = 12.2 -> capped at 2; exp(-2) = 0.1353; exp(log 4) = 4 -> 2;
    # padding -> 0 (whatever the values there)
    expected = torch.tensor([[1.5, 1.0, 2.0], [math.exp(-2.0), 2.0, 0.0]])
    torch.testing.assert_close(w, expected, rtol=1e-6, atol=0)
    w3 = truncated_is_weights(old, eng, mask, cap=3.0)
    assert w3[0, 2] == 3.0 and w3[1, 1] == 3.0 and w3[0, 0] == pytest.approx(1.5, rel=1e-6)


def test_tis_weights_carry_no_gradient_and_survive_infinite_logprobs():
    old = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    eng = torch.tensor([[-float("inf"), -2.0]])
    w = truncated_is_weights(old, eng, torch.ones(1, 2), cap=2.0)
    assert not w.requires_grad
    assert w.tolist() == [[2.0, 1.0]]  # an impossible-under-the-engine token gets the cap, not inf/NaN


def test_tis_weights_check_inputs():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        truncated_is_weights(x, x, torch.ones(2, 3), cap=0.5)
    with pytest.raises(ValueError, match="rollout_logp"):
        truncated_is_weights(x, torch.zeros(2, 4), torch.ones(2, 3), cap=2.0)


def test_logprob_mismatch_hand_computed():
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.25, -9.0]])
    eng = torch.tensor([[-1.5, -1.0, -4.0], [-0.5, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])  # the 4.0 and 9.0 gaps are padding: ignored
    s = logprob_mismatch(old, eng, mask)
    assert float(s["sum"]) == 0.5 + 1.0 + 0.0 + 0.25
    assert float(s["count"]) == 4
    assert float(s["max"]) == 1.0
    empty = logprob_mismatch(old, eng, torch.zeros(2, 3))
    assert float(empty["count"]) == 0 and float(empty["max"]) == 0.0


def test_tis_cap_of_exactly_one_is_allowed():
    old, gen = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])  # ratios e^0.5, e^-1
    w = truncated_is_weights(old, gen, torch.ones(1, 2), cap=1.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, math.exp(-1.0)]]))
