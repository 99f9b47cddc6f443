"""capo sweep: a sweep runs each (method, seed) once, resumes where it stopped, and refuses to mix settings; its
report's statistics are hand-computed here."""

import json
import math
import os
import pathlib
import subprocess
import sys
import time

import pytest
import yaml
from statsmodels.stats.power import TTestPower

from capo.cli import main
from capo.errors import CapoError
from capo.sweep import analysis, plots, records, runner, spec, tables

ROOT = pathlib.Path(__file__).resolve().parents[1]

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


def _write(tmp_path, body):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    return p


def _run(tmp_path, spec_path, *extra):
    return main(["sweep", "run", str(spec_path), "--jobs", "1", "--runs-root", str(tmp_path / "runs"),
                       "--records-root", str(tmp_path / "records"), *extra])


@pytest.mark.slow
def test_sweep_resumes_and_records(tmp_path, capsys):
    spec_path = _write(tmp_path, SPEC)
    assert _run(tmp_path, spec_path, "--max-runs", "1") == 0
    rec_dir = tmp_path / "records" / "tiny"
    assert sorted(p.name for p in rec_dir.iterdir()) == ["grpo-seed3.json"]  # seeds outermost, methods in order
    first = (rec_dir / "grpo-seed3.json").read_text()
    assert (tmp_path / "runs" / "tiny" / "grpo-seed3" / runner.RUN_RECORD).read_text() == first  # kept in the run folder

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
        assert rec["train_s"] == round(sum(r["time/step"] for r in rec["curves"]["train"]), 1) > 0
        assert rec["curves"]["eval"][-1]["step"] == 2 and "eval/auc_mean" in rec["curves"]["eval"][-1]
        import torch
        import transformers

        assert rec["machine"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
        assert (rec["machine"]["torch"], rec["machine"]["transformers"]) == (torch.__version__, transformers.__version__)
        # the code each phase started under: training, then the final evaluation, each with its commit
        assert [st["phase"] for st in rec["code"]] == ["train", "eval"]
        assert rec["commit"] == rec["code"][0]["commit"] == runner.code_commit()
        # --keep final (the default): of the trainer's two checkpoints the last stays, complete and resumable
        ck = tmp_path / "runs" / "tiny" / f"{method}-seed3" / "checkpoints"
        assert [p.name for p in ck.iterdir()] == ["step-000002"] and (ck / "step-000002" / "trainer_state.pt").is_file()
    assert _run(tmp_path, spec_path) == 0
    assert "2 done, 0 to run now" in capsys.readouterr().out


def test_changed_settings_are_stale_not_mixed(tmp_path, capsys):
    jobs = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")
    j = jobs[0]
    j.record.parent.mkdir(parents=True)
    j.record.write_text(json.dumps({"settings_hash": j.settings_hash}))
    assert spec.state(j) == "done"
    changed = spec.jobs({**SPEC, "eval": {**SPEC["eval"], "k": 4}}, tmp_path / "runs", tmp_path / "records")
    assert spec.state(changed[0]) == "stale" and spec.state(changed[1]) == "todo"
    assert changed[0].settings_hash != j.settings_hash
    # the same spec gives the same hashes (a resumed sweep recognises its records)
    assert [x.settings_hash for x in spec.jobs(SPEC, tmp_path, tmp_path)] == [x.settings_hash for x in jobs]


@pytest.mark.parametrize("bad, message", [
    ({"seeds": ["a"]}, "'seeds' must be a non-empty list of integers, got ['a']"),
    ({"seeds": 0}, "'seeds' must be a non-empty list of integers, got 0"),
    ({"seeds": []}, "'seeds' must be a non-empty list of integers, got []"),
    ({"seeds": None}, "'seeds' is required"),
    ({"name": ""}, "'name' is required"),
    ({"methods": {}}, "'methods' maps each method name to a dict of config overrides (one or more)"),
    ({"methods": ["grpo"]}, "'methods' maps each method name"),
    ({"methods": 5}, "'methods' maps each method name"),
    ({"name": "../elsewhere"}, "the sweep's name '../elsewhere' cannot name a run folder"),
    ({"name": "a/b"}, "the sweep's name 'a/b' cannot name a run folder"),
    ({"methods": {"a/b": {}}}, "method name 'a/b' cannot name a run folder"),
    ({"methods": {".hidden": {}}}, "method name '.hidden' cannot name a run folder"),
    ({"methods": {7: {}}}, "method name 7 cannot name a run folder"),
    ({"methods": {"base": {"algo.name": "grpo"}}}, "'base' is the initial model's evaluation"),
    ({"base": "yes"}, "'base' must be true, false or a number of draws >= 1"),
    ({"base": 0}, "'base' must be true, false or a number of draws >= 1"),
    ({"methods": {"grpo": "grpo"}}, "'methods' maps each method name"),
    ({"eval": {"problem": 3}}, "unknown eval key(s) ['problem']"),
    ({"step": 3}, "unknown key(s) ['step']"),
    ({"preset": ["default"]}, "'preset' is a preset's name or a YAML file's path, got ['default']"),
    ({"preset": 5}, "'preset' is a preset's name or a YAML file's path, got 5"),
    ({"overrides": [1, 2]}, "'overrides' maps config keys (section.key) to values, got [1, 2]"),
    ({"overrides": 5}, "'overrides' maps config keys"),
    ({"eval": {"seed": "x"}, "base": 2}, "eval.seed must be an integer, got 'x'"),
    ({"eval": {"k": 2.5}}, "eval.k must be an integer, got 2.5"),
    ({"eval": {"problems": True}}, "eval.problems must be an integer (or null: the held-out part), got True"),
    ({"description": ["a"]}, "'description' is text"),
    # an integer setting is refused where `capo train` refuses one (a fraction, a truth value)
    ({"steps": 1.5}, "'steps' must be an integer (or null: the preset's), got 1.5"),
    ({"steps": True}, "'steps' must be an integer (or null: the preset's), got True"),
    ({"save_every": 2.5}, "'save_every' must be an integer, got 2.5"),
    ({"save_every": None}, "'save_every' must be an integer, got None"),
    ({"seeds": [1, 2.5]}, "'seeds' must be a non-empty list of integers, got [1, 2.5]"),
    ({"seeds": [1, True]}, "'seeds' must be a non-empty list of integers, got [1, True]"),
    ({"eval": {"k": True}}, "eval.k must be an integer, got True"),
    ({"base": 1.5}, "'base' must be true, false or a number of draws >= 1, got 1.5"),
    ({"base": 0.0}, "'base' must be true, false or a number of draws >= 1, got 0.0"),
    # what the runner sets from the spec is refused in overrides, never silently replaced
    ({"methods": {"grpo": {"run.seed": 3}}}, "method 'grpo' sets run.seed, which each job takes from the spec's "
                                            "'seeds'; set it there"),
    ({"overrides": {"run.save_every": 5}}, "overrides sets run.save_every, which each job takes from the spec's "
                                          "'save_every'"),
    ({"methods": {"grpo": {"run.steps": 5}}}, "method 'grpo' sets run.steps, which each job takes from the spec's "
                                             "'steps'"),
])
def test_bad_spec_names_the_key(tmp_path, bad, message):
    with pytest.raises(CapoError) as e:
        spec.load_spec(_write(tmp_path, {**SPEC, **bad}))
    assert message in str(e.value)


@pytest.mark.parametrize("value", [2.0, "2", 2.5, True, "2.0", "x", None, [2]])
def test_an_integer_setting_of_a_spec_is_what_capo_train_takes_for_one(tmp_path, value):
    """A spec's integer settings (steps, save_every, seeds, eval's, base's draws) accept what `capo train` accepts in
    its config file for run.steps and refuse what it refuses, by the same rule (capo.trainer.config.coerce); what
    is accepted is kept as an int, so a job's command line, names and settings hash are those of the whole number:
    `steps: 2.0` gave `--run.steps 2.0`, which train's command line refuses."""
    from capo.trainer.config import TrainConfig

    try:
        TrainConfig.from_dict({"run": {"steps": value}})
        train_takes = True
    except CapoError:
        train_takes = False
    body = {**SPEC, "steps": value, "save_every": value, "seeds": [value], "eval": {**SPEC["eval"], "k": value},
            "base": value}
    if value is None:  # null is the preset's steps, never a save cadence or a seed
        body = {**SPEC, "steps": value}
    try:
        loaded = spec.load_spec(_write(tmp_path, body))
    except CapoError:
        assert not train_takes or value is None
        return
    assert train_takes or value is None
    if value is None:
        assert loaded["steps"] is None
        return
    whole = {**SPEC, "steps": 2, "save_every": 2, "seeds": [2], "eval": {**SPEC["eval"], "k": 2}, "base": 2}
    assert loaded == whole and all(type(v) is int for v in (loaded["steps"], loaded["save_every"], *loaded["seeds"],
                                                              loaded["eval"]["k"], loaded["base"]))
    assert [j.settings_hash for j in spec.jobs(loaded, tmp_path, tmp_path)] == [
        j.settings_hash for j in spec.jobs(whole, tmp_path, tmp_path)]


def test_a_whole_number_float_for_steps_passes_the_checks_before_a_sweep_runs(tmp_path, capsys):
    """`steps: 1.0` in a spec (as `run: {steps: 1.0}` in a `capo train --config` file) is one step: `capo sweep
    status` lists the jobs and finds nothing that would stop `capo sweep run` (it said "capo train: run.steps must be
    of type int, got '1.0'")."""
    p = _write(tmp_path, {**SPEC, "steps": 1.0, "save_every": 1.0})
    assert main(["sweep", "status", str(p), "--runs-root", str(tmp_path / "runs"), "--records-root",
                 str(tmp_path / "records")]) == 0, capsys.readouterr().err
    assert "todo    grpo-seed3" in capsys.readouterr().out


def test_a_methods_own_steps_apply_when_the_spec_sets_none(tmp_path):
    body = {k: v for k, v in SPEC.items() if k != "steps"}
    loaded = spec.load_spec(_write(tmp_path, {**body, "methods": {"grpo": {"run.steps": 5}}}))
    assert spec.jobs(loaded, tmp_path / "runs", tmp_path / "records")[0].overrides["run.steps"] == 5


def _record(method, seed, acc, auc):
    final = {k: 0.5 for k in analysis.MEASURES if k not in analysis.OPTIONAL_MEASURES} | {"accuracy": acc, "auc_mean": auc}
    curves = {"eval": [{"step": 20, "eval/accuracy": acc - 0.1, "eval/auc_mean": auc}, {"step": 40, "eval/accuracy": acc,
                                                                                        "eval/auc_mean": auc}]}
    return {"method": method, "seed": seed, "final": final, "curves": curves}


def test_seed_paired_leaves_a_non_finite_difference_out_of_every_number():
    with_nan = analysis.seed_paired([0.1, float("nan"), 0.2, 0.15], 0.03)
    without = analysis.seed_paired([0.1, 0.2, 0.15], 0.03)
    assert with_nan == without and with_nan["n_seeds"] == 3 and with_nan["mean"] == pytest.approx(0.15, abs=1e-12)


def test_a_seed_a_measure_could_not_score_is_left_out_by_name_never_the_measure(tmp_path, capsys):
    """A model whose answers were all wrong has no AUC-mean (None in its record). The paired difference, the change
    from the start and the change along the curve are read over the other seeds, name the seed left out, and the
    report says so; before, one such seed dropped the AUC-mean rows of that method from the whole report (and
    ``paired`` raised TypeError). Differences capo - grpo in AUC-mean over seeds 1, 2, 4 (seed 3 unscored):
    0.1, 0.2, 0.3 -> mean 0.2, interval as in the hand-computed test below."""
    recs = [_record("grpo", s, 0.4, 0.6) for s in (1, 2, 3, 4)]
    recs += [_record("capo", s, 0.4, 0.6 + d) for s, d in ((1, 0.1), (2, 0.2), (4, 0.3))]
    recs.append(_record("capo", 3, 0.0, None))
    for r in recs:
        for i, row in enumerate(r["curves"]["eval"]):
            row["step"] = 20 * i
        (tmp_path / f"{r['method']}-seed{r['seed']}.json").write_text(json.dumps(r))
    (tmp_path / "base.json").write_text(json.dumps(_base_draw(0, 0.3, 0.6)))
    s = analysis.summary(records.load_records(tmp_path), "grpo", 0.03, records.load_base(tmp_path))
    d = s["paired"]["capo"]["auc_mean"]
    assert d["seeds"] == [1, 2, 4] and d["left_out"] == [3] and d["n_seeds"] == 3
    half = 4.302652729911275 * 0.1 / 3 ** 0.5
    assert (d["mean"], d["low"], d["high"]) == pytest.approx((0.2, 0.2 - half, 0.2 + half), abs=1e-9)
    assert s["paired"]["capo"]["accuracy"]["seeds"] == [1, 2, 3, 4] and "left_out" not in s["paired"]["capo"]["accuracy"]
    base = s["from_base"]["capo"]["auc_mean"]
    assert base["left_out"] == [3] and base["mean"] == pytest.approx(0.2, abs=1e-12)
    assert s["along_curve"]["capo"]["auc_mean"]["left_out"] == [3]
    assert s["along_curve"]["capo"]["accuracy"]["seeds"] == [1, 2, 3, 4]
    md = tables.markdown(s)
    assert "| capo | auc_mean | 3 | +0.200 [-0.048, +0.448] |" in md
    for what in ("the paired difference with the reference", "the change from the start",
                 "the change along the periodic curve"):
        assert f"note: capo auc_mean: seed 3 left out of {what} (no value there" in md
    assert "note: capo accuracy" not in md
    assert "note: capo auc_mean: mean over 3 of its 4 seeds (seed 3: no value)" in md
    (tmp_path / "base.json").unlink()
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "note: capo auc_mean: seed 3 left out of the paired difference" in capsys.readouterr().out


def test_a_seed_whose_record_predates_a_measure_is_not_in_it_and_the_note_says_why():
    """A record without a measure's key (its evaluation had nothing to compute it from, or it predates the measure):
    its seed is not in that measure's readings, and the note says it was not measured (not that the model could not
    be scored)."""
    recs = {m: {s: _record(m, s, 0.4, 0.6 + (0.1 * s if m == "capo" else 0)) for s in (1, 2, 3, 4)}
            for m in ("grpo", "capo")}
    del recs["capo"][4]["final"]["auroc"]
    s = analysis.summary(recs, "grpo", 0.03)
    d = s["paired"]["capo"]["auroc"]
    assert d["seeds"] == [1, 2, 3] and d["unmeasured"] == [4] and "left_out" not in d
    md = tables.markdown(s)
    assert "note: capo auroc: seed 4 not in the paired difference with the reference (no such measure in the " \
           "record, of capo or of grpo: its evaluation had nothing to compute it from, or predates it)" in md
    assert "could not be computed" not in md


def test_seed_paired_statistics_hand_computed(tmp_path):
    # differences capo - grpo over seeds 1, 2, 3: 0.1, 0.2, 0.3 -> mean 0.2, sd 0.1,
    # t(0.975, 2) = 4.302652729911275, half-width 4.302652729911275 * 0.1 / sqrt(3) = 0.248414...
    # t statistic 0.2 / (0.1 / sqrt(3)) = 3.4641 -> two-sided p = 0.074180...
    # power: effect 0.03 / 0.1 = 0.3 standard deviations needs ~89.1 seeds (paired t, 80%, 5%)
    recs = [_record("grpo", s, 0.4, 0.6) for s in (1, 2, 3)]
    recs += [_record("capo", s, 0.4, 0.6 + d) for s, d in ((1, 0.1), (2, 0.2), (3, 0.3))]
    recs.append(_record("capo", 4, 0.4, 0.9))  # a seed GRPO has not finished: not paired
    for r in recs:
        (tmp_path / f"{r['method']}-seed{r['seed']}.json").write_text(json.dumps(r))
    s = analysis.summary(records.load_records(tmp_path), "grpo", 0.03)
    d = s["paired"]["capo"]["auc_mean"]
    assert d["seeds"] == [1, 2, 3]
    assert d["mean"] == pytest.approx(0.2, abs=1e-12) and d["sd"] == pytest.approx(0.1, abs=1e-12)
    half = 4.302652729911275 * 0.1 / 3 ** 0.5
    assert (d["low"], d["high"]) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-9)
    assert d["p"] == pytest.approx(0.07418, abs=5e-5)
    # the smallest whole n with 80% power at effect 0.03 / sd 0.1: 89 seeds give 0.7993, 90 give 0.8038
    power = TTestPower().power
    assert d["seeds_needed"] == 90 and power(0.3, 89, 0.05) < 0.8 <= power(0.3, 90, 0.05)
    assert s["methods"]["capo"]["auc_mean"]["mean"] == pytest.approx((0.7 + 0.8 + 0.9 + 0.9) / 4)
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "curves.png").stat().st_size > 10_000
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| capo | auc_mean | 3 | +0.200 [-0.048, +0.448] | 0.100 | 0.0742 | 0.0742 | 90 |" in md  # Holm over 1
    # at a glance: accuracy differences 0, 0, 0 (sd 0), AUC-mean as above; no base records, so no change from the
    # start column; the curves have no step-0 row, so nothing along them
    assert "| capo | 4 | +0.000 [+0.000, +0.000] | +0.200 [-0.048, +0.448] | - |\n" in md


