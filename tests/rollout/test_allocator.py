"""capo keeps large CPU tensors on glibc's heap (``tune_cpu_allocator``): the same tokens and log-probs, less time
in the kernel (the speed is measured by ``benchmarks/allocator.py``, not here)."""

import json
import os
import subprocess
import sys

import pytest


CHILD = """
import json, sys, torch
from capo.rollout.models import load_model, tune_cpu_allocator
from capo.rollout.sampling import sample_rollout
applied = tune_cpu_allocator(threshold=int(sys.argv[2])) if sys.argv[2] != "0" else None
torch.set_num_threads(1)
model, tok = load_model(sys.argv[1])
torch.manual_seed(7)
ro = sample_rollout(model, tok, ["1+2+3=", "40-8+1="], k=4, max_new_tokens=12)
print(json.dumps({"applied": applied, "ids": ro.response_ids.tolist(), "logp": ro.gen_logp.tolist()}))
"""


def _sample(model: str, threshold: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", CHILD, model, str(threshold)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_the_tuned_allocator_applies_and_changes_no_sampled_token(tiny_model):
    plain, low, tuned = _sample(tiny_model, 0), _sample(tiny_model, 4096), _sample(tiny_model, 1 << 30)
    assert plain["applied"] is None and low["applied"] is True and tuned["applied"] is True
    assert plain["ids"] == tuned["ids"] == low["ids"] and plain["logp"] == tuned["logp"] == low["logp"]


def test_the_capo_command_tunes_the_allocator_unless_told_not_to(monkeypatch):
    import capo.cli as cli
    import capo.rollout.models as models

    calls = []
    monkeypatch.setattr(models, "tune_cpu_allocator", lambda: calls.append(1) or True)
    assert cli.main([]) == 1 and calls == [1]  # no command: help printed, allocator tuned first
    assert cli.main(["--system-malloc"]) == 1 and calls == [1]  # the flag keeps glibc's defaults
