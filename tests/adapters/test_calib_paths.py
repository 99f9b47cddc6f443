"""The same batch through capo's trainer, the TRL adapter and the verl plugin: equal advantages and equal calib/*.

Runs in the main environment: the verl plugin's estimator function is called directly with a stand-in for verl's
DataProto (the plugin imports without verl); tests/adapters/test_verl.py runs it inside verl itself.
"""

from __future__ import annotations

import types

import pytest
import torch

from capo.core import REWARDS, advantage_step
from _tiny import VerlProto  # tests/adapters is on sys.path (conftest.py)

B, G, T = 3, 4, 5
HPARAMS = {"capo": {"tau": 0.6}, "grpo": {}}


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


def _trainer_path(correct, conf, fmt, rewards, mask, lp, ref, estimator="capo"):
    """capo's trainer: Trainer.advantages (verdicts from the grader) and Trainer.rollout_metrics."""
    from accelerate import Accelerator

    from capo.trainer.loop import Trainer

    algo = types.SimpleNamespace(advantage=estimator, advantage_kwargs=HPARAMS[estimator], noise_mask="fixed",
                                 group_filter=False, reward="rlcr", reward_kwargs={}, loss="ppo_clip")
    cfg = types.SimpleNamespace(algo=algo, rollout=types.SimpleNamespace(group_size=G),
                                run=types.SimpleNamespace(on_bad_sample="skip"))
    self = types.SimpleNamespace(cfg=cfg, acc=Accelerator(cpu=True), mask_thresholds=(1.3, 1.9), step=0,
                                 verifier=None)
    for name in ("_guard", "_method_inputs", "_mean"):
        setattr(self, name, types.MethodType(getattr(Trainer, name), self))
    ro = types.SimpleNamespace(gen_logp=lp, response_mask=mask, lengths=mask.sum(-1), truncated=torch.zeros(len(lp)),
                               texts=[""] * len(lp))
    from capo.verify import Verdict

    verdicts = [Verdict.CORRECT if c else Verdict.INCORRECT for c in correct.tolist()]
    g = types.SimpleNamespace(correct=correct, confidence=conf, format_ok=fmt, reward_errors=0, verdicts=verdicts,
                              answers=[None] * len(correct))
    adv, _, _ = Trainer.advantages(self, ro, g, rewards, ref, None)
    metrics = Trainer.rollout_metrics(self, ro, g, rewards)
    return adv, {k: v for k, v in metrics.items() if k.startswith("calib/")}


def _trl_path(correct, conf, fmt, rewards, mask, lp, ref, estimator="capo"):
    """The TRL adapter's step and metrics on the gathered batch (what _generate_and_score_completions calls), with
    the mask decided by the adapter's config as the trainer subclass decides it."""
    pytest.importorskip("trl")
    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer

    cfg = CapoAdvantageConfig(estimator=estimator, noise_mask=True, mask_low=1.3, mask_high=1.9)
    res = advantage_step(estimator, rewards, correct, G, token_logp=lp, mask=mask, ref_token_logp=ref,
                         mask_thresholds=(cfg.mask_low, cfg.mask_high) if cfg.uses_mask() else None,
                         valid=torch.ones_like(correct), hparams=HPARAMS[estimator])
    return res.advantages, CapoGRPOTrainer._capo_metrics(None, res, correct, conf, G)


def _verl_path(correct, conf, fmt, rewards, mask, lp, ref, estimator="capo"):
    """The verl plugin's registered estimator on verl's tensors; rows shuffled as verl does, verdicts and
    confidences from the reward function's dict (legacy trainer: non_tensor_batch)."""
    import numpy as np

    from capo.adapters import verl_plugin as vp

    perm = torch.randperm(len(lp), generator=torch.Generator().manual_seed(0))
    tok_rewards = torch.zeros(len(lp), T)
    tok_rewards[torch.arange(len(lp)), mask.sum(-1) - 1] = rewards.float()
    data = VerlProto({"old_log_probs": lp[perm].float(), "ref_log_prob": ref[perm].float()},
                  {"correct": correct[perm].float().numpy().astype(object),
                   "confidence": conf[perm].numpy().astype(object)})
    ctx = vp._Ctx(data, temperature=data.meta_info["temperature"])
    uid = np.array([f"u{i // G}" for i in range(len(lp))], dtype=object)[perm.numpy()]
    cfg = {"capo": {**HPARAMS[estimator], "noise_mask": True, "mask_low": 1.3, "mask_high": 1.9}}
    token = vp._BATCH.set(ctx)
    try:
        verl_name = {core: name for name, core in vp.ESTIMATORS.items()}[estimator]  # capo_grpo -> grpo
        adv, _ = vp._ESTIMATOR_FNS[verl_name](tok_rewards[perm], mask[perm].float(), index=uid, config=cfg)
    finally:
        vp._BATCH.reset(token)
    out = torch.empty(len(lp), dtype=torch.float64)
    out[perm] = adv.double().sum(-1) / mask[perm].sum(-1)
    return out, ctx.metrics


def test_trainer_trl_verl_same_advantages_and_calibration_metrics():
    batch = _batch()
    correct, rewards = batch[0], batch[3]
    assert ((rewards < 0.5) & correct).any(), "a correct answer with a low RLCR reward must be in the batch"
    a_tr, m_tr = _trainer_path(*batch)
    a_trl, m_trl = _trl_path(*batch)
    a_verl, m_verl = _verl_path(*batch)
    assert (a_tr.abs() > 1e-6).any()
    torch.testing.assert_close(a_trl, a_tr.double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(a_verl, a_tr.double(), rtol=0, atol=1e-6)  # verl holds float32 tensors
    assert set(m_tr) == set(m_trl) == set(m_verl) and "calib/verbal_brier" in m_tr
    for k in m_tr:
        assert m_trl[k] == pytest.approx(m_tr[k], abs=1e-12, nan_ok=True), k
        assert m_verl[k] == pytest.approx(m_tr[k], abs=1e-6, nan_ok=True), k


def test_grpo_with_capo_mask_is_the_same_on_every_path():
    """The paper's ablation "GRPO advantage + CAPO's noise mask" means one thing in the trainer, TRL and verl (the
    rule is capo.core.mask_on): equal advantages, and the mask really removed responses."""
    batch = _batch()
    a_tr, _ = _trainer_path(*batch, estimator="grpo")
    a_trl, _ = _trl_path(*batch, estimator="grpo")
    a_verl, _ = _verl_path(*batch, estimator="grpo")
    torch.testing.assert_close(a_trl, a_tr.double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(a_verl, a_tr.double(), rtol=0, atol=1e-6)  # verl holds float32 tensors
    correct, _, _, rewards, mask, lp, ref = batch
    plain = advantage_step("grpo", rewards, correct, G, token_logp=lp, mask=mask).advantages
    masked = (a_tr == 0) & (plain != 0)
    assert masked.any(), "the mask must remove at least one response with a nonzero GRPO advantage here"
    torch.testing.assert_close(a_tr[~masked].double(), plain[~masked].double(), rtol=0, atol=1e-12)


def test_mask_rule_defaults():
    from capo.core import mask_on

    assert mask_on("capo", None) and not mask_on("grpo", None)  # unset: the paper's method only
    assert mask_on("grpo", True) and not mask_on("capo", False)
