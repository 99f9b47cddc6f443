"""The reasoning testbed's task (a model that reasons in steps): deterministic generation whose prefix does not depend
on n, splits disjoint by skeleton, gold traces whose arithmetic is right and whose lines use the prompt's numbers, the
options and their errors, the verifier path (other wordings of a right answer, wrong steps with a right final line,
malformed output) and the trace diagnostic."""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from capo.errors import ConfigError
from capo.tasks import word_problems as w


def _key(ps):
    return [(p.id, p.prompt, p.answer, p.meta) for p in ps]


def test_generation_is_deterministic_and_prefix_stable():
    a = w.word_problems("train", 300, seed=5)
    assert _key(a) == _key(w.word_problems("train", 300, seed=5))
    assert _key(a[:40]) == _key(w.word_problems("train", 40, seed=5))  # problem i does not depend on n
    assert [p.prompt for p in a] != [p.prompt for p in w.word_problems("train", 300, seed=6)]


def test_splits_are_disjoint_by_skeleton_and_eval_is_unique():
    tr = w.word_problems("train", 4000, seed=0) + w.word_problems("train", 2000, seed=1)
    ev = w.word_problems("eval", 500, seed=0)
    assert not {p.meta["skeleton"] for p in tr} & {p.meta["skeleton"] for p in ev}
    assert len({p.meta["skeleton"] for p in ev}) == len(ev)
    # a skeleton's split does not depend on the stream it came from
    assert all(w._split_of(p.meta["skeleton"]) == "eval" for p in ev)


def _replay(p) -> int:
    """Re-derive the answer from the gold trace alone, checking each line's arithmetic and chaining."""
    cur = None
    for line in p.meta["trace"].split("\n"):
        m = re.fullmatch(r"[^:]+: (\d+)([-+*/])(\d+)=(\d+)", line)
        assert m, line
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        assert c == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] and (op != "/" or a % b == 0), line
        cur = c
    return cur


def test_gold_traces_are_right_and_use_the_prompts_numbers():
    for p in w.word_problems("eval", 400, seed=0):
        assert _replay(p) == int(p.answer) >= 0
        assert 3 <= p.meta["n_lines"] == len(p.meta["trace"].split("\n")) <= 6
        first = re.fullmatch(r"[^:]+: (\d+)[-+*/](\d+)=\d+", p.meta["trace"].split("\n")[0])
        nums = set(re.findall(r"\d+", p.prompt))
        assert first[1] in nums and first[2] in nums  # the first line starts from numbers in the text
        assert p.prompt.endswith("have now?") and w.format_prompt(p) == p.prompt + "\n"
        assert all(int(x) <= w.DEFAULT_OPTIONS["max_value"] for x in re.findall(r"=(\d+)", p.meta["trace"]))


def test_the_distribution_has_the_promised_spread():
    ps = w.word_problems("train", 2000, seed=0)
    lines = [p.meta["n_lines"] for p in ps]
    assert set(lines) == {3, 4, 5, 6}
    assert {p.meta["distractors"] for p in ps} == {0, 1, 2}
    ops = {k for p in ps for k in re.findall(r"(\w+):\d+:\d+", p.meta["skeleton"])}
    assert ops == set(w.WORDING)
    lens = [len(w.format_response(p, "0.5")) for p in ps]
    assert sum(lens) / len(lens) > 100  # characters: the response is a trace, not an answer


def test_options_change_difficulty_and_are_validated():
    easy = w.word_problems("train", 300, seed=0, options={"min_ops": 2, "max_ops": 2, "distractors": 0})
    assert {p.meta["n_lines"] for p in easy} == {2} and {p.meta["distractors"] for p in easy} == {0}
    hard = w.word_problems("train", 300, seed=0, options={"min_ops": 8, "max_ops": 8, "max_value": 500})
    assert {p.meta["n_lines"] for p in hard} == {8}
    assert all(_replay(p) == int(p.answer) for p in hard)
    with pytest.raises(ConfigError, match="unknown key 'ops'.*min_ops"):
        w.check_options({"ops": 3})
    with pytest.raises(ConfigError, match="min_ops <= max_ops"):
        w.check_options({"min_ops": 5, "max_ops": 4})
    with pytest.raises(ConfigError, match="non-negative integer"):
        w.check_options({"distractors": 1.5})
    with pytest.raises(ValueError, match="split 'test' is not allowed"):
        w.word_problems("test", 3)