def test_records_of_two_sweeps_form_one_comparison_only_with_the_same_settings(tmp_path, capsys):
    """A second spec's methods pair with the first spec's reference by seed when every training setting outside the
    method, the seed and the bookkeeping knobs agrees; a differing setting or a (method, seed) twice is an error."""
    def rec(method, seed, auc, **cfg):
        config = {"algo": {"name": method}, "optim": {"lr": 1e-4, "micro_batch_size": 0},
                  "run": {"seed": seed, "out_dir": f"/x/{method}{seed}", "threads": 1}}
        for key, v in cfg.items():
            sec, k = key.split("__")
            config[sec][k] = v
        return {**_record(method, seed, 0.4, auc), "config": config,
                "settings": {"preset": "p", "eval": {"problems": 100, "k": 8}}}

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for seed, auc in ((0, 0.60), (1, 0.70)):
        (a / f"grpo-seed{seed}.json").write_text(json.dumps(rec("grpo", seed, auc)))
    # the second sweep's method, run with another thread count and micro-batch size (free knobs): paired with a's GRPO
    for seed, auc in ((0, 0.65), (1, 0.80)):
        (b / f"rloo-seed{seed}.json").write_text(json.dumps(rec("rloo", seed, auc, run__threads=2,
                                                               optim__micro_batch_size=4)))
    both = records.load_records(a, b)
    d = analysis.summary(both, "grpo", 0.03)["paired"]["rloo"]["auc_mean"]
    assert d["seeds"] == [0, 1] and d["diffs"] == pytest.approx([0.05, 0.10], abs=1e-12)
    # a training setting that differs: refused, naming it
    (b / "rloo-seed1.json").write_text(json.dumps(rec("rloo", 1, 0.8, optim__lr=3e-4)))
    with pytest.raises(CapoError, match="differ in optim.lr"):
        records.load_records(a, b)
    # another evaluation: refused
    (b / "rloo-seed1.json").write_text(json.dumps({**rec("rloo", 1, 0.8), "settings": {"preset": "p", "eval": {}}}))
    with pytest.raises(CapoError, match="differ in eval"):
        records.load_records(a, b)
    # another device (a GPU run beside CPU runs): refused
    (b / "rloo-seed1.json").write_text(json.dumps({**rec("rloo", 1, 0.8), "machine": {"device": "cuda"}}))
    with pytest.raises(CapoError, match="differ in device"):
        records.load_records(a, b)
    (b / "rloo-seed1.json").write_text(json.dumps({**rec("rloo", 1, 0.8), "machine": {"device": "cpu"}}))
    assert records.load_records(a, b)["rloo"].keys() == {0, 1}  # a CPU record naming its machine pairs
    # the same method and seed in both folders: refused
    (b / "rloo-seed1.json").unlink()
    (b / "grpo-seed1.json").write_text(json.dumps(rec("grpo", 1, 0.7)))
    with pytest.raises(CapoError, match="grpo seed 1 twice"):
        records.load_records(a, b)
    capsys.readouterr()
    # --effect must be a difference > 0 (0 crashed in statsmodels; nan, inf and negatives printed nonsense); nan and
    # inf are refused where every command-line float is, by the flag's parser (exit 2 with a usage line)
    for effect in ("0", "-0.1"):
        assert main(["sweep", "report", str(a), "--out", str(tmp_path / "o"), "--effect", effect]) == 2
        assert f"--effect must be a difference > 0 (e.g. 0.03), got {float(effect)}" in capsys.readouterr().err
    for effect in ("nan", "inf"):
        with pytest.raises(SystemExit) as e:
            main(["sweep", "report", str(a), "--out", str(tmp_path / "o"), "--effect", effect])
        assert e.value.code == 2
        assert f"argument --effect: '{effect}' is not a finite number" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # a record whose seed is no integer or whose method no name: refused, naming the file
    (a / "grpo-seed9.json").write_text(json.dumps({**rec("grpo", 9, 0.7), "seed": "x"}))
    assert main(["sweep", "report", str(a), "--out", str(tmp_path / "o")]) == 2
    assert "grpo-seed9.json: not a sweep record (method 'grpo' is not a name or seed 'x' not an integer)" in \
        capsys.readouterr().err
    (a / "grpo-seed9.json").unlink()
    assert not (tmp_path / "o").exists()
    # a mistyped folder is no silent empty sweep: a clear error naming it, exit 2, nothing written
    assert main(["sweep", "report", str(a), str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert f"capo sweep: error: {tmp_path / 'none'}: no such records folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["sweep", "report", str(a), str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "empty: no records (*.json) found" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_job_held_by_a_live_process_is_skipped_and_a_dead_ones_lock_is_taken_over(tmp_path, capsys, monkeypatch):
    import socket
    import subprocess

    spec_path = _write(tmp_path, SPEC)
    jobs = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")
    for j in jobs:
        j.run_dir.mkdir(parents=True)
    host = socket.gethostname()
    # grpo-seed3: held by a live process (this test's parent); capo-seed3: left by a process that has exited
    (jobs[0].run_dir / "sweep.lock").write_text(f"{os.getppid()}@{host}")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (jobs[1].run_dir / "sweep.lock").write_text(f"{dead.pid}@{host}")
    ran = []
    monkeypatch.setattr(runner, "_train_eval_record", lambda job: ran.append(job.name) or {
        "final": {"accuracy": 0.5, "auc_mean": 0.5}, "wall_s": 1.0})
    assert _run(tmp_path, spec_path) == 0
    out = capsys.readouterr().out
    assert ran == ["capo-seed3"]
    assert f"skipped grpo-seed3: run by another sweep process ({os.getppid()}@{host})" in out
    assert (jobs[0].run_dir / "sweep.lock").read_text() == f"{os.getppid()}@{host}"  # the holder's lock is kept
    assert not (jobs[1].run_dir / "sweep.lock").exists()  # taken over, then released when the job ended
    # a free job is claimed with this process's pid; a second claim sees this (live) process as its holder
    assert runner.claim(jobs[1]) is None
    assert (jobs[1].run_dir / "sweep.lock").read_text() == f"{os.getpid()}@{host}"
    assert runner.claim(jobs[1]) == f"{os.getpid()}@{host}"
    # nothing else left behind but the takeover's flock file (kept: removing a lock file others may wait on races)
    assert sorted(p.name for p in jobs[1].run_dir.iterdir()) == [".sweep.lock.takeover", "sweep.lock"]


def test_a_lock_is_never_seen_empty(tmp_path, monkeypatch):
    """Another process reading a job's lock while it is being taken sees its holder, never an empty file (which
    reads as free: two sweep processes then ran one job, and the second's `capo train` failed on the run folder)."""
    import socket

    job = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")[0]
    seen, real_link = [], os.link

    def link_then_look(src, dst):  # what another process reads the moment the lock exists
        real_link(src, dst)
        seen.append(runner.holder(job))

    monkeypatch.setattr(runner.os, "link", link_then_look)
    assert runner.claim(job) is None
    assert seen == [f"{os.getpid()}@{socket.gethostname()}"]


def test_a_job_finished_by_another_process_after_listing_is_not_run_again(tmp_path, capsys, monkeypatch):
    """Two processes list the same jobs at their start; when one finishes a job the other has listed, the other
    skips it at its turn instead of evaluating it again and rewriting its record."""
    spec_path = _write(tmp_path, SPEC)
    jobs = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")
    ran = []

    def train(job):  # the first job's run: meanwhile "another process" finishes the second job
        ran.append(job.name)
        other = jobs[1]
        other.record.parent.mkdir(parents=True, exist_ok=True)
        other.record.write_text(json.dumps({"settings_hash": other.settings_hash, "final": {}}))
        return {"final": {"accuracy": 0.5, "auc_mean": 0.5}, "wall_s": 1.0}

    monkeypatch.setattr(runner, "_train_eval_record", train)
    assert _run(tmp_path, spec_path) == 0
    assert ran == ["grpo-seed3"]
    assert "skipped capo-seed3: finished by another sweep process (done record" in capsys.readouterr().out
    assert not (jobs[1].run_dir / "sweep.lock").exists()  # released


def test_paired_p_values_are_holm_adjusted_over_the_methods_hand_computed(tmp_path):
    # with 2 degrees of freedom the two-sided t-test p is 1 - t / sqrt(t^2 + 2):
    # capo - grpo: 0.1, 0.2, 0.3 -> t = sqrt(12), p = 1 - sqrt(12/14) = 0.0741799...
    # rloo - grpo: 0.2, 0.3, 0.4 -> t = sqrt(27), p = 1 - sqrt(27/29) = 0.0350977...
    # Holm over the 2 methods: the smaller p times 2 (0.0701955), the larger times 1, never below the one before it
    recs = [_record("grpo", s, 0.4, 0.6) for s in (1, 2, 3)]
    recs += [_record("capo", s, 0.4, 0.6 + d) for s, d in ((1, 0.1), (2, 0.2), (3, 0.3))]
    recs += [_record("rloo", s, 0.4, 0.6 + d) for s, d in ((1, 0.2), (2, 0.3), (3, 0.4))]
    for r in recs:
        (tmp_path / f"{r['method']}-seed{r['seed']}.json").write_text(json.dumps(r))
    s = analysis.summary(records.load_records(tmp_path), "grpo", 0.03)
    capo, rloo = s["paired"]["capo"]["auc_mean"], s["paired"]["rloo"]["auc_mean"]
    p_capo, p_rloo = 1 - (12 / 14) ** 0.5, 1 - (27 / 29) ** 0.5
    assert (capo["p"], rloo["p"]) == pytest.approx((p_capo, p_rloo), abs=1e-9)
    assert rloo["p_holm"] == pytest.approx(2 * p_rloo, abs=1e-9)
    assert capo["p_holm"] == pytest.approx(p_capo, abs=1e-9)
    assert "| rloo | auc_mean | 3 | +0.300 [+0.052, +0.548] | 0.100 | 0.0351 | 0.0702 |" in tables.markdown(s)


def test_change_from_base_hand_computed(tmp_path, capsys):
    # GRPO's final AUC-mean over seeds 1-3 is 0.70, 0.75, 0.65 against the base's 0.80: changes -0.10, -0.05, -0.15
    # -> mean -0.10, sd 0.05, half-width t(0.975, 2) * 0.05 / sqrt(3) = 0.124207...; t = -3.4641 -> p = 0.07418
    for s_, auc in ((1, 0.70), (2, 0.75), (3, 0.65)):
        (tmp_path / f"grpo-seed{s_}.json").write_text(json.dumps(_record("grpo", s_, 0.5, auc)))
    (tmp_path / "base.json").write_text(json.dumps({**_record("base", None, 0.3, 0.80), "curves": {}}))
    assert sorted(records.load_records(tmp_path)) == ["grpo"]  # the base is no method
    s = analysis.summary(records.load_records(tmp_path), "grpo", 0.03, records.load_base(tmp_path))
    d = s["from_base"]["grpo"]["auc_mean"]
    half = 4.302652729911275 * 0.05 / 3 ** 0.5
    assert d["seeds"] == [1, 2, 3] and d["mean"] == pytest.approx(-0.10, abs=1e-12)
    assert (d["low"], d["high"]) == pytest.approx((-0.10 - half, -0.10 + half), abs=1e-9)
    assert d["p"] == pytest.approx(0.07418, abs=5e-5)
    assert s["from_base"]["grpo"]["accuracy"]["mean"] == pytest.approx(0.2, abs=1e-12)  # 0.5 - 0.3, sd 0: no interval
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "| grpo | auc_mean | 3 | -0.100 [-0.224, +0.024] | 0.050 | 0.0742 |" in capsys.readouterr().out


def _base_draw(seed, acc, auc):
    return {**_record("base", None, acc, auc), "curves": {}, "settings": {"eval": {"problems": 6, "seed": seed}}}


def test_change_from_several_base_draws_is_welchs_interval_hand_computed(tmp_path, capsys):
    # GRPO's finals 0.70, 0.75, 0.65 (mean 0.70, variance 0.0025) against four draws of the base evaluation, 0.80,
    # 0.82, 0.78, 0.80 (mean 0.80, variance 0.0008/3): change -0.10, standard error sqrt(0.0025/3 + 0.0008/12) = 0.03,
    # Welch-Satterthwaite df = 0.0009^2 / ((0.0025/3)^2 / 2 + (0.0008/12)^2 / 3) = 2.32289; t(0.975, 2.32289) =
    # 3.77740 -> half-width 0.113322; t = -3.3333 -> two-sided p = 0.064539
    for s_, auc in ((1, 0.70), (2, 0.75), (3, 0.65)):  # evaluated as the base draws are (their seeds aside)
        rec = {**_record("grpo", s_, 0.5, auc), "settings": {"eval": {"problems": 6, "seed": 0}}}
        (tmp_path / f"grpo-seed{s_}.json").write_text(json.dumps(rec))
    for d, auc in enumerate((0.80, 0.82, 0.78, 0.80)):
        (tmp_path / ("base.json" if d == 0 else f"base-draw{d}.json")).write_text(json.dumps(_base_draw(d, 0.3, auc)))
    bases = records.load_base(tmp_path)
    assert len(bases) == 4 and sorted(records.load_records(tmp_path)) == ["grpo"]
    assert [b["settings"]["eval"]["seed"] for b in bases] == [0, 1, 2, 3]  # by sampling seed: base.json first
    s = analysis.summary(records.load_records(tmp_path), "grpo", 0.03, bases)
    d = s["from_base"]["grpo"]["auc_mean"]
    assert d["base_draws"] == 4 and s["base"]["auc_mean"] == pytest.approx(0.80, abs=1e-12)
    assert d["mean"] == pytest.approx(-0.10, abs=1e-12) and d["p"] == pytest.approx(0.064539, abs=1e-6)
    assert (d["low"], d["high"]) == pytest.approx((-0.10 - 0.113322, -0.10 + 0.113322), abs=1e-6)
    # one draw alone gives the one-sample interval of the test above, which is narrower here: the draw's noise
    one = analysis.summary(records.load_records(tmp_path), "grpo", 0.03, bases[:1])["from_base"]["grpo"]
    assert one["auc_mean"]["base_draws"] == 1 and one["auc_mean"]["high"] - one["auc_mean"]["low"] == pytest.approx(
        2 * 4.302652729911275 * 0.05 / 3 ** 0.5, abs=1e-9)
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "mean of 4 draws of the base evaluation" in out and "auc_mean 0.800 (sd 0.016)" in out
    assert "| grpo | auc_mean | 3 | -0.100 [-0.213, +0.013] | 0.050 | 0.0645 |" in out
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "out1"), "--base-draws", "1"]) == 0
    assert "one draw of the base evaluation" in capsys.readouterr().out


