"""CapoGRPOTrainer end to end with a tiny model: the advantages TRL trains on are capo core's, to 1e-6 (CPU).

Each run is 2 optimizer steps of 8 completions (2 prompts x G=4, 8 tokens) -- a few seconds after imports. They run on
the test device (tests/_device.py: the GPU when one is visible); the independent recomputations run on that device
too, and everything is compared on the CPU.
"""

from __future__ import annotations

import math

import pytest

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")

import torch  # noqa: E402

from capo.core import ADVANTAGES, REWARDS, capo_noise_mask, compute_advantages, sequence_logprob_mean  # noqa: E402
from capo.errors import ConfigError  # noqa: E402

G = 4


from _tiny import TOL, cpu_copy, dataset as _dataset, raw_token_logps, reference_model, seven_reward  # noqa: E402


def _args(tmp_path, **kw):
    import _tiny

    return _tiny.grpo_args(tmp_path / "out", **kw)


def _probe_class():
    from capo.adapters.trl import CapoGRPOTrainer

    class Probe(CapoGRPOTrainer):
        """Records, per generation batch, an independent recomputation of the advantages and what the loss saw."""

        probe_ref = None  # independent frozen reference model, set by the test

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.records = getattr(self, "records", [])
            self.records.append({"out": cpu_copy(out), "batch": dict(self.capo_last_batch),
                                 "expected": self._independent(out)})
            return out

        def _independent(self, out):
            """Recompute everything from the rollout tensors with plain HF forwards (on the trainer's device) and capo
            core (on the CPU); no adapter code."""
            cfg = self.capo
            mask = out["completion_mask"].cpu()

            def token_logps(model):
                return raw_token_logps(model, out, self.temperature)

            texts = self.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)
            rewards = torch.tensor(seven_reward(texts), dtype=torch.float64)
            lpm = sequence_logprob_mean(token_logps(self.accelerator.unwrap_model(self.model)).double(), mask)
            keep = torch.ones(len(texts), dtype=torch.bool)
            on = cfg.noise_mask not in (None, "off") or (cfg.noise_mask is None and cfg.advantage == "capo")
            if on:  # any estimator when set; unset: capo only
                ppl = torch.exp(-sequence_logprob_mean(token_logps(self.probe_ref).double(), mask))
                keep = capo_noise_mask(ppl, rewards > 0.5, low=cfg.mask_low, high=cfg.mask_high)
            return compute_advantages(cfg.advantage, rewards, G, scores=lpm if cfg.advantage == "capo" else None,
                                      keep=keep, **cfg.advantage_kwargs), keep

        def _compute_loss(self, model, inputs):
            self.used = getattr(self, "used", [])
            self.used.append(inputs["advantages"].detach().cpu().clone())
            return super()._compute_loss(model, inputs)

    return Probe


