"""The one CAPO-input step (capo.core.step) and the CAPO wrong results fixed with it, with hand-computed values.

Each test here fails on the code before it: CAPO thresholded the reward at 0.5 to decide correctness, the
pairs normaliser counted dropped pairs, and rows without tokens or without a reward still acted as partners.
"""

import math

import pytest
import torch

from capo.core import REWARDS, advantage_step, calibration_metrics, capo_advantage
from capo.core.calibration import summarize

f64 = dict(dtype=torch.float64)


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _tokens(lpm, t=4):
    """[N, T] token log-probs whose per-row mean over a full mask is ``lpm``."""
    return torch.tensor(lpm, **f64)[:, None].expand(-1, t).clone(), torch.ones(len(lpm), t)


def test_capo_with_rlcr_reward_uses_verdicts_not_the_reward():
    """A correct answer with confidence q = 0.2 gets RLCR reward 1 - 0.8^2 = 0.36 < 0.5: it must still be in P."""
    correct = torch.tensor([True, False])
    r = REWARDS.get("rlcr")(correct, confidence=torch.tensor([0.2, 0.9]), format_ok=torch.tensor([True, True]))
    r = r.double()
    assert r[0].item() == pytest.approx(0.36) and r[1].item() == pytest.approx(-0.81)
    lp, m = _tokens([-1.0, -0.5])
    res = advantage_step("capo", r, correct, 2, token_logp=lp, mask=m, advantage_kwargs={"tau": 0.5})
    w = sig((-0.5 - -1.0) / 0.5) / 0.5  # (1/tau) sigmoid((lpm_j - lpm_i)/tau), i correct, j incorrect
    torch.testing.assert_close(res.advantages, torch.tensor([w / 2, -w / 2], **f64), rtol=0, atol=1e-12)


def test_capo_refuses_to_threshold_a_non_binary_reward():
    with pytest.raises(ValueError, match="needs the verifier's verdicts"):
        capo_advantage(torch.tensor([0.36, -0.81], **f64), 2, scores=torch.tensor([-1.0, -0.5], **f64))


def test_capo_overlong_penalty_does_not_flip_a_correct_answer():
    """Correct answer with a DAPO overlong penalty of -1 (reward 0) stays correct; the wrong one stays wrong."""
    r = torch.tensor([0.0, 0.0, 1.0, 0.0], **f64)  # row 0: correct (1) + overlong penalty (-1)
    correct = torch.tensor([True, False, True, False])
    s = torch.tensor([-1.0, -1.0, -1.0, -1.0], **f64)
    a = capo_advantage(r, 4, scores=s, correct=correct, surrogate="linear")
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, 0.5, -0.5], **f64))


def test_pairs_norm_counts_only_the_pairs_summed_when_partners_are_dropped():
    """P = {0, 1}, N = {2, 3}, row 3 masked and dropped: the pairs are (0,2), (1,2) -> Z = 2, not |P||N| = 4."""
    r = torch.tensor([1.0, 1.0, 0.0, 0.0], **f64)
    keep = torch.tensor([True, True, True, False])
    a = capo_advantage(r, 4, scores=torch.zeros(4, **f64), keep=keep, surrogate="linear", norm="pairs",
                       masked_partners="drop")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.5, -1.0, 0.0], **f64))
    # without dropping, all 4 pairs count
    a = capo_advantage(r, 4, scores=torch.zeros(4, **f64), keep=keep, surrogate="linear", norm="pairs")
    torch.testing.assert_close(a, torch.tensor([0.5, 0.5, -0.5, 0.0], **f64))


def test_non_partner_rows_take_part_in_no_pair():
    """Row 2 was scored by no reward function: not a partner, zero advantage, whatever masked_partners says."""
    r = torch.tensor([1.0, 0.0, 0.0], **f64)
    s = torch.tensor([-1.0, -2.0, 0.0], **f64)  # row 2 would be the most confident wrong answer
    partners = torch.tensor([True, True, False])
    a = capo_advantage(r, 3, scores=s, tau=1.0, partners=partners)
    w01 = sig(-2.0 - -1.0)
    torch.testing.assert_close(a, torch.tensor([w01 / 3, -w01 / 3, 0.0], **f64), rtol=0, atol=1e-12)