def test_a_seed_without_a_number_counts_nowhere_in_the_change_from_several_base_draws():
    """A NaN final (a measure a seed could not compute) is left out of the mean, the sd and the count, as the
    one-draw change and the seed-paired differences leave it out (it gave mean NaN over "4" seeds beside an interval
    over the other three)."""
    recs = {"grpo": {s_: {"final": {"accuracy": v}} for s_, v in ((1, 0.5), (2, math.nan), (3, 0.6), (4, 0.55))}}
    bases = [{"final": {"accuracy": 0.30}}, {"final": {"accuracy": 0.32}}]
    d = analysis.from_base(recs, bases, 0.03)["grpo"]["accuracy"]
    assert d["n_seeds"] == 3 and d["mean"] == pytest.approx(0.55 - 0.31, abs=1e-12)
    assert d["sd"] == pytest.approx(0.05, abs=1e-12) and d["low"] < d["mean"] < d["high"]
    assert analysis.mean_or_none([0.5, math.nan, None]) == 0.5 and analysis.sd_or_none([0.5, math.nan]) is None


def test_base_draws_must_have_their_own_evaluation_seeds(tmp_path):
    (tmp_path / "grpo-seed1.json").write_text(json.dumps(_record("grpo", 1, 0.5, 0.7)))
    (tmp_path / "base.json").write_text(json.dumps(_base_draw(0, 0.3, 0.8)))
    (tmp_path / "base-draw1.json").write_text(json.dumps(_base_draw(0, 0.3, 0.8)))
    with pytest.raises(CapoError, match="same evaluation seed"):
        records.load_base(tmp_path)
    other = _base_draw(1, 0.3, 0.8)
    other["settings"]["eval"]["problems"] = 7  # another evaluation, not another draw
    (tmp_path / "base-draw1.json").write_text(json.dumps(other))
    with pytest.raises(CapoError, match="base records differ in eval"):
        records.load_base(tmp_path)


