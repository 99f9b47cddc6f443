"""capo.rollout.step by hand: the noise-mask thresholds (fixed and quantile rules), the batch metrics
(``train/masked_frac``, ``train/filtered_frac``, ``calib/*`` from the right log-probs over the right rows) and the
step without log-probs. Found missing by mutation testing: these numbers reach every engine's logs."""

import math

import pytest
import torch

from capo.core import MASK_HIGH, MASK_LOW
from capo.errors import ConfigError
from capo.rollout.step import MaskThresholds, StepBatch, StepSpec, step_advantages

f64 = torch.float64


def per_row(values, t=2):
    """[N, T] log-probs whose mean over T tokens is ``values`` (every token the same)."""
    return torch.tensor(values, dtype=f64)[:, None].repeat(1, t)


def batch(**kw):
    # G = 2, two prompts; row lpm -0.1, -0.5, -0.2, -0.3; reference perplexities 1, 2, 3, 1.5
    base = dict(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=f64), group_size=2,
                mask=torch.ones(4, 2, dtype=torch.bool), correct=torch.tensor([True, False, True, False]),
                token_logp=per_row([-0.1, -0.5, -0.2, -0.3]),
                ref_token_logp=per_row([-math.log(v) for v in (1.0, 2.0, 3.0, 1.5)]))
    return StepBatch(**(base | kw))


def test_fixed_thresholds_and_masked_fraction():
    # keep = (right and PPL <= 2.5) or (wrong and PPL >= 1.8): rows 0 (right, 1) and 1 (wrong, 2) kept; row 2 (right,
    # 3 > 2.5) and row 3 (wrong, 1.5 < 1.8) masked -> 1/2
    spec = StepSpec("capo", mask=MaskThresholds("fixed", mask_low=1.8, mask_high=2.5, engine="t"))
    out = step_advantages(batch(), spec)
    assert out.thresholds == (1.8, 2.5)
    assert out.result.keep.tolist() == [True, True, False, False]
    assert out.metrics["train/masked_frac"] == 0.5
    # per verdict: correct rows 0 (kept), 2 (masked) -> 1/2; incorrect rows 1 (kept), 3 (masked) -> 1/2
    assert out.metrics["train/masked_frac_correct"] == 0.5 and out.metrics["train/masked_frac_incorrect"] == 0.5
    # over existing rows only: row 3 does not exist -> rows 0, 1 kept, row 2 masked: 1/3
    out = step_advantages(batch(valid=torch.tensor([True, True, True, False])), spec)
    assert out.metrics["train/masked_frac"] == pytest.approx(1 / 3, abs=1e-7)  # a float32 mean
    assert out.metrics["train/masked_frac_correct"] == 0.5 and out.metrics["train/masked_frac_incorrect"] == 0.0
    # no mask: no masked fraction at all
    assert "train/masked_frac" not in step_advantages(batch(), StepSpec("capo")).metrics


def test_quantile_thresholds_are_read_once_from_two_or_more_finite_perplexities():
    m = MaskThresholds("quantile", mask_q_low=0.2, mask_q_high=0.6, engine="t")
    assert m.value is None
    assert m.resolve(torch.tensor([1.0, math.nan])) is None and m.value is None  # one finite value: not yet
    # exactly two finite values: 2 and 4 -> linear quantiles 2 + 0.2 * 2 = 2.4 and 2 + 0.6 * 2 = 3.2
    assert m.resolve(torch.tensor([4.0, math.inf, 2.0])) == pytest.approx((2.4, 3.2), abs=1e-12)
    assert m.resolve(torch.tensor([10.0, 20.0, 30.0])) == pytest.approx((2.4, 3.2), abs=1e-12)  # frozen


def test_default_thresholds_and_knob_errors():
    assert MaskThresholds(engine="t").value == (MASK_LOW, MASK_HIGH)
    assert MaskThresholds(engine="t", mask_low=1.2, mask_high=1.9).value == (1.2, 1.9)
    with pytest.raises(ConfigError, match="t: noise_mask='median' is not allowed"):
        MaskThresholds("median", engine="t")
    with pytest.raises(ConfigError, match="t: need 0 < mask_low <= mask_high"):
        MaskThresholds(mask_low=3.0, mask_high=2.0, engine="t")
    with pytest.raises(ConfigError, match="t: need 0 <= mask_q_low <= mask_q_high <= 1"):
        MaskThresholds("quantile", mask_q_low=0.9, mask_q_high=0.1, engine="t")
    with pytest.raises(ConfigError, match="t: need 0 <= mask_q_low <= mask_q_high <= 1"):
        MaskThresholds("quantile", mask_q_low=0.1, mask_q_high=1.5, engine="t")
    with pytest.raises(ConfigError, match="t: CAPO's noise mask needs reference-model log-probs"):
        step_advantages(batch(ref_token_logp=None), StepSpec("capo", mask=MaskThresholds(engine="t"), engine="t"))
    with pytest.raises(ConfigError, match="t: noise_mask=off has no thresholds"):
        MaskThresholds("off", engine="t")


