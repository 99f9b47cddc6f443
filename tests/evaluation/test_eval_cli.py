"""`capo eval` end to end on a tiny random model: outputs, resume without loss or duplicates, bad input."""

import json
import shutil

import pytest
from eval_cli_helpers import eval_argv

from capo.cli import main
from capo.rundir import read_jsonl_rows


def test_eval_smoke_outputs(tiny_model_dir, tiny_dataset, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(eval_argv(tiny_model_dir, tiny_dataset, out, "--limit", "3")) == 0
    for f in ("config.json", "generations.jsonl", "metrics.json", "report.html", "plots/reliability.png",
              "plots/precision_coverage.png", "plots/confidence_hist.png"):
        assert (out / f).exists(), f
    rows = read_jsonl_rows(out / "generations.jsonl")
    assert len(rows) == 6
    assert [(r["prompt_id"], r["sample_idx"]) for r in rows] == [(f"q{i}", j) for i in range(3) for j in range(2)]
    for r in rows:
        assert set(r) >= {"prompt_id", "sample_idx", "prompt", "text", "answer", "verdict", "n_tokens",
                          "mean_logprob", "sum_logprob", "confidence", "finish_reason"}
        assert r["verdict"] in ("correct", "incorrect", "unparsable", "timeout")
        assert 1 <= r["n_tokens"] <= 6
        assert r["mean_logprob"] == pytest.approx(r["sum_logprob"] / r["n_tokens"], rel=1e-12)
        assert r["mean_logprob"] < 0
        assert r["finish_reason"] in ("stop", "length")
        assert (r["finish_reason"] == "length") == (r["n_tokens"] == 6) or r["finish_reason"] == "stop"
    m = json.loads((out / "metrics.json").read_text())
    assert m["metrics"]["n"] == 6 and m["metrics"]["n_groups"] == 3
    assert m["metrics"]["accuracy"] == sum(r["verdict"] == "correct" for r in rows) / 6
    assert m["config"]["k"] == 2
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3
    assert "capo eval:" in capsys.readouterr().out


def test_eval_resume_loses_and_duplicates_nothing(tiny_model_dir, tiny_dataset, tmp_path):
    full = tmp_path / "full"
    assert main(eval_argv(tiny_model_dir, tiny_dataset, full)) == 0
    ref = read_jsonl_rows(full / "generations.jsonl")
    assert len(ref) == 10
    # simulate a crash: 5 complete rows (one batch and a half) + a torn line, no metrics.json
    part = tmp_path / "part"
    part.mkdir()
    shutil.copy(full / "config.json", part / "config.json")
    lines = (full / "generations.jsonl").read_text().splitlines(keepends=True)
    (part / "generations.jsonl").write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])
    assert main(eval_argv(tiny_model_dir, tiny_dataset, part)) == 0
    got = read_jsonl_rows(part / "generations.jsonl")
    key = lambda r: (r["prompt_id"], r["sample_idx"])  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, ref))  # nothing lost, nothing duplicated
    strip = lambda r: {k: v for k, v in r.items()}  # noqa: E731
    assert sorted(map(strip, got), key=key) == sorted(map(strip, ref), key=key)  # identical rows (CPU determinism)
    assert (part / "metrics.json").exists()
    m_full = json.loads((full / "metrics.json").read_text())["metrics"]
    m_part = json.loads((part / "metrics.json").read_text())["metrics"]
    for k in ("accuracy", "ece", "brier", "mean_tokens", "auroc"):
        assert m_full[k] == m_part[k]
    # resuming a complete run does not generate again
    assert main(eval_argv(tiny_model_dir, tiny_dataset, part)) == 0
    assert len(read_jsonl_rows(part / "generations.jsonl")) == 10


