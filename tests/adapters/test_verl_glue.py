"""The verl plugin's glue, hand-checked without verl: how the estimator reads verl's config and batch, when it refuses
and with which words, and what the compute_advantage wrappers hand on.

Runs in the main environment with stand-ins for verl's DataProto, trainer and TransferQueue (the plugin imports
without verl); the OmegaConf case runs where OmegaConf is installed (.venv-verl). tests/adapters/test_verl.py runs
the plugin inside verl itself.
"""

from __future__ import annotations

import sys
from enum import Enum
from types import SimpleNamespace

import pytest
import torch

from capo.adapters.verl_plugin import estimators as est
from capo.adapters.verl_plugin import patch
from capo.adapters.verl_plugin.run import BatchContext, CapoRun, batch_context, current_batch
from capo.core import compute_advantages, rlcr_components, sequence_logprob_mean
from capo.errors import ConfigError

from _tiny import VerlProto  # tests/adapters is on sys.path (conftest.py)

G, T = 4, 3
UID = ["b", "a", "b", "a", "a", "b", "b", "a"]  # two prompts, rows interleaved as verl's balancing leaves them
ORDER = [0, 2, 5, 6, 1, 3, 4, 7]  # the rows grouped: prompt "b" first (row 0 is its), each in row order
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
LENGTHS = torch.tensor([3, 2, 1, 3, 2, 3, 1, 2])
MASK = (torch.arange(T)[None, :] < LENGTHS[:, None]).float()  # [N, T]
LOGP = -torch.linspace(0.1, 2.3, 8 * T).reshape(8, T) * MASK  # [N, T]


def _tok(rewards):
    """verl's token-level rewards: the outcome reward on each response's last token."""
    out = torch.zeros(len(rewards), T)
    out[torch.arange(len(rewards)), LENGTHS - 1] = rewards
    return out


def _ctx(tensors=None, non_tensor=None, temperature=1.0, run=None):
    return BatchContext(VerlProto(tensors or {}, non_tensor or {}), run=run or CapoRun(verifier="no verifier"),
                        temperature=temperature)


def _call(name, rewards=REWARDS, config=None, ctx=None):
    """The registered verl estimator on this file's batch; [N] advantages (one per row: the estimators' outcome
    advantages are constant over a response's tokens)."""
    fn = est.ESTIMATOR_FNS[name]
    if ctx is None:
        adv, ret = fn(_tok(rewards), MASK, index=list(UID), config=config)
    else:
        with batch_context(ctx):
            adv, ret = fn(_tok(rewards), MASK, index=list(UID), config=config)
    assert torch.equal(adv, ret) and torch.equal(adv, adv * MASK)
    return adv[:, 0]


def _grouped(x):
    return x[ORDER]


def _ungrouped(x):
    out = torch.empty_like(x)
    out[ORDER] = x
    return out


# ----------------------------------------------------------------------------------------------- verl's config


def test_settings_read_algorithm_capo_from_a_mapping_an_attribute_config_or_nothing():
    assert est._settings(None) == {}
    assert est._settings({"capo": None}) == {} and est._settings({}) == {}
    assert est._settings({"capo": {"noise_mask": "off"}}) == {"noise_mask": "off"}
    assert est._settings(SimpleNamespace(capo={"mask_low": 1.2})) == {"mask_low": 1.2}  # a config without .get
    assert est._settings(SimpleNamespace()) == {}
    cfg = {"capo": {"advantage_kwargs": {"tau": 0.5}}}
    opts, hp = est._options(est._settings(cfg), "capo", cfg)
    hp["tau"] = 9.0  # a copy: reading the settings leaves verl's config alone
    assert cfg == {"capo": {"advantage_kwargs": {"tau": 0.5}}} and opts["noise_mask"] == "fixed"


