"""The methods with extra per-response inputs, end to end in TRL: CapoGRPOTrainer with ACE (its own frozen reference)
and SEED-GRPO (answer clusters from capo's CorrectnessReward) trains 2 steps on the tiny model, and the advantages TRL
receives equal the core estimator on inputs recomputed independently (plain HF forwards; the verifier's equivalence
classes of the recorded answers).
"""

from __future__ import annotations

import pytest

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")

import torch  # noqa: E402

from capo.core import ADVANTAGES  # noqa: E402
from capo.errors import ConfigError  # noqa: E402
from _tiny import raw_token_logps  # noqa: E402  (tests/adapters is on sys.path: conftest.py)

G = 4


def _recorder():
    from capo.adapters.trl import CapoGRPOTrainer

    class Recorder(CapoGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            fn = self.reward_funcs[0]
            # independent of the adapter: full logits, temperature 1, on the trainer's device; compared on the CPU
            self.records = getattr(self, "records", []) + [dict(
                adv=out["advantages"].double().cpu(), mask=out["completion_mask"].bool().cpu(),
                answers=list(fn.last.answers), rewards=torch.tensor(fn.last.rewards, dtype=torch.float64),
                lp=raw_token_logps(self.accelerator.unwrap_model(self.model), out),
                ref=raw_token_logps(self.probe_ref, out))]
            return out

    return Recorder


@pytest.mark.parametrize("est,hp", [("ace", {"alpha": 2.0}), ("seed_grpo", {"alpha": 1.0})])
def test_trl_ace_and_seed_grpo_advantages_equal_the_core_estimator(est, hp, tiny_model_dir, tmp_path):
    import _tiny
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CorrectnessReward
    from capo.verify import Verifier

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with Verifier(workers=1) as v:
        Recorder = _recorder()
        Recorder.probe_ref = _tiny.reference_model(tiny_model_dir)
        tr = Recorder(model=tiny_model_dir, reward_funcs=CorrectnessReward(verifier=v),
                      args=_tiny.grpo_args(tmp_path / "out"), train_dataset=_tiny.dataset(), processing_class=tok,
                      capo=CapoAdvantageConfig(advantage=est, advantage_kwargs=hp, calibration_metrics=False))
        tr.train()
        assert len(tr.records) == 2
        differs = 0
        for r in tr.records:
            kw = {}
            if est == "ace":
                kw["confidence_shift"] = torch.where(r["mask"], r["lp"] - r["ref"], 0.0).sum(-1)
            else:
                groups = [r["answers"][i:i + G] for i in range(0, len(r["answers"]), G)]
                kw["cluster_ids"] = torch.tensor([c for g in groups for c in v.equivalence_classes(g)])
            want = ADVANTAGES.get(est)(r["rewards"], G, **kw, **hp)
            # TRL holds advantages and its fused-head log-probs in float32 (ACE's reach |A| ~ 10 here: rtol 1e-6)
            torch.testing.assert_close(r["adv"], want, rtol=_tiny.TOL, atol=_tiny.TOL)
            grpo = ADVANTAGES.get("grpo")(r["rewards"], G)
            differs += int(((want - grpo).abs() > 1e-4).sum())
        assert differs > 0, "the method equalled GRPO on every row: the test would not notice a missing input"


def test_trl_ace_without_a_reference_says_what_to_pass(tiny_model_dir, tmp_path):
    import _tiny
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"^CapoGRPOTrainer: CAPO's noise mask needs reference-model log-probs, "
                                          r"and nothing supplies them: .* or pass `model` as a path, or set "
                                          r"CapoAdvantageConfig\(noise_mask='off'\)\.$"):
        CapoGRPOTrainer(model=model, reward_funcs=_tiny.seven_reward, args=_tiny.grpo_args(tmp_path / "out"),
                        train_dataset=_tiny.dataset(), processing_class=tok, capo=CapoAdvantageConfig())
    with pytest.raises(ConfigError, match="^CapoGRPOTrainer: noise_mask='bogus' is not allowed; allowed values: off, "
                                          "fixed, quantile"):
        CapoGRPOTrainer(model=tiny_model_dir, reward_funcs=_tiny.seven_reward, args=_tiny.grpo_args(tmp_path / "out"),
                        train_dataset=_tiny.dataset(), processing_class=tok,
                        capo=CapoAdvantageConfig(noise_mask="bogus"))
    with pytest.raises(ConfigError, match="^CapoGRPOTrainer: noise_mask=True is the old spelling.*noise_mask=fixed"):
        CapoGRPOTrainer(model=tiny_model_dir, reward_funcs=_tiny.seven_reward, args=_tiny.grpo_args(tmp_path / "out"),
                        train_dataset=_tiny.dataset(), processing_class=tok,
                        capo=CapoAdvantageConfig(noise_mask=True))
    with pytest.raises(ConfigError, match=r"^CapoGRPOTrainer: estimator 'ace' \(an input it reads is built from "
                                          r"them\) needs "
                                          r"reference-model log-probs.*Pass ref_model=<model or path>"):
        CapoGRPOTrainer(model=model, reward_funcs=_tiny.seven_reward, args=_tiny.grpo_args(tmp_path / "out"),
                        train_dataset=_tiny.dataset(), processing_class=tok, capo=CapoAdvantageConfig(advantage="ace"))
    # the step's message names the engine (StepSpec.engine) and its hint (the adapter's _HINTS)
    with pytest.raises(ConfigError, match="^CapoGRPOTrainer: advantage estimator 'seed_grpo' needs the extracted "
                                          "answers.*use capo's CorrectnessReward"):
        tr = CapoGRPOTrainer(model=tiny_model_dir, reward_funcs=_tiny.seven_reward,
                             args=_tiny.grpo_args(tmp_path / "out", max_steps=1), train_dataset=_tiny.dataset(),
                             processing_class=tok, capo=CapoAdvantageConfig(advantage="seed_grpo"))
        tr.train()