def test_base_n_draws_the_base_evaluation_n_times_with_consecutive_seeds(tmp_path):
    one = spec.jobs({**SPEC, "base": True}, tmp_path / "runs", tmp_path / "records")
    three = spec.jobs({**SPEC, "base": 3}, tmp_path / "runs", tmp_path / "records")
    assert [j.name for j in three[:4]] == ["base", "base-draw1", "base-draw2", "grpo-seed3"]
    assert [j.eval["seed"] for j in three[:3]] == [0, 1, 2] and {j.draw for j in three[:3]} == {0, 1, 2}
    assert three[1].record.name == "base-draw1.json" and three[1].seed is None
    # the first draw is `base: true`'s job (its record stays valid), and no method job changes
    assert [j.settings_hash for j in three[:1] + three[3:]] == [j.settings_hash for j in one]
    assert len({j.settings_hash for j in three[:3]}) == 3


def test_the_base_job_comes_first_once_and_evaluates_the_presets_model(tmp_path, monkeypatch):
    with_base = {**SPEC, "base": True, "seeds": [3, 4]}
    jobs = spec.jobs(with_base, tmp_path / "runs", tmp_path / "records")
    assert [j.name for j in jobs] == ["base", "grpo-seed3", "capo-seed3", "grpo-seed4", "capo-seed4"]
    assert jobs[0].seed is None and jobs[0].record == tmp_path / "records" / "tiny" / "base.json"
    # adding the base job leaves the method jobs' settings (and so their records) as they were
    assert [j.settings_hash for j in jobs[1:]] == [j.settings_hash for j in spec.jobs({**SPEC, "seeds": [3, 4]},
                                                                                      tmp_path, tmp_path)]
    calls = []
    monkeypatch.setattr(runner, "_capo", lambda args, log: calls.append(args))
    monkeypatch.setattr(runner, "build_record", lambda job, cfg, wall: {"cfg": cfg})
    rec = runner._train_eval_record(jobs[0])
    assert [c[0] for c in calls] == ["eval"]  # no training
    ev = calls[0]
    assert ev[ev.index("--model") + 1] == "default" and ev[ev.index("--limit") + 1] == "6"
    assert ev[ev.index("-k") + 1] == "3" and ev[ev.index("--seed") + 1] == "0"
    assert rec["cfg"]["rollout"]["group_size"] == 4  # the spec's common overrides resolved with the preset


def test_curve_table_averages_training_rows_since_the_previous_evaluation():
    train = [{"step": s, "train/accuracy": a, "train/response_len": n}
             for s, a, n in ((1, 0.2, 80), (2, 0.4, 90), (3, 0.9, 100))]
    ev = [{"step": 0, "eval/accuracy": 0.3, "eval/auc_mean": 0.8},
          {"step": 2, "eval/accuracy": 0.5, "eval/auc_mean": 0.7, "eval/auroc": 0.6, "eval/ece": 0.4,
           "eval/brier": 0.35, "eval/entropy": 0.05}]
    out = tables.curve_table({"method": "grpo", "seed": 1, "curves": {"train": train, "eval": ev}})
    assert "| 0 | 0.300 | 0.800 | - | - | - | - | - | - |" in out  # the step-0 point: no training rows yet
    assert "| 2 | 0.500 | 0.700 | 0.600 | 0.400 | 0.350 | 0.050 | 0.300 | 85.0 |" in out  # steps 1-2 averaged