def test_settings_resolve_omegaconf_interpolations_into_plain_containers():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"t": 0.7, "capo": {"advantage_kwargs": {"tau": "${t}", "weights": [1.0, 2.0]}}})
    _, hp = est._options(est._settings(cfg), "capo", cfg)
    assert hp == {"tau": 0.7, "weights": [1.0, 2.0]}
    assert type(hp["weights"]) is list  # not a ListConfig


def test_old_algorithm_capo_keys_say_their_new_spelling():
    """algorithm.capo speaks the trainer's vocabulary: estimator hyperparameters under advantage_kwargs, noise_mask
    off|fixed|quantile (capo.core.NOISE_MASKS); each old spelling is refused naming the new one."""
    def refused(settings, core="capo"):
        with pytest.raises(ConfigError) as e:
            est._options(settings, core, None, "eng")
        return str(e.value)

    assert refused({"tau": 0.6}) == ("eng: algorithm.capo.tau is an estimator hyperparameter: estimator "
                                      "hyperparameters go in algorithm.capo.advantage_kwargs now (as capo's "
                                      "algo.advantage_kwargs): +algorithm.capo.advantage_kwargs.tau=0.6")
    assert "+algorithm.capo.advantage_kwargs.eps=0.0001" in refused({"eps": 1e-4}, "grpo")
    assert refused({"mask_rule": "quantile"}).startswith("eng: algorithm.capo.mask_rule is gone: "
                                                         "algorithm.capo.noise_mask says the rule now (off, fixed, "
                                                         "quantile), e.g. +algorithm.capo.noise_mask=quantile")
    assert refused({"noise_mask": True}).startswith("eng: algorithm.capo.noise_mask=True is the old spelling")
    assert "algorithm.capo.noise_mask=off" in refused({"noise_mask": False})
    assert refused({"noise_mask": "on"}).startswith("eng: algorithm.capo.noise_mask='on' is not allowed")
    assert refused({"mask_lo": 1.0}).startswith("eng: algorithm.capo.mask_lo is not a capo setting (did you mean "
                                                "'mask_low'?); allowed keys: advantage_kwargs, noise_mask")
    assert "algorithm.adv_estimator=capo_<advantage>" in refused({"advantage": "capo_grpo"})
    for value in ("off", "fixed", "quantile"):
        assert est._options({"noise_mask": value}, "grpo", None)[0]["noise_mask"] == value


def test_grpo_scale_follows_verls_norm_flag_unless_set():
    def scale(hp, config, name="grpo"):
        return est._options({"advantage_kwargs": hp}, name, config)[1].get("scale")

    assert scale({}, {"norm_adv_by_std_in_grpo": False}) == "none"
    assert scale({}, {"norm_adv_by_std_in_grpo": True}) == "group"
    assert scale({}, {}) == "group"  # verl's default
    assert scale({}, SimpleNamespace()) == "group"  # a config object without .get: verl's default
    assert scale({"scale": "batch"}, {"norm_adv_by_std_in_grpo": False}) == "batch"  # the user's own choice wins
    assert scale({}, None) is None  # no config: the core default
    assert scale({}, {"norm_adv_by_std_in_grpo": False}, name="rloo") is None  # no scale to follow it
    for name in ("ace", "seed_grpo", "unlikeliness"):  # every estimator with a scale follows it, as on TRL's path
        assert scale({}, {"norm_adv_by_std_in_grpo": False}, name=name) == "none"


# ----------------------------------------------------------------------------------------------- verl's batch


def test_one_prompt_is_one_group_and_padding_rows_take_no_part():
    rows, g = est._grouped_rows(["a", "a", "a"], 3)
    assert rows.tolist() == [0, 1, 2] and g == 3
    rows, g = est._grouped_rows(["a", "pad_1", "a", "pad_1"], 4)
    assert rows.tolist() == [0, 2] and g == 2
    rows, g = est._grouped_rows(UID, 8)
    assert rows.tolist() == ORDER and g == 4


