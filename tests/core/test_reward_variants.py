"""PPO-C (verifiable form) reward and RLCR's reward components: hand-computed values, identities, errors."""

import math

import pytest
import torch

from capo.core import REWARDS
from capo.core.rewards import ppo_c_reward, rlcr_components, rlcr_reward

NAN = float("nan")


def test_ppo_c_hand_computed():
    correct = torch.tensor([True, True, False, False, True])
    q = torch.tensor([0.9, 0.2, 0.9, 0.1, NAN])
    r = ppo_c_reward(correct, confidence=q, weight=0.5)
    # correct: 1 + .5 (q - .5) -> 1.2, 0.85; wrong: 0 - .5 (q - .5) -> -0.2, 0.2; missing confidence -> -1
    torch.testing.assert_close(r, torch.tensor([1.2, 0.85, -0.2, 0.2, -1.0]), rtol=0, atol=1e-6)
    assert r.dtype == torch.float32 and REWARDS.get("ppo_c") is ppo_c_reward


def test_ppo_c_ordering_weight_zero_and_format():
    c = torch.tensor([True, True, False, False])
    q = torch.tensor([1.0, 0.0, 0.0, 1.0])  # correct+sure > correct+unsure > wrong+unsure > wrong+sure
    r = ppo_c_reward(c, confidence=q)
    assert r[0] > r[1] > r[2] > r[3]
    assert torch.equal(ppo_c_reward(c, confidence=q, weight=0.0), c.float())
    fmt = torch.tensor([True, False, True, True])
    assert float(ppo_c_reward(c, confidence=q, format_ok=fmt, format_failure_reward=-2.0)[1]) == -2.0
    # a non-binary threshold: nothing clears 1.5, so every answer's confidence costs
    r_hi = ppo_c_reward(c, confidence=q, threshold=1.5)
    torch.testing.assert_close(r_hi, torch.tensor([0.75, 1.25, 0.25, -0.25]), rtol=0, atol=1e-6)


def test_ppo_c_errors():
    c = torch.tensor([True, False])
    with pytest.raises(ValueError, match="ppo_c reward needs confidence"):
        ppo_c_reward(c)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        ppo_c_reward(c, confidence=torch.tensor([0.5, 0.5]), weight=-1.0)
    with pytest.raises(TypeError, match="confidence must have a floating dtype"):
        ppo_c_reward(c, confidence=torch.tensor([1, 0]))


def test_rlcr_components_hand_computed_and_sum_to_rlcr():
    c = torch.tensor([True, False, True, False])
    q = torch.tensor([0.8, 0.3, NAN, 1.0])
    fmt = torch.tensor([True, True, True, False])
    comp = rlcr_components(c, confidence=q, format_ok=fmt)
    # correctness column; Brier column -(q - c)^2: -(0.2^2) = -0.04, -(0.3^2) = -0.09; invalid rows -> -1
    want = torch.tensor([[1.0, -0.04], [0.0, -0.09], [1.0, -1.0], [0.0, -1.0]])
    torch.testing.assert_close(comp, want, rtol=0, atol=1e-6)
    ok = torch.tensor([True, True, False, False])
    torch.testing.assert_close(comp.sum(1)[ok], rlcr_reward(c, confidence=q, format_ok=fmt)[ok], rtol=0, atol=0)
    with pytest.raises(ValueError, match="confidence has shape"):
        rlcr_components(c, confidence=torch.tensor([0.5]))
    assert math.isclose(float(rlcr_components(c[:1], confidence=q[:1], format_failure_reward=-3.0)[0, 1]), -0.04,
                        abs_tol=1e-6)