def test_change_along_the_periodic_curve_hand_computed(tmp_path, capsys):
    # periodic AUC-mean, step 0 -> step 40: seed 1 0.85 -> 0.80, seed 2 0.90 -> 0.80, seed 3 0.80 -> 0.80, seed 4 has
    # no step-0 row (left out). Changes -0.05, -0.10, 0.00 -> mean -0.05, sd 0.05,
    # half-width t(0.975, 2) * 0.05 / sqrt(3) = 0.124207..., t = -1.7321 -> p = 0.2254
    for s_, start in ((1, 0.85), (2, 0.90), (3, 0.80)):
        rec = _record("grpo", s_, 0.5, 0.7)
        rec["curves"]["eval"] = [{"step": 0, "eval/accuracy": 0.3, "eval/auc_mean": start, "eval/auroc": 0.7},
                                 {"step": 20, "eval/accuracy": 0.9, "eval/auc_mean": 0.1, "eval/auroc": 0.1},
                                 {"step": 40, "eval/accuracy": 0.4 + s_ / 100, "eval/auc_mean": 0.80,
                                  "eval/auroc": 0.7 - s_ / 100}]
        (tmp_path / f"grpo-seed{s_}.json").write_text(json.dumps(rec))
    (tmp_path / "grpo-seed4.json").write_text(json.dumps(_record("grpo", 4, 0.5, 0.7)))  # curve from step 20
    s = analysis.summary(records.load_records(tmp_path), "grpo", 0.03)
    d = s["along_curve"]["grpo"]["auc_mean"]
    half = 4.302652729911275 * 0.05 / 3 ** 0.5
    assert d["seeds"] == [1, 2, 3] and d["last_step"] == [40]
    assert d["mean"] == pytest.approx(-0.05, abs=1e-12) and d["sd"] == pytest.approx(0.05, abs=1e-12)
    assert (d["low"], d["high"]) == pytest.approx((-0.05 - half, -0.05 + half), abs=1e-9)
    assert d["p"] == pytest.approx(0.2254, abs=5e-5)
    # accuracy: 0.11, 0.12, 0.13 -> mean 0.12; pooled AUROC -0.01, -0.02, -0.03 -> mean -0.02
    assert s["along_curve"]["grpo"]["accuracy"]["mean"] == pytest.approx(0.12, abs=1e-12)
    assert s["along_curve"]["grpo"]["auroc"]["mean"] == pytest.approx(-0.02, abs=1e-12)
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "| grpo | auc_mean | 3 | 40 | -0.050 [-0.174, +0.074] | 0.050 | 0.225 |" in capsys.readouterr().out


