"""A finished sweep job's checkpoints are reduced to what --keep names, only after its record is written, never for
a job without its record or one a live process holds; a weights-only checkpoint still loads and refuses a resume by
name."""

import json
import os
import socket

import pytest
import yaml

from capo.cli import main
from capo.errors import CapoError
from capo.sweep import runner, spec
from capo.trainer import checkpoint

SPEC = {"name": "tiny", "preset": "default", "steps": 4, "save_every": 2,
        "methods": {"grpo": {"algo.name": "grpo"}, "capo": {"algo.name": "capo"}}, "seeds": [1],
        "eval": {"problems": 6, "k": 3, "batch_size": 12}}


def _fake_checkpoints(run_dir, steps=(2, 4)):
    """Step folders laid out as the trainer writes them, each file of a known size."""
    sizes = {}
    for s in steps:
        d = run_dir / "checkpoints" / f"step-{s:06d}"
        d.mkdir(parents=True)
        for name, n in (("model.safetensors", 1000), ("config.json", 10), (checkpoint.STATE_FILE, 300),
                        ("rng_rank0.pt", 7), ("rng_rank1.pt", 5)):
            (d / name).write_bytes(b"x" * n)
        sizes[s] = 1322
    return sizes


def _jobs(tmp_path):
    return spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")


def _done(job):
    job.record.parent.mkdir(parents=True, exist_ok=True)
    job.record.write_text(json.dumps({"settings_hash": job.settings_hash, "settings": job.settings, "final": {}}))


@pytest.mark.parametrize("keep, left, freed", [
    ("all", {"step-000002", "step-000004"}, 0),
    ("final", {"step-000004"}, 1322),
    ("weights", {"step-000004"}, 1322 + 300 + 7 + 5),
    ("none", set(), 2 * 1322),
])
def test_prune_keeps_what_keep_names_and_counts_the_bytes(tmp_path, keep, left, freed):
    job = _jobs(tmp_path)[0]
    _fake_checkpoints(job.run_dir)
    assert runner.prune_checkpoints(job, keep) == freed
    ck = job.run_dir / "checkpoints"
    assert {p.name for p in ck.iterdir()} == left
    if keep in ("all", "final"):
        assert checkpoint.latest_checkpoint(job.run_dir) == ck / "step-000004"  # complete: resumable
    if keep == "weights":
        last = ck / "step-000004"
        assert sorted(p.name for p in last.iterdir()) == ["WEIGHTS_ONLY", "config.json", "model.safetensors"]
        with pytest.raises(CapoError, match="holds only the model weights.*--model.path"):
            checkpoint.latest_checkpoint(job.run_dir)


def test_prune_refuses_an_unknown_keep(tmp_path):
    with pytest.raises(ValueError, match="allowed values: all, final, weights, none"):
        runner.prune_checkpoints(_jobs(tmp_path)[0], "everything")


def test_a_weights_only_checkpoint_still_loads_as_a_model(tmp_path):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg)
    d = tmp_path / "run" / "checkpoints" / "step-000004"
    model.save_pretrained(d)
    (d / checkpoint.STATE_FILE).write_bytes(b"state")
    checkpoint.strip_resume_state(d, "a test")
    again = transformers.AutoModelForCausalLM.from_pretrained(d)
    assert all((a == b).all() for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert (d / checkpoint.WEIGHTS_ONLY).read_text() == "a test\n"


def test_sweep_prune_touches_only_done_jobs_no_live_process_holds(tmp_path, capsys):
    grpo, capo = _jobs(tmp_path)
    _fake_checkpoints(grpo.run_dir)
    _fake_checkpoints(capo.run_dir)
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(SPEC))
    args = ["sweep", "prune", str(p), "--runs-root", str(tmp_path / "runs"), "--records-root",
            str(tmp_path / "records"), "--keep", "none"]
    assert main(args) == 0  # no records: nothing touched
    assert len(list((grpo.run_dir / "checkpoints").iterdir())) == 2
    assert len(list((capo.run_dir / "checkpoints").iterdir())) == 2
    _done(grpo)
    _done(capo)
    (capo.run_dir / runner.LOCK).write_text(f"{os.getpid()}@{socket.gethostname()}")  # held by a live process
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert list((grpo.run_dir / "checkpoints").iterdir()) == []
    assert len(list((capo.run_dir / "checkpoints").iterdir())) == 2
    assert "skipped capo-seed1: held by a live sweep process" in out
    assert "grpo-seed1: freed" in out and (capo.run_dir / runner.LOCK).exists()
    assert not (grpo.run_dir / runner.LOCK).exists()  # its own claim released


def test_run_prunes_each_job_after_its_record_and_not_before(tmp_path, capsys, monkeypatch):
    """The runner prunes once the record is written; a job that fails before its record keeps every checkpoint."""
    grpo, capo = _jobs(tmp_path)
    seen = []

    def train(job):
        _fake_checkpoints(job.run_dir)
        if job.method == "capo":
            raise RuntimeError("evaluation failed")
        seen.append(len(list((job.run_dir / "checkpoints").iterdir())))  # nothing pruned before the record
        return {"final": {"accuracy": 0.5, "auc_mean": 0.5}, "wall_s": 1.0}

    monkeypatch.setattr(runner, "_train_eval_record", train)
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(SPEC))
    rc = main(["sweep", "run", str(p), "--jobs", "1", "--runs-root", str(tmp_path / "runs"), "--records-root",
               str(tmp_path / "records"), "--keep", "weights"])
    assert rc == 1 and seen == [2]
    assert [q.name for q in (grpo.run_dir / "checkpoints").iterdir()] == ["step-000004"]
    assert (grpo.run_dir / "checkpoints" / "step-000004" / checkpoint.WEIGHTS_ONLY).exists()
    assert len(list((capo.run_dir / "checkpoints").iterdir())) == 2  # failed: untouched, resumable
    assert "FAILED capo-seed1" in capsys.readouterr().out


def test_keep_is_checked_on_the_command_line(tmp_path, capsys):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(SPEC))
    with pytest.raises(SystemExit) as e:
        main(["sweep", "prune", str(p), "--keep", "everything"])
    assert e.value.code == 2
    assert "invalid choice: 'everything'" in capsys.readouterr().err
