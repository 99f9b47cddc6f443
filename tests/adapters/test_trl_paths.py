"""CapoGRPOTrainer on the TRL paths users run: RLCR verdicts, truncation masking, the quantile mask,
temperature != 1, TRL's own old log-probs (steps_per_generation / num_iterations > 1), the completions table, the
reference through TRL's fused log-prob head with ``model_init_kwargs``, and 2 processes == 1 process.

Every expectation is recomputed independently: decoded texts, plain Hugging Face forwards with full logits (raw,
temperature 1) on the trainer's device (tests/_device.py), and capo core's estimator on the CPU -- no adapter code.
The multi-process tests run on the CPU on every machine (gloo; one GPU cannot hold two NCCL ranks).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

import pytest

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")

import torch  # noqa: E402

from capo.core import capo_noise_mask, compute_advantages, ppl_quantile_thresholds, sequence_logprob_mean  # noqa: E402
from capo.errors import CapoError  # noqa: E402

G = 4
HERE = pathlib.Path(__file__).parent
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "CAPO_TEST_DEVICE": "cpu"}  # the multi-process runs' environment


from _launch import accelerate_launch  # noqa: E402
from _tiny import DEVICE, TOL, cpu_copy, dataset as _dataset, raw_token_logps, reference_model, seven_reward  # noqa: E402


def _args(tmp_path, **kw):
    import _tiny

    return _tiny.grpo_args(tmp_path / "out", **kw)


def _trainer(tiny_model_dir, tmp_path, cfg, reward=seven_reward, trainer_kw=None, model=None, probe_ref=None,
             **args):
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoGRPOTrainer

    class Probe(CapoGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            policy = self.accelerator.unwrap_model(self.model)
            raw = {}
            out = super()._generate_and_score_completions(inputs)
            texts = self.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)
            raw["lp"] = raw_token_logps(policy, out)  # the policy that generated (no update in between)
            raw["lp_scaled"] = raw_token_logps(policy, out, self.temperature)
            raw["ref"] = raw_token_logps(self.probe_ref, out)
            self.records = getattr(self, "records", [])
            self.records.append({"out": cpu_copy(out), "batch": dict(self.capo_last_batch), "texts": texts, **raw,
                                 "rpf": self.capo_last_batch["rewards_per_func"].double().cpu(),
                                 "table": list(self._logs["advantages"])[-out["completion_ids"].size(0):]})
            return out

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    Probe.probe_ref = (probe_ref or reference_model(tiny_model_dir)).to(DEVICE)
    return Probe(model=model or tiny_model_dir, reward_funcs=reward, args=_args(tmp_path, **args), train_dataset=_dataset(),
                 processing_class=tok, capo=cfg, **(trainer_kw or {}))


def _expected(rec, *, correct, rewards, lp, thresholds=None, tau=0.6, scored=None):
    """capo core on one batch: P/N from the verdicts, rows without tokens (or unscored) are no partners."""
    mask = rec["out"]["completion_mask"]
    partners = mask.bool().any(-1) if scored is None else mask.bool().any(-1) & scored
    lpm = sequence_logprob_mean(lp, mask)
    keep = torch.ones_like(partners)
    if thresholds is not None:
        ppl = torch.exp(-sequence_logprob_mean(rec["ref"], mask))
        keep = capo_noise_mask(ppl, correct, low=thresholds[0], high=thresholds[1])
    return compute_advantages("capo", rewards, G, scores=lpm, keep=keep & partners, correct=correct,
                              partners=partners, tau=tau)


def _check_capo(tr, *, thresholds=None, lp_key="lp", correct_fn=None, scored_fn=None):
    nonzero = 0
    for rec in tr.records:
        b = rec["batch"]
        correct = b["correct"] if correct_fn is None else correct_fn(rec)
        exp = _expected(rec, correct=correct, rewards=b["rewards"], lp=rec[lp_key],
                        thresholds=thresholds or b["mask_thresholds"],
                        scored=None if scored_fn is None else scored_fn(rec))
        got = rec["out"]["advantages"].double()
        assert torch.allclose(got, exp, atol=TOL, rtol=0), (got, exp)
        # TRL's completions table shows capo's advantages
        assert torch.allclose(torch.tensor(rec["table"], dtype=torch.float64), exp, atol=1e-6)
        nonzero += int((got.abs() > 1e-9).sum())
    assert nonzero > 0, "no signal in any batch: the test would not notice a wrong estimator"


def test_capo_with_rlcr_reward_reads_the_verdicts(tiny_model_dir, tmp_path):
    """RLCR: a correct answer with q = 0.1 gets reward 0.19 and must still be in CAPO's P set."""
    from capo.adapters.trl import CapoAdvantageConfig, RLCRReward

    reward = RLCRReward(answer_key="answer")
    cfg = CapoAdvantageConfig(advantage="capo", advantage_kwargs={"tau": 0.6}, noise_mask="off")
    tr = _trainer(tiny_model_dir, tmp_path, cfg, reward=reward, max_steps=3)
    tr.train()
    low_reward_correct = 0
    for rec in tr.records:
        b = rec["batch"]
        low_reward_correct += int((b["correct"] & (b["rewards"] < 0.5)).sum())
    assert low_reward_correct > 0, "no correct answer with reward < 0.5: the test would not see the old bug"
    _check_capo(tr, correct_fn=lambda rec: torch.tensor([bool(re.search(r"<answer>\s*7\s*</answer>", t))
                                                         for t in rec["texts"]]))