def test_per_row_values_of_the_wrong_length_or_all_missing_are_absent():
    ctx = _ctx(non_tensor={"correct": [1.0, 0.0, 1.0], "pred": [None, None], "format_ok": [1.0, 1.0]})
    assert est._ctx_values(ctx, "correct", 2) is None  # 3 values for 2 rows
    assert est._ctx_values(ctx, "pred", 2) is None  # all missing
    assert est._ctx_values(ctx, "format_ok", 2) == [1.0, 1.0]
    assert est._ctx_values(ctx, "confidence", 2) is None
    assert est._ctx_values(None, "correct", 2) is None
    ctx.extra["format_ok"] = [0.0, 1.0]  # v1: the reward function's extras fetched by the trainer come first
    assert est._ctx_values(ctx, "format_ok", 2) == [0.0, 1.0]


def test_seed_grpo_clusters_use_the_format_the_reward_function_read_its_answers_in():
    """capo's verl reward functions say which format "pred" was read in; the estimator hands it to the step, so on
    facts (rlcr_short) SEED-GRPO's clusters are the short answers' normal forms, as in capo's trainer and TRL
    (before, math-verify classes: "Paris." and "Paris" two clusters). One format per batch; none: math-verify."""
    from capo.adapters.verl_plugin.rewards import compute_score_correctness, compute_score_rlcr

    assert compute_score_rlcr("facts", "<answer>Paris</answer><confidence>0.9</confidence>", "Paris",
                              answer_format="rlcr_short")["answer_format"] == "rlcr_short"
    assert compute_score_correctness("m", "\\boxed{4}", "4")["answer_format"] == "auto"
    opts, _ = est._options({}, "seed_grpo", None)
    base = {"pred": ["Paris", "Paris.", "Lyon", "Paris", "x", "y", "x", "y"], "correct": [1.0] * 8}
    for formats, want in [(["rlcr_short"] * 8, "rlcr_short"), ([None] * 8, None), ({}, None)]:
        nt = {**base, **({"answer_format": formats} if formats != {} else {})}
        ctx = _ctx({"old_log_probs": LOGP}, nt, run=CapoRun(verifier="v"))
        b, _ = est._step_batch(ctx, "capo_seed_grpo", opts, _tok(REWARDS), MASK, list(UID))
        assert b.answer_format == want, formats
    nt = {**base, "answer_format": ["rlcr_short"] * 7 + ["auto"]}
    with pytest.raises(ConfigError, match="several formats .auto, rlcr_short."):
        est._step_batch(_ctx({"old_log_probs": LOGP}, nt, run=CapoRun(verifier="v")), "capo_seed_grpo", opts,
                        _tok(REWARDS), MASK, list(UID))


def test_verdicts_above_one_half_are_correct_and_a_missing_one_is_not():
    ctx = _ctx(non_tensor={"correct": [1.0, 0.5, None, 0.51, 0.0, True]})
    got = est._verdicts(ctx, torch.zeros(6), need=True, who="capo")
    assert got.tolist() == [True, False, False, True, False, True]


def test_confidences_and_format_flags_are_float64_with_nan_for_missing():
    x = est._floats([0.1, None, 1], torch.tensor([2, 0, 1]))
    assert x.dtype == torch.float64 and x[0].item() == 1.0 and x[1].item() == 0.1 and torch.isnan(x[2])
    assert est._floats(None, torch.tensor([0])) is None


