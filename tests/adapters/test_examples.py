"""The TRL example users open first: its offline smoke run trains 3 optimizer steps on CPU with capo's embedded
model and task (no Hub), and a preset TRL cannot run stops with the reason before anything is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl" / "capo_grpo.py"


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(EXAMPLE), *args, "--output-dir", str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_trl_example_smoke_trains_three_steps_offline(tmp_path):
    r = _run("--smoke", "--algo", "capo", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "smoke: 3 optimizer steps with capo" in r.stdout
    assert "train/masked_frac=" in r.stdout and "calib/auc_mean=" in r.stdout  # CAPO's mask and metrics ran
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_trl_example_refuses_a_preset_trl_cannot_run(tmp_path):
    r = _run("--smoke", "--algo", "c2gspg", tmp_path=tmp_path)
    assert r.returncode != 0
    assert "preset 'c2gspg' cannot run here" in r.stderr
    assert not (tmp_path / "out").exists()