@pytest.mark.parametrize("fail", [None, -0.25])
def test_gdpo_with_the_rlcr_reward_alone_normalises_rlcrs_two_terms(tiny_model_dir, tmp_path, fail):
    """GDPO with RLCRReward as the only reward function: its components are RLCR's correctness and Brier terms (from
    the recorded verdicts, confidences and format flags; a malformed output gets the format-failure reward, -1 or
    the one given), each normalised in its group, not the one summed reward (mutation testing: the
    RLCR-alone rule, the format flags and the failure reward could each be dropped unnoticed)."""
    from capo.adapters.trl import CapoAdvantageConfig, RLCRReward
    from capo.core import ADVANTAGES, rlcr_components

    class Keep(RLCRReward):
        def __call__(self, *a, **kw):
            out = super().__call__(*a, **kw)
            self.history = getattr(self, "history", []) + [self.last]
            return out

    reward = Keep(answer_key="answer", format_failure_reward=fail)
    cfg = CapoAdvantageConfig(advantage="gdpo", noise_mask="off", calibration_metrics=False)
    tr = _trainer(tiny_model_dir, tmp_path, cfg, reward=reward, max_steps=2, max_completion_length=6)
    tr.train()
    assert len(reward.history) == len(tr.records) == 2
    assert tr.state.log_history and not any(k.startswith("calib/") for h in tr.state.log_history for k in h)
    formats, differs = set(), 0
    for rec, last in zip(tr.records, reward.history, strict=True):
        formats |= set(last.format_ok)
        comp = rlcr_components(torch.tensor(last.correct), confidence=torch.tensor(last.confidence).float(),
                               format_ok=torch.tensor(last.format_ok),
                               format_failure_reward=-1.0 if fail is None else fail).double()
        rewards = rec["batch"]["rewards"]
        want = ADVANTAGES.get("gdpo")(rewards, G, components=comp)
        got = rec["out"]["advantages"].double()
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
        one = ADVANTAGES.get("gdpo")(rewards, G, components=rewards[:, None])
        differs += int(((want - one).abs() > 1e-4).sum())
    assert differs > 0, "two terms equalled the summed reward on every row: the test would not see the rule"
    assert formats == {True, False}, "every output well formed, or none: the format flags would not matter"


