"""The methods with extra per-response inputs (ACE, SEED-GRPO, GDPO) give the same advantages through
capo's trainer, the TRL adapter and the verl plugin, which all build those inputs with
:func:`capo.rollout.method_inputs.method_inputs`; and every path says what to enable when an input is missing.

Runs in the main environment: the verl plugin's estimator is called with a stand-in for verl's DataProto (the plugin
imports without verl); tests/adapters/test_verl.py runs the new estimators inside verl itself.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from capo.core import ADVANTAGES, REWARDS, advantage_step
from capo.errors import ConfigError
from capo.rollout.method_inputs import StepBatch, StepSpec, method_inputs, needed_data
from capo.rollout.step import step_advantages
from _tiny import VerlProto  # tests/adapters is on sys.path (conftest.py)

B, G, T = 3, 4, 5
# prompt 0: 1/2 and 0.5 are one answer (math-verify), prompt 1 agrees on 7 but once, prompt 2 has four answers
ANSWERS = ["1/2", "0.5", "3", None, "7", "7", "7", "8", "2", "3", "4", "5"]
CORRECT = [1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0]
CONF = [0.9, 0.2, 0.8, float("nan"), 0.7, 0.9, 0.4, 0.6, 0.1, 0.3, 0.5, 0.95]
CASES = [("ace", {"alpha": 0.7}, "correctness"), ("seed_grpo", {"alpha": 0.8}, "correctness"),
         ("gdpo", {}, "rlcr")]


@pytest.fixture(scope="module")
def verifier():
    from capo.verify import Verifier

    v = Verifier(workers=1)
    yield v
    v.close()


def _batch(reward: str):
    gen = torch.Generator().manual_seed(5)
    n = B * G
    correct = torch.tensor(CORRECT, dtype=torch.bool)
    conf = torch.tensor(CONF, dtype=torch.float32)
    fmt = torch.tensor([a is not None for a in ANSWERS]) & ~torch.isnan(conf)
    kw = dict(confidence=conf, format_ok=fmt) if reward == "rlcr" else {}
    rewards = REWARDS.get(reward)(correct, **kw).double()
    lengths = torch.randint(1, T + 1, (n,), generator=gen)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    lp = -torch.rand(n, T, generator=gen, dtype=torch.float64) * 2 * mask
    ref = -torch.rand(n, T, generator=gen, dtype=torch.float64) * 1.2 * mask
    return dict(correct=correct, conf=conf, fmt=fmt, rewards=rewards, mask=mask, lp=lp, ref=ref)


def _trainer_path(est, hp, reward, b, verifier):
    """capo's trainer: Trainer.advantages with the grader's answers/verdicts and its verifier."""
    from accelerate import Accelerator

    from capo.trainer.loop import Trainer

    algo = types.SimpleNamespace(advantage=est, advantage_kwargs=hp, noise_mask="off", group_filter=False, group_filter_by=None,
                                 reward=reward, reward_kwargs={}, loss="ppo_clip")
    cfg = types.SimpleNamespace(algo=algo, rollout=types.SimpleNamespace(group_size=G),
                                run=types.SimpleNamespace(on_bad_sample="skip"),
                                data=types.SimpleNamespace(answer_format="rlcr"))
    self = types.SimpleNamespace(cfg=cfg, acc=Accelerator(cpu=True), mask_thresholds=None, step=0, verifier=verifier)
    for name in ("_step_spec", "_check_bad", "_mean"):
        setattr(self, name, types.MethodType(getattr(Trainer, name), self))
    ro = types.SimpleNamespace(gen_logp=b["lp"], response_mask=b["mask"], texts=[""] * len(b["lp"]))
    g = types.SimpleNamespace(correct=b["correct"], confidence=b["conf"], format_ok=b["fmt"], answers=ANSWERS)
    ref = b["ref"] if "ref_token_logp" in needed_data(est) else None
    batch, _ = Trainer.advantages(self, ro, g, b["rewards"], ref, None)
    return batch.advantages.double()


def _trl_self(est, hp, reward_fn, weights):
    from accelerate import Accelerator

    from capo.adapters.trl import CapoAdvantageConfig

    return types.SimpleNamespace(capo=CapoAdvantageConfig(advantage=est, advantage_kwargs=hp),
                                 reward_funcs=reward_fn, reward_weights=torch.tensor(weights),
                                 accelerator=Accelerator(cpu=True), _capo_thresholds=None)


def _trl_path(est, hp, reward, b, verifier):
    """The TRL adapter's _capo_step_inputs + the step on the gathered batch (what _generate_and_score_completions
    calls), the verdicts/answers recorded by capo's reward function."""
    pytest.importorskip("trl")
    from capo.adapters._common import ScoredBatch
    from capo.adapters.trl import CapoGRPOTrainer, CorrectnessReward, RLCRReward

    fn = (RLCRReward if reward == "rlcr" else CorrectnessReward)(verifier=verifier)
    fn.last = ScoredBatch(correct=b["correct"].tolist(), confidence=b["conf"].tolist(), format_ok=b["fmt"].tolist(),
                          rewards=b["rewards"].tolist(), answers=list(ANSWERS))
    self = _trl_self(est, hp, [fn], [1.0])
    ref = b["ref"] if self.capo.needs_reference() else None
    conf = b["conf"].double() if reward == "rlcr" else None
    batch = StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"], correct=b["correct"], token_logp=b["lp"],
                      ref_token_logp=ref, valid=torch.ones_like(b["correct"]), confidence=conf)
    return step_advantages(*CapoGRPOTrainer._capo_step_inputs(self, b["rewards"][:, None], batch)).result.advantages


