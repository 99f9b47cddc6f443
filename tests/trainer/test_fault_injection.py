"""Crash safety: SIGKILL a training run at random points, resume, and get exactly the uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

STEPS = 6


def _cmd(model, out):
    return [sys.executable, "-m", "capo.cli", "train", "--model.path", model, "--run.out_dir", str(out),
            "--run.steps", str(STEPS), "--run.save_every", "1", "--run.keep_checkpoints", "2", "--run.seed", "1",
            "--rollout.prompts_per_step", "2", "--rollout.group_size", "4", "--rollout.max_new_tokens", "10",
            "--data.n_train", "32", "--data.n_eval", "2", "--run.eval_samples", "2", "--run.progress", "false",
            "--algo.name", "capo", "--optim.lr", "1e-3", "--run.threads", "1"]


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _rows(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _steps(run, tmp):
    ck = run / "checkpoints"
    names = [d.name for d in ck.iterdir()] if ck.exists() else []
    return [int(n[5:11]) for n in names if n.startswith("step-") and n.endswith(".tmp") == tmp]


def _last_step(run):
    """The newest complete checkpoint's step (0 when none): where the next attempt resumes."""
    return max(_steps(run, tmp=False), default=0)


def _writing_step(run):
    """The newest step whose checkpoint is being written or complete."""
    return max(_steps(run, tmp=False) + _steps(run, tmp=True), default=0)


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_equals_uninterrupted(tiny_model, tmp_path):
    ref = tmp_path / "ref"
    subprocess.run(_cmd(tiny_model, ref), check=True, env=ENV, timeout=600, capture_output=True)
    run = tmp_path / "killed"
    rng = random.Random(0)
    kills = 0
    for attempt in range(8):
        p = subprocess.Popen(_cmd(tiny_model, run), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kills < 3:
            # pick a random step still ahead of this attempt's resume point, wait until the run starts writing
            # that step's checkpoint (or a later one), then kill at a random moment inside the next step or two.
            # Choosing the step (not a wall-clock delay) keeps the kill inside the run however fast the machine is.
            done = _last_step(run)
            target = min(STEPS - 1, done + rng.randint(1, 2))
            t0 = time.time()
            while p.poll() is None and time.time() - t0 < 300 and _writing_step(run) < target:
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.05))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
                continue
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
        break
    assert kills >= 1, "the run finished before it could be killed; the test proved nothing"
    assert _strip(_rows(run)) == _strip(_rows(ref))
    a = load_file(ref / f"checkpoints/step-{STEPS:06d}/model.safetensors")
    b = load_file(run / f"checkpoints/step-{STEPS:06d}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((run / "checkpoints").glob("*.tmp"))


def test_partial_checkpoint_is_ignored_and_corrupt_one_is_reported(tiny_model, tmp_path):
    from capo.errors import CapoError
    from capo.trainer.checkpoint import latest_checkpoint

    ck = tmp_path / "checkpoints"
    (ck / "step-000003.tmp").mkdir(parents=True)  # a crash mid-write: never looks complete
    assert latest_checkpoint(tmp_path) is None
    (ck / "step-000002").mkdir()
    (ck / "step-000002" / "config.json").write_text("{}")
    with pytest.raises(CapoError, match="step-000002 is incomplete or corrupt .missing trainer_state.pt"):
        latest_checkpoint(tmp_path)