def test_gdpo_with_two_reward_functions_normalises_each_with_trls_weights(tiny_model_dir, tmp_path):
    """GDPO with two reward functions: one component per function (TRL's gathered rewards per function, unscored =
    0), combined with TRL's reward_weights; a weights hyperparameter given to capo wins over them."""
    from capo.adapters.trl import CapoAdvantageConfig
    from capo.core import ADVANTAGES

    def digit(completions, completion_ids, **kwargs):  # a second reward, not a function of the first: the first
        # digit / 9; it reads TRL's token ids too (the override must hand them on)
        assert len(completion_ids) == len(completions) and all(len(i) > 0 for i in completion_ids)
        return [int(m.group()) / 9 if (m := re.search(r"\d", c)) else 0.0 for c in completions]

    for hp, weights in [({}, [1.0, 0.5]), ({"weights": [0.2, 1.0]}, [0.2, 1.0])]:
        cfg = CapoAdvantageConfig(advantage="gdpo", advantage_kwargs=hp, noise_mask="off")
        tr = _trainer(tiny_model_dir, tmp_path / str(weights), cfg, reward=[seven_reward, digit],
                      reward_weights=[1.0, 0.5])
        tr.train()
        differs = 0
        for rec in tr.records:
            rpf, got, used = rec["rpf"], rec["out"]["advantages"].double(), rec["batch"]["rewards"]
            rewards = (rpf * torch.tensor([1.0, 0.5], dtype=torch.float64)).nansum(1)
            torch.testing.assert_close(used, rewards, rtol=0, atol=1e-7)  # the reward the step read: TRL's weights
            want = ADVANTAGES.get("gdpo")(rewards, G, components=torch.nan_to_num(rpf), weights=weights)
            torch.testing.assert_close(got, want, rtol=0, atol=TOL)
            one = ADVANTAGES.get("gdpo")(rewards, G, components=rewards[:, None])
            differs += int(((want - one).abs() > 1e-4).sum())
        assert differs > 0, "per-function components equalled the summed reward: the test would not see them"


def test_trls_evaluation_runs_capos_step_with_its_own_group_size_and_logs_under_eval(tiny_model_dir, tmp_path):
    """``trainer.evaluate()``: the policy in eval mode, groups of ``num_generations_eval`` (2 here, 4 in training),
    the extra forwards (old log-probs, capo's own reference) in chunks of the eval batch size, capo's step (with its
    noise mask) and calibration metrics logged under TRL's "eval" metrics, not "train"; ``capo_last_batch`` holds
    the documented keys."""
    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", mask_low=1.3, mask_high=1.9)
    tr = _trainer(tiny_model_dir, tmp_path, cfg, max_steps=1, num_generations_eval=2, per_device_eval_batch_size=4)
    chunks, forward = [], tr._capo_token_logps
    tr._capo_token_logps = lambda model, out, batch_size: chunks.append(batch_size) or forward(model, out, batch_size)
    tr.train()
    assert chunks == [8, 8]  # old log-probs and the reference, in chunks of per_device_train_batch_size
    first = tr.records[0]  # training: groups of num_generations (4), not the evaluation's 2
    assert first["batch"]["group_size"] == G
    _check_capo(tr, thresholds=(1.3, 1.9))
    logged = [h for h in tr.state.log_history if "calib/accuracy" in h]
    assert len(logged) == 1 and 0 <= logged[0]["time/capo_ref_forward_s"] < 60  # a duration, not a clock reading
    metrics = tr.evaluate(_dataset())
    rec = tr.records[-1]
    assert rec["batch"]["group_size"] == 2 and len(rec["texts"]) == 4 and set(chunks[2:]) == {4}
    mask = rec["out"]["completion_mask"]
    real = mask.bool().any(-1)
    keep = capo_noise_mask(torch.exp(-sequence_logprob_mean(rec["ref"], mask)), rec["batch"]["correct"], low=1.3,
                           high=1.9)
    want = compute_advantages("capo", rec["batch"]["rewards"], 2, correct=rec["batch"]["correct"], keep=keep & real,
                              scores=sequence_logprob_mean(rec["lp"], mask), partners=real, tau=0.6)
    torch.testing.assert_close(rec["batch"]["advantages"].double(), want, rtol=0, atol=TOL)
    assert "eval_calib/accuracy" in metrics and "eval_time/capo_ref_forward_s" in metrics
    assert [h for h in tr.state.log_history if "calib/accuracy" in h] == logged  # nothing more under "train"
    assert set(tr.capo_last_batch) == {"rewards_per_func", "rewards", "correct", "valid", "scores", "keep", "ref_ppl",
                                       "mask_thresholds", "advantages", "trl_advantages_local", "process_slice",
                                       "group_size"}
    assert tr.capo_last_batch["process_slice"] == slice(0, 4) and tr.capo_last_batch["valid"].all()


