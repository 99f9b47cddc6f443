"""The same batch through capo's trainer, the TRL adapter and the verl plugin: equal advantages and equal calib/*.

Runs in the main environment: the verl plugin's estimator function is called directly with a stand-in for verl's
DataProto (the plugin imports without verl); tests/adapters/test_verl.py runs it inside verl itself.
"""

from __future__ import annotations

import types

import pytest
import torch

from capo.core import REWARDS, capo_noise_mask, compute_advantages, sequence_logprob_mean
from _tiny import VerlProto  # tests/adapters is on sys.path (conftest.py)

B, G, T = 3, 4, 5
LOW, HIGH = 1.3, 1.9  # fixed mask thresholds inside this batch's PPL_ref range (some rows masked, most kept)


def _batch():
    """RLCR rewards from verdicts and verbal confidences, rollout/ref token log-probs, ragged masks."""
    gen = torch.Generator().manual_seed(11)
    n = B * G
    correct = torch.tensor([1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1], dtype=torch.bool)
    conf = torch.tensor([0.2, 0.9, 0.8, 0.1, 0.5, 0.9, 0.7, float("nan"), 0.3, 0.6, 0.2, 0.9], dtype=torch.float64)
    fmt = ~torch.isnan(conf)
    rewards = REWARDS.get("rlcr")(correct, confidence=conf.float(), format_ok=fmt).double()
    lengths = torch.randint(1, T + 1, (n,), generator=gen)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    lp = -torch.rand(n, T, generator=gen, dtype=torch.float64) * 2 * mask
    ref = -torch.rand(n, T, generator=gen, dtype=torch.float64) * 1.2 * mask
    return correct, conf, fmt, rewards, mask, lp, ref


def _trainer_path(est, hp, correct, conf, fmt, rewards, mask, lp, ref):
    """capo's trainer: Trainer.advantages (verdicts from the grader), its noise mask on (any estimator)."""
    from accelerate import Accelerator

    from capo.trainer.loop import Trainer
    from capo.verify import Verdict

    algo = types.SimpleNamespace(advantage=est, advantage_kwargs=hp, noise_mask="fixed", group_filter=False, group_filter_by=None,
                                 reward="rlcr", reward_kwargs={}, loss="ppo_clip")
    cfg = types.SimpleNamespace(algo=algo, rollout=types.SimpleNamespace(group_size=G),
                                run=types.SimpleNamespace(on_bad_sample="skip"),
                                data=types.SimpleNamespace(answer_format="rlcr"))
    self = types.SimpleNamespace(cfg=cfg, acc=Accelerator(cpu=True), mask_thresholds=(LOW, HIGH), step=0,
                                 verifier=None)
    for name in ("_step_spec", "_check_bad", "_mean"):
        setattr(self, name, types.MethodType(getattr(Trainer, name), self))
    ro = types.SimpleNamespace(gen_logp=lp, response_mask=mask, lengths=mask.sum(-1), truncated=torch.zeros(len(lp)),
                               texts=[""] * len(lp))
    verdicts = [Verdict.CORRECT if c else Verdict.INCORRECT for c in correct.tolist()]
    g = types.SimpleNamespace(correct=correct, confidence=conf, format_ok=fmt, reward_errors=0, verdicts=verdicts,
                              answers=[None] * len(correct))
    batch, stats = Trainer.advantages(self, ro, g, rewards, ref, None)
    return batch.advantages, {k: v for k, v in stats.items() if k.startswith("calib/")}