def test_step_drops_rows_without_tokens_as_partners():
    """A truncated completion masked to zero tokens has lpm 0 (the highest confidence): the step drops it."""
    lp, m = _tokens([-1.0, -2.0, -3.0])
    m[2] = 0  # e.g. TRL's mask_truncated_completions
    r = torch.tensor([1.0, 0.0, 0.0], **f64)
    res = advantage_step("capo", r, r == 1, 3, token_logp=lp, mask=m, advantage_kwargs={"tau": 1.0})
    assert res.valid.tolist() == [True, True, False]
    w01 = sig(-2.0 - -1.0)
    torch.testing.assert_close(res.advantages, torch.tensor([w01 / 3, -w01 / 3, 0.0], **f64), rtol=0, atol=1e-12)


def test_step_noise_mask_and_guard():
    """Noise mask from reference log-probs; a NaN reward deactivates its whole group; hand-computed keep."""
    lp, m = _tokens([-1.0, -2.0, -1.5, -0.5])
    ref, _ = _tokens([-0.01, -0.01, -2.0, -0.5])  # PPL_ref = e^0.01 ~ 1.01, 1.01, e^2 ~ 7.4, e^0.5 ~ 1.65
    r = torch.tensor([1.0, 0.0, float("nan"), 1.0], **f64)
    correct = torch.tensor([True, False, False, True])
    res = advantage_step("capo", r, correct, 2, token_logp=lp, mask=m, ref_token_logp=ref,
                         mask_thresholds=(1.05, 2.5), advantage_kwargs={"tau": 1.0})
    # row 1: incorrect with PPL_ref 1.01 < low -> "near-correct", masked; row 0 kept (correct, 1.01 <= 2.5)
    assert res.keep.tolist() == [True, False, True, True]  # row 2: incorrect, PPL_ref 7.4 >= low: kept
    assert res.bad.tolist() == [False, False, True, False] and res.active.tolist() == [True, True, False, False]
    w01 = sig(-2.0 - -1.0)
    torch.testing.assert_close(res.advantages, torch.tensor([w01 / 2, 0.0, 0.0, 0.0], **f64), rtol=0, atol=1e-12)
    torch.testing.assert_close(res.ref_ppl, torch.exp(torch.tensor([0.01, 0.01, 2.0, 0.5], **f64)))


def test_step_passes_non_capo_estimators_their_inputs_unchanged():
    lp, m = _tokens([-1.0, -2.0, -1.5, -0.5])
    r = torch.tensor([0.3, 0.9, 0.1, 0.2], **f64)
    res = advantage_step("grpo", r, torch.zeros(4, dtype=torch.bool), 4, token_logp=lp, mask=m, advantage_kwargs={"eps": 1e-300})
    torch.testing.assert_close(res.advantages, (r - r.mean()) / r.std())


def test_calibration_metrics_are_summarize_under_calib_names():
    gen = torch.Generator().manual_seed(0)
    s = -torch.rand(12, generator=gen, **f64)
    c = torch.rand(12, generator=gen) > 0.5
    gid = torch.arange(12) // 4
    conf = torch.rand(12, generator=gen, **f64)
    conf[3] = float("nan")
    m = calibration_metrics(s, c, gid, verbal_conf=conf)
    ref = summarize(s, c, gid, verbal_conf=conf)
    assert set(m) == {f"calib/{k}" for k in ("accuracy", "auc_mean", "auc_mean_groups", "auroc", "ece", "brier",
                                               "verbal_ece", "verbal_brier", "verbal_auroc", "verbal_auc_mean",
                                               "verbal_missing")}
    for k, v in m.items():
        assert v == ref[k.removeprefix("calib/")]
    assert m["calib/verbal_missing"] == 1.0


def test_what_an_estimator_reads_is_its_registry_declaration():
    """needs_scores and the inputs the step passes are the ``reads=`` declarations, and every declaration is
    complete: an estimator parameter that names a per-response input (other than ``scores``/``keep``, which every
    estimator takes) is declared. A new estimator is registered once."""
    import inspect

    from capo.core import ADVANTAGES, STEP_INPUTS, needs_scores

    assert {n for n in ADVANTAGES.names() if needs_scores(n)} == {"capo", "unlikeliness"}
    assert ADVANTAGES.reads("capo") == {"scores", "correct", "partners", "lengths"}
    assert {n: set(ADVANTAGES.reads(n)) for n in ("ace", "seed_grpo", "gdpo")} == {
        "ace": {"confidence_shift"}, "seed_grpo": {"cluster_ids"}, "gdpo": {"components"}}
    for name in ADVANTAGES.names():
        named = set(inspect.signature(ADVANTAGES.get(name)).parameters) & set(STEP_INPUTS) - {"scores", "keep"}
        assert named <= ADVANTAGES.reads(name), name
        if not needs_scores(name):  # the others accept and ignore scores
            r = torch.tensor([1.0, 0.0, 0.0, 1.0], **f64)
            kw = {"components": r[:, None]} if name == "gdpo" else {"cluster_ids": torch.arange(4)} \
                if name == "seed_grpo" else {"confidence_shift": torch.zeros(4, **f64)} if name == "ace" else {}
            a = ADVANTAGES.get(name)(r, 2, **kw)
            torch.testing.assert_close(ADVANTAGES.get(name)(r, 2, scores=-torch.arange(4, **f64), **kw), a)


