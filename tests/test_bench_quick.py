"""`make bench` runs every benchmark's quick mode: each script in benchmarks/ (bench_env.py is their shared helper)
has a ``--quick`` flag that its --help explains, and the Makefile's bench recipe runs each with it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "bench_env.py")


def _bench_recipe() -> str:
    text = (ROOT / "Makefile").read_text()
    m = re.search(r"^bench:.*?\n((?:\t.*\n)+)", text, flags=re.M)
    assert m, "the Makefile has no bench recipe"
    return m.group(1)


def test_make_bench_runs_every_benchmark_in_its_quick_mode():
    lines = _bench_recipe().splitlines()
    assert len(SCRIPTS) >= 6
    for name in SCRIPTS:
        assert any(f"benchmarks/{name} --quick" in ln for ln in lines), f"make bench does not run {name} --quick"


@pytest.mark.parametrize("name", SCRIPTS)
def test_quick_is_explained_by_help(name):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), "--help"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "--quick" in p.stdout and "a quick check of the script (--" in " ".join(p.stdout.split())


@pytest.mark.slow
def test_the_trainer_step_benchmark_runs_capos_real_loop():
    """benchmarks/trl_vs_capo.py subclasses the trainer (its timing hooks): a change to the trainer's methods must not
    break it silently (it once did: `save` gained an argument). One capo run of the quick shape, no TRL."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trl_vs_capo.py"), "--quick", "--variants", "capo"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert re.search(r"capo +median step wall [\d.]+s CPU [\d.]+s", p.stdout), p.stdout[-2000:]