def _trl_path(est, hp, correct, conf, fmt, rewards, mask, lp, ref):
    """The TRL adapter: its mask rule and step inputs on the gathered batch (what _generate_and_score_completions
    calls), with the mask switched on explicitly (needed for a non-capo estimator)."""
    pytest.importorskip("trl")
    from accelerate import Accelerator

    from capo.adapters import trl
    from capo.rollout.step import StepBatch, step_advantages

    cfg = trl.CapoAdvantageConfig(advantage=est, advantage_kwargs=hp, noise_mask="fixed", mask_low=LOW, mask_high=HIGH)
    self = types.SimpleNamespace(capo=cfg, reward_funcs=[], reward_weights=torch.ones(1),
                                 accelerator=Accelerator(cpu=True), _capo_thresholds=trl.mask_thresholds(cfg))
    batch = StepBatch(rewards=rewards, group_size=G, mask=mask, correct=correct, token_logp=lp, ref_token_logp=ref,
                      valid=torch.ones_like(correct), confidence=conf)
    step = step_advantages(*trl.CapoGRPOTrainer._capo_step_inputs(self, rewards[:, None], batch))
    return step.result.advantages, {k: v for k, v in step.metrics.items() if k.startswith("calib/")}


def _verl_path(est, hp, correct, conf, fmt, rewards, mask, lp, ref):
    """The verl plugin's registered estimator on verl's tensors; rows shuffled as verl does, verdicts and
    confidences from the reward function's dict (legacy trainer: non_tensor_batch); the mask switched on."""
    import numpy as np

    from capo.adapters import verl_plugin as vp

    perm = torch.randperm(len(lp), generator=torch.Generator().manual_seed(0))
    tok_rewards = torch.zeros(len(lp), T)
    tok_rewards[torch.arange(len(lp)), mask.sum(-1) - 1] = rewards.float()
    data = VerlProto({"old_log_probs": lp[perm].float(), "ref_log_prob": ref[perm].float()},
                     {"correct": correct[perm].float().numpy().astype(object),
                      "confidence": conf[perm].numpy().astype(object)})
    ctx = vp.BatchContext(data, run=vp.CapoRun(), temperature=data.meta_info["temperature"])
    uid = np.array([f"u{i // G}" for i in range(len(lp))], dtype=object)[perm.numpy()]
    cfg = {"capo": {"advantage_kwargs": hp, "noise_mask": "fixed", "mask_low": LOW, "mask_high": HIGH}}
    with vp.batch_context(ctx):
        adv, _ = vp.ESTIMATOR_FNS["capo" if est == "capo" else f"capo_{est}"](
            tok_rewards[perm], mask[perm].float(), index=uid, config=cfg)
    out = torch.empty(len(lp), dtype=torch.float64)
    out[perm] = adv.double().sum(-1) / mask[perm].sum(-1)
    return out, {k: v for k, v in ctx.metrics.items() if k.startswith("calib/")}