def test_capo_advantages_used_by_trl_equal_core(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = CapoAdvantageConfig(advantage="capo", advantage_kwargs={"tau": 0.6}, noise_mask="fixed",
                              mask_low=1.3, mask_high=1.9)
    Probe = _probe_class()
    Probe.probe_ref = reference_model(tiny_model_dir)
    tr = Probe(model=tiny_model_dir, reward_funcs=seven_reward, args=_args(tmp_path), train_dataset=_dataset(),
               processing_class=tok, capo=cfg)
    tr.train()
    assert len(tr.records) == 2 and len(tr.used) == 2
    nonzero = 0
    for rec, used in zip(tr.records, tr.used):
        expected, keep = rec["expected"]
        got = rec["out"]["advantages"].double()
        assert got.shape == expected.shape == (8,)
        assert torch.allclose(got, expected, atol=TOL, rtol=0), (got, expected)
        # the loss saw exactly these advantages (TRL shuffles rows before the loss: compare as multisets)
        assert torch.allclose(used.double().sort().values, got.sort().values, atol=0, rtol=0)
        assert torch.equal(rec["batch"]["keep"].cpu(), keep)
        nonzero += int((got.abs() > 1e-9).sum())
    assert nonzero > 0, "no signal in either batch: the test would not notice a wrong estimator"
    kept = torch.cat([r["batch"]["keep"] for r in tr.records])
    assert 0 < int(kept.sum()) < kept.numel(), "the noise mask should drop some but not all responses here"
    # the step's calibration metrics were logged
    logged = {k for h in tr.state.log_history for k in h}
    assert {"calib/accuracy", "calib/auroc", "calib/ece", "train/masked_frac"} <= logged, logged
    assert "time/capo_extra_forward_s" in logged and "time/capo_ref_forward_s" in logged


def test_capo_grpo_equals_trl_grpo(tiny_model_dir, tmp_path):
    """capo's grpo with TRL's eps (1e-4), Bessel std and group scaling == TRL's own GRPO advantages, same batch."""
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = CapoAdvantageConfig(advantage="grpo", advantage_kwargs={"eps": 1e-4, "std_ddof": 1, "scale": "group"},
                              calibration_metrics=False)
    Probe = _probe_class()
    tr = Probe(model=tiny_model_dir, reward_funcs=seven_reward, args=_args(tmp_path), train_dataset=_dataset(),
               processing_class=tok, capo=cfg)
    tr.train()
    n_signal = 0
    for rec in tr.records:
        ours = rec["out"]["advantages"]
        trl_own = rec["batch"]["trl_advantages_local"].cpu()  # TRL's tensor, on the trainer's device
        assert torch.allclose(ours, trl_own, atol=TOL, rtol=0), (ours, trl_own)
        assert torch.allclose(ours.double(), rec["expected"][0], atol=TOL, rtol=0)
        n_signal += int((trl_own.abs() > 1e-3).sum())
    assert n_signal > 0, "all groups had equal rewards: the comparison tested nothing"
    logged = {k for h in tr.state.log_history for k in h}
    assert "time/capo_extra_forward_s" not in logged  # grpo without metrics costs no extra forward


@pytest.mark.parametrize("kind", ["rlcr", "ppo_c"])
def test_rewards_on_a_stated_confidence_log_verbal_calibration_end_to_end(kind, tiny_model_dir, tmp_path):
    """RLCR's and PPO-C's reward functions: TRL receives the core reward of the verdicts, and calib/verbal_* of the
    stated confidences is logged (for PPO-C it was not: the confidences were read from RLCRReward only)."""
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer, PPOCReward, RLCRReward

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    reward = {"rlcr": RLCRReward, "ppo_c": PPOCReward}[kind](answer_key="answer")
    tr = CapoGRPOTrainer(model=tiny_model_dir, reward_funcs=reward, args=_args(tmp_path), train_dataset=_dataset(),
                         processing_class=tok, capo=CapoAdvantageConfig(advantage="grpo", advantage_kwargs={"eps": 1e-4}))
    tr.train()
    b = reward.last
    assert b is not None and len(b.rewards) == 8
    # the rewards TRL received are the core reward of the verdicts
    expected = REWARDS.get(kind)(torch.tensor(b.correct), confidence=torch.tensor(b.confidence, dtype=torch.float32),
                                   format_ok=torch.tensor(b.format_ok))
    assert torch.allclose(tr.capo_last_batch["rewards"].float(), expected, atol=TOL)
    assert sum(b.format_ok) > 0, "the tiny model should write well-formed RLCR answers"
    last = [h for h in tr.state.log_history if "calib/verbal_brier" in h]
    assert last, "verbalized Brier was not logged"
    brier = sum((q - c) ** 2 for q, c, ok in zip(b.confidence, b.correct, b.format_ok) if ok) / sum(b.format_ok)
    assert math.isclose(last[-1]["calib/verbal_brier"], brier, abs_tol=1e-6)
    assert "calib/verbal_ece" in last[-1]


def test_rlcr_and_correctness_reward_functions_on_text():
    from capo.adapters.trl import CorrectnessReward, RLCRReward
    from capo.verify import Verifier

    with Verifier(workers=1) as v:
        rl = RLCRReward(answer_key="gold", verifier=v)
        texts = ["<answer>0.5</answer><confidence>0.8</confidence>",  # 1/2 == 0.5 by math, not string
                 "<answer>3</answer><confidence>0.8</confidence>",
                 "<answer>1/2</answer>",  # no confidence: format failure
                 [{"role": "assistant", "content": "<answer>\\frac{1}{2}</answer><confidence>1</confidence>"}]]
        r = rl(prompts=[""] * 4, completions=texts, gold=["1/2"] * 4)
        assert r == pytest.approx([1 - 0.2 ** 2, 0 - 0.8 ** 2, -1.0, 1.0], abs=1e-6)
        cr = CorrectnessReward(answer_key="gold", verifier=v)
        assert cr(completions=["so \\boxed{0.5}", "\\boxed{2}"], gold=["1/2", "1/2"]) == [1.0, 0.0]
        with pytest.raises(ConfigError, match="no column 'gold'"):
            cr(completions=["x"], answer=["1"])


def test_bad_configuration_messages(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match="not known to the installed capo; allowed values: " + ", ".join(ADVANTAGES.names())):
        CapoGRPOTrainer(model=tiny_model_dir, reward_funcs=seven_reward, args=_args(tmp_path),
                        train_dataset=_dataset(), processing_class=tok, capo=CapoAdvantageConfig(advantage="gspo_adv"))
    with pytest.raises(ConfigError, match="no hyperparameter 'temperature'; allowed: tau"):
        CapoGRPOTrainer(model=tiny_model_dir, reward_funcs=seven_reward, args=_args(tmp_path),
                        train_dataset=_dataset(), processing_class=tok,
                        capo=CapoAdvantageConfig(advantage_kwargs={"temperature": 0.6}))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match="Pass ref_model=<model or path>"):
        CapoGRPOTrainer(model=model, reward_funcs=seven_reward, args=_args(tmp_path), train_dataset=_dataset(),
                        processing_class=tok, capo=CapoAdvantageConfig(advantage="capo", noise_mask="fixed"))
