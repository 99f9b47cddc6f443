"""Output folders: a command never writes into another command's folder (a training run, an evaluation, a model),
a refused command leaves no skeleton folder behind, and a model whose weights cannot be read or are not finite is
refused by name before anything runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from capo.cli import main
from capo.errors import ConfigError, DataError
from capo.rundir import FOLDER_FILES, check_out_folder, run_lock


@pytest.mark.parametrize("kind", sorted(FOLDER_FILES))
def test_each_command_refuses_another_kinds_folder(tmp_path, kind):
    """Each file a kind of folder holds at its top marks it; the same kind's folder (a resume) is accepted."""
    for other, names in FOLDER_FILES.items():
        for name in names:
            folder = tmp_path / f"{other}-{name}"
            folder.mkdir()
            (folder / name).write_text("x")
            if other == kind:
                check_out_folder(folder, kind=kind, flag="--out")
            else:
                with pytest.raises(ConfigError, match=rf"--out {folder} holds an? {other}'s files \({name}\): "
                                                      rf"an? {kind} goes in a folder of its own"):
                    check_out_folder(folder, kind=kind, flag="--out")
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_out_folder(tmp_path / "f", kind=kind, flag="--out")
    check_out_folder(tmp_path / "new", kind=kind, flag="--out")  # not there yet: nothing to mix with
    assert not (tmp_path / "new").exists()


def test_a_refused_command_leaves_no_skeleton_folder(tmp_path):
    """The folders the lock made are removed when the command fails holding only its settings and empty files, or
    ends holding nothing; a folder with a result, or one that was there before, stays."""
    out = tmp_path / "a" / "b" / "run"
    with pytest.raises(RuntimeError), run_lock(out, "eval", settings=("config.json",)):
        (out / "config.json").write_text("{}")
        (out / "generations.jsonl").write_text("")
        raise RuntimeError("the model would not load")
    assert list(tmp_path.iterdir()) == []
    with run_lock(out, "eval"):  # ended, wrote nothing
        pass
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), run_lock(out, "eval", settings=("config.json",)):
        (out / "generations.jsonl").write_text('{"row": 1}\n')  # a result: kept for the resume
        raise RuntimeError("killed")
    assert (out / "generations.jsonl").read_text() == '{"row": 1}\n'
    with pytest.raises(RuntimeError), run_lock(tmp_path / "a", "eval", settings=("config.json",)):
        raise RuntimeError  # a folder that was there before
    assert (tmp_path / "a").is_dir()
    kept = tmp_path / "kept"
    with run_lock(kept, "eval", settings=("config.json",)):  # a success holding only its settings: kept
        (kept / "config.json").write_text("{}")
    assert (kept / "config.json").exists()


@pytest.fixture
def model_copy(tmp_path):
    from capo.tasks.default import DEFAULT_MODEL_DIR

    return shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "model")


def test_unreadable_and_non_finite_weights_are_refused_by_name(model_copy):
    """An empty weights file (SafetensorError) and weights of another shape (RuntimeError) were tracebacks; NaN
    weights loaded and failed in sampling. Each is one message naming the model."""
    from safetensors.torch import load_file, save_file

    from capo.rollout.models import load_model

    weights = model_copy / "model.safetensors"
    state = {k: v.clone() for k, v in load_file(weights).items()}  # not a view of the file rewritten below
    name = sorted(state)[3]
    weights.write_bytes(b"")
    with pytest.raises(ConfigError, match=rf"could not load model '{model_copy}'.*header"):
        load_model(str(model_copy))
    save_file({**state, name: state[name][:1]}, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=rf"could not load model '{model_copy}'"):
        load_model(str(model_copy))
    for bad in (float("nan"), float("inf")):
        broken = state[name].clone()
        broken[0, 0] = bad
        save_file({**state, name: broken}, weights, metadata={"format": "pt"})
        with pytest.raises(DataError, match=rf"not finite numbers \(NaN or inf\) in 1 tensor\(s\), e.g. {name}"):
            load_model(str(model_copy))
    save_file(state, weights, metadata={"format": "pt"})
    model, _ = load_model(str(model_copy))
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())


def test_eval_and_train_refuse_each_others_folders_and_leave_nothing(model_copy, tmp_path, capsys):
    """Through the command line: eval into a model's folder (its config.json would be replaced), train into an
    evaluation's folder, and an eval of an unreadable model into a new folder, each exit 2 and leave the folders as
    they were."""
    config = (model_copy / "config.json").read_text()
    argv = ["--limit", "1", "-k", "2", "--dataset", "default", "--no-progress"]
    assert main(["eval", "--model", "default", *argv, "--out", str(model_copy)]) == 2
    assert "holds a model's files" in capsys.readouterr().err and (model_copy / "config.json").read_text() == config
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "metrics.json").write_text(json.dumps({"metrics": {}}))
    assert main(["train", "--run.out_dir", str(ev), "--run.steps", "1", "--run.progress", "false"]) == 2
    assert "holds an evaluation's files (metrics.json)" in capsys.readouterr().err
    assert sorted(p.name for p in ev.iterdir()) == ["metrics.json"]
    (model_copy / "model.safetensors").write_bytes(b"")
    assert main(["eval", "--model", str(model_copy), *argv, "--out", str(tmp_path / "new" / "e")]) == 2
    assert "could not load model" in capsys.readouterr().err and not (tmp_path / "new").exists()