@pytest.mark.parametrize("methods", [("grpo",), ("grpo", "capo"), ("grpo", "capo", "rloo", "ace")])
def test_curves_are_small_multiples_one_pair_of_panels_per_method(tmp_path, methods):
    """The figure's layout: each method other than the reference gets an accuracy and an AUC-mean panel (two methods
    per row); the reference alone gets its own pair."""
    import matplotlib.image

    recs = {m: {s: _record(m, s, 0.4 + 0.01 * s, 0.7 + 0.02 * i) for s in (1, 2)} for i, m in enumerate(methods)}
    plots.plot_curves(recs, "grpo", tmp_path / "c.png")
    h, w = matplotlib.image.imread(tmp_path / "c.png").shape[:2]
    n = max(len(methods) - 1, 1)
    assert w == (1400 if n > 1 else 700)  # two methods (four panels) per row at 7 in x 100 dpi
    assert h == round((2.6 * -(-n // (2 if n > 1 else 1)) + 0.6) * 100)


def test_forest_panels_fit_the_powered_intervals_and_cut_the_rest():
    """A 2-seed interval (t = 12.7) must not set a panel's range: the range fits the rows with >= 3 seeds."""
    powered, wide = {"seeds": [1, 2, 3], "low": -0.01, "high": 0.03}, {"seeds": [1, 2], "low": -2.0, "high": 2.0}
    assert plots._forest_limit([powered, wide]) == pytest.approx(1.15 * 0.03)
    assert plots._forest_limit([wide]) == pytest.approx(2.3)  # no powered row: fit them all
    assert plots._forest_limit([{"seeds": [1, 2, 3], "low": -1e-4, "high": 1e-4}]) == 0.02  # a floor


def test_plane_points_are_each_methods_seeds_mean_and_sd_hand_computed(tmp_path):
    """The accuracy / AUC-mean plane: GRPO seeds (0.4, 0.6), (0.5, 0.8) -> mean (0.45, 0.7), sd (0.0707, 0.1414);
    a one-seed method has no sd; the start is the base draws' mean and sd; the figure is written."""
    recs = [_record("grpo", 1, 0.4, 0.6), _record("grpo", 2, 0.5, 0.8), _record("rloo", 1, 0.3, 0.9)]
    for r in recs:
        (tmp_path / f"{r['method']}-seed{r['seed']}.json").write_text(json.dumps(r))
    s = analysis.summary(records.load_records(tmp_path), "grpo", 0.03)
    pts = plots.plane_points(s)
    assert pts["start"] is None
    g = pts["methods"]["grpo"]
    assert g["seeds"] == [(0.4, 0.6), (0.5, 0.8)]
    assert g["mean"] == pytest.approx((0.45, 0.7), abs=1e-12)
    assert g["sd"] == pytest.approx((0.05 * 2 ** 0.5, 0.1 * 2 ** 0.5), abs=1e-12)
    assert pts["methods"]["rloo"]["sd"] == (None, None)
    s |= {"base": {"accuracy": 0.3, "auc_mean": 0.75}, "base_sd": {"accuracy": 0.01, "auc_mean": 0.02},
          "base_draws": 8}
    assert plots.plane_points(s)["start"] == {"mean": (0.3, 0.75), "sd": (0.01, 0.02), "draws": 8}
    plots.plot_plane(s, tmp_path / "plane.png")
    assert (tmp_path / "plane.png").stat().st_size > 10_000


def test_pooled_reliability_bins_every_seeds_responses_hand_computed(tmp_path):
    """exp(lpm) of every response of all of a method's seeds, in 10 equal bins: GRPO's two seeds give confidences
    0.95, 0.95, 0.15 (one lpm missing: left out) -> bin 9 holds 2 responses at accuracy 0.5, bin 1 one at 0; the base
    comes first, then the reference, then the others; a folder whose records keep no log-prob draws nothing."""
    import math

    def rec(method, seed, responses):
        return {"method": method, "seed": seed, "final": {}, "responses": responses}

    lp = math.log
    recs = {"grpo": {1: rec("grpo", 1, [["a", 1, lp(0.95)], ["b", 0, lp(0.15)]]),
                     2: rec("grpo", 2, [["a", 0, lp(0.95)], ["b", 1, None]])},
            "capo": {1: rec("capo", 1, [["a", 1, lp(0.55)]])}}
    bases = [rec("base", None, [["a", 0, lp(0.05)]])]
    runs = plots.pooled_reliability(recs, bases, "grpo")
    assert list(runs) == ["base (1 draw)", "grpo (2 seeds)", "capo (1 seed)"]
    g = runs["grpo (2 seeds)"]["reliability"]
    assert g["count"] == [0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0]  # (the last bin: confidence exactly 1)
    assert g["accuracy"][9] == 0.5 and g["accuracy"][1] == 0.0
    assert g["confidence"][9] == pytest.approx(0.95) and g["confidence"][1] == pytest.approx(0.15)
    assert runs["capo (1 seed)"]["reliability"]["count"][5] == 1
    assert plots.plot_reliability(recs, bases, "grpo", tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 10_000
    none = {"grpo": {1: rec("grpo", 1, [["a", 1, None]])}}
    assert not plots.plot_reliability(none, [], "grpo", tmp_path / "n.png") and not (tmp_path / "n.png").exists()


def test_a_record_is_built_from_responses_holding_a_line_separator(tmp_path):
    """A generated answer with U+2028 in it (SmolLM2 wrote one: facts_methods' capo_sum seed 6 failed to record)
    stays one response: the record has every row of the evaluation and their lpm."""
    job = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")[0]
    ev = job.run_dir / "eval"
    ev.mkdir(parents=True)
    (ev / "metrics.json").write_text(json.dumps({"metrics": {"accuracy": 0.5}}))
    rows = [{"prompt_id": "p1", "verdict": "correct", "mean_logprob": -0.25, "text": "Al A\u2028x"},
            {"prompt_id": "p1", "verdict": "incorrect", "mean_logprob": None, "text": "b\u2029c"}]
    (ev / "generations.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                          encoding="utf-8")
    (job.run_dir / "metrics.jsonl").write_text('{"step": 1, "train/accuracy": 0.5, "time/step": 2.25}\n'
                                               '{"step": 2, "train/accuracy": 0.5, "time/step": 3.5}\n')
    rec = runner.build_record(job, {}, 1.0)
    assert rec["responses"] == [["p1", 1, -0.25], ["p1", 0, None]]
    assert [r["train/accuracy"] for r in rec["curves"]["train"]] == [0.5, 0.5]
    assert (rec["wall_s"], rec["train_s"]) == (1.0, 5.8)  # every step's time, whichever process trained it


def test_a_run_finished_under_another_records_folder_is_copied_not_evaluated_again(tmp_path, monkeypatch, capsys):
    """Two checkouts sharing --runs-root: the second finds the finished run's record in the run folder and copies it
    byte for byte (same wall time, same commit) instead of evaluating the run again, saying so (status says it
    before: deleting a record alone does not rerun its job); a record kept from other settings (the spec was
    edited) is not taken."""
    spec_path = _write(tmp_path, SPEC)
    job = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")[0]
    job.run_dir.mkdir(parents=True)
    kept = '{"settings_hash":"%s","final":{"accuracy":0.5,"auc_mean":0.7},"wall_s":2331.1}\n' % job.settings_hash
    (job.run_dir / runner.RUN_RECORD).write_text(kept)
    argv = [str(spec_path), "--runs-root", str(tmp_path / "runs"), "--records-root", str(tmp_path / "records")]
    assert main(["sweep", "status", *argv]) == 0
    assert "todo    grpo-seed3  (finished: run copies record.json from its run folder)" in capsys.readouterr().out
    monkeypatch.setattr(runner, "_capo", lambda *a: pytest.fail("a finished run was evaluated again"))
    assert runner.run_job(job)["wall_s"] == 2331.1
    assert job.record.read_text() == kept
    assert (f"note: grpo-seed3: copied the record its run folder keeps ({job.run_dir / runner.RUN_RECORD}), without "
            "training or evaluating; to run the job anew, move its whole run folder aside") in capsys.readouterr().out
    job.record.unlink()
    (job.run_dir / runner.RUN_RECORD).write_text(kept.replace(job.settings_hash, "0" * 16))
    monkeypatch.setattr(runner, "_capo", lambda *a: (_ for _ in ()).throw(RuntimeError("trains again")))
    with pytest.raises(RuntimeError, match="trains again"):
        runner.run_job(job)
    assert not job.record.exists()


def test_a_finished_job_without_auc_mean_is_reported(capsys):
    """A stochastic-task record has no AUC-mean (one outcome per question): the runner prints its stated-probability
    ECE instead of failing on the missing value (it did, and lost the sweep's --commit)."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from capo.sweep.runner import _report_job

    fut = Future()
    fut.set_result({"wall_s": 90.0, "final": {"accuracy": 0.5, "auc_mean": None, "stochastic_ece": 0.1234,
                                              "stochastic_auroc": None}})
    assert _report_job(SimpleNamespace(name="grpo-seed1"), fut, commit=False) == 0
    assert "done grpo-seed1 in 1.5 min: stochastic_ece 0.123 stochastic_auroc n/a" in capsys.readouterr().out
    fut = Future()  # the binary variant: the predicted outcome's and the stated confidence's ECE
    fut.set_result({"wall_s": 30.0, "final": {"accuracy": 0.7, "stochastic_ece": 0.2, "answer_ece": 0.0951,
                                              "verbal_ece": 0.3}})
    assert _report_job(SimpleNamespace(name="capo-seed2"), fut, commit=False) == 0
    assert "done capo-seed2 in 0.5 min: answer_ece 0.095 verbal_ece 0.300" in capsys.readouterr().out
    fut = Future()
    fut.set_result({"wall_s": 60.0, "final": {"accuracy": 0.25, "auc_mean": 0.75}})
    assert _report_job(SimpleNamespace(name="capo-seed0"), fut, commit=False) == 0
    assert "done capo-seed0 in 1.0 min: accuracy 0.250 auc_mean 0.750" in capsys.readouterr().out
    fut = Future()  # resumed: the last process trained a part of the run
    fut.set_result({"wall_s": 60.0, "train_s": 3000.0, "final": {"accuracy": 0.25, "auc_mean": 0.75}})
    assert _report_job(SimpleNamespace(name="capo-seed1"), fut, commit=False) == 0
    assert ("done capo-seed1 in 1.0 min (trained 50.0 min over every process): accuracy 0.250 auc_mean 0.750"
            in capsys.readouterr().out)


@pytest.mark.slow
def test_a_run_folder_trained_with_other_settings_is_refused_never_evaluated_as_this_job(tmp_path, capsys):
    """A record is written only for a model trained with the record's settings. After a sweep ran, its run
    folder (final checkpoint) is refused for (1) a job of another method or seed whose folder holds a copy of it
    (with its settings mark, and without one, as a folder from before the mark or from `capo train` by hand), and
    (2) the user's sequence: change optim.lr, see the record stale, delete it, run again -- which re-evaluated the
    old model and recorded it under the new lr. Refused before anything runs: exit 2, the folder named, no record."""
    import shutil

    one = {**SPEC, "steps": 1, "methods": {"grpo": {"algo.name": "grpo"}}}
    spec_path = _write(tmp_path, one)
    assert _run(tmp_path, spec_path) == 0
    runs, rec_dir = tmp_path / "runs" / "tiny", tmp_path / "records" / "tiny"
    trained = runs / "grpo-seed3"
    assert (trained / "checkpoints" / "step-000001").is_dir()
    evaluated = (trained / "eval" / "metrics.json").read_bytes()
    # (1) the same folder under another method's and another seed's name
    shutil.copytree(trained, runs / "capo-seed3")
    shutil.copytree(trained, runs / "grpo-seed4")
    for copy in (runs / "capo-seed3", runs / "grpo-seed4"):  # killed after training, before its evaluation
        shutil.rmtree(copy / "eval")
        (copy / runner.RUN_RECORD).unlink()
    (runs / "grpo-seed4" / runner.RUN_SETTINGS).unlink()  # no mark: its config.yaml is compared instead
    capsys.readouterr()
    assert _run(tmp_path, _write(tmp_path, {**one, "methods": SPEC["methods"], "seeds": [3, 4]})) == 2
    err = capsys.readouterr().err
    assert f"{runs / 'capo-seed3'} was trained with other settings" in err and "algo.name: 'grpo' -> 'capo'" in err
    assert f"{runs / 'grpo-seed4'} was trained with other settings" in err and "run.seed: 3 -> 4" in err
    assert sorted(p.name for p in rec_dir.iterdir()) == ["grpo-seed3.json"]  # nothing evaluated, nothing recorded
    # (2) the learning rate changed after the run
    new_lr = _write(tmp_path, {**one, "overrides": {**SPEC["overrides"], "optim.lr": 1e-4}})
    assert _run(tmp_path, new_lr) == 0
    assert "stale record" in capsys.readouterr().out
    (rec_dir / "grpo-seed3.json").unlink()
    assert _run(tmp_path, new_lr) == 2
    err = capsys.readouterr().err
    assert f"{trained} was trained with other settings (optim.lr: 0.0003 -> 0.0001)" in err
    assert not (rec_dir / "grpo-seed3.json").exists()
    assert (trained / "eval" / "metrics.json").read_bytes() == evaluated  # the old model was not evaluated again


def test_the_run_folder_is_marked_with_its_settings_before_training_and_bookkeeping_may_change(tmp_path, monkeypatch):
    """The settings mark is written before `capo train` starts (a run killed at step 1 carries it); a job whose
    settings differ from the mark's only in bookkeeping knobs (save cadence, threads) resumes in that folder."""
    job = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")[0]
    marks = []

    def killed(args, log):
        marks.append(json.loads((job.run_dir / runner.RUN_SETTINGS).read_text()))
        raise RuntimeError("killed")

    monkeypatch.setattr(runner, "_capo", killed)
    with pytest.raises(RuntimeError, match="killed"):
        runner.run_job(job)
    assert marks[0]["settings_hash"] == job.settings_hash and marks[0]["config"]["rollout"]["group_size"] == 4
    assert marks[0]["settings"] == {"preset": "default", "overrides": job.overrides, "eval": job.eval}
    resumed = spec.jobs({**SPEC, "save_every": 5, "overrides": {**SPEC["overrides"], "run.threads": 2}},
                        tmp_path / "runs", tmp_path / "records")[0]
    assert resumed.settings_hash != job.settings_hash
    with pytest.raises(RuntimeError, match="killed"):  # it trains (here: is killed again), not refused
        runner.run_job(resumed)
    assert marks[1] == marks[0]  # the mark keeps the settings the folder started with
    other = spec.jobs({**SPEC, "overrides": {**SPEC["overrides"], "rollout.group_size": 2}}, tmp_path / "runs",
                      tmp_path / "records")[0]
    with pytest.raises(CapoError, match=r"rollout.group_size: 4 -> 2"):
        runner.run_job(other)
    assert len(marks) == 2


def test_bookkeeping_knobs_do_not_make_a_record_stale(tmp_path):
    """A record stays done when the spec changes only knobs that cannot change a result (records.FREE outside the
    method and the seed: save cadence, threads, ...); any other change still makes it stale. The hash itself is
    unchanged (committed records keep theirs)."""
    j = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")[0]
    j.record.parent.mkdir(parents=True)
    j.record.write_text(json.dumps({"settings_hash": j.settings_hash, "settings": {
        "preset": j.preset, "overrides": j.overrides, "eval": j.eval}}))
    free = spec.jobs({**SPEC, "save_every": 5, "overrides": {**SPEC["overrides"], "run.threads": 2,
                                                             "optim.micro_batch_size": 4}},
                     tmp_path / "runs", tmp_path / "records")[0]
    assert free.settings_hash != j.settings_hash and spec.state(free) == "done"
    for changed in ({"optim.lr": 1e-3}, {"algo.advantage_kwargs": {"tau": 0.5}}, {"rollout.temperature": 0.7}):
        other = dict(SPEC, methods={"grpo": {**SPEC["methods"]["grpo"], **changed}})
        assert spec.state(spec.jobs(other, tmp_path / "runs", tmp_path / "records")[0]) == "stale", changed


@pytest.mark.parametrize("loss, counts", [("ppo_clip", False), ("clip_cov", True), ("kl_cov", True)])
def test_micro_batches_count_as_a_setting_only_for_a_batch_dependent_loss(tmp_path, loss, counts):
    """Clip-Cov and KL-Cov select tokens within each micro-batch, so for them the micro-batch size is a setting, not
    bookkeeping: a record, a run folder or a second seed of the method with another one is not the job's (stale,
    refused, not pooled); for any other loss it stays free."""
    from types import SimpleNamespace

    from capo.trainer.config import TrainConfig

    methods = {"m": {"algo.name": "grpo", "algo.loss": loss}}
    j = spec.jobs({**SPEC, "methods": methods}, tmp_path / "runs", tmp_path / "records")[0]
    cfg = TrainConfig.from_dict({"algo": {"name": "grpo", "loss": loss}}).resolved().to_dict()
    j.record.parent.mkdir(parents=True)
    j.record.write_text(json.dumps({"settings_hash": j.settings_hash, "config": cfg, "settings": j.settings}))
    micro = {**SPEC, "methods": methods, "overrides": {**SPEC["overrides"], "optim.micro_batch_size": 4}}
    other = spec.jobs(micro, tmp_path / "runs", tmp_path / "records")[0]
    assert spec.state(other) == ("stale" if counts else "done")
    # the run folder: marked with micro-batch 0, asked to train with 4
    folder = SimpleNamespace(run_dir=tmp_path / "m-seed1", eval={"problems": 4})
    folder.run_dir.mkdir()
    (folder.run_dir / runner.RUN_SETTINGS).write_text(json.dumps({"config": cfg, "settings": {"eval": {"problems": 4}}}))
    now = json.loads(json.dumps(cfg))
    now["optim"]["micro_batch_size"] = 4
    problem = runner.run_dir_problem(folder, now)
    assert (problem is not None and "optim.micro_batch_size: 0 -> 4" in problem) == counts
    # two seeds of the method with other micro-batches
    recs = tmp_path / "recs"
    recs.mkdir()
    for s_, c in ((1, cfg), (2, now)):
        (recs / f"m-seed{s_}.json").write_text(json.dumps({**_record("m", s_, 0.5, 0.7), "config": c}))
    if counts:
        with pytest.raises(CapoError, match=r"two seeds of 'm' ran other algorithm settings \(optim.micro_batch_size\)"):
            records.load_records(recs)
    else:
        assert sorted(records.load_records(recs)["m"]) == [1, 2]


def test_a_corrupt_record_is_reported_and_never_rewritten(tmp_path, capsys, monkeypatch):
    """A truncated record (a kill mid-copy, a merge's conflict markers) is 'corrupt' under status, and run refuses
    to start (exit 2) instead of training the job again and overwriting the file."""
    spec_path = _write(tmp_path, SPEC)
    job = spec.jobs(SPEC, tmp_path / "runs", tmp_path / "records")[0]
    job.record.parent.mkdir(parents=True)
    torn = '{"sweep": "tiny", "method": "grpo", "seed": 3, "settings_ha'
    job.record.write_text(torn)
    monkeypatch.setattr(runner, "_train_eval_record", lambda j: pytest.fail(f"{j.name} ran"))
    assert spec.state(job) == "corrupt"
    argv = [str(spec_path), "--runs-root", str(tmp_path / "runs"), "--records-root", str(tmp_path / "records")]
    assert main(["sweep", "status", *argv]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == ["corrupt grpo-seed3", "todo    capo-seed3",
                                "0 of 2 done, 0 running, 1 waiting, 1 corrupt"]
    assert f"{job.record}: corrupt record (not valid JSON" in err and "nothing was run" in err
    assert _run(tmp_path, spec_path) == 2
    assert f"{job.record}: corrupt record" in capsys.readouterr().err
    assert job.record.read_text() == torn


def test_the_final_evaluation_renders_prompts_as_training_did(tmp_path):
    """A chat model's sweep evaluates with its config's chat template and system prompt (None: the answer format's
    default, as the trainer renders it), not the raw prompts of a task generated in code."""
    from capo.trainer.config import load_config

    body = spec.load_spec(_write(tmp_path, {**SPEC, "preset": "facts", "overrides": {}}))
    job = spec.jobs(body, tmp_path / "runs", tmp_path / "records")[0]
    cfg = load_config("facts").to_dict()
    s = runner.eval_settings(job, cfg, "smollm2")
    assert s.chat_template is True and s.system_prompt is None and s.answer_format == "short"
    args = runner._eval_args(s, tmp_path / "e")
    assert "--no-chat-template" not in args and "--system-prompt" not in args
    cfg["model"]["chat_template"], cfg["data"]["system_prompt"] = False, "Be brief."
    args = runner._eval_args(runner.eval_settings(job, cfg, "smollm2"), tmp_path / "e")
    assert "--no-chat-template" in args and args[args.index("--system-prompt") + 1] == "Be brief."


def test_the_final_evaluations_arguments_carry_every_setting(tmp_path):
    """`capo eval`'s parser reads back from the runner's arguments exactly the settings of eval_settings (a field
    left out of the arguments would silently fall back to `capo eval`'s default)."""
    import dataclasses

    from capo.cli import build_parser, eval_cmd
    from capo.cli.flags import given_flags
    from capo.evaluation.run import EvalSettings
    from capo.settings import from_namespace
    from capo.trainer.config import load_config

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"q": "{i}?", "a": "#### {i}"}}\n' for i in range(12)))
    body = spec.load_spec(_write(tmp_path, {**SPEC, "overrides": {}}))
    job = spec.jobs(body, tmp_path / "runs", tmp_path / "records")[0]
    cfg = load_config("facts", {"data.dataset": str(data), "data.prompt_field": "q", "data.answer_field": "a",
                                "data.gold_format": "gsm8k", "data.n_eval": 8, "rollout.top_p": 0.8,
                                "data.system_prompt": "Be brief.", "data.response_prefix": "<a>"}).to_dict()
    s = runner.eval_settings(job, cfg, "smollm2")
    argv = runner._eval_args(s, tmp_path / "e")
    args = build_parser().parse_args(argv)
    eval_cmd._generation_settings(args, given_flags(args._parser, argv[1:]))  # no flag it refuses (--split of a file)
    eval_cmd._extraction_settings(args)
    read = from_namespace(EvalSettings, args)  # what `capo eval` runs with, as its `run` builds it
    for f in dataclasses.fields(EvalSettings):
        assert getattr(read, f.name) == getattr(s, f.name), f.name
    assert (s.top_p, s.prompt_field, s.gold_format, s.limit) == (0.8, "q", "gsm8k", 6)


@pytest.mark.parametrize("n_measures,rows", [(3, 1), (4, 1), (11, 3)])
def test_forest_plot_wraps_its_panels_into_rows(tmp_path, n_measures, rows):
    """Eleven measures drew 11 panels in one row (3201 x 327 px); they wrap, FOREST_PER_ROW to a row."""
    import matplotlib.image

    measures = plots.FOREST[:n_measures]
    d = {"seeds": [1, 2, 3], "low": -0.01, "mean": 0.01, "high": 0.03, "sd": 0.02}
    s = {"reference": "grpo", "paired": {m: {k: d for k in measures} for m in ("capo", "rloo", "dr_grpo")}}
    assert plots.plot_forest(s, tmp_path / "f.png")
    h, w = matplotlib.image.imread(tmp_path / "f.png").shape[:2]
    cols = min(n_measures, plots.FOREST_PER_ROW)
    assert abs(w - (2.5 * cols + 1.6) * 110) <= 1  # 110 dpi
    assert abs(h - (rows * (0.42 * 3 + 0.9) + 0.4) * 110) <= 1
    assert w <= 1300


def test_a_setting_a_record_predates_reads_as_its_default():
    """Records written before a knob existed (model.attention, model.ref_dtype) enter one comparison with newer
    records that hold its default, and not with records that changed it."""
    old = {"settings": {"preset": "p", "eval": {}}, "config": {"model": {"path": "m"}, "algo": {"name": "capo"}}}
    new = {"settings": {"preset": "p", "eval": {}},
           "config": {"model": {"path": "m", "attention": "sdpa", "ref_dtype": None}, "algo": {"name": "grpo"}}}
    assert records.comparable(old) == records.comparable(new)
    changed = {**new, "config": {**new["config"], "model": {"path": "m", "attention": "eager"}}}
    assert records.comparable(old) != records.comparable(changed)
    with pytest.raises(CapoError, match="differ in config|model.attention"):
        records._check_same([(pathlib.Path("a"), old), (pathlib.Path("b"), changed)], "training records")


def test_a_flipped_default_does_not_change_how_an_older_record_reads(monkeypatch):
    """A record without `optim.fused` ran the per-parameter AdamW loop: if the knob's default became True, the record
    must still read as False, and so not enter one comparison with fused runs."""
    from capo.trainer import config

    old = {"settings": {"preset": "p", "eval": {}}, "config": {"model": {"path": "m"}, "optim": {"lr": 1e-5}}}
    fused = {"settings": {"preset": "p", "eval": {}}, "config": {"model": {"path": "m"},
                                                                  "optim": {"lr": 1e-5, "fused": True}}}
    as_shipped = config.TrainConfig.to_dict
    monkeypatch.setattr(config.TrainConfig, "to_dict",  # the default, flipped
                        lambda self: {**as_shipped(self), "optim": {**as_shipped(self)["optim"], "fused": True}})
    assert config.TrainConfig().to_dict()["optim"]["fused"] is True
    assert records.comparable(old)["config"]["optim.fused"] is False
    assert records.comparable(old) != records.comparable(fused)


def test_every_key_a_committed_record_lacks_reads_as_what_it_ran_with():
    """Each training setting missing from a committed record's config is bookkeeping or listed in PREDATING (the
    behaviour before the knob): a knob added later must say what the records before it ran with."""
    from capo.rundir import BOOKKEEPING

    from capo.trainer.config import TrainConfig

    flat_now = records.flat_config(TrainConfig().to_dict())
    lacking = set()
    for f in sorted(pathlib.Path(__file__).resolve().parents[1].glob("sweeps/records/*/*.json")):
        cfg = json.loads(f.read_text()).get("config")
        if cfg:  # the table-model records keep no trainer config
            lacking |= set(flat_now) - set(records.flat_config(cfg))
    assert lacking, "the committed records no longer predate any knob: this test reads nothing"
    unlisted = sorted(k for k in lacking if k not in BOOKKEEPING and k not in records.PREDATING)
    assert not unlisted, f"committed records lack {unlisted}: add what they ran with to capo.sweep.records.PREDATING"


def test_a_setting_the_run_folders_mark_predates_reads_as_its_default(tmp_path):
    """A run folder marked before a knob existed (its resolved config lacks the key) ran with what is now the knob's
    default, as a record that predates a knob reads: it is not refused for that key alone; the same folder marked
    with another value of the knob is refused, naming it."""
    from types import SimpleNamespace

    from capo.trainer.config import TrainConfig

    cfg = TrainConfig().to_dict()
    job = SimpleNamespace(run_dir=tmp_path / "grpo-seed1", eval={"problems": 4})
    job.run_dir.mkdir()
    old = json.loads(json.dumps(cfg))
    del old["model"]["train_top_layers"]  # a folder started before the knob existed
    mark = job.run_dir / runner.RUN_SETTINGS
    mark.write_text(json.dumps({"config": old, "settings": {"eval": {"problems": 4}}}))
    assert runner.run_dir_problem(job, cfg) is None
    old["model"]["train_top_layers"] = 2
    mark.write_text(json.dumps({"config": old, "settings": {"eval": {"problems": 4}}}))
    assert "(model.train_top_layers: 2 -> 0)" in runner.run_dir_problem(job, cfg)


def test_two_seeds_of_one_method_with_other_algorithm_settings_are_refused(tmp_path):
    """`algo.*` is free between methods, not within one: a method whose spec was edited after some seeds ran (or a
    name two sweeps gave to two algorithms) is never pooled."""
    for s_, tau in ((1, 0.6), (2, 0.6), (3, 0.5)):
        rec = {**_record("capo", s_, 0.5, 0.7), "config": {"algo": {"name": "capo", "advantage_kwargs": {"tau": tau}}}}
        (tmp_path / f"capo-seed{s_}.json").write_text(json.dumps(rec))
    with pytest.raises(CapoError, match=r"capo-seed3.json and .*capo-seed1.json: two seeds of 'capo' ran other "
                                        r"algorithm settings \(algo.advantage_kwargs\)"):
        records.load_records(tmp_path)
    (tmp_path / "capo-seed3.json").unlink()
    assert sorted(records.load_records(tmp_path)["capo"]) == [1, 2]


def test_a_base_record_of_another_start_is_refused_by_the_report(tmp_path, capsys):
    """The change from the start is measured against the comparison's own start: a base record of another preset,
    evaluation, model or data stops the report before anything is written."""
    cfg = {"model": {"path": "word_problems"}, "data": {"dataset": "word_problems"}}
    settings = {"preset": "word_problems", "eval": {"problems": 100, "k": 8, "seed": 0}}
    for s_, auc in ((1, 0.70), (2, 0.75)):
        rec = {**_record("grpo", s_, 0.5, auc), "config": cfg, "settings": settings}
        (tmp_path / f"grpo-seed{s_}.json").write_text(json.dumps(rec))
    base = {**_record("base", None, 0.3, 0.8), "curves": {}, "config": cfg, "settings": settings}
    (tmp_path / "base.json").write_text(json.dumps(base))
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "ok")]) == 0
    other = {**base, "config": {"model": {"path": "smollm2"}, "data": {"dataset": "facts"}},
             "settings": {"preset": "facts", "eval": {"problems": 572, "k": 8, "seed": 0}}}
    (tmp_path / "base.json").write_text(json.dumps(other))
    capsys.readouterr()
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "base.json is not the start of grpo-seed1: they differ in preset, eval, data.dataset, model.path" in err
    assert not (tmp_path / "no").exists()


def test_two_runners_finding_one_stale_lock_never_both_take_it(tmp_path, monkeypatch):
    """A lock left by a dead runner: this process judges it stale and, in that moment, a second runner claims the
    job. The second waits for the judgement and finds this one holding the job (both took it: the second unlinked
    the first's fresh lock; found by an audit). The job's lock is removed only by its holder."""
    import socket
    from types import SimpleNamespace

    run = tmp_path / "job"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / runner.LOCK).write_text(f"{dead.pid}@{socket.gethostname()}")
    job = SimpleNamespace(run_dir=run)
    other, judge = [], runner._holder
    code = ("import sys; from pathlib import Path; from types import SimpleNamespace; from capo.sweep import runner; "
            "print(runner.claim(SimpleNamespace(run_dir=Path(sys.argv[1]))))")

    def judged_while_another_claims(lock):
        if not other:
            other.append(subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True,
                                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}))
            time.sleep(1.0)  # the other runner reaches the stale lock meanwhile
        return judge(lock)

    monkeypatch.setattr(runner, "_holder", judged_while_another_claims)
    assert runner.claim(job) is None
    out, _ = other[0].communicate(timeout=60)
    assert out.strip() == f"{os.getpid()}@{socket.gethostname()}"  # the other runner left the job to this one
    (run / runner.LOCK).write_text("12345@elsewhere")  # taken by another host meanwhile: not this process's to free
    runner.release(job)
    assert (run / runner.LOCK).exists()