def test_the_step_passes_only_declared_inputs(monkeypatch):
    """An estimator that declares no input gets none of the step's own (correct, partners, lengths), whatever its
    signature names: the declaration, not the signature, decides."""
    from capo.core import registry

    seen = {}

    def probe(rewards, group_size, *, scores=None, keep=None, correct=None, lengths=None):
        seen.update(correct=correct, lengths=lengths)
        return torch.zeros_like(rewards)

    monkeypatch.setitem(registry.ADVANTAGES._fns, "probe", probe)
    monkeypatch.setitem(registry.ADVANTAGES._reads, "probe", frozenset({"lengths"}))
    r = torch.tensor([1.0, 0.0], **f64)
    advantage_step("probe", r, r == 1, 2, token_logp=torch.zeros(2, 3, **f64), mask=torch.ones(2, 3))
    assert seen["correct"] is None and seen["lengths"].tolist() == [3, 3]


def test_the_steps_old_keyword_names_say_the_new_ones():
    from capo.core import estimate, guard_batch
    from capo.rollout.method_inputs import StepSpec

    r = torch.tensor([1.0, 0.0], **f64)
    lp, m = torch.zeros(2, 3, **f64), torch.ones(2, 3)
    with pytest.raises(TypeError, match=r"^advantage_step: 'hparams' is now called 'advantage_kwargs'"):
        advantage_step("grpo", r, r == 1, 2, token_logp=lp, mask=m, hparams={"eps": 1e-300})
    g = guard_batch(r, 2, token_logp=lp, mask=m)
    with pytest.raises(TypeError, match=r"^estimate: 'hparams' is now called 'advantage_kwargs'"):
        estimate("grpo", g, r == 1, 2, hparams={"eps": 1e-300})
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'advantage'"):  # Python names it
        estimate(estimator="grpo", guarded=g, correct=r == 1, group_size=2)
    with pytest.raises(TypeError, match=r"^estimate\(\) got an unexpected keyword argument 'nope'"):
        estimate("grpo", g, r == 1, 2, nope=1)
    with pytest.raises(TypeError, match=r"^StepSpec: 'estimator' is now called 'advantage'"):
        StepSpec(estimator="grpo")
    with pytest.raises(TypeError, match=r"^StepSpec: 'hparams' is now called 'advantage_kwargs'"):
        StepSpec("grpo", hparams={})
    assert StepSpec(advantage="capo", advantage_kwargs={"tau": 1.0}).advantage_kwargs == {"tau": 1.0}


def test_advantage_kwargs_are_checked_once_by_the_estimator_itself():
    """The early check every path runs (trainer, TRL, verl) refuses unknown names and the values the estimator's own
    checks refuse (CAPO's tau > 0 lives only in capo_advantage), naming the setting as the engine spells it."""
    from capo.core import ADVANTAGES, advantage_kwargs_problem, hyperparameters

    assert hyperparameters("capo") == ["tau", "surrogate", "norm", "masked_partners", "score"]
    assert all(advantage_kwargs_problem(n, {}) is None for n in ADVANTAGES.names())
    assert advantage_kwargs_problem("capo", {"tau": 0}, key="algo.advantage_kwargs") == \
        "algo.advantage_kwargs.tau must be > 0, got 0"
    assert advantage_kwargs_problem("capo", {"tau": -1.0}).startswith("advantage_kwargs.tau must be > 0")
    assert advantage_kwargs_problem("capo", {"tau": 0.6, "score": "sum"}) is None
    assert advantage_kwargs_problem("capo", {"lengths": 1}) == ("advantage_kwargs: advantage estimator 'capo' has no "
                                                                "hyperparameter 'lengths'; allowed: tau, surrogate, "
                                                                "norm, masked_partners, score")
    assert advantage_kwargs_problem("seed_grpo", {"alpha": 2.0}).startswith("advantage_kwargs.alpha must be <= 1")
    assert advantage_kwargs_problem("gdpo", {"weights": [1.0, 0.5]}) is None  # two components probed for two weights
    # eps = 0 would turn a group whose rewards are all equal into 0 / 0 = NaN: refused for every std-scaled estimator
    for name in ("grpo", "ace", "seed_grpo", "unlikeliness", "ngrpo", "gdpo"):
        assert advantage_kwargs_problem(name, {"eps": 0.0}) == "advantage_kwargs.eps must be > 0, got 0.0", name


