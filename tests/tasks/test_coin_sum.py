"""The coin_sum testbed (where GRPO's overconfidence appears on a CPU): deterministic generation, the verifier agrees
with the known answers, the coin has the designed probabilities, the options are validated, the shipped model loads, and
a 2-step training run works."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from capo.errors import ConfigError
from capo.tasks import coin_sum as c
from capo.tasks import default as d


def test_generation_is_deterministic_given_the_seed():
    a = c.coin_problems("train", 200, seed=3)
    b = c.coin_problems("train", 200, seed=3)
    other = c.coin_problems("train", 200, seed=4)
    assert [(p.id, p.prompt, p.answer, p.meta) for p in a] == [(p.id, p.prompt, p.answer, p.meta) for p in b]
    assert [p.prompt for p in a] != [p.prompt for p in other]
    # options change the coins, never the chain sums underneath
    biased = c.coin_problems("train", 200, seed=3, options={"p_one": 0.9})
    assert [p.meta["base_answer"] for p in biased] == [p.meta["base_answer"] for p in a]


def test_gold_is_chain_sum_plus_hidden_coin_and_prompt_hides_the_coin():
    for p in c.coin_problems("eval", 300, seed=0):
        expr = p.prompt.removesuffix(c.COIN)
        assert c.eval_chain(expr) == int(p.meta["base_answer"])
        if p.meta["coin"] is None:
            assert not p.prompt.endswith(c.COIN) and p.answer == p.meta["base_answer"]
        else:
            assert p.prompt.endswith(c.COIN) and int(p.answer) == int(p.meta["base_answer"]) + p.meta["coin"]
    assert c.coin_trace("5+8-9+?", 1) == ("5+8=13 13-9=4 4+?=5", 5)
    assert c.coin_trace("5+8-9+?", 0) == ("5+8=13 13-9=4 4+?=4", 4)
    assert c.coin_trace("5+8", 1) == ("5+8=13", 13)


def test_prompt_does_not_depend_on_the_coin():
    zeros = c.coin_problems("eval", 100, seed=0, options={"p_one": 0.0})
    ones = c.coin_problems("eval", 100, seed=0, options={"p_one": 1.0})
    assert [p.prompt for p in zeros] == [p.prompt for p in ones]
    coin = [i for i, p in enumerate(zeros) if p.prompt.endswith(c.COIN)]
    assert coin and all(int(ones[i].answer) == int(zeros[i].answer) + 1 for i in coin)


def test_train_and_eval_are_disjoint_by_expression():
    tr = {p.prompt.removesuffix(c.COIN) for p in c.coin_problems("train", 3000, seed=0)}
    ev = {p.prompt.removesuffix(c.COIN) for p in c.coin_problems("eval", 300, seed=0)}
    assert not tr & ev


def test_verifier_agrees_with_the_known_answers():
    from capo.rollout import grade
    from capo.verify import Verifier

    probs = c.coin_problems("eval", 120, seed=0)
    coin = [p for p in probs if p.meta["coin"] is not None]
    right = [c.format_response(p, "0.5", p.meta["coin"] or 0) for p in probs]
    wrong = [c.format_response(p, "0.5", 1 - p.meta["coin"]) for p in coin]
    with Verifier(workers=1) as v:
        g_right = grade(right, [p.answer for p in probs], v, answer_format="rlcr")
        g_wrong = grade(wrong, [p.answer for p in coin], v, answer_format="rlcr")
    assert bool(g_right.correct.all()) and bool(g_right.format_ok.all())
    assert not bool(g_wrong.correct.any()) and bool(g_wrong.format_ok.all())


@pytest.mark.parametrize("p_one,coin_frac", [(0.5, 0.5), (0.8, 0.5), (0.5, 1.0), (0.3, 0.0)])
def test_coin_probabilities_are_as_designed(p_one, coin_frac):
    n = 2000
    probs = c.coin_problems("train", n, seed=1, options={"p_one": p_one, "coin_frac": coin_frac})
    coins = [p.meta["coin"] for p in probs if p.meta["coin"] is not None]
    # within 4.5 binomial standard deviations (a failure rate of ~1e-5 for a correct generator)
    assert abs(len(coins) - coin_frac * n) <= 4.5 * math.sqrt(n * coin_frac * (1 - coin_frac)) + 1e-9
    if coins:
        k = len(coins)
        assert abs(sum(coins) - p_one * k) <= 4.5 * math.sqrt(k * p_one * (1 - p_one))


def test_options_are_validated():
    assert c.check_options(None) == c.DEFAULT_OPTIONS
    with pytest.raises(ConfigError, match="unknown key 'p'.*p_one, coin_frac"):
        c.check_options({"p": 0.5})
    with pytest.raises(ConfigError, match=r"p_one must be a number in \[0, 1\]"):
        c.check_options({"p_one": 1.5})
    from capo.trainer.config import load_config

    with pytest.raises(ConfigError, match="the 'default' task takes no options"):
        load_config("default", {"data.task_options": "{p_one: 0.5}"})
    with pytest.raises(ConfigError, match="only for a task generated in code"):
        load_config("default", {"data.dataset": "gsm8k", "data.task_options": "{p_one: 0.5}"})
    with pytest.raises(ConfigError, match="coin_frac must be"):
        load_config("collapse", {"data.task_options": "{coin_frac: -1}"})
    cfg = load_config("collapse", {"data.task_options": "{p_one: 0.8}"})
    assert cfg.data.task_options == {"p_one": 0.8}


def test_capo_eval_loads_the_task_and_renders_the_raw_prompt():
    from capo.rollout.models import load_model
    from capo.tasks.datasets import load_problems
    from capo.tasks.prompts import render_problem

    probs = load_problems("coin_sum", "test", limit=5)
    assert [p.id for p in probs] == [p.id for p in c.coin_problems("eval", 5, seed=0)]
    model, tok = load_model("coin_sum")
    assert model.config.model_type == "llama"
    assert render_problem(tok, probs[0], dataset="coin_sum") == "<s>" + d.format_prompt(probs[0])
    stats = json.loads((c.COIN_MODEL_DIR / "capo_default.json").read_text())
    assert stats["task"] == "coin_sum" and 0.2 < stats["eval"]["accuracy"] < 0.8


def test_tiny_coin_build_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    kw = dict(steps=2, batch_size=4)
    s1 = c.build_coin_model(tmp_path / "a", seed=2, **kw)
    s2 = c.build_coin_model(tmp_path / "b", seed=2, **kw)
    wa, wb = (load_file(str(tmp_path / x / "model.safetensors")) for x in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert s1["final_loss"] == s2["final_loss"]
    base = load_file(str(d.DEFAULT_MODEL_DIR / "model.safetensors"))
    assert not all(torch.equal(wa[k], base[k]) for k in wa)  # the fine-tune moved the weights


def test_two_step_run_on_the_collapse_preset(tmp_path):
    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer

    cfg = load_config("collapse", {"run.steps": 2, "run.out_dir": str(tmp_path / "r"), "run.threads": 1,
                                   "run.progress": False, "data.n_eval": 8, "run.eval_samples": 2,
                                   "rollout.prompts_per_step": 4, "rollout.group_size": 4})
    last = Trainer(cfg).train()
    assert last["step"] == 2
    for k in ("policy/logp_adv_cov", "policy/entropy", "eval/accuracy", "eval/auc_mean", "eval/ece"):
        assert k in last
    assert math.isfinite(last["policy/logp_adv_cov"]) and last["policy/entropy"] > 0


def test_demo_refuses_task_options_its_final_evaluation_would_not_use(tmp_path):
    from capo.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "--task", "collapse", "--out", str(out), "--set", "data.task_options={p_one: 0.9}"]) == 2
    assert not out.exists()


def test_plot_bands_writes_a_png(tmp_path):
    from capo.evaluation.plots import plot_bands

    data = plot_bands({"grpo": [([20, 40], [0.6, 0.5]), ([20, 40], [0.7, 0.55])], "capo": [([20, 40], [0.6, 0.7])]},
                      tmp_path / "x.png", title="t", xlabel="step", ylabel="auc", reference=0.65)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "x.png").read_bytes() == data