def _verl_call(verl_name, b, cfg, non_tensor, with_ref, verifier):
    import numpy as np

    from capo.adapters import verl_plugin as vp

    n = len(b["lp"])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))  # verl reorders rows
    tok_rewards = torch.zeros(n, T)
    tok_rewards[torch.arange(n), b["mask"].sum(-1) - 1] = b["rewards"].float()
    tensors = {"old_log_probs": b["lp"][perm].float()}
    if with_ref:
        tensors["ref_log_prob"] = b["ref"][perm].float()
    nt = {k: np.array(v, dtype=object)[perm.numpy()] for k, v in non_tensor.items()}
    ctx = vp.BatchContext(VerlProto(tensors, nt), run=vp.CapoRun(verifier=verifier), temperature=1.0)
    uid = np.array([f"u{i // G}" for i in range(n)], dtype=object)[perm.numpy()]
    with vp.batch_context(ctx):
        adv, _ = vp.ESTIMATOR_FNS[verl_name](tok_rewards[perm], b["mask"][perm].float(), index=uid, config=cfg)
    out = torch.empty(n, dtype=torch.float64)
    out[perm] = adv.double().sum(-1) / b["mask"][perm].sum(-1)
    return out


def _reward_dicts(b):
    """What capo's verl compute_score_* return per row: correct, confidence, format_ok, pred ('' = no answer)."""
    return {"correct": b["correct"].float().tolist(), "confidence": b["conf"].tolist(),
            "format_ok": b["fmt"].float().tolist(), "pred": [a or "" for a in ANSWERS]}


@pytest.mark.parametrize("est,hp,reward", CASES)
def test_trainer_trl_verl_same_advantages(est, hp, reward, verifier):
    b = _batch(reward)
    a_tr = _trainer_path(est, hp, reward, b, verifier)
    a_trl = _trl_path(est, hp, reward, b, verifier)
    cfg = {"capo": {"advantage_kwargs": hp, "reward": reward}}
    a_verl = _verl_call(f"capo_{est}", b, cfg, _reward_dicts(b), est == "ace", verifier)
    grpo = advantage_step("grpo", b["rewards"], b["correct"], G, token_logp=b["lp"], mask=b["mask"]).advantages
    assert (a_tr - grpo).abs().max() > 1e-3, "the method must differ from GRPO on this batch"
    torch.testing.assert_close(a_trl, a_tr, rtol=0, atol=1e-12)
    torch.testing.assert_close(a_verl, a_tr, rtol=0, atol=1e-6)  # verl holds float32 tensors