def test_resume_with_different_settings_is_refused(tiny_model_dir, tiny_dataset, tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": "other", "k": 2}))
    row = '{"prompt_id": "p0", "sample_idx": 0, "text": "x"}\n'  # a generated row of those settings
    (out / "generations.jsonl").write_text(row)
    assert main(eval_argv(tiny_model_dir, tiny_dataset, out)) == 2
    err = capsys.readouterr().err
    assert "different settings" in err and "model" in err and not (out / "metrics.json").exists()
    assert (out / "generations.jsonl").read_text() == row  # nothing lost


def test_a_resume_under_another_precision_or_token_recording_is_refused(tiny_model_dir, tiny_dataset, tmp_path,
                                                                          capsys):
    """bf16 autocast samples other tokens and --no-token-stats records no per-token fields: a run cut and resumed
    with another of either mixed its rows and rewrote config.json (AUC-mean 0.722 -> 0.778; 8 of 10 estimators gone;
    found by an audit). Resumed as it started, the run completes, its load time summed over both sessions."""
    full = tmp_path / "full"
    assert main(eval_argv(tiny_model_dir, tiny_dataset, full, "--no-token-stats")) == 0
    lines = (full / "generations.jsonl").read_text().splitlines(keepends=True)
    for flags, key in ((["--autocast", "on"], "autocast"), ([], "token_stats")):
        part = tmp_path / f"part-{key}"
        part.mkdir()
        (part / "config.json").write_text((full / "config.json").read_text())
        (part / "generations.jsonl").write_text("".join(lines[:4]))
        extra = [*flags, *([] if key == "token_stats" else ["--no-token-stats"])]
        assert main(eval_argv(tiny_model_dir, tiny_dataset, part, *extra)) == 2
        assert "different settings" in (err := capsys.readouterr().err) and key in err, err
        assert (part / "generations.jsonl").read_text() == "".join(lines[:4])
    part = tmp_path / "part-token_stats"
    (part / "timing.json").write_text(json.dumps({"load_model_s": 100.0}))
    assert main(eval_argv(tiny_model_dir, tiny_dataset, part, "--no-token-stats")) == 0
    assert json.loads((part / "metrics.json").read_text())["metrics"]["time_load_model_s"] > 100.0


def test_a_folder_written_before_gold_format_was_named_so_resumes_by_its_old_name(tiny_model_dir, tiny_dataset,
                                                                                  tmp_path, capsys):
    """``--gold-format`` was ``--dataset-answer-format`` (config.json's ``dataset_answer_format``), one name per option
    with training's ``data.gold_format``: a folder cut before the rename resumes when its old value matches and is
    refused, naming the setting, when it does not."""
    full = tmp_path / "full"
    assert main(eval_argv(tiny_model_dir, tiny_dataset, full, "--no-token-stats")) == 0
    config = json.loads((full / "config.json").read_text())
    lines = (full / "generations.jsonl").read_text().splitlines(keepends=True)
    for old_value, rc in (("plain", 2), ("boxed", 0)):
        part = tmp_path / f"part-{old_value}"
        part.mkdir()
        old = {("dataset_answer_format" if k == "gold_format" else k): (old_value if k == "gold_format" else v)
               for k, v in config.items()}
        (part / "config.json").write_text(json.dumps(old))
        (part / "generations.jsonl").write_text("".join(lines[:4]))
        assert main(eval_argv(tiny_model_dir, tiny_dataset, part, "--no-token-stats")) == rc
        if rc:
            assert "gold_format: 'plain' -> 'boxed'" in capsys.readouterr().err
    assert (tmp_path / "part-boxed" / "generations.jsonl").read_text() == "".join(lines)


def test_a_folder_refused_before_its_first_row_takes_the_corrected_command(tiny_model_dir, tiny_dataset, tmp_path):
    """A run refused after it wrote its settings but before any row (e.g. a response budget beyond the model's
    context) holds nothing to resume: the corrected command runs there instead of being refused as "different
    settings"."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": "other", "k": 2, "max_new_tokens": 100000}))
    (out / "generations.jsonl").write_text("")
    assert main(eval_argv(tiny_model_dir, tiny_dataset, out)) == 0
    assert json.loads((out / "config.json").read_text())["max_new_tokens"] == 6
    assert (out / "metrics.json").exists()


@pytest.mark.parametrize(
    "argv_patch, match",
    [
        ({"-k": "0"}, "-k: must be an integer >= 1, got 0"),
        ({"--temperature": "-1"}, "--temperature: must be >= 0"),
        ({"--top-p": "0"}, r"--top-p: must be in \(0, 1\]"),
        ({"--max-new-tokens": "0"}, "--max-new-tokens: must be an integer >= 1"),
        ({"--batch-size": "0"}, "--batch-size: must be an integer >= 1"),
        ({"--model": "/no/such/model"}, "model '/no/such/model': no such file or folder"),
        ({"--dataset": "/no/such/data.jsonl"}, "dataset file /no/such/data.jsonl does not exist"),
        ({"--dataset": "gsm9k"}, r"unknown dataset 'gsm9k' \(did you mean 'gsm8k'\?\); allowed names: (default, coin_sum, word_problems, stochastic, stochastic_binary, )?gsm8k, math500"),
        ({"--answer-field": "nope"}, r"line 1: no field 'nope'"),
    ],
)
def test_eval_bad_input(tiny_model_dir, tiny_dataset, tmp_path, capsys, argv_patch, match):
    import re

    argv = eval_argv(tiny_model_dir, tiny_dataset, tmp_path / "bad")
    for flag, val in argv_patch.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = val
        else:
            argv += [flag, val]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert "Traceback" not in err
    assert not (tmp_path / "bad" / "metrics.json").exists()


def test_malformed_dataset_names_line(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "solution": "\\\\boxed{1}"}\n{"question": \n')
    assert main(eval_argv(tiny_model_dir, bad, tmp_path / "o")) == 2
    assert "bad.jsonl line 2: malformed JSON" in capsys.readouterr().err
    assert not (tmp_path / "o" / "metrics.json").exists()


def test_eval_on_facts_grades_short_answers_and_breaks_metrics_down_by_relation(tiny_model_dir, tmp_path, capsys):
    """`capo eval --dataset facts` takes the short-answer format by default (no verifier), writes each row's relation
    as its group and one summary per relation in metrics.json, and prints one line per relation."""
    from capo.tasks.facts import facts_problems

    out = tmp_path / "facts"
    assert main(["eval", "--model", str(tiny_model_dir), "--dataset", "facts", "--limit", "12", "-k", "2",
                 "--max-new-tokens", "4", "--n-boot", "0", "--no-progress", "--out", str(out)]) == 0
    rows = read_jsonl_rows(out / "generations.jsonl")
    problems = {p.id: p for p in facts_problems("test", 12)}
    assert len(rows) == 24 and {r["prompt_id"] for r in rows} == set(problems)
    assert all(r["group"] == problems[r["prompt_id"]].meta["group"] for r in rows)
    m = json.loads((out / "metrics.json").read_text())
    assert m["config"]["answer_format"] == "short"
    by = m["curves"]["by_group"]
    assert set(by) == {r["group"] for r in rows}
    assert sum(g["n"] for g in by.values()) == 24
    printed = capsys.readouterr().out
    assert all(f"  {name:16s}" in printed for name in by)
