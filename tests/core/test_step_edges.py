"""The step's row bookkeeping and argument passing, and the registries, on hand-computed cases (mutation testing:
the survivors of ``core.step``, docs/testing.md "Mutation testing"). GRPO with its default std_ddof=1 on
a group of rewards (1, 0) gives (+-0.5) / sqrt(0.5) = +-1/sqrt(2)."""

import math

import pytest
import torch

from capo.core.registry import Registry, UnknownNameError
from capo.core.step import advantage_step, estimate, guard_batch

f64 = dict(dtype=torch.float64)
H = 1 / math.sqrt(2)


def _tokens(lpm, t=3):
    """[N, T] token log-probs whose per-row mean over a full mask is ``lpm``, and the full mask."""
    return torch.tensor(lpm, **f64)[:, None].expand(-1, t).clone(), torch.ones(len(lpm), t)


LP, M = _tokens([-1.0, -2.0, -1.5, -0.5])
R = torch.tensor([1.0, 0.0, 1.0, 0.0], **f64)
CORRECT = R.bool()
NO_EPS = {"eps": 1e-300}  # GRPO divides by std + eps (eps > 0): 1e-300 adds nothing at float64, exact hand values


def test_registry_registers_looks_up_and_refuses():
    reg = Registry("widget")
    assert "a" not in reg and reg.names() == []

    def f(*, scores=None):
        return 1

    def g():
        return 2

    with pytest.raises(ValueError, match=r"widget 'a' declares reads=\['lengths'\] that are not parameters"):
        reg.register("a", reads=("lengths",))(f)  # a declaration the function cannot take is refused
    assert "a" not in reg
    assert reg.register("a", reads=("scores",))(f) is f  # the decorator returns the function itself
    assert reg.register("b")(g) is g
    assert "a" in reg and "b" in reg and "c" not in reg
    assert reg.get("a") is f and reg.get("b") is g
    assert reg.reads("a") == frozenset({"scores"}) and reg.reads("b") == frozenset()
    assert reg.names() == ["a", "b"] and repr(reg) == "Registry('widget', ['a', 'b'])"
    with pytest.raises(ValueError, match=r"^duplicate widget name 'a'"):
        reg.register("a")(g)
    assert reg.get("a") is f  # the refused registration changed nothing
    with pytest.raises(UnknownNameError, match=r"^unknown widget 'aa' \(did you mean 'a'\?\); allowed values: a, b$"):
        reg.get("aa")
    with pytest.raises(UnknownNameError, match=r"^unknown widget 'zzz'; allowed values"):
        reg.reads("zzz")


def test_guard_defaults_no_group_filter_and_keeps_every_row():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0], **f64)  # group 0 all equal: active without the filter, dropped with it
    res = guard_batch(r, 2, token_logp=LP, mask=M)
    assert res.advantages is None and res.informative is None and res.ref_ppl is None
    assert res.active.tolist() == [True] * 4 and res.valid.tolist() == [True] * 4
    assert res.keep.dtype == torch.bool and res.keep.tolist() == [True] * 4
    filtered = guard_batch(r, 2, token_logp=LP, mask=M, group_filter=True)
    assert filtered.active.tolist() == [False, False, True, True]
    assert filtered.informative.tolist() == [False, False, True, True]


def test_guard_intersects_the_callers_active_and_valid():
    r = torch.tensor([1.0, 0.0, 1.0, float("nan")], **f64)  # row 3 bad: group 1 inactive whatever the caller says
    m = M.clone()
    m[2] = 0  # row 2 has no token: never valid
    res = guard_batch(r, 2, token_logp=LP, mask=m, active=torch.tensor([True, False, True, True]),
                      valid=torch.tensor([True, False, True, True]))
    assert res.active.tolist() == [True, False, False, False]  # the caller's False stays, the bad group goes
    assert res.valid.tolist() == [True, False, False, True]  # the caller's False stays, the empty row goes
    assert res.rewards.tolist() == [1.0, 0.0, 1.0, 0.0] and res.rewards.dtype == torch.float64


def test_guard_and_estimate_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match=r"^rewards must have 1 dimension"):
        guard_batch(R[None], 2, token_logp=LP, mask=M)
    with pytest.raises(ValueError, match=r"^group_size must be >= 2, got 1"):  # a group of one has no baseline
        guard_batch(R, 1, token_logp=LP, mask=M)
    guarded = guard_batch(R, 2, token_logp=LP, mask=M)
    with pytest.raises(ValueError, match=r"^correct must have 1 dimension"):
        estimate("grpo", guarded, CORRECT[None], 2)
    # GRPO reads no verdicts, so only the step's own check sees verdicts of the wrong length
    with pytest.raises(ValueError, match=r"^correct has shape \(2,\) but rewards has shape \(4,\)"):
        estimate("grpo", guarded, CORRECT[:2], 2)


def test_noise_mask_reads_low_and_high_from_their_places():
    ref, _ = _tokens([-0.5, -0.5, -0.01, -2.0])  # PPL_ref = 1.65, 1.65, 1.01, 7.39
    guarded = guard_batch(R, 2, token_logp=LP, mask=M, ref_token_logp=ref)
    res = estimate("grpo", guarded, torch.tensor([False, False, True, True]), 2, mask_thresholds=(1.05, 2.5))
    # incorrect rows kept when PPL_ref >= low = 1.05 (1.65: kept; a low read as 2.5 would mask them);
    # correct rows kept when PPL_ref <= high = 2.5 (1.01 kept, 7.39 masked)
    assert res.keep.tolist() == [True, True, True, False]


def test_advantage_step_forwards_active_valid_and_inputs():
    res = advantage_step("grpo", R, CORRECT, 2, token_logp=LP, mask=M, active=torch.tensor([True, True, False, False]),
                         advantage_kwargs=NO_EPS)
    torch.testing.assert_close(res.advantages, torch.tensor([H, -H, 0.0, 0.0], **f64))
    res = advantage_step("grpo", R, CORRECT, 2, token_logp=LP, mask=M, valid=torch.tensor([True, True, True, False]),
                         advantage_kwargs=NO_EPS)
    torch.testing.assert_close(res.advantages, torch.tensor([H, -H, H, 0.0], **f64))
    # SEED-GRPO: group 0 gives one answer (SE 0: GRPO's advantage), group 1 two (SE = log 2 = SE_max: f = 1 - 1 = 0)
    res = advantage_step("seed_grpo", R, CORRECT, 2, token_logp=LP, mask=M,
                         inputs={"cluster_ids": torch.tensor([0, 0, 0, 1])}, advantage_kwargs=NO_EPS)
    torch.testing.assert_close(res.advantages, torch.tensor([H, -H, 0.0, 0.0], **f64))


def test_integer_rewards_are_refused_not_cast():
    # the guard's zero for bad rows takes the rewards' dtype: integer rewards stay integer and the estimator refuses
    # them (a float zero would have cast them to float32 silently)
    with pytest.raises(TypeError, match=r"^rewards must have a floating dtype"):
        advantage_step("grpo", torch.tensor([1, 0, 1, 0]), CORRECT, 2, token_logp=LP, mask=M)
    assert guard_batch(torch.tensor([1, 0, 1, 0]), 2, token_logp=LP, mask=M).rewards.dtype == torch.int64