def test_tokens_a_tool_wrote_are_left_out_of_capos_scores(tiny_model_dir, tmp_path, monkeypatch):
    """With TRL's tool calling, ``tool_mask`` marks the completion tokens a tool wrote (0): capo's log-prob scores
    read the model's own tokens only (completion mask x tool mask), as TRL's loss does. Simulated: TRL's batch gains
    a tool mask hiding each row's last 3 tokens."""
    from trl import GRPOTrainer

    from capo.adapters.trl import CapoAdvantageConfig

    generate = GRPOTrainer._generate_and_score_completions

    def with_tools(self, inputs):
        out = generate(self, inputs)
        out["tool_mask"] = torch.ones_like(out["completion_mask"])
        out["tool_mask"][:, -3:] = 0
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", with_tools)
    tr = _trainer(tiny_model_dir, tmp_path, CapoAdvantageConfig(advantage="capo", noise_mask="off"), max_steps=2)
    tr.train()
    differs = 0
    for rec in tr.records:
        b, out = rec["batch"], rec["out"]
        own = {**rec, "out": {**out, "completion_mask": out["completion_mask"] * out["tool_mask"]}}
        want = _expected(own, correct=b["correct"], rewards=b["rewards"], lp=rec["lp"])
        torch.testing.assert_close(out["advantages"].double(), want, rtol=0, atol=TOL)
        whole = _expected(rec, correct=b["correct"], rewards=b["rewards"], lp=rec["lp"])
        differs += int(((want - whole).abs() > 1e-4).sum())
    assert differs > 0, "the tool tokens changed no advantage: the test would not see them counted"


def test_construction_passes_trls_positional_arguments_and_names_itself_in_errors(tiny_model_dir, tmp_path):
    """GRPOTrainer's positional arguments after ``args`` (the training set) reach TRL; no batch is recorded before
    training; a bad estimator setting is refused with a message that starts with the trainer's name."""
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer
    from capo.errors import ConfigError

    tok, data = AutoTokenizer.from_pretrained(tiny_model_dir), _dataset()
    tr = CapoGRPOTrainer(tiny_model_dir, seven_reward, _args(tmp_path), data, processing_class=tok,
                         capo=CapoAdvantageConfig(advantage="grpo"))
    assert tr.train_dataset is data and tr.capo_last_batch is None
    for bad in (dict(advantage="grpoo"), dict(advantage="grpo", advantage_kwargs={"tauu": 1.0})):
        with pytest.raises(ConfigError, match="^CapoGRPOTrainer: (advantage_kwargs: )?advantage estimator "):
            CapoGRPOTrainer(tiny_model_dir, seven_reward, _args(tmp_path), data, processing_class=tok,
                            capo=CapoAdvantageConfig(**bad))


def test_truncated_completions_are_no_partners_and_quantile_mask(tiny_model_dir, tmp_path):
    """mask_truncated_completions=True zeroes a truncated row's mask: it must not enter pairs as a maximally
    confident partner (lpm 0). Quantile mask: thresholds from the first batch's PPL_ref, then frozen."""
    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", advantage_kwargs={"tau": 0.6}, noise_mask="quantile",
                              mask_q_low=0.3, mask_q_high=0.7)
    tr = _trainer(tiny_model_dir, tmp_path, cfg, mask_truncated_completions=True, max_completion_length=7,
                  max_steps=3)
    tr.train()
    first = tr.records[0]
    m = first["out"]["completion_mask"]
    ppl = torch.exp(-sequence_logprob_mean(first["ref"], m))[m.bool().any(-1)]
    q = ppl_quantile_thresholds(ppl, 0.3, 0.7)
    assert all(r["batch"]["mask_thresholds"] == pytest.approx(q, rel=1e-6) for r in tr.records)
    truncated = torch.cat([~r["out"]["completion_mask"].bool().any(-1) for r in tr.records])
    assert 0 < int(truncated.sum()) < truncated.numel(), "need both truncated and complete rows"
    adv = torch.cat([r["out"]["advantages"] for r in tr.records])
    assert (adv[truncated] == 0).all()
    _check_capo(tr, thresholds=q, correct_fn=lambda rec: torch.tensor(seven_reward(rec["texts"])) == 1)