def test_method_inputs_by_hand(verifier):
    """The inputs themselves: ACE's shift sums the real tokens' log-ratios, SEED's clusters are math-verify classes
    (1/2 == 0.5; no answer = -1), GDPO's RLCR components; C2GSPG's loss gets the rewards."""
    b = _batch("rlcr")
    x = method_inputs(StepSpec("ace", loss="c2gspg"), StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"],
                                                                 token_logp=b["lp"], ref_token_logp=b["ref"]))
    row = 3
    want = sum(float(b["lp"][row, t] - b["ref"][row, t]) for t in range(T) if b["mask"][row, t])
    assert float(x.advantage["confidence_shift"][row]) == pytest.approx(want, abs=1e-12)
    assert x.loss["rewards"] is b["rewards"]
    s = method_inputs(StepSpec("seed_grpo"), StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"],
                                                       answers=ANSWERS, verifier=verifier))
    assert s.advantage["cluster_ids"].tolist() == [0, 0, 1, -1, 0, 0, 0, 1, 0, 1, 2, 3]
    # short free-text answers (facts) are clustered by their normal form, as capo eval's votes are (one rule)
    from capo.evaluation.metrics import assign_answer_ids

    facts = ["Paris", "paris", "Paris.", None, "St. Louis", "Saint Louis", "New York", "York New"] + ["x"] * 4
    f = method_inputs(StepSpec("seed_grpo"), StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"],
                                                       answers=facts, verifier=verifier, answer_format="rlcr_short"))
    rows = [{"prompt_id": i // G, "answer": a} for i, a in enumerate(facts)]
    assign_answer_ids(rows, verifier, "rlcr_short")
    assert f.advantage["cluster_ids"].tolist() == [r["answer_id"] for r in rows]
    assert f.advantage["cluster_ids"].tolist()[:4] == [0, 0, 0, -1]  # math-verify split "Paris." from "Paris"
    c = method_inputs(StepSpec("gdpo", reward="rlcr"), StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"],
                                                                 correct=b["correct"], confidence=b["conf"],
                                                                 format_ok=b["fmt"]))
    comp = c.advantage["components"]
    assert comp.shape == (B * G, 2) and comp[3, 1] == -1.0  # no answer: RLCR's format-failure value
    torch.testing.assert_close(comp.sum(1)[b["fmt"]], b["rewards"][b["fmt"]])
    plain = StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"])
    assert method_inputs(StepSpec("grpo", loss="ppo_clip"), plain).advantage == {}


def test_missing_inputs_say_what_to_enable():
    b = _batch("rlcr")
    batch = StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"])
    kw = dict(engine="eng", hints={"ref_token_logp": "turn the reference on", "answers": "use capo's reward",
                                   "confidence": "use rlcr"})
    with pytest.raises(ConfigError, match="eng: advantage estimator 'ace' needs reference-model log-probs.*: turn "
                                          "the reference on"):
        method_inputs(StepSpec("ace", **kw), StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"],
                                                       token_logp=b["lp"]))
    with pytest.raises(ConfigError, match="'seed_grpo' needs the extracted answers.*: use capo's reward"):
        method_inputs(StepSpec("seed_grpo", **kw), batch)
    with pytest.raises(ConfigError, match="'gdpo' with the rlcr reward needs the verdicts.*: use rlcr"):
        method_inputs(StepSpec("gdpo", reward="rlcr", **kw), batch)
    assert needed_data("ace") == {"token_logp", "ref_token_logp"} and needed_data("seed_grpo") == {"answers"}
    assert needed_data("gdpo") == set() and needed_data("gdpo", reward="rlcr") == {"confidence", "format_ok"}


def test_verl_errors_name_the_setting(verifier):
    b = _batch("correctness")
    with pytest.raises(ConfigError, match="capo_ace.*reference-model log-probs.*use_kl_loss=True"):
        _verl_call("capo_ace", b, {}, _reward_dicts(b), False, verifier)
    no_pred = {k: v for k, v in _reward_dicts(b).items() if k != "pred"}
    with pytest.raises(ConfigError, match="capo_seed_grpo.*extracted answers.*compute_score"):
        _verl_call("capo_seed_grpo", b, {}, no_pred, False, verifier)
    r = _batch("rlcr")
    with pytest.raises(ConfigError, match="algorithm.capo.reward='brier' is not allowed; allowed values .*: "
                                          "correctness, rlcr, ppo_c"):
        _verl_call("capo_gdpo", r, {"capo": {"reward": "brier"}}, _reward_dicts(r), False, verifier)
    with pytest.raises(ConfigError, match="capo_gdpo.*verdicts and verbal confidences.*compute_score_rlcr"):
        _verl_call("capo_gdpo", r, {"capo": {"reward": "rlcr"}}, {"correct": CORRECT}, False, verifier)


