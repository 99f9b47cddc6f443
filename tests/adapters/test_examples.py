"""The examples users open first: the TRL example's offline smoke run trains 3 optimizer steps on CPU with capo's
embedded model and task (no Hub), and a preset TRL cannot run stops with the reason before anything is loaded; the
verl script's smoke twin (in .venv-verl) trains 3 steps through verl's own advantage and policy-loss code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl" / "capo_grpo.py"


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(EXAMPLE), *args, "--output-dir", str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_trl_example_smoke_trains_three_steps_offline(tmp_path):
    pytest.importorskip("trl")
    r = _run("--smoke", "--algo", "capo", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "smoke: 3 optimizer steps with capo" in r.stdout
    assert "train/masked_frac=" in r.stdout and "calib/auc_mean=" in r.stdout  # CAPO's mask and metrics ran
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_trl_example_refuses_a_preset_trl_cannot_run(tmp_path):
    pytest.importorskip("trl")
    r = _run("--smoke", "--algo", "c2gspg", tmp_path=tmp_path)
    assert r.returncode != 0
    assert "preset 'c2gspg' cannot run here" in r.stderr
    assert not (tmp_path / "out").exists()


def test_verl_smoke_twin_trains_three_steps_through_verls_code(tmp_path):
    pytest.importorskip("verl", reason="verl is not installed here; run with .venv-verl (sh scripts/engine-env.sh verl)")
    import json

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "verl" / "smoke.py")], env=env, capture_output=True,
                       text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["adv_abs_mean"] > 0 for s in steps)  # CAPO gave non-zero advantages inside verl
    assert steps[-1]["moved_from_initial"] > 0 and steps[0]["ppo_kl"] == 0.0  # on-policy first step, then moved
    assert "smoke: 3 optimizer steps with capo inside verl's compute_advantage and policy loss" in r.stdout