@pytest.mark.parametrize("mode", ["raw", "sampling"])
def test_temperature_convention(tiny_model_dir, tmp_path, mode):
    """At temperature 0.7: "raw" lpm/PPL_ref are temperature-1 log-probs (the paper's, capo's trainer), "sampling"
    TRL's temperature-scaled ones. The reference goes through TRL's fused head (patched, no full logits)."""
    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", mask_low=1.3, mask_high=1.9, logprobs=mode)
    tr = _trainer(tiny_model_dir, tmp_path, cfg, temperature=0.7, model_init_kwargs={"attn_implementation": "eager"})
    assert tr._capo_ref.config._attn_implementation == "eager"  # loaded with args.model_init_kwargs
    assert "forward" in tr._capo_ref.__dict__  # TRL's fused per-token log-prob head is installed on it
    tr.train()
    if mode == "raw":
        _check_capo(tr, thresholds=(1.3, 1.9))
    else:
        for rec in tr.records:
            mask = rec["out"]["completion_mask"]
            got = rec["batch"]["scores"]
            assert torch.allclose(got, sequence_logprob_mean(rec["lp_scaled"], mask), atol=TOL)
            assert not torch.allclose(got, sequence_logprob_mean(rec["lp"], mask), atol=1e-3)


@pytest.mark.parametrize("extra", [{"steps_per_generation": 2}, {"num_iterations": 2}])
def test_trl_own_old_logprobs(tiny_model_dir, tmp_path, extra):
    """With steps_per_generation or num_iterations > 1 TRL keeps its old log-probs: capo reads them (no extra
    forward) and the advantages still equal capo core's."""
    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", noise_mask="off")
    tr = _trainer(tiny_model_dir, tmp_path, cfg, per_device_train_batch_size=4, max_steps=4, **extra)
    tr.train()
    assert all(r["out"].get("old_per_token_logps") is not None for r in tr.records)
    assert len(tr.records) == 2
    _check_capo(tr)
    logged = {k for h in tr.state.log_history for k in h}
    assert "time/capo_extra_forward_s" not in logged and "calib/auroc" in logged


def test_unscored_rows_are_no_partners(tiny_model_dir, tmp_path):
    """A reward function returning None (TRL: unscored) for confidence-0.5 answers: those rows get advantage 0 and
    take part in no pair (they were once partners with reward 0)."""
    from capo.adapters.trl import CapoAdvantageConfig

    def unscored(texts):
        return torch.tensor([bool(re.search(r"<confidence>\s*0\.5", t)) for t in texts])

    def verifier(completions, **kw):
        r = seven_reward(completions)
        return [None if u else v for v, u in zip(r, unscored(completions).tolist())]

    cfg = CapoAdvantageConfig(advantage="capo", noise_mask="off", verdict_reward="verifier")
    tr = _trainer(tiny_model_dir, tmp_path, cfg, reward=verifier, max_steps=3)
    tr.train()
    skipped = torch.cat([unscored(r["texts"]) for r in tr.records])
    assert 0 < int(skipped.sum()) < skipped.numel(), "need both scored and unscored rows"
    assert (torch.cat([r["out"]["advantages"] for r in tr.records])[skipped] == 0).all()
    _check_capo(tr, correct_fn=lambda rec: torch.tensor(seven_reward(rec["texts"])) == 1,
                scored_fn=lambda rec: ~unscored(rec["texts"]))