def test_trl_gdpo_one_component_per_reward_function():
    """Without RLCRReward alone, TRL's GDPO components are the reward functions' columns (unscored = 0), weighted
    by TRL's reward_weights: equal to the core estimator on those columns."""
    pytest.importorskip("trl")
    from capo.adapters.trl import CapoGRPOTrainer

    b = _batch("correctness")
    rpf = torch.stack([b["rewards"], torch.linspace(0, 1, B * G, dtype=torch.float64)], dim=1)
    rpf[5, 1] = math.nan
    self = _trl_self("gdpo", {}, [lambda **k: None, lambda **k: None], [1.0, 0.5])
    batch = StepBatch(rewards=b["rewards"], group_size=G, mask=b["mask"], correct=b["correct"], token_logp=b["lp"])
    batch, spec = CapoGRPOTrainer._capo_step_inputs(self, rpf, batch)
    assert spec.advantage_kwargs == {"weights": [1.0, 0.5]}
    want = ADVANTAGES.get("gdpo")(b["rewards"], G, components=torch.nan_to_num(rpf), weights=[1.0, 0.5])
    got = step_advantages(batch, spec).result.advantages
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_presets_reach_the_adapters_or_say_why():
    """The presets of the methods beside CAPO and GRPO map to TRL settings and verl overrides, except the policy
    losses an engine cannot run, which are refused with the reason."""
    pytest.importorskip("trl")
    from capo.adapters.trl import PPOCReward, RLCRReward, capo_preset
    from capo.adapters.verl_plugin import preset_overrides

    cfg, grpo, fn = capo_preset("ngrpo")
    assert cfg.advantage == "ngrpo" and grpo == {"loss_type": "dapo", "beta": 0.0, "epsilon": 0.16,
                                                 "epsilon_high": 0.24}
    assert isinstance(capo_preset("gdpo")[2], RLCRReward) and isinstance(capo_preset("ppo_c")[2], PPOCReward)
    assert capo_preset("ace")[0].needs_reference() and not capo_preset("seed_grpo")[0].needs_reference()
    for name in ("c2gspg", "clip_cov", "kl_cov"):
        with pytest.raises(ConfigError, match=f"trl: preset '{name}' cannot run here: policy loss '{name}': TRL's "
                                              "GRPOTrainer computes its own loss"):
            capo_preset(name)
    with pytest.raises(ConfigError, match="verl: preset 'c2gspg' cannot run here: .*not the rewards"):
        preset_overrides("c2gspg")
    ace = preset_overrides("ace")
    assert "algorithm.adv_estimator=capo_ace" in ace and "actor_rollout_ref.actor.kl_loss_coef=0" in ace
    kl = preset_overrides("kl_cov")
    assert {"actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
            "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=1.0"} <= set(kl)
    assert "reward.custom_reward_function.name=compute_score_ppo_c" in preset_overrides("ppo_c")
    # CISPO: verl's own loss mode; no lower bound is verl's clip_ratio_low 1 (r >= 0 never reaches it), eps_high 4
    assert {"actor_rollout_ref.actor.policy_loss.loss_mode=cispo", "actor_rollout_ref.actor.clip_ratio_low=1.0",
            "actor_rollout_ref.actor.clip_ratio_high=4.0"} <= set(preset_overrides("cispo"))
    # capo's whole-sequence variant: CAPO's estimator with score "sum" at tau 1, the quantile mask kept
    cs, grpo_cs, _ = capo_preset("capo_sum")
    assert (cs.advantage, cs.advantage_kwargs, cs.noise_mask) == ("capo", {"tau": 1.0, "score": "sum"}, "quantile")
    assert {"algorithm.adv_estimator=capo", "+algorithm.capo.advantage_kwargs.tau=1.0",
            "+algorithm.capo.advantage_kwargs.score=sum",
            "+algorithm.capo.noise_mask=quantile"} <= set(preset_overrides("capo_sum"))


