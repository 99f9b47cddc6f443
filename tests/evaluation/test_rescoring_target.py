"""`capo eval --generations` never replaces what its --out holds (found by a CLI audit, 2026-12-02): before, it
rewrote a finished evaluation, a training run's folder, or its own input file, without a word. The same re-scoring
again writes the same result and is allowed."""

import json

from capo.cli import main
from capo.rundir import read_jsonl_rows


def _write(path, shift=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt_id": p, "sample_idx": j, "text": f"<answer>{p + (j + shift) % 2}</answer>", "gold": str(p),
             "mean_logprob": -0.1 * (1 + j + p % 3), "mine": 1} for p in range(4) for j in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _eval(gens, out):
    return main(["eval", "--generations", str(gens), "--out", str(out), "--n-boot", "0"])


def test_the_same_rescoring_again_is_allowed_another_is_refused(tmp_path, capsys):
    a, b = _write(tmp_path / "a" / "run1" / "g.jsonl"), _write(tmp_path / "b" / "run1" / "g.jsonl", 1)
    out = tmp_path / "o"
    assert _eval(a, out) == 0
    before = (out / "generations.jsonl").read_text()
    assert _eval(a, out) == 0 and (out / "generations.jsonl").read_text() == before
    assert _eval(b, out) != 0
    assert "already holds an evaluation" in capsys.readouterr().err
    assert (out / "generations.jsonl").read_text() == before and json.loads((out / "config.json").read_text())[
        "generations"] == str(a)


def test_the_input_file_and_a_training_run_are_never_written(tmp_path, capsys):
    gens = _write(tmp_path / "g1" / "generations.jsonl")
    text = gens.read_text()
    assert _eval(gens, gens.parent) != 0
    assert "would replace the input" in capsys.readouterr().err and gens.read_text() == text
    run = tmp_path / "train_run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert _eval(gens, run) != 0
    assert "holds a training run's files (metrics.jsonl)" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == ["metrics.jsonl"]
    assert read_jsonl_rows(gens)[0]["mine"] == 1