@pytest.mark.parametrize("advantage", ["grpo", "capo"])
def test_an_evaluation_of_one_generation_per_prompt_keeps_trls_zero_advantages(tiny_model_dir, tmp_path, advantage):
    """TRL evaluates with num_generations_eval=1 (advantage 0): there is no group to rank within, and the adapter
    leaves TRL's zeros (it stopped the evaluation with "group_size must be >= 2"; found by an audit)."""
    from transformers import AutoTokenizer

    from capo.adapters.trl import CapoAdvantageConfig, CapoGRPOTrainer

    cfg = CapoAdvantageConfig(advantage=advantage, noise_mask="off")
    tr = CapoGRPOTrainer(model=tiny_model_dir, reward_funcs=seven_reward, processing_class=AutoTokenizer.from_pretrained(
        tiny_model_dir), args=_args(tmp_path, num_generations_eval=1, per_device_eval_batch_size=4, max_steps=0),
        train_dataset=_dataset(), capo=cfg)
    out = tr.evaluate(_dataset(4))
    assert "eval_reward" in out and tr.capo_last_batch is None
    assert not any(k.startswith("eval_calib/") for k in out)


def test_verdict_reward_must_be_binary(tiny_model_dir, tmp_path):
    from capo.adapters.trl import CapoAdvantageConfig

    def graded(completions, **kw):
        return [0.3 for _ in completions]

    cfg = CapoAdvantageConfig(advantage="capo", noise_mask="off")
    tr = _trainer(tiny_model_dir, tmp_path, cfg, reward=graded, max_steps=1)
    with pytest.raises(CapoError, match="returned values other than 0/1, so it cannot serve as the verifier"):
        tr.train()


def test_reward_functions_beside_the_verdicts_are_said_not_to_change_capos_update(tiny_model_dir, tmp_path):
    """CAPO ranks the verdicts: a second reward function (a length bonus) changes TRL's logged rewards, not the
    update, and constructing the trainer warns so, naming it (as ``capo train`` notes its own reward's shaping);
    GRPO reads the summed reward, and one function alone is the verdicts: no warning."""
    import warnings

    from capo.adapters.trl import CapoAdvantageConfig

    def verifier(completions, **kw):
        return seven_reward(completions)

    def length_bonus(completions, **kw):
        return [len(c) / 100 for c in completions]

    capo = CapoAdvantageConfig(advantage="capo", noise_mask="off", verdict_reward="verifier")
    with pytest.warns(UserWarning, match=r"length_bonus do not change the update: advantage 'capo' ranks responses "
                                         r"by the verifier's verdicts.*come from verifier"):
        _trainer(tiny_model_dir, tmp_path, capo, reward=[verifier, length_bonus])
    for cfg, reward in ((CapoAdvantageConfig(advantage="grpo"), [verifier, length_bonus]), (capo, [verifier])):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="CapoGRPOTrainer: reward function")
            _trainer(tiny_model_dir, tmp_path, cfg, reward=reward)