def test_noise_mask_thresholds_resolve_the_default_and_check_the_value_once():
    """The one way TRL and verl turn a noise_mask setting into the run's thresholds: unset = fixed for capo only."""
    from capo.rollout.step import noise_mask_thresholds

    assert noise_mask_thresholds("capo", None, engine="t").value == (MASK_LOW, MASK_HIGH)
    assert noise_mask_thresholds("grpo", None, engine="t") is None
    assert noise_mask_thresholds("capo", "off", engine="t") is None
    q = noise_mask_thresholds("grpo", "quantile", engine="t", mask_q_low=0.1, mask_q_high=0.9)
    assert (q.rule, q.q_low, q.q_high, q.value) == ("quantile", 0.1, 0.9, None)
    with pytest.raises(ConfigError, match=r"^t: x.noise_mask=True is the old spelling.*x.noise_mask=fixed"):
        noise_mask_thresholds("grpo", True, engine="t", key="x.noise_mask")
    with pytest.raises(ConfigError, match=r"^t: noise_mask='on' is not allowed; allowed values: off, fixed, quantile"):
        noise_mask_thresholds("capo", "on", engine="t")


def test_filtered_fraction_counts_rows_of_all_equal_groups():
    out = step_advantages(batch(rewards=torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=f64),
                                correct=torch.tensor([True, True, True, False])), StepSpec("grpo", group_filter=True))
    assert out.metrics["train/filtered_frac"] == 0.5  # the first group is all right
    out = step_advantages(batch(rewards=torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=f64),
                                correct=torch.tensor([True, True, False, False])), StepSpec("grpo", group_filter=True))
    assert out.metrics["train/filtered_frac"] == 1.0
    assert "train/filtered_frac" not in step_advantages(batch(), StepSpec("grpo")).metrics


def test_the_group_filter_compares_the_verdicts_unless_told_the_rewards():
    """DAPO eq. 11 keeps a group with 0 < #correct < G. An all-wrong group whose rewards differ only by an overlong
    penalty (0 and -0.75) is dropped by the verdicts, kept by the rewards (where its advantages pushed the wrong
    answer without the penalty up)."""
    b = batch(rewards=torch.tensor([0.0, -0.75, 1.0, 0.0], dtype=f64),
              correct=torch.tensor([False, False, True, False]))
    by_verdict = step_advantages(b, StepSpec("grpo", group_filter=True))
    assert by_verdict.metrics["train/filtered_frac"] == 0.5
    assert by_verdict.result.advantages[:2].tolist() == [0.0, 0.0]
    by_reward = step_advantages(b, StepSpec("grpo", group_filter=True, group_filter_by="reward"))
    assert by_reward.metrics["train/filtered_frac"] == 0.0 and float(by_reward.result.advantages[0]) > 0
    with pytest.raises(ConfigError, match="group filter by correctness needs the verdicts.*algo.group_filter_by=reward"):
        step_advantages(batch(correct=None), StepSpec("grpo", group_filter=True, engine="t"))


def test_a_batch_without_verdicts_is_refused_where_they_are_read():
    """CAPO's pairs and the noise mask's thresholds are chosen by the verdicts: a batch without them (correct=None)
    is refused by name, where it gave CAPO all-zero advantages (every response "incorrect": no pair) and masked every
    row as incorrect, without a word. An estimator that reads no verdict (GRPO) takes the batch as before."""
    for spec, who in ((StepSpec("capo", engine="t"), "the estimator 'capo'"),
                      (StepSpec("grpo", engine="t", mask=MaskThresholds("fixed", engine="t")), "CAPO's noise mask")):
        with pytest.raises(ConfigError, match=f"t: {who} reads the verifier's verdicts .* give StepBatch\\(correct="):
            step_advantages(batch(correct=None), spec)
    assert step_advantages(batch(correct=None), StepSpec("grpo")).result.advantages.tolist() == \
        step_advantages(batch(), StepSpec("grpo")).result.advantages.tolist()