def _grade(texts, golds):
    from capo.rollout import grade
    from capo.verify import Verifier

    with Verifier(workers=1) as v:
        return grade(texts, golds, v, answer_format="rlcr")


def test_verifier_path_rewards_the_final_answer_only():
    p = w.word_problems("eval", 1, seed=0)[0]
    gold = w.format_response(p, "0.7")
    trace = p.meta["trace"]
    bad_steps = trace.replace("=", "=9", 1)  # a wrong intermediate result, then the right final line
    texts = [
        gold,
        f"{trace}\n<answer>{p.answer}.0</answer><confidence>0.7</confidence>",  # another wording of the number
        f"{trace}\n<answer> {p.answer} </answer><confidence>1</confidence>",
        f"{bad_steps}\n<answer>{p.answer}</answer><confidence>0.2</confidence>",
        f"{trace}\n<answer>{int(p.answer) + 1}</answer><confidence>0.9</confidence>",  # right steps, wrong answer
        f"{trace}\nthe answer is {p.answer}",  # malformed: no tags
        f"{trace}\n<answer></answer><confidence>0.5</confidence>",
        f"{trace}\n<answer>{p.answer}<confidence>0.5</confidence>",  # unclosed tag
    ]
    g = _grade(texts, [p.answer] * len(texts))
    assert g.correct.tolist() == [True, True, True, True, False, False, False, False]
    assert g.format_ok.tolist()[:5] == [True] * 5 and not any(g.format_ok.tolist()[5:])


def test_trace_check_locates_the_first_departure():
    p = next(q for q in w.word_problems("eval", 50, seed=0) if q.meta["n_lines"] >= 4)
    lines = p.meta["trace"].split("\n")
    tail = f"\n<answer>{p.answer}</answer>"
    assert w.check_trace("\n".join(lines) + tail, p) == w.TraceCheck("ok", None)
    label, rest = lines[1].split(": ")
    lhs, res = rest.split("=")
    wrong = lines[:1] + [f"{label}: {lhs}={int(res) + 1}"] + lines[2:]
    assert w.check_trace("\n".join(wrong) + tail, p) == w.TraceCheck("arithmetic", 1)
    a = int(re.match(r"(\d+)", lhs)[1])
    swapped = lines[:2] + [f"{label}: {a}+1={a + 1}"] + lines[3:]
    assert w.check_trace("\n".join(swapped) + tail, p).kind in ("operands",)
    assert w.check_trace("\n".join(lines[:2] + ["so many apples"]) + tail, p) == w.TraceCheck("malformed", 2)
    assert w.check_trace("\n".join(lines[:-1]) + tail, p) == w.TraceCheck("length", len(lines) - 1)


def test_loaded_through_the_one_dataset_list():
    from capo.tasks.datasets import DATASET_NAMES, load_problems
    from capo.tasks.generated import GENERATED_TASKS, generated_task
    from capo.tasks.prompts import render_problem

    assert "word_problems" in DATASET_NAMES and "word_problems" in GENERATED_TASKS
    got = load_problems("word_problems", "test", limit=5)
    assert _key(got) == _key(w.word_problems("eval", 5, seed=0))

    class Tok:
        bos_token = "<s>"

    assert render_problem(Tok(), got[0], dataset="word_problems") == "<s>" + got[0].prompt + "\n"
    with pytest.raises(ConfigError, match="unknown generated task 'words'"):
        generated_task("words")


def test_build_is_deterministic_and_a_prefix_of_a_longer_build(tmp_path):
    """A k-step build equals step k of a longer one (constant learning rate after warm-up), so the scan's chosen
    checkpoint is what ``capo build-default --task word_problems --steps k`` rebuilds."""
    import torch
    from safetensors.torch import load_file

    at_two = {}

    def grab(step, model):
        if step == 2:
            at_two.update({k: v.detach().clone() for k, v in model.state_dict().items()})

    s2 = w.build_word_model(tmp_path / "two", seed=3, steps=2, batch_size=2)
    s2b = w.build_word_model(tmp_path / "two_b", seed=3, steps=2, batch_size=2)
    w.build_word_model(tmp_path / "three", seed=3, steps=3, batch_size=2, on_step=grab)
    two, two_b, three = (load_file(str(tmp_path / x / "model.safetensors")) for x in ("two", "two_b", "three"))
    assert s2["loss_curve"] == s2b["loss_curve"] and all(torch.equal(two[k], two_b[k]) for k in two)
    shared = [k for k in two if k in at_two]
    assert len(shared) > 40
    assert all(torch.equal(two[k], at_two[k]) for k in shared)
    assert not all(torch.equal(two[k], three[k]) for k in shared)  # the third step moved the weights
    assert 5_000_000 <= s2["params"] <= 30_000_000