def test_two_processes_equal_one(tiny_model_dir, tmp_path):
    """TRL on 2 processes (accelerate launch, gloo on CPU): each process's advantages are its slice of capo core
    on the whole gathered batch, recomputed here from the full batch in one process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **CPU_ONLY}
    out = tmp_path / "two"
    subprocess.run([*accelerate_launch(2), str(HERE / "trl_two_process.py"), tiny_model_dir, str(out)], check=True,
                   env=env, timeout=600)
    ranks = [torch.load(out / f"rank{r}.pt") for r in (0, 1)]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    n_local = ranks[0]["local_adv"].numel()
    t = max(r["completion_ids"].size(1) for r in ranks)

    def pad(x):
        return torch.nn.functional.pad(x, (0, t - x.size(1)))

    full = {k: torch.cat([pad(r[k]) for r in ranks]) for k in ("completion_ids", "completion_mask")}
    full["prompt_ids"] = torch.cat([r["prompt_ids"] for r in ranks])
    full["prompt_mask"] = torch.cat([r["prompt_mask"] for r in ranks])
    assert full["prompt_ids"].size(1) == ranks[1]["prompt_ids"].size(1)
    lp = raw_token_logps(model, full)
    ref = lp  # the reference is the same initial model
    mask = full["completion_mask"]
    rec = {"out": full, "ref": ref}
    rewards = torch.cat([r["rewards_local"] for r in ranks])
    assert torch.equal(rewards, ranks[0]["rewards_all"]), "gathered rewards are the concatenated local ones"
    exp = _expected(rec, correct=rewards == 1, rewards=rewards, lp=lp, thresholds=(1.3, 1.9))
    got = torch.cat([r["local_adv"].double() for r in ranks])
    assert n_local == 8 and torch.allclose(got, exp, atol=TOL, rtol=0), (got, exp)
    assert (got.abs() > 1e-9).any()
    assert torch.allclose(ranks[0]["all_adv"], exp, atol=TOL) and torch.allclose(ranks[1]["all_adv"], exp, atol=TOL)
    assert json.loads((out / "rank0.json").read_text())["world"] == 2
    del mask


def test_trls_own_reference_at_beta_nonzero_serves_the_mask(tiny_model_dir, tmp_path):
    """beta != 0 at temperature 1: TRL keeps its own frozen reference and computes its per-token log-probs, and
    capo's noise mask reads those (no reference of its own, no extra forward). After the first update the policy
    differs from the reference, so the second batch's mask tells them apart (mutation testing: a wrong
    key for TRL's log-probs went unnoticed)."""
    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", mask_low=1.3, mask_high=1.9)
    tr = _trainer(tiny_model_dir, tmp_path, cfg, max_steps=2, learning_rate=5e-2, beta=0.04, temperature=1.0)
    assert tr._capo_ref is None and tr.ref_model is not None  # TRL's reference, not capo's
    tr.train()
    _check_capo(tr, thresholds=(1.3, 1.9))
    last = tr.records[-1]
    assert not torch.allclose(last["lp"], last["ref"], atol=1e-4), "the policy did not move: the test is vacuous"
    ppl = torch.exp(-sequence_logprob_mean(last["ref"], last["out"]["completion_mask"]))
    assert torch.allclose(last["batch"]["ref_ppl"].double(), ppl, rtol=1e-6, atol=0)  # TRL's are float32
    assert "time/capo_ref_forward_s" not in tr._metrics["train"]


def test_peft_reference_is_the_base_model(tiny_model_dir, tmp_path):
    """PEFT (LoRA via TRL's peft_config), beta = 0: the reference is TRL's convention -- the "ref" adapter if present,
    else adapters disabled -- here the base model. After the first update the LoRA policy differs from the base, so
    the second batch's mask tells base from policy."""
    peft = pytest.importorskip("peft", reason="peft is not installed")
    from capo.adapters.trl import CapoAdvantageConfig

    cfg = CapoAdvantageConfig(advantage="capo", mask_low=1.3, mask_high=1.9)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    tr = _trainer(tiny_model_dir, tmp_path, cfg, max_steps=2, learning_rate=5e-2,
                  trainer_kw={"peft_config": lora})
    assert tr._capo_ref is None  # no own reference model: the PEFT base serves
    tr.train()
    _check_capo(tr, thresholds=(1.3, 1.9))
    last = tr.records[-1]
    assert not torch.allclose(last["lp"], last["ref"], atol=1e-4), "the policy did not move: the test is vacuous"


def test_peft_pretrained_adapter_reference_is_trls_ref_adapter(tiny_model_dir, tmp_path):
    """A PEFT model with a pretrained (non-zero) adapter and beta != 0: TRL keeps a frozen copy of the adapter as
    "ref". At temperature 0.7 with logprobs="raw", capo scores the reference itself at temperature 1 and must use
    that "ref" adapter (base + initial adapter), not the bare base model (what disable_adapter() gives)."""
    import copy

    peft = pytest.importorskip("peft", reason="peft is not installed")
    from transformers import AutoModelForCausalLM

    from capo.adapters.trl import CapoAdvantageConfig

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    pm = peft.get_peft_model(base, lora)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a "pretrained" adapter: the policy is not the base model
    ref = copy.deepcopy(pm).merge_and_unload().eval()
    cfg = CapoAdvantageConfig(advantage="capo", mask_low=1.3, mask_high=1.9)
    tr = _trainer(tiny_model_dir, tmp_path, cfg, model=pm, probe_ref=ref, max_steps=1, beta=0.04, temperature=0.7)
    assert "ref" in tr.accelerator.unwrap_model(tr.model).peft_config
    tr.train()
    rec = tr.records[0]
    plain = raw_token_logps(reference_model(tiny_model_dir), rec["out"])
    m = rec["out"]["completion_mask"]
    ppl_ref, ppl_base = (torch.exp(-sequence_logprob_mean(x, m)) for x in (rec["ref"], plain))
    assert torch.allclose(rec["batch"]["ref_ppl"], ppl_ref, rtol=1e-5)  # raw temperature-1, "ref" adapter
    assert not torch.allclose(rec["batch"]["ref_ppl"], ppl_base, rtol=1e-3)  # not the bare base model
    _check_capo(tr, thresholds=(1.3, 1.9))


