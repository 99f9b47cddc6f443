"""The bad-input corpus (tests/data/bad_inputs.jsonl): every case exits 2 with a message naming the problem, no
traceback, and leaves nothing that looks like a complete result."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capo.cli import main

CASES = [json.loads(ln) for ln in (Path(__file__).parent / "data" / "bad_inputs.jsonl").read_text().splitlines()
         if ln.strip()]


def _prepare(case, tmp_path):
    for rel, content in case.get("files", {}).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    for rel, content in case.get("latin1_files", {}).items():  # bytes that are no UTF-8 (e.g. 0xe9 for "é")
        (tmp_path / rel).write_text(content, encoding="latin-1")
    for rel in case.get("dirs", []):
        (tmp_path / rel).mkdir()
    return [a.replace("{tmp}", str(tmp_path)) for a in case["argv"]]


def test_corpus_is_large_enough():
    assert len(CASES) >= 25


def test_the_testing_page_counts_the_corpus():
    """docs/testing.md's table of faults gives the corpus's size: the count is the file's."""
    page = (Path(__file__).parents[1] / "docs" / "testing.md").read_text()
    row = re.search(r"\| bad-input corpus \(`tests/data/bad_inputs.jsonl`, run through the CLI\) \| (\d+) \|", page)
    assert row and int(row.group(1)) == len(CASES), (row and row.group(1), len(CASES))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_input_is_refused_cleanly(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written by accident lands here and is checked below
    argv = _prepare(case, tmp_path)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors (unknown flag, bad int) exit 2 with a usage line
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)
    assert case["expect"] in err, err
    assert "Traceback" not in err
    assert not list(tmp_path.rglob("metrics.json")), "a complete-looking eval result was written"
    prepared = {tmp_path / d for d in case.get("dirs", [])}
    assert not [p for p in tmp_path.rglob("step-*") if p not in prepared], "a checkpoint was written"
    assert not list(tmp_path.rglob("r.html")), "a report was written"


def test_process_exit_code_and_no_traceback(tmp_path):
    """The same through a real process: exit status 2, one-paragraph message, traceback only with --debug."""
    cmd = [sys.executable, "-m", "capo.cli", "train", "--optim.lr", "-1"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and "optim.lr must be > 0" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(cmd + ["--debug"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode != 0 and "Traceback" in p.stderr


def test_an_eval_note_is_said_once(tmp_path, capsys):
    """`capo eval` checks its settings before loading anything and again in run_eval; its notes come once."""
    assert main(["eval", "--model", "default", "--limit", "2", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert capsys.readouterr().err.count("note: model 'default' is capo's shipped model") == 1
