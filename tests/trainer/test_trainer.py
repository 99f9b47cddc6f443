"""Trainer: smoke runs per algorithm, grad-accumulation and 1-vs-2-process invariance, exact resume, bad config."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _launch import accelerate_launch  # tests/ is on sys.path (its conftest.py)
from capo.errors import ConfigError
from capo.core.presets import ALGORITHMS
from capo.trainer.config import load_config
from capo.trainer.loop import Trainer

HERE = Path(__file__).parent
SMALL = {"rollout.prompts_per_step": 2, "rollout.group_size": 4, "rollout.max_new_tokens": 10, "data.n_train": 32,
         "data.n_eval": 4, "run.eval_samples": 2, "run.progress": False, "optim.lr": 1e-3}


def cfg_for(model, out, **kw):
    return load_config(None, {"model.path": model, "run.out_dir": str(out), **SMALL, **kw})


def rows(run):
    return [json.loads(ln) for ln in (Path(run) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_trains_end_to_end(tiny_model, tmp_path, algo):
    cfg = cfg_for(tiny_model, tmp_path / algo, **{"algo.name": algo, "run.steps": 2, "algo.kl_coef": 0.01})
    last = Trainer(cfg).train()
    assert last["step"] == 2
    r = rows(tmp_path / algo)
    assert [x["step"] for x in r] == [1, 2]
    for key in ("train/reward_mean", "time/rollout", "time/update", "calib/auc_mean", "eval/accuracy"):
        assert key in r[-1], key
    if r[-1]["policy/updates"] == 0:  # DAPO may filter every group of a random model
        assert r[-1]["train/filtered_frac"] == 1.0
    else:
        for key in ("policy/entropy", "policy/grad_norm", "policy/kl", "policy/clip_frac"):
            assert key in r[-1], key
    assert all(v is None or v == v for v in r[-1].values())  # no NaN written (NaN -> null)
    from safetensors.torch import load_file

    saved = load_file(tmp_path / algo / "checkpoints" / "step-000002" / "model.safetensors")
    init = load_file(Path(tiny_model) / "model.safetensors")
    moved = any(not torch.equal(saved[k], init[k]) for k in init)
    # the checkpoint holds the trained weights: they differ from the initial ones exactly when a gradient was non-zero
    # (a random model rarely answers right: many algorithms get all-zero advantages here, and then nothing moves;
    # test_every_algorithm_updates_towards_its_advantages checks the direction of an update)
    assert moved == any(x.get("policy/grad_norm", 0.0) > 0 for x in r)
    assert (tmp_path / algo / "config.yaml").is_file()


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_updates_towards_its_advantages(tiny_model, tmp_path, algo):
    """One update on a fixed batch (binary rewards = verdicts): in every mixed group the correct responses get a
    higher mean advantage than the incorrect ones, and the update raises the log-prob of the positively-advantaged
    responses against the others, sum_i A_i (lpm_after_i - lpm_before_i) > 0 -- what one descent step on a
    policy-gradient loss does to first order (lr 1e-3: one Adam step moves each weight by ~1e-3)."""
    from capo.core import sequence_logprob_mean

    tr = Trainer(cfg_for(tiny_model, tmp_path, **{"algo.name": algo, "algo.noise_mask": "off", "optim.lr": 1e-3,
                                                  "rollout.prompts_per_step": 4, "run.resume": False}))
    ro, g, rewards = _fixed_batch(tr)
    # answers that agree when correct (a random model writes none: SEED-GRPO would see maximal entropy, no update)
    g.answers = ["7" if c else str(i) for i, c in enumerate(g.correct.tolist())]
    ref = tr.logprobs(tr.ref, ro) if tr.ref is not None else None
    old = None if tr.cfg.single_update else tr.logprobs(tr.model, ro)
    batch, _ = tr.advantages(ro, g, rewards, ref, old)
    adv, c = batch.advantages.view(-1, 4), g.correct.view(-1, 4)
    mixed = c.any(1) & ~c.all(1)
    assert int(mixed.sum()) >= 2, "the fixed batch must have mixed groups"
    for a, k in zip(adv[mixed], c[mixed]):
        assert a[k].mean() > a[~k].mean(), (algo, a, k)
    before = sequence_logprob_mean(tr.logprobs(tr.model, ro), ro.response_mask)
    assert tr.update(batch)["policy/updates"] == 1
    after = sequence_logprob_mean(tr.logprobs(tr.model, ro), ro.response_mask)
    assert float((batch.advantages * (after - before)).sum()) > 0, algo


def _fixed_batch(tr, seed=5):
    from capo.trainer.data import render_prompts
    from capo.rollout import HFEngine

    problems = tr.train_set[:4]
    torch.manual_seed(seed)
    ro = HFEngine(tr.acc.unwrap_model(tr.model), tr.tok).sample(
        render_prompts(problems, tr.tok, tr.cfg.data, use_chat_template=False), k=4, max_new_tokens=10)
    g, _ = tr.reward(ro, problems)
    rewards = torch.rand(16, generator=torch.Generator().manual_seed(seed)).round()
    g.correct = rewards.bool()  # the verdicts these binary rewards stand for (CAPO reads verdicts, not rewards)
    return ro, g, rewards


@pytest.mark.parametrize("algo,extra", [("grpo", {}), ("capo", {"algo.noise_mask": "off"}),
                                         ("dapo", {}), ("gspo", {}), ("dr_grpo", {}),
                                         ("grpo", {"optim.mini_batches": 2, "optim.ppo_epochs": 2})])
def test_grad_accumulation_invariance(tiny_model, tmp_path, algo, extra):
    """Micro-batches of 4 responses give the same update as one batch of 16 (global loss normalisers)."""
    grads = []
    for micro in (0, 4):
        kw = {"algo.name": algo, "rollout.prompts_per_step": 4, "optim.micro_batch_size": micro,
              "optim.lr": 1e-2, "run.resume": False, **extra}
        tr = Trainer(cfg_for(tiny_model, tmp_path / f"m{micro}", **kw))
        ro, g, rewards = _fixed_batch(tr)
        old = None if tr.cfg.single_update else tr.logprobs(tr.model, ro)
        batch, _ = tr.advantages(ro, g, rewards, None, old)
        grads.append(record_grads(tr))
        tr.update(batch)
    assert len(grads[0]) == tr.cfg.optim.ppo_epochs * tr.cfg.optim.mini_batches
    for i, (a, b) in enumerate(zip(*grads)):
        assert a.abs().max() > 1e-4  # the update did something
        # Compare the gradients the optimizer receives. The first is exact up to float summation order; later ones
        # (several PPO epochs / mini-batches) follow an Adam step, which turns 1e-8 float noise in near-zero
        # gradient entries into parameter differences of ~lr * 1e-3, so they get a looser bound.
        tol = 1e-6 if i == 0 else 1e-4
        torch.testing.assert_close(a, b, rtol=1e-5, atol=tol * float(a.abs().max()))


@pytest.mark.parametrize("algo,extra", [("grpo", {"algo.kl_coef": 0.1}), ("gspo", {})])
def test_policy_metrics_are_means_over_a_steps_tokens_whatever_the_micro_batch_size(tiny_model, tmp_path, algo,
                                                                                       extra):
    """Four responses cut to one token: micro-batches of 4 and 8 responses hold unequal token counts, and the
    logged policy/* means (per token; GSPO's per response) equal one batch's, policy/entropy the token mean of the
    training forward's entropy (found by an audit: a mean of micro-batch means weighted by rows logged 3.455 and
    3.595 for 3.607)."""
    logged, want = {}, None
    for micro in (0, 4, 8):
        tr = Trainer(cfg_for(tiny_model, tmp_path / f"m{micro}", **{
            "algo.name": algo, "rollout.prompts_per_step": 4, "optim.micro_batch_size": micro, "run.resume": False,
            **extra}))
        with torch.no_grad():
            tr.acc.unwrap_model(tr.model).lm_head.weight.mul_(6)  # token entropies that differ
        ro, g, rewards = _fixed_batch(tr)
        ro.response_mask[:4, 1:] = 0
        ro.gen_logp[:4, 1:] = 0
        batch, _ = tr.advantages(ro, g, rewards, tr.logprobs(tr.ref, ro) if tr.ref is not None else None, None)
        if want is None:
            with torch.no_grad():
                rows_ = torch.arange(16)[batch.active]
                _, ent = tr._forward(tr.model, ro, rows_, with_entropy=True)
                m = ro.response_mask[rows_].float()
                want = float((ent * m).sum() / m.sum())
        logged[micro] = {k: v for k, v in tr.update(batch).items() if k.startswith("policy/") and k != "policy/lr"}
    assert logged[0]["policy/entropy"] == pytest.approx(want, rel=1e-6)
    assert algo != "grpo" or "policy/kl" in logged[0]
    for micro in (4, 8):
        assert logged[micro].keys() == logged[0].keys()
        for k, v in logged[0].items():
            assert logged[micro][k] == pytest.approx(v, rel=1e-5, abs=1e-7), (micro, k)


def test_a_skipped_optimizer_step_counts_in_no_policy_mean(tiny_model, tmp_path):
    """Two mini-batches, the second's gradient NaN (its advantages NaN): the step is skipped and the logged means are
    the first step's alone -- ratio 1 (the first update of the batch), the entropy of its rows' tokens (they were the
    sum of both steps over one: ratio 2.0, entropy 9.27 for 4.64)."""
    import dataclasses

    tr = Trainer(cfg_for(tiny_model, tmp_path / "r", **{"algo.name": "grpo", "rollout.prompts_per_step": 4,
                                                        "optim.mini_batches": 2, "run.resume": False}))
    ro, g, rewards = _fixed_batch(tr)
    batch, _ = tr.advantages(ro, g, rewards, None, tr.logprobs(tr.model, ro))
    first, second = tr._mini_batches(torch.arange(16)[batch.active])
    with torch.no_grad():
        _, ent = tr._forward(tr.model, ro, first, with_entropy=True)
        m = ro.response_mask[first].float()
    adv = batch.advantages.clone()
    adv[second] = float("nan")
    out = tr.update(dataclasses.replace(batch, advantages=adv))
    assert out["policy/updates"] == 1 and out["policy/skipped_updates"] == 1
    assert out["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5) and math.isfinite(out["policy/loss"])
    assert out["policy/entropy"] == pytest.approx(float((ent * m).sum() / m.sum()), rel=1e-6)


def record_grads(tr):
    """Capture the (clipped) gradient vector at every optimizer step."""
    seen, step = [], tr.opt.step

    def wrapped(*args, **kwargs):
        seen.append(torch.cat([p.grad.detach().flatten() for p in tr.model.parameters()]))
        return step(*args, **kwargs)

    tr.opt.step = wrapped
    return seen


def test_exact_resume(tiny_model, tmp_path):
    kw = {"algo.name": "capo", "run.save_every": 2, "run.seed": 3}
    Trainer(cfg_for(tiny_model, tmp_path / "full", **{**kw, "run.steps": 4})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 2})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 4})).train()  # resumes from step 2

    def strip(r):
        return {k: v for k, v in r.items() if not k.startswith(("time/", "eval/"))}

    full, part = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in part] == [1, 2, 3, 4]
    assert [strip(r) for r in full] == [strip(r) for r in part]
    from safetensors.torch import load_file

    a = load_file(tmp_path / "full/checkpoints/step-000004/model.safetensors")
    b = load_file(tmp_path / "part/checkpoints/step-000004/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_progress_bar_names_its_numbers_as_the_metrics_do():
    from capo.trainer.logging import progress_info

    m = {"train/accuracy": 0.5, "calib/auc_mean": 0.75, "train/reward_mean": float("nan")}
    assert progress_info(m) == "acc 0.500 auc_mean 0.750 reward -"


def test_resuming_with_other_settings_is_refused_and_leaves_the_run_as_it_was(tiny_model, tmp_path, capsys):
    """A run folder's checkpoints belong to the settings in its config.yaml: resuming them under others would train
    one run and label it as another. More steps, another evaluation or checkpoint schedule are a resume."""
    from capo.cli import main

    run = tmp_path / "run"
    Trainer(cfg_for(tiny_model, run, **{"algo.name": "capo", "run.steps": 1})).train()
    before = {f: (run / f).read_bytes() for f in ("config.yaml", "metrics.jsonl")}
    with pytest.raises(ConfigError, match=r'holds a run trained with other settings \(.*algo.name: "capo" -> "grpo"; '
                                          r'algo.advantage: "capo" -> "grpo";.*start it over with run.resume=false'):
        Trainer(cfg_for(tiny_model, run, **{"algo.name": "grpo", "run.steps": 2}))
    flags = [f"--{k}={v}" for k, v in {"model.path": tiny_model, "run.out_dir": run, **SMALL}.items()]
    assert main(["train", *flags, "--algo.name", "capo", "--optim.lr", "0.002", "--run.steps", "2"]) == 2
    assert "optim.lr: 0.001 -> 0.002" in capsys.readouterr().err
    assert {f: (run / f).read_bytes() for f in before} == before  # nothing trained, nothing relabelled
    Trainer(cfg_for(tiny_model, run, **{"algo.name": "capo", "run.steps": 2, "run.eval_every": 1,
                                        "run.save_every": 1, "run.keep_checkpoints": 3})).train()
    assert [r["step"] for r in rows(run)] == [1, 2]
    Trainer(cfg_for(tiny_model, run, **{"algo.name": "grpo", "run.steps": 1, "run.resume": False})).train()  # anew
    assert "name: grpo" in (run / "config.yaml").read_text()


def test_a_resume_may_change_the_knobs_that_change_no_result(tmp_path):
    """The knobs that change no result (capo.rundir.BOOKKEEPING: the KV-cache layout, the decoding loop,
    micro-batches) are a resume, as they are one job to capo sweep; micro-batches not for Clip-Cov, which chooses its
    tokens within each micro-batch."""
    from capo.rollout.engine import DECODERS, KV_CACHES
    from capo.trainer.config import dump_yaml, resume_changes

    run = tmp_path / "run"
    run.mkdir()
    for loss, refused in (("ppo_clip", []), ("clip_cov", ["optim.micro_batch_size: 8 -> 4"])):
        base = {"model.path": "default", "run.out_dir": str(run), **SMALL, "algo.loss": loss, "optim.micro_batch_size": 8}
        (run / "config.yaml").write_text(dump_yaml(load_config(None, base)))
        other = {"rollout.kv_cache": KV_CACHES[1], "rollout.decode": DECODERS[1], "optim.micro_batch_size": 4,
                 "run.steps": 9, "run.on_bad_sample": "fail"}
        assert resume_changes(run, load_config(None, {**base, **other})) == refused, loss
        assert resume_changes(run, load_config(None, {**base, "rollout.temperature": 0.5})) == [
            "rollout.temperature: 1.0 -> 0.5"]


def test_eval_at_start_logs_step_0_and_changes_no_training_number(tiny_model, tmp_path):
    """run.eval_at_start evaluates the starting model first (a step-0 row of eval/* only); it draws from its own
    random stream, so every training metric and the final weights equal a run without it."""
    kw = {"algo.name": "grpo", "run.steps": 2, "run.seed": 5, "run.eval_every": 1}
    Trainer(cfg_for(tiny_model, tmp_path / "plain", **kw)).train()
    Trainer(cfg_for(tiny_model, tmp_path / "start", **kw, **{"run.eval_at_start": True})).train()
    plain, start = rows(tmp_path / "plain"), rows(tmp_path / "start")
    assert [r["step"] for r in start] == [0, 1, 2]
    assert set(start[0]) - {"step"} == {k for k in plain[0] if k.startswith("eval/")}
    assert 0.0 <= start[0]["eval/accuracy"] <= 1.0

    def strip(r):
        return {k: v for k, v in r.items() if not k.startswith("time/")}

    assert [strip(r) for r in start[1:]] == [strip(r) for r in plain]  # eval/* at steps 1, 2 included
    from safetensors.torch import load_file

    a = load_file(tmp_path / "plain/checkpoints/step-000002/model.safetensors")
    b = load_file(tmp_path / "start/checkpoints/step-000002/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_killed_between_its_checkpoint_and_its_row_resumes_with_every_row(tiny_model, tmp_path):
    """A step writes its checkpoint, then its metrics row: a kill in between leaves checkpoint k without row k.
    The checkpoint keeps the row, so the resumed file equals the uninterrupted one (timings aside); a step-0
    evaluation already logged is not repeated."""
    kw = {"algo.name": "capo", "run.save_every": 1, "run.seed": 2, "run.eval_at_start": True}
    Trainer(cfg_for(tiny_model, tmp_path / "full", **{**kw, "run.steps": 3})).train()
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 2})).train()
    metrics = tmp_path / "part" / "metrics.jsonl"
    metrics.write_text("".join(ln + "\n" for ln in metrics.read_text().splitlines()[:-1]))  # row 2 never written
    Trainer(cfg_for(tiny_model, tmp_path / "part", **{**kw, "run.steps": 3})).train()  # resumes from step 2

    def strip(r):  # the 2-step run evaluated at its end (step 2), the 3-step one did not
        return {k: v for k, v in r.items() if not k.startswith("time/") and (r["step"] == 0 or k[:5] != "eval/")}

    full, part = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in part] == [0, 1, 2, 3]
    assert [strip(r) for r in part] == [strip(r) for r in full]
    assert "train/accuracy" in part[2] and "eval/accuracy" in part[0]


@pytest.mark.slow
def test_two_processes_equal_one(tiny_model, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    one = tmp_path / "one.pt"
    subprocess.run([sys.executable, str(HERE / "update_once.py"), tiny_model, str(one)], check=True, env=env,
                   timeout=300)
    two = tmp_path / "two.pt"
    subprocess.run([*accelerate_launch(2), str(HERE / "update_once.py"), tiny_model, str(two)], check=True, env=env,
                   timeout=300)
    a, b = torch.load(one), torch.load(two)  # the gradient each optimizer step received (after all-reduce)
    assert a.abs().max() > 1e-4
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(a.abs().max()))
    _same_policy_metrics(one, two)


def _same_policy_metrics(one, two):
    """The logged policy/* of both runs agree: every process's tokens pooled (they were the main process's own)."""
    a, b = (json.loads(Path(f"{x}.json").read_text()) for x in (one, two))
    assert a.keys() == b.keys() and {"policy/entropy", "policy/clip_frac", "policy/ratio_mean"} <= a.keys()
    for k, v in a.items():
        assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


@pytest.mark.slow
@pytest.mark.parametrize("dropped", ["0", "0,1"])
def test_two_processes_with_unequal_rows_equal_one(tiny_model, tmp_path, dropped):
    """Groups a filter left out: process 0 keeps one group of its two while process 1 keeps both, or process 0
    keeps none. The update is still the one-process update of the kept rows: the sequence count is summed over
    the processes (it was this process's rows times two, which weighted process 0's rows 1/4 and process 1's 1/8
    instead of 1/6), and a process without a row joins every all-reduce (it skipped them, and the other waited)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, str(HERE / "update_once.py"), tiny_model, str(one), "0", dropped], check=True,
                   env=env, timeout=300)
    subprocess.run([*accelerate_launch(2), str(HERE / "update_once.py"), tiny_model, str(two), "0", dropped],
                   check=True, env=env, timeout=300)
    a, b = torch.load(one), torch.load(two)
    assert a.abs().max() > 1e-4
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(a.abs().max()))
    _same_policy_metrics(one, two)


@pytest.mark.parametrize("override,message", [
    ({"rollout.group_size": 1}, "rollout.group_size must be >= 2"),
    ({"algo.name": "ppo"}, "algo.name='ppo' is not known (did you mean 'ppo_c'?); allowed: grpo"),
    ({"algo.advantage": "foo"}, "algo.advantage='foo' is not allowed; allowed values: ace, capo, dr_grpo"),
    ({"optim.lr": -1}, "optim.lr must be > 0"),
    ({"model.path": "/does/not/exist"}, "model.path: model ./does/not/exist.: no such file or folder"),
    ({"optim.micro_batch_size": 3}, "optim.micro_batch_size=3 must be a multiple of rollout.group_size"),
    ({"optim.mini_batches": 3}, "optim.mini_batches=3 must divide rollout.prompts_per_step"),
    ({"optim.nope": 1}, "unknown key optim.nope; allowed keys in optim: lr"),
    ({"rollout.group_size": "eight"}, "rollout.group_size must be of type int, got 'eight'"),
    ({"algo.advantage_kwargs": "{tau: 0}", "algo.name": "capo"}, "algo.advantage_kwargs.tau must be > 0"),
    ({"algo.advantage_kwargs": "{tauu: 1}", "algo.name": "capo"},
     "algo.advantage_kwargs: advantage estimator 'capo' has no hyperparameter 'tauu'; allowed: tau, surrogate"),
    ({"algo.advantage_kwargs": "{alpha: 2}", "algo.name": "seed_grpo"}, "algo.advantage_kwargs.alpha must be <= 1"),
    ({"algo.noise_mask": "on"}, "algo.noise_mask='on' is not allowed; allowed values: off, fixed, quantile"),
])
def test_bad_config_fails_before_work(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("?", r"\?")):
        load_config(None, override)


def test_cli_bad_config_exit_code(tmp_path):
    p = subprocess.run([sys.executable, "-m", "capo.cli", "train", "--rollout.group_size", "1"], capture_output=True,
                       text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 2
    assert "rollout.group_size must be >= 2" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_accelerate_launch_two_processes_trains(tiny_model, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on CPU (gloo) runs the CLI end to end and writes one run
    directory."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([*accelerate_launch(2), "-m", "capo.cli", "train", "--model.path", tiny_model,
                        "--run.out_dir", str(tmp_path / "ddp"),
                        "--run.steps", "2", "--rollout.prompts_per_step", "4", "--rollout.group_size", "4",
                        "--rollout.max_new_tokens", "8", "--data.n_train", "32", "--data.n_eval", "4",
                        "--run.eval_samples", "2", "--run.progress", "false", "--algo.name", "capo"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "outlived" not in p.stderr  # Trainer.leave_process_group freed DDP before the process group
    r = rows(tmp_path / "ddp")
    assert [x["step"] for x in r] == [1, 2]  # written once (main process), not once per process
    assert (tmp_path / "ddp/checkpoints/step-000002/model.safetensors").is_file()


def test_the_reference_is_held_in_model_ref_dtype(tiny_model, tmp_path):
    """model.ref_dtype: the frozen reference in bfloat16 beside a float32 policy (None: the policy's dtype); CAPO's
    step runs with it, its reference log-probs within bf16 rounding of the float32 reference's."""
    kw = {"algo.name": "capo", "run.steps": 1, "algo.noise_mask": "fixed"}
    same = Trainer(cfg_for(tiny_model, tmp_path / "same", **kw))
    assert next(same.ref.parameters()).dtype == torch.float32
    half = Trainer(cfg_for(tiny_model, tmp_path / "half", **kw, **{"model.ref_dtype": "bfloat16"}))
    assert next(half.ref.parameters()).dtype == torch.bfloat16 and next(half.model.parameters()).dtype == torch.float32
    ro = half.rollout(half.next_problems(), 4)
    a, b = same.logprobs(same.ref, ro), half.logprobs(half.ref, ro)
    m = ro.response_mask.bool()
    assert b.dtype == torch.float32 and 0 < float((a - b)[m].abs().max()) < 0.1
    assert half.train()["step"] == 1
    with pytest.raises(ConfigError, match="model.ref_dtype='fp16' is not allowed; allowed values: float32, bfloat16"):
        cfg_for(tiny_model, tmp_path / "bad", **{"model.ref_dtype": "fp16"})


def test_optim_fused_takes_the_same_steps_up_to_float_rounding(tiny_model, tmp_path):
    """optim.fused: AdamW's fused kernel, the same update as the default loop up to float rounding: two steps of GRPO
    from one seed end at the same weights within 1e-6, with the same logged numbers."""
    kw = {"algo.name": "grpo", "run.steps": 2, "run.seed": 5, "algo.reward": "reward_fns:length_reward"}  # advantages
    loop = Trainer(cfg_for(tiny_model, tmp_path / "loop", **kw))  # each trains before the next is built: the
    start = [p.detach().clone() for p in loop.model.parameters()]  # sampler draws from torch's global RNG
    loop.train()
    fused = Trainer(cfg_for(tiny_model, tmp_path / "fused", **kw, **{"optim.fused": True}))
    fused.train()
    assert fused.opt.optimizer.defaults["fused"] and not loop.opt.optimizer.defaults["fused"]
    for (name, a), b in zip(loop.model.named_parameters(), fused.model.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), name
    # the steps moved the weights: the comparison is not between two untouched models
    assert max(float((a - s0).abs().max()) for a, s0 in zip(loop.model.parameters(), start)) > 1e-4

    def nums(r):
        return {k: v for k, v in r.items() if not k.startswith("time/") and isinstance(v, float)}

    for a, b in zip(rows(tmp_path / "loop"), rows(tmp_path / "fused")):
        assert nums(b) == pytest.approx(nums(a), rel=1e-4, abs=1e-6)


def test_train_top_layers_trains_only_the_top_layers_and_the_final_norm(tiny_model, tmp_path, capsys):
    """model.train_top_layers=1: after an update, only the top decoder layer and the final norm moved; every lower
    layer and the embeddings (tied to the head) are bit-identical to the start, and the optimizer holds only the
    trained parameters. 0 (the default) trains every parameter; more layers than the model has is an error."""
    kw = {"algo.name": "grpo", "run.steps": 1, "optim.lr": 1e-2}
    t = Trainer(cfg_for(tiny_model, tmp_path / "top", **kw, **{"model.train_top_layers": 1}))
    model = t.acc.unwrap_model(t.model)
    layers = model.get_decoder().layers
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    top = {n for n, p in model.named_parameters() if p.requires_grad}
    assert top and all(n.startswith((f"model.layers.{len(layers) - 1}.", "model.norm.")) for n in top), top
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied: the head stays frozen
    assert sum(len(g["params"]) for g in t.opt.param_groups) == len(top)
    n_top = sum(p.numel() for n, p in model.named_parameters() if n in top)
    n_all = sum(p.numel() for p in model.parameters())
    assert t.param_counts == {"trained": n_top, "total": n_all} and n_top < n_all
    assert (f"training {n_top / 1e6:.2f}M of {n_all / 1e6:.2f}M parameters (model.train_top_layers=1)"
            in capsys.readouterr().err)
    ro, g, rewards = _fixed_batch(t)  # mixed groups: a non-zero update
    batch, _ = t.advantages(ro, g, rewards, None, None)
    assert t.update(batch)["policy/updates"] == 1
    after = model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and moved <= top, (moved, top)
    every = Trainer(cfg_for(tiny_model, tmp_path / "all", **kw))
    assert all(p.requires_grad for p in every.acc.unwrap_model(every.model).parameters())
    with pytest.raises(ConfigError, match=f"model.train_top_layers={len(layers) + 1}: the model has only "
                                          f"{len(layers)} decoder layers"):
        Trainer(cfg_for(tiny_model, tmp_path / "bad", **kw, **{"model.train_top_layers": len(layers) + 1}))
    with pytest.raises(ConfigError, match="model.train_top_layers"):
        cfg_for(tiny_model, tmp_path / "neg", **{"model.train_top_layers": -1})


def test_a_training_run_leaves_no_tensor_to_the_cyclic_collector(tiny_model, tmp_path):
    """Every tensor a run makes (rollouts and their KV caches, the mask calibration, the reference and old
    log-probs, the update, the evaluations) is freed by reference counting. A tensor in a reference cycle waits for
    Python's cyclic collector, which runs rarely: a rollout cache kept so made a testbed run hold 8.5 GB
    (docs/performance.md, "Memory of a testbed run")."""
    from _cycles import left_to_the_cyclic_collector

    cfg = cfg_for(tiny_model, tmp_path / "run", **{"algo.name": "capo", "run.steps": 2, "run.eval_every": 1,
                                                     "algo.mask_calib_prompts": 4})
    trainer = Trainer(cfg)
    left = [tuple(o.shape) for o in left_to_the_cyclic_collector(trainer.train) if isinstance(o, torch.Tensor)]
    assert rows(tmp_path / "run")[-1]["step"] == 2 and "eval/accuracy" in rows(tmp_path / "run")[-1]
    assert left == []