def _launch(procs: int, model_dir: str, out: pathlib.Path, est: str, per_device: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **CPU_ONLY}
    subprocess.run([*accelerate_launch(procs), str(HERE / "trl_train_processes.py"), model_dir, str(out), est,
                    str(per_device), "3"], check=True, env=env, timeout=600)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(procs)]
    assert all(r["world"] == procs for r in ranks)
    rows = {}  # (step, global row) -> (prompt, completion, advantage)
    for r in ranks:
        for b in r["batches"]:
            for j, p, c, a in zip(b["rows"], b["prompts"], b["completions"], b["advantages"], strict=True):
                rows[(b["step"], j)] = (p, c, a)
    return {"rows": rows, "params": torch.load(out / "params.pt")}


@pytest.mark.parametrize("est", ["capo", "seed_grpo"])
def test_training_on_two_processes_equals_one(est, tiny_model_dir, tmp_path):
    """Three optimizer steps of CapoGRPOTrainer on 2 processes (gloo on CPU) end at the parameters of one process
    with the same global batch (16 rows = 4 prompts x 4), seeds and completions (a fixed function of the row and
    the step: sampling is the one thing ranks cannot share). CAPO runs with its noise mask (thresholds from the
    gathered batch); SEED-GRPO reads the extracted answers of every row of its group. Tolerance 2e-5 absolute on
    parameters of size ~0.1 (measured: 1.9e-6 CAPO, 4.3e-6 SEED-GRPO): the two runs differ only in the order of
    floating-point sums (DDP's all-reduce of the two ranks' gradients vs one backward over all rows), which
    AdamW's normalised steps (lr 5e-3) carry; a wrong slice, a missing gather or a mask computed per rank moves
    parameters by ~lr = 5e-3, 250 times the tolerance."""
    from transformers import AutoModelForCausalLM

    one = _launch(1, tiny_model_dir, tmp_path / "one", est, 16)
    two = _launch(2, tiny_model_dir, tmp_path / "two", est, 8)
    assert set(one["rows"]) == set(two["rows"]) and len(one["rows"]) == 3 * 16
    for key, (p, c, a) in one["rows"].items():
        p2, c2, a2 = two["rows"][key]
        assert (p, c) == (p2, c2), f"row {key}: the two runs saw different prompts or completions"
        assert abs(a - a2) <= 1e-6, (key, a, a2)
    assert sum(abs(a) > 1e-6 for _, _, a in one["rows"].values()) >= 8, "advantages all ~0: nothing would be tested"
    init = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = max((one["params"][k] - init[k]).abs().max().item() for k in init)
    assert moved > 1e-3, "the three steps did not move the parameters"
    diffs = {k: (two["params"][k] - v).abs().max().item() for k, v in one["params"].items()}
    # The key projection's bias has an exactly-zero gradient in exact arithmetic (softmax over keys is invariant to
    # it), so it receives float noise ~1e-10 whose AdamW step, noise / (|noise| + eps) * lr, is any size up to lr:
    # it is checked against lr / 50 instead (a real error moves parameters by ~lr).
    noise = {k for k in diffs if k.endswith("k_proj.bias")}
    print(f"{est}: moved {moved:.2e}; max |2 procs - 1 proc| {max(diffs[k] for k in diffs if k not in noise):.2e}, "
          f"k_proj.bias {max(diffs[k] for k in noise):.2e}")  # docs/results/engines.md records these (pytest -s)
    assert max(diffs[k] for k in diffs if k not in noise) <= 2e-5, sorted(diffs.items(), key=lambda x: -x[1])[:3]
    assert max(diffs[k] for k in noise) <= 5e-3 / 50, {k: diffs[k] for k in noise}