def calib_batch(**kw):
    # three prompts: the confidence log-probs rank prompt 1 the other way round from the token log-probs; prompt 2's
    # right answer has a non-finite confidence lpm (left out of calib/*)
    return batch(**(dict(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], dtype=f64),
                         mask=torch.ones(6, 2, dtype=torch.bool), correct=torch.tensor([True, False, True, False, True, False]),
                         token_logp=per_row([-0.1, -0.5, -0.2, -0.3, -0.6, -0.7]), ref_token_logp=None) | kw))


def test_calibration_metrics_read_the_confidence_log_probs_over_finite_rows():
    conf = per_row([-0.1, -0.5, -0.4, -0.3, -math.inf, -0.2])
    out = step_advantages(calib_batch(confidence_logp=conf), StepSpec("grpo"))
    m = out.metrics
    # rows 0-3 and 5: right 0, 2; AUC prompt 0 = 1 (-0.1 > -0.5), prompt 1 = 0 (-0.4 < -0.3), prompt 2 one class
    assert m["calib/accuracy"] == pytest.approx(2 / 5, abs=1e-12)
    assert m["calib/auc_mean"] == 0.5 and m["calib/auc_mean_groups"] == 1 * 2
    lpm, c = torch.tensor([-0.1, -0.5, -0.4, -0.3, -0.2], dtype=f64), torch.tensor([1.0, 0, 1, 0, 0], dtype=f64)
    assert m["calib/brier"] == pytest.approx(float(((lpm.exp() - c) ** 2).mean()), abs=1e-12)
    # without confidence_logp the token log-probs are the confidence: prompt 1 ranks right, prompt 2 too -> 1.0
    m = step_advantages(calib_batch(), StepSpec("grpo")).metrics
    assert m["calib/accuracy"] == 0.5 and m["calib/auc_mean"] == 1.0 and m["calib/auc_mean_groups"] == 3


def test_calibration_metrics_with_verbal_confidence_and_when_off():
    verbal = torch.tensor([0.9, 0.2, math.nan, 0.4, 0.7, 0.1], dtype=f64)
    m = step_advantages(calib_batch(confidence=verbal), StepSpec("grpo")).metrics
    assert m["calib/verbal_missing"] == 1
    assert m["calib/verbal_brier"] == pytest.approx((0.1**2 + 0.2**2 + 0.4**2 + 0.3**2 + 0.1**2) / 5, abs=1e-12)
    assert not any(k.startswith("calib/") for k in step_advantages(calib_batch(), StepSpec("grpo", calibration=False)).metrics)
    assert not any(k.startswith("calib/") for k in step_advantages(calib_batch(correct=None), StepSpec("grpo")).metrics)
    # every lpm non-finite: nothing to summarise
    none = step_advantages(calib_batch(confidence_logp=per_row([-math.inf] * 6)), StepSpec("grpo")).metrics
    assert not any(k.startswith("calib/") for k in none)


def test_step_without_log_probs():
    # no token log-probs: lpm is 0 for every row (float64), GRPO still runs, no calib/*
    out = step_advantages(batch(token_logp=None, ref_token_logp=None), StepSpec("grpo", advantage_kwargs={"eps": 1e-300}))
    assert out.result.scores.dtype == f64 and out.result.scores.tolist() == [0.0] * 4
    assert out.result.advantages.tolist() == pytest.approx([2 ** -0.5, -(2 ** -0.5)] * 2, abs=1e-12)
    assert out.metrics == {}


def test_quantile_mask_reads_the_existing_rows_reference_perplexities():
    # existing rows 0-2 have reference perplexities 1, 2, 3 -> quantiles 0.25 / 0.75 = 1.5 / 2.5 (row 3's 1.5 would
    # move them to 1.375 / 2.25)
    spec = StepSpec("capo", mask=MaskThresholds("quantile", mask_q_low=0.25, mask_q_high=0.75, engine="t"))
    out = step_advantages(batch(valid=torch.tensor([True, True, True, False])), spec)
    assert out.thresholds == pytest.approx((1.5, 2.5), abs=1e-12)


def test_loss_inputs_get_the_guarded_rewards():
    # C2GSPG's loss reads the rewards: a non-finite reward is 0 there, as for the estimator
    rewards = torch.tensor([1.0, 0.0, 1.0, math.nan], dtype=f64)
    out = step_advantages(batch(rewards=rewards), StepSpec("grpo", loss="c2gspg"))
    assert out.loss_inputs["rewards"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert step_advantages(batch(), StepSpec("grpo", loss="ppo_clip")).loss_inputs == {}