def test_step_batch_hands_capo_the_grouped_rows_answers_flags_and_the_runs_verifier():
    nt = {"pred": ["7", "", None, "8", "7", "x", "", "8"], "format_ok": [1.0, 0.5, 0.0, 1.0, 1.0, None, 1.0, 0.0],
          "correct": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0], "confidence": [0.9, 0.2, None, 0.6, 0.5, 0.4, 0.3, 0.1]}
    opts, _ = est._options({}, "seed_grpo", None)
    ctx = _ctx({"old_log_probs": LOGP}, nt, run=CapoRun(verifier="the run's verifier"))
    b, rows = est._step_batch(ctx, "capo_seed_grpo", opts, _tok(REWARDS), MASK, list(UID))
    assert rows.tolist() == ORDER and b.group_size == G
    assert b.answers == [None if nt["pred"][i] in ("", None) else nt["pred"][i] for i in ORDER]  # '' = no answer
    assert b.format_ok.tolist() == [nt["format_ok"][i] == 1.0 for i in ORDER]  # 0.5 and None are not well formed
    assert torch.equal(b.correct, _grouped(REWARDS) == 1) and torch.equal(b.rewards, _grouped(REWARDS).double())
    assert torch.equal(b.token_logp, _grouped(LOGP).double()) and b.ref_token_logp is None
    assert b.confidence.dtype == torch.float64 and torch.isnan(b.confidence[ORDER.index(2)])
    assert b.verifier == "the run's verifier"
    b, _ = est._step_batch(_ctx({"old_log_probs": LOGP}, {}, run=CapoRun(verifier="unused")), "capo_grpo",
                           est._options({}, "grpo", None)[0], _tok(REWARDS), MASK, list(UID))
    assert b.answers is None and b.verifier is None and b.format_ok is None and b.confidence is None  # none started


def test_bypass_mode_reads_the_rollout_log_probs_as_the_old_policys():
    cfg = {"capo": {"noise_mask": "off"}}
    own = _call("capo", config=cfg, ctx=_ctx({"old_log_probs": LOGP}))
    bypass = _call("capo", config=cfg, ctx=_ctx({"rollout_log_probs": LOGP}))
    assert torch.equal(bypass, own) and bool((own != 0).any())
    lpm = sequence_logprob_mean(LOGP.double(), MASK)
    exp = _ungrouped(compute_advantages("capo", _grouped(REWARDS).double(), G, scores=_grouped(lpm)))
    torch.testing.assert_close(own, exp.float(), rtol=0, atol=1e-6)
    # the rollout's log-probs are never the reference's
    with pytest.raises(ConfigError, match="'capo' with CAPO's noise mask needs ref_log_prob"):
        _call("capo", config={}, ctx=_ctx({"rollout_log_probs": LOGP}))


# ----------------------------------------------------------------------------------------------- what it refuses


@pytest.mark.parametrize("name, cfg", [("capo", {"capo": {"noise_mask": "off"}}), ("capo_seed_grpo", {}),
                                       ("capo_gdpo", {"capo": {"reward": "rlcr"}}),
                                       ("capo_grpo", {"capo": {"noise_mask": "fixed"}})],
                         ids=["scores", "answers", "rlcr-components", "mask"])
def test_an_estimator_that_needs_the_batch_refuses_a_call_outside_compute_advantage(name, cfg):
    with pytest.raises(ConfigError, match=f"^verl estimator '{name}' was called outside verl's compute_advantage"):
        _call(name, config=cfg)


@pytest.mark.parametrize("name, core", [("capo_grpo", "grpo"), ("capo_dr_grpo", "dr_grpo"), ("capo_rloo", "rloo")])
def test_the_grpo_family_needs_nothing_but_verls_own_arguments(name, core):
    rewards = torch.tensor([0.3, 1.0, 0.0, 0.7, 0.2, 0.9, 0.4, 0.0])  # not 0/1: no verdicts to be had
    expected = _ungrouped(compute_advantages(core, _grouped(rewards).double(), G)).float()
    torch.testing.assert_close(_call(name, rewards), expected, rtol=0, atol=1e-6)  # outside compute_advantage
    # inside, at another temperature, without log-probs, verdicts or a reference: the same
    got = _call(name, rewards, config={"capo": {"logprobs": "sampling"}}, ctx=_ctx(temperature=0.6))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_rlcr_components_need_the_verdicts_and_say_so_naming_the_estimator():
    rewards = torch.tensor([0.8, -0.1, 0.5, 0.9, -1.0, 0.6, 0.0, 0.3])
    with pytest.raises(ConfigError, match="^verl estimator 'capo_gdpo' needs the verifier's verdicts"):
        _call("capo_gdpo", rewards, config={"capo": {"reward": "rlcr"}}, ctx=_ctx(non_tensor={"confidence": [0.5] * 8}))