def test_a_preset_giving_one_clip_bound_runs_the_trainers_bounds_in_both_engines(monkeypatch):
    """Found by a design audit (2026-12-02): a preset giving only eps_low = 0.1 trained (0.1, 0.2) in capo's trainer
    and verl (ppo_clip's own default eps_high) but (0.1, 0.1) in TRL, whose preset mapping fell back to eps_low."""
    pytest.importorskip("trl")
    from capo.adapters.trl import capo_preset
    from capo.adapters.verl_plugin import preset_overrides
    from capo.core import presets
    from capo.trainer.config import load_config

    monkeypatch.setitem(presets.ALGORITHMS, "one_bound", dict(advantage="grpo", loss="ppo_clip",
                                                             aggregation="seq-mean-token-mean", reward="correctness",
                                                             loss_kwargs={"eps_low": 0.1}))
    _, grpo, _ = capo_preset("one_bound")
    assert (grpo["epsilon"], grpo["epsilon_high"]) == (0.1, 0.2)
    verl = preset_overrides("one_bound")
    actor = "actor_rollout_ref.actor"
    assert f"{actor}.clip_ratio_low=0.1" in verl and f"{actor}.clip_ratio_high=0.2" in verl
    assert load_config(None, {"algo.name": "one_bound"}).algo.loss_kwargs == {"eps_low": 0.1}  # ppo_clip's 0.2 above


def test_the_trainer_trl_and_verl_need_reference_log_probs_by_one_rule():
    """Reference log-probs: a KL penalty, a noise mask that is on, or an estimator built from them (ACE). The rule was
    written three times (trainer config, TRL, verl presets); the three now call ``needs_reference`` and agree on every
    preset; hand-checked cases first."""
    from capo.core.presets import ALGORITHMS
    from capo.rollout.method_inputs import needs_reference
    from capo.trainer.config import load_config

    assert not needs_reference("grpo", "off") and needs_reference("grpo", "off", kl_coef=0.01)
    assert needs_reference("grpo", "quantile") and needs_reference("ace", "off")
    assert not needs_reference("seed_grpo", "off") and not needs_reference("no_such_estimator", "off")
    pytest.importorskip("trl")
    from capo.adapters.trl import capo_preset
    from capo.adapters.verl_plugin import preset_overrides

    def engine_needs(build, read):  # None: a loss the engine cannot run (refused with the reason, tested above)
        try:
            return read(build())
        except ConfigError:
            return None

    # the trainer by hand: the presets with a mask (capo, capo_sum) or ACE's input, and any preset with a KL term
    hand = {"grpo": False, "dr_grpo": False, "rloo": False, "seed_grpo": False, "rlcr": False, "capo": True,
            "capo_sum": True, "ace": True}
    for name, want in hand.items():
        assert load_config(None, {"algo.name": name}).needs_reference is want, name
    assert load_config(None, {"algo.name": "grpo", "algo.kl_coef": 0.01}).needs_reference
    assert load_config(None, {"algo.name": "grpo", "algo.noise_mask": "fixed"}).needs_reference
    assert not load_config(None, {"algo.name": "capo", "algo.noise_mask": "off"}).needs_reference
    read, needing = 0, set()
    for name in sorted(ALGORITHMS):
        cfg = load_config(None, {"algo.name": name})
        want = needs_reference(cfg.algo.advantage, cfg.algo.noise_mask, kl_coef=cfg.algo.kl_coef)
        assert want is hand.get(name, want), name
        got = (engine_needs(lambda: capo_preset(name)[0], lambda c: c.needs_reference()),
               engine_needs(lambda: preset_overrides(name), lambda o: "actor_rollout_ref.actor.kl_loss_coef=0" in o))
        assert all(x in (want, None) for x in got), (name, want, got)
        read += sum(x is not None for x in got)
        needing |= {name} if want else set()
    assert read >= len(ALGORITHMS) and {"capo", "capo_sum", "ace"} <= needing and "grpo" not in needing