def test_an_evaluation_of_other_weights_at_the_final_checkpoints_path_is_never_resumed(tmp_path, capsys):
    """capo eval knows a model by its path: a final checkpoint trained again there (other weights) found the first
    model's rows and resumed them, one evaluation of two models (found by an audit). The eval folder is marked with
    the weights' sha256; rows of other or unknown weights are moved aside, those of the same weights kept."""
    from types import SimpleNamespace

    run = tmp_path / "grpo-seed1"
    ckpt = run / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"first weights")
    job = SimpleNamespace(run_dir=run, method="grpo", name="grpo-seed1")
    out = runner.eval_folder(job, str(ckpt))
    (out / "generations.jsonl").write_text('{"prompt_id": "p0"}\n')  # a partial evaluation, killed
    assert runner.eval_folder(job, str(ckpt)) == out and (out / "generations.jsonl").exists()  # same weights: kept
    (ckpt / "model.safetensors").write_bytes(b"trained again")
    assert runner.eval_folder(job, str(ckpt)) == out and not (out / "generations.jsonl").exists()
    (aside,) = run.glob("eval.replaced-*")
    assert (aside / "generations.jsonl").read_text() == '{"prompt_id": "p0"}\n'  # moved, not lost
    assert "held responses of other weights" in capsys.readouterr().out
    mark = json.loads((out / runner.EVALUATED).read_text())
    assert mark["weights_sha256"] == runner.weights_digest(ckpt) != json.loads((aside / runner.EVALUATED).read_text())[
        "weights_sha256"]