def test_ace_without_old_log_probs_names_the_setting():
    ctx = _ctx({"ref_log_prob": LOGP})
    with pytest.raises(ConfigError, match="^verl estimator 'capo_ace' needs old_log_probs .*log-prob recomputation"):
        _call("capo_ace", config={}, ctx=ctx)


def test_the_plugins_refusals_name_the_verl_estimator():
    ctx = _ctx({"old_log_probs": LOGP, "ref_log_prob": LOGP})
    with pytest.raises(ConfigError, match=r"verl estimator 'capo' \(algorithm\.capo\): algorithm.capo.bogus_knob"):
        _call("capo", config={"capo": {"bogus_knob": 1}}, ctx=ctx)
    with pytest.raises(ConfigError, match=r"^verl estimator 'capo' \(algorithm\.capo\): algorithm\.capo\.noise_mask="
                                          r"'nope' is not allowed"):
        _call("capo", config={"capo": {"noise_mask": "nope"}}, ctx=ctx)
    with pytest.raises(ConfigError, match=r"^verl estimator 'capo' \(algorithm\.capo\): algorithm\.capo\."
                                          r"advantage_kwargs\.tau must be > 0, got 0"):
        _call("capo", config={"capo": {"advantage_kwargs": {"tau": 0}}}, ctx=ctx)
    with pytest.raises(ConfigError, match=r"temperature \(0\.7\)"):
        _call("capo", config={"capo": {"noise_mask": "off"}}, ctx=_ctx({"old_log_probs": LOGP}, temperature=0.7))


def test_gdpo_with_rlcr_uses_the_configured_format_failure_reward():
    correct = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0], dtype=torch.bool)
    conf = torch.tensor([0.9, 0.2, 0.5, 0.6, 0.5, 0.4, 0.3, 0.1])
    fmt = torch.tensor([1, 1, 0, 1, 0, 1, 1, 1], dtype=torch.bool)  # two malformed rows, one in each prompt
    nt = {"correct": correct.float().tolist(), "confidence": conf.tolist(), "format_ok": fmt.float().tolist()}
    got = {}
    for fail in (-1.0, -3.0):
        comp = rlcr_components(correct, confidence=conf, format_ok=fmt, format_failure_reward=fail)  # [N, 2]
        rewards = comp.sum(-1)
        cfg = {"capo": {"reward": "rlcr", "format_failure_reward": fail}}
        got[fail] = _call("capo_gdpo", rewards, config=cfg, ctx=_ctx(non_tensor=nt))
        exp = compute_advantages("gdpo", _grouped(rewards).double(), G, components=_grouped(comp).double())
        torch.testing.assert_close(got[fail], _ungrouped(exp).float(), rtol=0, atol=1e-6)
    assert not torch.allclose(got[-1.0], got[-3.0], atol=1e-3)


# ----------------------------------------------------------------------------------------------- the wrappers


def test_an_enum_estimator_is_read_by_its_value():
    class Est(Enum):
        CAPO = "capo"

    assert patch._name(Est.CAPO) == "capo" and patch._name("capo_grpo") == "capo_grpo"


class _Out:
    def __init__(self):
        self.meta_info = {}