@pytest.mark.parametrize("est,hp", [("capo", {"tau": 0.6}), ("capo", {"tau": 1.0, "score": "sum"}), ("grpo", {})])
def test_trainer_trl_verl_same_advantages_and_calibration_metrics(est, hp):
    """CAPO, CAPO's whole-sequence variant (capo_sum's knobs; this batch's responses have 1-5 tokens) and GRPO +
    CAPO's mask (the paper's ablation): the three paths give the same advantages, equal to the core estimator with
    the mask computed by hand, and the same calib/*."""
    batch = _batch()
    correct, conf, _, rewards, mask, lp, ref = batch
    assert ((rewards < 0.5) & correct).any(), "a correct answer with a low RLCR reward must be in the batch"
    keep = capo_noise_mask(torch.exp(-sequence_logprob_mean(ref, mask)), correct, low=LOW, high=HIGH)
    assert 0 < int((~keep).sum()) < len(keep) // 2, "the mask must drop some rows, not most"
    kw = {"scores": sequence_logprob_mean(lp, mask), "correct": correct} if est == "capo" else {}
    if hp.get("score") == "sum":
        kw["lengths"] = mask.sum(-1)
        assert len(set(kw["lengths"].tolist())) > 2, "the lengths must differ within groups"
    want = compute_advantages(est, rewards, G, keep=keep, **kw, **hp)
    assert (want - compute_advantages(est, rewards, G, **kw, **hp)).abs().max() > 1e-3, "the mask must matter here"
    a_tr, m_tr = _trainer_path(est, hp, *batch)
    a_trl, m_trl = _trl_path(est, hp, *batch)
    a_verl, m_verl = _verl_path(est, hp, *batch)
    torch.testing.assert_close(a_tr.double(), want, rtol=0, atol=1e-12)
    assert (a_tr[~keep] == 0).all()
    torch.testing.assert_close(a_trl, a_tr.double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(a_verl, a_tr.double(), rtol=0, atol=1e-6)  # verl holds float32 tensors
    assert set(m_tr) == set(m_trl) == set(m_verl) and "calib/verbal_brier" in m_tr
    for k in m_tr:
        assert m_trl[k] == pytest.approx(m_tr[k], abs=1e-12, nan_ok=True), k
        assert m_verl[k] == pytest.approx(m_tr[k], abs=1e-6, nan_ok=True), k


def test_mask_is_on_by_default_for_capo_only_on_every_path():
    """One rule (capo.core.default_noise_mask): unset means fixed for capo, off for grpo; an explicit setting wins,
    spelled with the trainer's values on every path."""
    pytest.importorskip("trl")
    from capo.adapters.trl import CapoAdvantageConfig, mask_thresholds
    from capo.adapters.verl_plugin.estimators import _options
    from capo.core import default_noise_mask

    for est, default in (("capo", "fixed"), ("grpo", "off"), ("unlikeliness", "off")):
        other = "off" if default == "fixed" else "quantile"
        assert default_noise_mask(est) == default
        assert CapoAdvantageConfig(advantage=est).uses_mask() is (default != "off")
        assert _options({}, est, None)[0]["noise_mask"] == default
        assert CapoAdvantageConfig(advantage=est, noise_mask=other).uses_mask() is (other != "off")
        assert _options({"noise_mask": other}, est, None)[0]["noise_mask"] == other
        m = mask_thresholds(CapoAdvantageConfig(advantage=est, noise_mask=other))
        assert (m is None) if other == "off" else (m.rule == other)


def test_trl_config_old_names_say_the_new_ones():
    """CapoAdvantageConfig speaks the trainer's vocabulary; each old keyword raises naming its replacement."""
    pytest.importorskip("trl")
    from capo.adapters.trl import CapoAdvantageConfig, mask_thresholds
    from capo.errors import ConfigError

    for old, new in (("estimator", "advantage"), ("estimator_kwargs", "advantage_kwargs"), ("mask_rule", "noise_mask")):
        with pytest.raises(TypeError, match=rf"^CapoAdvantageConfig: '{old}' is now called '{new}'"):
            CapoAdvantageConfig(**{old: "capo" if old != "estimator_kwargs" else {}})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bogus'"):
        CapoAdvantageConfig(bogus=1)
    for old, new in ((True, "fixed"), (False, "off")):
        with pytest.raises(ConfigError, match=rf"^CapoGRPOTrainer: noise_mask={old} is the old spelling.*"
                                              rf"noise_mask={new}"):
            mask_thresholds(CapoAdvantageConfig(noise_mask=old))


def test_verl_run_state_belongs_to_the_trainer_object():
    """The verl plugin keeps no state in its modules: each verl trainer object owns one CapoRun (mask thresholds,
    verifier); the legacy trainer's fit makes it current for the duration of training, and only then."""
    from capo.adapters.verl_plugin import CapoRun
    from capo.adapters.verl_plugin.patch import _wrap_fit

    class FakeTrainer:
        pass

    fit = _wrap_fit(lambda self: CapoRun.current())
    a, b = FakeTrainer(), FakeTrainer()
    assert fit(a) is CapoRun.of(a) and fit(b) is CapoRun.of(b) and CapoRun.of(a) is not CapoRun.of(b)
    assert CapoRun.current() is None
    opts = {"noise_mask": "quantile", "mask_low": 1.05, "mask_high": 2.5, "mask_q_low": 0.25, "mask_q_high": 0.75}
    m = CapoRun.of(a).mask(opts, engine="e")
    assert CapoRun.of(a).mask(opts, engine="e") is m and CapoRun.of(b).mask(opts, engine="e") is not m
    assert m.resolve(torch.tensor([1.0, 2.0, 3.0, 4.0])) == (1.75, 3.25) and m.value == (1.75, 3.25)
    assert m.resolve(torch.tensor([9.0, 9.5])) == (1.75, 3.25)  # frozen on the run's first batch


def test_trl_quantile_thresholds_freeze_on_the_first_training_batch_not_an_eval_one():
    """`eval_on_start` runs an eval batch through the same step before any training batch: it reads its own
    quantiles without freezing them; the first training batch sets the run's, which later eval batches use."""
    pytest.importorskip("trl")
    from accelerate import Accelerator

    from capo.adapters import trl
    from capo.rollout.step import StepBatch, step_advantages

    cfg = trl.CapoAdvantageConfig(advantage="capo", noise_mask="quantile", mask_q_low=0.25, mask_q_high=0.75)
    self = types.SimpleNamespace(capo=cfg, reward_funcs=[], reward_weights=torch.ones(1),
                                 accelerator=Accelerator(cpu=True), _capo_thresholds=trl.mask_thresholds(cfg))
    correct = torch.tensor([True, False] * (G // 2) * 2)
    n = correct.numel()
    mask = torch.ones(n, 3, dtype=torch.bool)
    lp = torch.full((n, 3), -0.5, dtype=torch.float64)

    def step(ref_ppl, mode):
        ref = (-torch.log(torch.tensor(ref_ppl, dtype=torch.float64)))[:, None].expand(n, 3).clone()
        batch = StepBatch(rewards=correct.double(), group_size=G, mask=mask, correct=correct, token_logp=lp,
                          ref_token_logp=ref, valid=torch.ones(n, dtype=torch.bool))
        return step_advantages(*trl.CapoGRPOTrainer._capo_step_inputs(self, correct.double()[:, None], batch, mode))

    step([10.0 + i for i in range(n)], "eval")
    assert self._capo_thresholds.value is None  # the eval batch froze nothing
    step([1.0 + i / n for i in range(n)], "train")
    frozen = self._capo_thresholds.value
    assert frozen is not None and frozen[1] < 2.0  # the training batch's perplexities, not the eval batch's
    step([10.0 + i for i in range(n)], "eval")
    assert self._capo_thresholds.value == frozen


def test_trls_scale_rewards_reaches_the_estimators_scale_or_is_refused():
    """TRL's scale_rewards was ignored (capo computes the advantages): it is now the scale of the estimators that
    take one unless advantage_kwargs gives one (capo's own setting wins, as on verl's path), and refused where the
    estimator has none."""
    pytest.importorskip("trl")
    from capo.adapters import trl
    from capo.errors import ConfigError

    grpo = trl.CapoAdvantageConfig(advantage="grpo", noise_mask="off")
    assert trl._with_trl_scale(grpo, "none").advantage_kwargs == {"scale": "none"}
    assert trl._with_trl_scale(grpo, False).advantage_kwargs == {"scale": "none"}
    assert trl._with_trl_scale(grpo, "group").advantage_kwargs == {"scale": "group"}
    given = trl.CapoAdvantageConfig(advantage="grpo", advantage_kwargs={"scale": "batch"}, noise_mask="off")
    assert trl._with_trl_scale(given, "group") is given  # TRL's default never overrides capo's own setting
    assert trl._with_trl_scale(given, "none") is given
    capo = trl.CapoAdvantageConfig()
    assert trl._with_trl_scale(capo, "group") is capo
    with pytest.raises(ConfigError, match="scale_rewards='batch' is TRL's GRPO normalisation; capo's 'capo'"):
        trl._with_trl_scale(capo, "batch")
