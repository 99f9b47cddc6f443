"""`capo eval`'s response budget when --max-new-tokens is not given: a shipped model's task budget; else 512, lowered
to what the model's context leaves after the longest prompt (said on stderr); a value given that does not fit is
still an error (found as a new user: `capo eval --model default --dataset default` stopped with "exceeds the model's
context of 256 positions")."""

import json
from types import SimpleNamespace

from capo.cli import main
from capo.evaluation.run import DEFAULT_MAX_NEW_TOKENS, EvalSettings, response_budget
from capo.rundir import read_jsonl_rows
from capo.tasks.generated import GENERATED_TASKS


def _problems(path, n=3):
    from capo.tasks.datasets import load_problems

    path.write_text("".join(json.dumps({"prompt": f"What is {i}+{i} and then some more words {'x ' * i}?",
                                        "answer": str(2 * i)}) + "\n" for i in range(n)))
    return load_problems(str(path), split="test")


def test_the_default_model_evaluates_with_its_tasks_budget(tmp_path, capsys):
    """The command a new user types (with a quick bootstrap): no context error, the budget is the task's 64."""
    out = tmp_path / "e"
    assert main(["eval", "--model", "default", "--dataset", "default", "--limit", "2", "-k", "2", "--out", str(out),
                 "--no-progress", "--n-boot", "20", "--verify-workers", "1"]) == 0
    assert json.loads((out / "config.json").read_text())["max_new_tokens"] == GENERATED_TASKS["default"].max_new_tokens
    rows = read_jsonl_rows(out / "generations.jsonl")
    assert len(rows) == 4 and all(1 <= r["n_tokens"] <= 64 for r in rows)
    assert "--max-new-tokens not given" not in capsys.readouterr().err  # a shipped model's budget needs no note


def test_every_shipped_model_gets_its_tasks_budget(tmp_path):
    for name, task in GENERATED_TASKS.items():
        assert response_budget(EvalSettings(model=name, dataset=name), []) == task.max_new_tokens
    assert response_budget(EvalSettings(model="default", max_new_tokens=7), []) == 7  # given: kept


def test_default_budget_is_lowered_to_what_the_context_leaves(tiny_model, tmp_path, capsys):
    """The tests' tiny model has 256 positions: 512 cannot fit; the budget is 256 - the longest prompt, and stderr
    says which budget was used and why."""
    from capo.rollout.models import load_tokenizer_and_context
    from capo.tasks.prompts import render_prompt

    problems = _problems(tmp_path / "d.jsonl")
    s = EvalSettings(model=str(tiny_model), dataset=str(tmp_path / "d.jsonl"), chat_template=False, system_prompt="")
    tok, limit = load_tokenizer_and_context(str(tiny_model))
    assert limit == 256
    texts = [render_prompt(tok, p.prompt, chat_template=False, system="") for p in problems]
    longest = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    got = response_budget(s, problems)
    assert got == limit - longest and 0 < got < DEFAULT_MAX_NEW_TOKENS
    err = capsys.readouterr().err
    assert (f"the default {DEFAULT_MAX_NEW_TOKENS} does not fit the model's context of 256 positions after the "
            f"longest prompt ({longest} tokens): using {got}") in err
    # a context that holds the default: 512, no note (an engine already started is asked, not the model folder)
    big = SimpleNamespace(tokenizer=tok, model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=4096)))
    assert response_budget(s, problems, engine=big) == DEFAULT_MAX_NEW_TOKENS
    assert "not given" not in capsys.readouterr().err


def test_a_given_budget_that_does_not_fit_is_still_an_error(tiny_model, tmp_path, capsys):
    _problems(tmp_path / "d.jsonl", n=1)
    rc = main(["eval", "--model", str(tiny_model), "--dataset", str(tmp_path / "d.jsonl"), "--max-new-tokens", "512",
               "-k", "1", "--n-boot", "0", "--verify-workers", "1", "--no-progress", "--out", str(tmp_path / "e")])
    assert rc != 0
    assert "with max_new_tokens=512 it exceeds the model's context of 256 positions" in capsys.readouterr().err


def test_help_states_the_default():
    text = EvalSettings.__dataclass_fields__["max_new_tokens"].metadata["help"]
    assert "default 64" in text and "word_problems 192" in text and str(DEFAULT_MAX_NEW_TOKENS) in text
