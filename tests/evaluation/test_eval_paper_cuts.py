"""`capo eval` paper cuts: a default --out it prints, re-scoring a run's generations with the answer-extraction
settings recorded with it, answer classes in generations.jsonl."""

import json
import os

from capo.cli import main


def _gens(path):
    """Responses without an answer tag: only --fallback-last-number extracts their last number."""
    rows = [{"prompt_id": f"q{p}", "sample_idx": i, "gold": str(p + 2), "mean_logprob": -0.1 * (i + 1),
             "text": f"so it is {p + 2 if i % 2 == 0 else p + 3}"} for p in range(3) for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _acc(run):
    return json.loads((run / "metrics.json").read_text())["metrics"]["accuracy"]


def test_rescoring_reuses_the_recorded_extraction_settings(tmp_path, capsys):
    first = tmp_path / "first"
    assert main(["eval", "--generations", str(_gens(tmp_path / "g.jsonl")), "--fallback-last-number", "--n-boot", "0",
                 "--out", str(first), "--no-progress"]) == 0
    assert _acc(first) == 0.5  # the even samples name the gold number
    capsys.readouterr()
    # re-score the run's own generations without repeating the flag: the recorded setting is reused and said
    again = tmp_path / "again"
    assert main(["eval", "--generations", str(first / "generations.jsonl"), "--n-boot", "0", "--out", str(again),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "--fallback-last-number taken from" in out and "True" in out
    assert _acc(again) == 0.5
    # an explicit flag still wins: the recorded answer format is overridden when asked
    third = tmp_path / "third"
    assert main(["eval", "--generations", str(first / "generations.jsonl"), "--answer-format", "rlcr", "--n-boot", "0",
                 "--out", str(third), "--no-progress"]) == 0
    assert json.loads((third / "config.json").read_text())["answer_format"] == "rlcr"
    # a recorded fallback_last_number: true is turned off by its --no- flag (the flag alone could only turn it on)
    off = tmp_path / "off"
    assert main(["eval", "--generations", str(first / "generations.jsonl"), "--no-fallback-last-number", "--n-boot",
                 "0", "--out", str(off), "--no-progress"]) == 0
    assert json.loads((off / "config.json").read_text())["fallback_last_number"] is False and _acc(off) == 0.0


def test_a_damaged_record_beside_the_generations_is_refused_unless_both_settings_are_given(tmp_path, capsys):
    """A config.json beside --generations that is not JSON, or not a capo eval run's, was skipped: the file was
    scored with the defaults while its run had recorded others. It is refused, naming it; given both extraction
    settings, the record is not needed."""
    folder = tmp_path / "run"
    folder.mkdir()
    gens = _gens(folder / "generations.jsonl")
    for text in ("{oops", "[1]", '{"fallback_last_number": "yes"}'):
        (folder / "config.json").write_text(text)
        assert main(["eval", "--generations", str(gens), "--out", str(tmp_path / "r"), "--no-progress"]) == 2
        assert "run/config.json: the settings recorded beside --generations" in capsys.readouterr().err
        assert not (tmp_path / "r").exists()
    assert main(["eval", "--generations", str(gens), "--answer-format", "auto", "--fallback-last-number", "--n-boot",
                 "0", "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert _acc(tmp_path / "r") == 0.5


def test_generations_carry_answer_classes(tmp_path):
    run = tmp_path / "run"
    assert main(["eval", "--generations", str(_gens(tmp_path / "g.jsonl")), "--fallback-last-number", "--n-boot", "0",
                 "--out", str(run), "--no-progress"]) == 0
    rows = [json.loads(ln) for ln in (run / "generations.jsonl").read_text().splitlines()]
    # per prompt: samples 0 and 2 answer p+2, samples 1 and 3 answer p+3 -> classes 0, 1, 0, 1
    assert [r["answer_id"] for r in rows] == [0, 1, 0, 1] * 3


def test_default_out_is_printed_and_used(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--generations", str(_gens(tmp_path / "g.jsonl")), "--n-boot", "0", "--no-progress"]) == 0
    out = capsys.readouterr().out
    want = os.path.join("runs", "eval", "rescored-" + tmp_path.name)
    assert f"--out not given; writing to {want}" in out
    assert (tmp_path / want / "metrics.json").is_file()
