"""scripts/sweep.py: a sweep runs each (method, seed) once, resumes where it stopped, and refuses to mix settings."""

import importlib.util
import json
import pathlib
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sweep", ROOT / "scripts" / "sweep.py")
sweep = importlib.util.module_from_spec(_spec)
sys.modules["sweep"] = sweep  # dataclasses look their module up by name
_spec.loader.exec_module(sweep)

SPEC = {
    "name": "tiny",
    "preset": "default",
    "steps": 2,
    "save_every": 1,
    "overrides": {"rollout.prompts_per_step": 4, "rollout.group_size": 4, "data.n_eval": 4, "run.eval_samples": 2},
    "methods": {"grpo": {"algo.name": "grpo"}, "capo": {"algo.name": "capo"}},
    "seeds": [3],
    "eval": {"problems": 6, "k": 3, "batch_size": 12},
}


def _write(tmp_path, spec):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return p


def _run(tmp_path, spec_path, *extra):
    return sweep.main(["run", str(spec_path), "--jobs", "1", "--runs-root", str(tmp_path / "runs"),
                       "--records-root", str(tmp_path / "records"), *extra])


@pytest.mark.slow
def test_sweep_resumes_and_records(tmp_path, capsys):
    spec_path = _write(tmp_path, SPEC)
    assert _run(tmp_path, spec_path, "--max-runs", "1") == 0
    rec_dir = tmp_path / "records" / "tiny"
    assert sorted(p.name for p in rec_dir.iterdir()) == ["grpo-seed3.json"]  # seeds outermost, methods in order
    first = (rec_dir / "grpo-seed3.json").read_text()

    assert _run(tmp_path, spec_path) == 0  # continues: only the missing job runs
    assert (rec_dir / "grpo-seed3.json").read_text() == first
    assert "1 done, 1 to run now" in capsys.readouterr().out
    for method in ("grpo", "capo"):
        rec = json.loads((rec_dir / f"{method}-seed3.json").read_text())
        assert rec["method"] == method and rec["seed"] == 3
        assert rec["config"]["algo"]["name"] == method and rec["config"]["run"]["steps"] == 2
        # the record holds every response of the final evaluation: 6 prompts x 3 samples, and its accuracy
        # recomputes to the stored metric exactly
        resp = rec["responses"]
        assert len(resp) == 18 and len({r[0] for r in resp}) == 6
        assert rec["final"]["accuracy"] == pytest.approx(sum(r[1] for r in resp) / 18, abs=1e-12)
        assert [r["step"] for r in rec["curves"]["train"]] == [1, 2]
        assert rec["curves"]["eval"][-1]["step"] == 2 and "eval/auc_mean" in rec["curves"]["eval"][-1]
    assert _run(tmp_path, spec_path) == 0
    assert "2 done, 0 to run now" in capsys.readouterr().out


def test_changed_settings_are_stale_not_mixed(tmp_path, capsys):
    jobs = sweep.jobs(SPEC, tmp_path / "runs", tmp_path / "records")
    j = jobs[0]
    j.record.parent.mkdir(parents=True)
    j.record.write_text(json.dumps({"settings_hash": j.settings_hash}))
    assert sweep.state(j) == "done"
    changed = sweep.jobs({**SPEC, "eval": {**SPEC["eval"], "k": 4}}, tmp_path / "runs", tmp_path / "records")
    assert sweep.state(changed[0]) == "stale" and sweep.state(changed[1]) == "todo"
    assert changed[0].settings_hash != j.settings_hash
    # the same spec gives the same hashes (a resumed sweep recognises its records)
    assert [x.settings_hash for x in sweep.jobs(SPEC, tmp_path, tmp_path)] == [x.settings_hash for x in jobs]


@pytest.mark.parametrize("bad, message", [
    ({"seeds": ["a"]}, "'seeds' must be a list of integers"),
    ({"methods": {"grpo": "grpo"}}, "'methods' maps each method name"),
    ({"eval": {"problem": 3}}, "unknown eval key(s) ['problem']"),
    ({"step": 3}, "unknown key(s) ['step']"),
])
def test_bad_spec_names_the_key(tmp_path, bad, message):
    with pytest.raises(SystemExit) as e:
        sweep.load_spec(_write(tmp_path, {**SPEC, **bad}))
    assert message in str(e.value)