def test_mask_rules():
    """One list of mask values, one default and its knob ranges (trainer, TRL, verl read these)."""
    from capo.core import (NOISE_MASKS, default_noise_mask, mask_knob_problem, noise_mask_problem,
                           resolve_noise_mask)
    from capo.core.presets import ALGORITHMS

    assert NOISE_MASKS == ("off", "fixed", "quantile")
    assert {n: default_noise_mask(n) for n in ALGORITHMS if default_noise_mask(n) != "off"} == {"capo": "fixed"}
    assert resolve_noise_mask("grpo", "quantile") == "quantile" and resolve_noise_mask("capo", "off") == "off"
    assert resolve_noise_mask("capo", None) == "fixed" and resolve_noise_mask("grpo", None) == "off"
    assert all(noise_mask_problem(v) is None for v in NOISE_MASKS)
    assert noise_mask_problem("quantil", key="algo.noise_mask") == (
        "algo.noise_mask='quantil' is not allowed (did you mean 'quantile'?); allowed values: off, fixed, quantile")
    assert noise_mask_problem(True).startswith("noise_mask=True is the old spelling") and \
        "noise_mask=fixed" in noise_mask_problem(True) and "noise_mask=off" in noise_mask_problem(False)
    assert mask_knob_problem(1.05, 2.5) is None and mask_knob_problem(1.0, 1.0, 0.5, 0.5) is None
    assert mask_knob_problem(0.0, 2.5, prefix="algo.") == "need 0 < algo.mask_low <= algo.mask_high, got 0.0, 2.5"
    assert mask_knob_problem(3.0, 2.5) == "need 0 < mask_low <= mask_high, got 3.0, 2.5"
    assert mask_knob_problem(1.0, 2.0, 0.8, 0.2) == "need 0 <= mask_q_low <= mask_q_high <= 1, got 0.8, 0.2"
    assert mask_knob_problem(1.0, 2.0, 0.1, 1.2) is not None and mask_knob_problem(1.0, 2.0, -0.1, 0.5) is not None


def test_guard_keeps_raw_scores_and_applies_the_group_filter():
    """guard_batch computes each lpm once (raw, NaN kept for the caller's report); the estimator sees 0 there.
    The group filter drops groups whose (guarded) rewards are all equal."""
    from capo.core import estimate, guard_batch

    lp, m = _tokens([-1.0, float("nan"), -1.5, -0.5, -2.0, -0.2])
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], **f64)
    g = guard_batch(r, 2, token_logp=lp, mask=m, group_filter=True)
    assert g.advantages is None and math.isnan(float(g.scores[1])) and g.bad.tolist() == [0, 1, 0, 0, 0, 0]
    assert g.informative.tolist() == [True, True, False, False, True, True]
    assert g.active.tolist() == [False, False, False, False, True, True]
    res = estimate("grpo", g, r == 1, 2)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # the active group {0, 1}: (r - mean) / (std with ddof 1 + eps)
    torch.testing.assert_close(res.advantages, torch.tensor([0.0, 0.0, 0.0, 0.0, -a, a], **f64), rtol=0, atol=1e-12)


def test_step_supplies_lengths_for_capo_sum():
    """The step hands CAPO the real-token counts of each row (from the mask), so ``score="sum"`` ranks by the
    whole-sequence log-prob sum_t log pi: equal to the core estimator on sequence_logprob_sum's scores."""
    from capo.core import compute_advantages, sequence_logprob_sum

    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    lp = torch.tensor([[-0.5, -0.5, 9, 9], [-0.25] * 4, [-2.0, 9, 9, 9], [-0.1, -0.2, -0.3, 9]], **f64)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], **f64)
    res = advantage_step("capo", r, r == 1, 2, token_logp=lp, mask=mask, advantage_kwargs={"tau": 1.0, "score": "sum"})
    assert res.lengths.tolist() == [2, 4, 1, 3]
    sums = sequence_logprob_sum(lp, mask)  # -1, -1, -2, -0.6
    want = compute_advantages("capo", r, 2, scores=sums, tau=1.0)
    torch.testing.assert_close(res.advantages, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.advantages[:2], torch.tensor([0.25, -0.25], **f64), rtol=0, atol=1e-12)