def test_a_base_record_sampled_otherwise_than_the_training_records_is_refused(tmp_path, capsys):
    """The base's evaluation samples as the preset trains (temperature, top-p, budget, bf16): a base draw from before
    the preset's temperature was edited is not the start of records sampled at the new one, and two draws sampled
    differently are not one base (both were pooled, the change from the start over a mix; found by an audit)."""
    def cfg(t):
        return {"model": {"path": "word_problems"}, "data": {"dataset": "word_problems"},
                "rollout": {"temperature": t}}

    settings = {"preset": "word_problems", "eval": {"problems": 100, "k": 8, "seed": 0}}
    for s_, auc in ((1, 0.70), (2, 0.75)):
        rec = {**_record("grpo", s_, 0.5, auc), "config": cfg(0.5), "settings": settings}
        (tmp_path / f"grpo-seed{s_}.json").write_text(json.dumps(rec))
    base = {**_record("base", None, 0.3, 0.8), "curves": {}, "config": cfg(1.0), "settings": settings}
    (tmp_path / "base.json").write_text(json.dumps(base))
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "no")]) == 2
    assert "base.json is not the start of grpo-seed1: they differ in eval" in capsys.readouterr().err
    (tmp_path / "base.json").write_text(json.dumps({**base, "config": cfg(0.5)}))
    draw = {**base, "config": cfg(1.0), "settings": {**settings, "eval": {**settings["eval"], "seed": 1}}}
    (tmp_path / "base-draw1.json").write_text(json.dumps(draw))
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "no2")]) == 2
    assert "base records differ in eval" in capsys.readouterr().err
    (tmp_path / "base-draw1.json").write_text(json.dumps({**draw, "config": cfg(0.5)}))
    assert main(["sweep", "report", str(tmp_path), "--out", str(tmp_path / "ok")]) == 0


@pytest.mark.slow
def test_a_runner_stopped_by_sigterm_stops_its_jobs_training(tmp_path):
    """`kill RUNNER` (SIGTERM): the job's `capo train` stops with it (it went on training without its runner, which
    would never write the record, and held the run folder's lock against the next runner); the runner exits 143,
    writes no record and starts no other job."""
    import signal
    import subprocess
    import time

    body = {**SPEC, "steps": 100000, "methods": {"grpo": {"algo.name": "grpo"}}, "seeds": [3, 4]}
    spec_path = _write(tmp_path, body)
    runner_p = subprocess.Popen(
        [sys.executable, "-m", "capo.cli", "sweep", "run", str(spec_path), "--jobs", "1", "--runs-root",
         str(tmp_path / "runs"), "--records-root", str(tmp_path / "records")],
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = tmp_path / "runs" / "tiny" / "grpo-seed3" / ".lock"
    pid, deadline = None, time.monotonic() + 300  # a condition to wait for, not a timing: the train process starts
    while pid is None and time.monotonic() < deadline and runner_p.poll() is None:
        text = lock.read_text() if lock.exists() else ""
        pid = int(text.split("pid ")[1].rstrip(")\n")) if "capo train (pid" in text else None
        time.sleep(0.5)
    assert pid is not None, runner_p.communicate(timeout=60)[0][-2000:]
    os.kill(runner_p.pid, signal.SIGTERM)
    out, _ = runner_p.communicate(timeout=120)
    try:
        assert runner_p.returncode == 128 + signal.SIGTERM, out[-2000:]
        with pytest.raises(ProcessLookupError):  # the runner reaped its job's process before it exited
            os.kill(pid, 0)
    finally:  # a failure must not leave a 100000-step training behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not (tmp_path / "records").exists() or not any((tmp_path / "records").rglob("*.json"))
    assert not (tmp_path / "runs" / "tiny" / "grpo-seed4").exists()  # the next job never started