def test_compute_advantage_hands_verls_arguments_on_and_owns_a_run_only_outside_one(monkeypatch):
    closed = []
    monkeypatch.setattr(CapoRun, "close", lambda self: closed.append(self))
    seen = []

    def original(data, adv_estimator, *args, **kwargs):
        ctx = current_batch()
        seen.append((data, adv_estimator, args, kwargs, ctx))
        if ctx is not None:
            ctx.metrics["m"] = 1.5
        return _Out()

    data = VerlProto({"x": torch.zeros(2)}, {})
    data.meta_info["temperature"] = 0.8
    patch._compute_advantage(original, data, "gae", 0.9, lam=0.95)  # not capo's: verl's own, untouched
    assert seen.pop() == (data, "gae", (0.9,), {"lam": 0.95}, None) and closed == []
    out = patch._compute_advantage(original, data, "capo", 0.9, num_repeat=4)  # outside any run: one of its own
    (d, name, args, kwargs, ctx) = seen.pop()
    assert (d, name, args, kwargs) == (data, "capo", (0.9,), {"num_repeat": 4})
    assert ctx.data is data and ctx.temperature == 0.8 and closed == [ctx.run]
    assert out.meta_info["capo_metrics"] == {"m": 1.5} and current_batch() is None
    run = CapoRun()
    with run.active():  # the legacy trainer's fit: its run, kept open
        patch._compute_advantage(original, data, "capo", 0.9)
    assert seen.pop()[4].run is run and closed == [ctx.run]
    v1 = BatchContext(None, run=CapoRun(), temperature=0.6)
    token = patch._V1_CALL.set(v1)  # inside the v1 trainer's advantage step: its context, its run, kept open
    try:
        patch._compute_advantage(original, data, "capo", 0.9)
    finally:
        patch._V1_CALL.reset(token)
    assert seen.pop()[4] is v1 and v1.data is data and v1.temperature == 0.6 and closed == [ctx.run]


def test_v1_extra_fields_are_unwrapped_and_missing_entries_are_none():
    class NonTensor:  # tensordict's NonTensorData holds its value in .data
        def __init__(self, data):
            self.data = data

    rows = [{"reward_extra_info": {"correct": 1.0, "pred": "7"}}, NonTensor({"reward_extra_info": {"correct": 0.0}}),
            None, {"reward_extra_info": None}, {"other": 1}, NonTensor(None)]
    assert patch._v1_extra(rows, "correct") == [1.0, 0.0, None, None, None, None]
    assert patch._v1_extra(rows, "pred") == ["7", None, None, None, None, None]


def test_v1_advantage_step_fetches_the_verdicts_and_merges_the_metrics(monkeypatch):
    calls, seen = [], []

    class TQ:
        @staticmethod
        def kv_batch_get(keys, partition_id, select_fields):
            calls.append((keys, partition_id, select_fields))
            return {"extra_fields": [{"reward_extra_info": {"correct": 1.0, "confidence": 0.25}},
                                     {"reward_extra_info": {"correct": 0.0}}]}

    monkeypatch.setitem(sys.modules, patch._TARGET_V1, SimpleNamespace(tq=TQ))

    def original(self, batch, metrics):
        ctx = patch._V1_CALL.get()
        seen.append((self, batch, metrics, ctx))
        if ctx is not None:
            ctx.metrics["calib/x"] = 2.0
        return "verl's result"

    def trainer(estimator):
        algo = SimpleNamespace(adv_estimator=estimator)
        return SimpleNamespace(config=SimpleNamespace(algorithm=algo, actor_rollout_ref=SimpleNamespace(
            rollout=SimpleNamespace(temperature=0.7))))

    batch, metrics = SimpleNamespace(keys=["k0", "k1"], partition_id="train_3"), {"step": 1}
    other = trainer("gae")
    assert patch._v1_compute_advantage(original, other, batch, metrics) == "verl's result"
    assert seen.pop() == (other, batch, metrics, None) and calls == [] and metrics == {"step": 1}
    me = trainer("capo")
    assert patch._v1_compute_advantage(original, me, batch, metrics) == "verl's result"
    assert calls == [(["k0", "k1"], "train_3", ["extra_fields"])]
    s, b, m, ctx = seen.pop()
    assert (s, b, m) == (me, batch, metrics) and ctx.run is CapoRun.of(me) and ctx.temperature == 0.7
    assert ctx.extra == {"correct": [1.0, 0.0], "confidence": [0.25, None], "format_ok": [None, None],
                         "pred": [None, None]}
    assert metrics == {"step": 1, "calib/x": 2.0} and patch._V1_CALL.get() is None
