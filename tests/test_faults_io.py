"""I/O faults: a simulated full disk and an unusable output folder end cleanly (exit 2, no traceback, nothing
complete-looking); a SIGKILLed `capo eval` resumes with no row lost or duplicated."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from capo.cli import main

ENOSPC = OSError(errno.ENOSPC, "No space left on device")
EVAL = ["eval", "--model", "default", "--dataset", "default", "--limit", "6", "-k", "2", "--max-new-tokens", "40",
        "--no-chat-template", "--system-prompt", "", "--answer-format", "rlcr", "--n-boot", "20", "--no-progress"]


def test_full_disk_during_eval(tmp_path, capsys, monkeypatch):
    import capo.evaluation.run as run

    def no_space(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(run, "atomic_write_text", no_space)
    rc = main(EVAL + ["--out", str(tmp_path / "ev")])
    err = capsys.readouterr().err
    assert rc == 2 and "No space left on device" in err and "Traceback" not in err
    assert not (tmp_path / "ev" / "metrics.json").exists()


def test_full_disk_during_checkpoint(tmp_path, capsys, monkeypatch):
    import capo.trainer.checkpoint as ck

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "trainer_state.pt")

    monkeypatch.setattr(ck.torch, "save", no_space)
    rc = main(["train", "--run.out_dir", str(tmp_path / "run"), "--run.steps", "1", "--rollout.prompts_per_step",
               "2", "--rollout.group_size", "2", "--rollout.max_new_tokens", "8", "--data.n_eval", "2",
               "--run.eval_samples", "1", "--run.progress", "false"])
    err = capsys.readouterr().err
    assert rc == 2 and "No space left on device" in err and "Traceback" not in err
    assert not list((tmp_path / "run" / "checkpoints").glob("step-??????"))  # only an ignored .tmp, if anything


def test_output_folder_that_is_a_file(tmp_path, capsys):
    (tmp_path / "taken").write_text("not a folder")
    rc = main(EVAL + ["--out", str(tmp_path / "taken" / "ev")])
    err = capsys.readouterr().err
    assert rc == 2 and "taken" in err and "Traceback" not in err


@pytest.mark.slow
def test_sigkilled_eval_resumes_without_loss_or_duplicates(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = ["eval", "--model", "default", "--dataset", "default", "--limit", "48", "-k", "4", "--batch-size", "16",
            "--max-new-tokens", "40", "--no-chat-template", "--system-prompt", "", "--answer-format", "rlcr",
            "--n-boot", "20", "--no-progress"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    subprocess.run([sys.executable, "-m", "capo.cli", *args, "--out", str(ref)], check=True, env=env, timeout=600,
                   capture_output=True)
    rng, kills = random.Random(1), 0
    for _ in range(6):
        p = subprocess.Popen([sys.executable, "-m", "capo.cli", *args, "--out", str(run)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        gen = run / "generations.jsonl"
        n0 = len(gen.read_text().splitlines()) if gen.exists() else 0
        t0 = time.time()
        while kills < 2 and p.poll() is None and time.time() - t0 < 300:
            if gen.exists() and len(gen.read_text().splitlines()) > n0:
                time.sleep(rng.uniform(0.0, 1.0))
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
                break
            time.sleep(0.05)
        if p.poll() is None or p.returncode == 0:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err.decode()[-2000:]
            break
    assert kills >= 1

    def rows(d):
        return [json.loads(ln) for ln in (d / "generations.jsonl").read_text().splitlines()]

    a, b = rows(ref), rows(run)
    keys = [(r["prompt_id"], r["sample_idx"]) for r in b]
    assert len(keys) == len(set(keys)) == 48 * 4  # none lost, none duplicated
    strip = lambda r: {k: r[k] for k in ("prompt_id", "sample_idx", "text", "verdict")}  # noqa: E731
    assert sorted(map(json.dumps, map(strip, a))) == sorted(map(json.dumps, map(strip, b)))
    assert json.loads((run / "metrics.json").read_text())["metrics"]["accuracy"] == \
        json.loads((ref / "metrics.json").read_text())["metrics"]["accuracy"]