def test_a_killed_build_resumes_bit_identically(tmp_path):
    """A build that saved its state at step 2 and is started again with more steps continues from that state: its
    weights and loss curve equal those of an uninterrupted build."""
    from safetensors.torch import load_file

    state = tmp_path / "state.pt"
    w.build_word_model(tmp_path / "a", seed=4, steps=2, batch_size=2, resume=state, save_every=2, log_every=1)
    assert state.exists()
    logs = []
    resumed = w.build_word_model(tmp_path / "b", seed=4, steps=3, batch_size=2, resume=state, save_every=2,
                                 log_every=1, log=logs.append)
    straight = w.build_word_model(tmp_path / "c", seed=4, steps=3, batch_size=2, log_every=1)
    assert logs[0] == f"resumed at step 2 from {state}"
    assert resumed["loss_curve"] == straight["loss_curve"] and len(straight["loss_curve"]) == 3
    b, c = load_file(str(tmp_path / "b" / "model.safetensors")), load_file(str(tmp_path / "c" / "model.safetensors"))
    assert all(torch.equal(b[k], c[k]) for k in c)


def test_shipped_model_and_a_two_step_run_on_the_preset(tmp_path):
    import json
    import math

    from capo.rollout.models import load_model
    from capo.tasks.generated import generated_task
    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer

    task = generated_task("word_problems")
    model, tok = load_model("word_problems")
    n = sum(p.numel() for p in model.parameters())
    assert 5_000_000 <= n <= 30_000_000 and model.config.max_position_embeddings >= 512
    size = sum(f.stat().st_size for f in task.model_dir.glob("*.safetensors"))
    assert size <= 25 * 2**20
    rec = json.loads((task.model_dir / "capo_default.json").read_text())
    assert rec["params"] == n and rec["task"] == "capo:word_problems"
    assert 0.2 <= rec["eval"]["accuracy"] <= 0.6 and rec["eval"]["mean_response_tokens"] >= 64
    cfg = load_config("word_problems", {"run.steps": 2, "run.out_dir": str(tmp_path / "r"), "run.threads": 1,
                                        "run.progress": False, "data.n_eval": 4, "run.eval_samples": 2,
                                        "rollout.prompts_per_step": 4, "rollout.group_size": 4,
                                        "algo.name": "capo", "algo.mask_calib_prompts": 4})
    last = Trainer(cfg).train()
    assert last["step"] == 2
    assert math.isfinite(last["eval/entropy"]) and last["eval/entropy"] > 0
    assert last["train/response_len"] > 30  # tokens: a trace, not a ten-token answer


def test_demo_on_the_reasoning_testbed_compares_grpo_and_capo(tmp_path, capsys):
    import json

    from capo.cli import main

    out = tmp_path / "demo"
    tiny = ["rollout.prompts_per_step=2", "rollout.group_size=2", "data.n_eval=2", "run.eval_samples=2",
            "algo.mask_calib_prompts=2", "run.threads=1", "run.progress=false", "rollout.max_new_tokens=160"]
    argv = ["demo", "--task", "word_problems", "--out", str(out), "--steps", "1", "--eval-problems", "2",
            "--eval-k", "2", *[x for kv in tiny for x in ("--set", kv)]]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["per_run"]) == {"base", "grpo-seed0", "capo-seed0"}  # the task's default algorithms
    printed = capsys.readouterr().out
    assert "2 algorithms (grpo, capo)" in printed and "conclusion" in printed
    cfg = json.loads((out / "eval" / "capo-seed0" / "config.json").read_text())
    assert cfg["dataset"] == "word_problems" and cfg["max_new_tokens"] == 160


def test_a_missing_shipped_model_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """An installation without a task's shipped model (a model still being built, a trimmed wheel) stops at config
    validation with the command that builds it, writing nothing."""
    from capo.cli import main
    from capo.rollout import models

    monkeypatch.setattr(models, "_builtin_model_dir", lambda spec: tmp_path / "absent")
    assert main(["demo", "--task", "word_problems", "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert "model 'word_problems': not shipped" in err and "capo build-default --task word_problems" in err
    assert not (tmp_path / "demo").exists()
