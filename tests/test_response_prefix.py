"""A response prefix (prefill) is written after the rendered prompt for the model and read back as the start of
the response by the grader, in training and in `capo eval` alike; a task generated in code refuses one."""

import dataclasses
import json

import pytest

from capo.errors import ConfigError
from capo.tasks.default import build_tokenizer
from capo.tasks.problem import Problem
from capo.tasks.prompts import render_problem, render_prompt, with_prefix

RLCR_TAIL = "7</answer> <confidence>0.8</confidence>"  # what a model writes after a prefilled "<answer>"


def test_the_prefix_follows_the_rendered_prompt_and_starts_the_graded_response():
    tok = build_tokenizer()
    p = Problem(id="q", prompt="3+4?", answer="7")
    plain = render_prompt(tok, "3+4?", chat_template=False, system="Be brief.")
    assert render_problem(tok, p, dataset="x.jsonl", chat_template=False, system="Be brief.",
                          response_prefix="<answer>") == plain + "<answer>"
    assert render_problem(tok, p, dataset="x.jsonl", chat_template=False, system="Be brief.") == plain
    assert with_prefix("<answer>", ["a", ""]) == ["<answer>a", "<answer>"]
    assert with_prefix("", ["a"]) == ["a"]


def test_a_task_generated_in_code_refuses_a_prefix():
    tok = build_tokenizer()
    p = Problem(id="q", prompt="1+2=", answer="3")
    with pytest.raises(ValueError, match="generated in code"):
        render_problem(tok, p, dataset="default", response_prefix="<answer>")
    from capo.trainer.config import load_config

    with pytest.raises(ConfigError, match="data.response_prefix: a response prefix is for prompted datasets"):
        load_config("default", {"data.response_prefix": "<answer>"})
    from capo.evaluation.run import EvalSettings, validate_settings

    with pytest.raises(ConfigError, match="--response-prefix: a response prefix is for prompted datasets"):
        validate_settings(EvalSettings(model="default", dataset="default", response_prefix="<answer>"))


def _dataset(path):
    path.write_text("".join(json.dumps({"prompt": f"What is {a}+{b}?", "answer": str(a + b)}) + "\n"
                            for a in range(1, 9) for b in range(1, 5)))
    return str(path)


def test_training_grades_the_prefix_and_the_response_together(tiny_model, tmp_path):
    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer

    cfg = load_config(None, {"model.path": tiny_model, "run.out_dir": str(tmp_path / "run"), "run.progress": False,
                             "data.dataset": _dataset(tmp_path / "d.jsonl"), "data.answer_format": "rlcr",
                             "model.chat_template": False, "data.n_eval": 4, "rollout.max_new_tokens": 4,
                             "data.response_prefix": "<answer>", "algo.reward": "rlcr"})
    tr = Trainer(cfg)
    seen = []
    sample = tr.engine.sample
    tr.engine.sample = lambda prompts, **kw: seen.extend(prompts) or sample(prompts, **kw)
    problems = [dataclasses.replace(p, answer="7") for p in tr.train_set[:2]]
    ro = tr.rollout(problems, 2)
    assert len(seen) == 2 and all(s.endswith("\n<answer>") for s in seen)
    ro = dataclasses.replace(ro, texts=[RLCR_TAIL] * 4)
    g, rewards = tr.reward(ro, problems)
    assert g.format_ok.all() and g.correct.all() and g.confidence.tolist() == pytest.approx([0.8] * 4)
    assert rewards.tolist() == pytest.approx([1 - 0.2 ** 2] * 4)  # RLCR: correct - (q - 1)^2
    tr.cfg.data.response_prefix = ""  # the same text without its prefix is no RLCR answer
    g, rewards = tr.reward(ro, problems)
    assert not g.format_ok.any() and rewards.tolist() == [-1.0] * 4


def test_capo_eval_prefills_grades_and_records_the_prefix(tiny_model, tmp_path, monkeypatch):
    import capo.evaluation.run as eval_run
    from capo.evaluation.run import EvalSettings, run_eval

    seen, sample = [], eval_run._sample

    def fixed(engine, texts, s, *, seed):
        seen.extend(texts)
        out = sample(engine, texts, s, seed=seed)
        return [[dataclasses.replace(x, text=RLCR_TAIL) for x in row] for row in out]

    monkeypatch.setattr(eval_run, "_sample", fixed)
    data = _dataset(tmp_path / "d.jsonl")
    s = EvalSettings(model=tiny_model, dataset=data, limit=3, k=2, max_new_tokens=4, chat_template=False,
                     system_prompt="", answer_format="rlcr", response_prefix="<answer>", n_boot=0, autocast="off")
    run_eval(s, tmp_path / "e", progress=False)
    rows = [json.loads(ln) for ln in (tmp_path / "e" / "generations.jsonl").read_text().splitlines()]
    assert seen and all(t.endswith("<answer>") for t in seen)
    assert len(rows) == 6 and all(r["text"] == "<answer>" + RLCR_TAIL and r["format_ok"] for r in rows)
    assert [r["confidence"] for r in rows] == [0.8] * 6
    assert [r["verdict"] == "correct" for r in rows] == [r["gold"] == "7" for r in rows]
    # resuming under another prefix is refused: it changes what is generated
    with pytest.raises(Exception, match="response_prefix"):
        run_eval(dataclasses.replace(s, response_prefix="<a>"), tmp_path / "e", progress=False)


def test_a_sweeps_final_evaluation_keeps_the_training_prefix(tmp_path):
    from capo.sweep import runner, spec
    from capo.trainer.config import load_config

    body = {"name": "t", "preset": "facts", "methods": {"grpo": {"algo.name": "grpo"}}, "seeds": [1]}
    job = spec.jobs(body, tmp_path / "runs", tmp_path / "records")[0]
    cfg = load_config("facts", {"data.response_prefix": "<answer>"}).to_dict()
    s = runner.eval_settings(job, cfg, "smollm2")
    assert s.response_prefix == "<answer>"
    args = runner._eval_args(s, tmp_path / "e")
    assert "--response-prefix=<answer>" in args
    from capo.cli import build_parser

    ns = build_parser().parse_args(args)
    assert ns.response_prefix == "<answer>"
    assert "--response-prefix" not in " ".join(runner._eval_args(runner.eval_settings(
        job, load_config("facts").to_dict(), "smollm2"), tmp_path / "e"))
