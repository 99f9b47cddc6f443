"""A user's own TRL script, written as people write them (imports and training at top level, no `__main__` guard),
whose process holds ~4 GB of address space as CUDA's torch effectively does, runs to the end with capo's verifier.

Before 2026-11-26 the verifier's forkserver/spawn workers re-imported such a script: its whole top level ran again
inside every worker, and the worker's absolute 4 GB address-space bound failed math-verify's import with
MemoryError (seen on an H200 with a bf16 run). Workers are now fresh interpreters running capo.verify._worker: the script runs
once and the bound is relative to the worker's own baseline.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")

SCRIPT = r'''
import ctypes, json, mmap, os, sys

with open(os.environ["COUNTER"], "a") as f:  # how many times this top level runs
    f.write("ran\n")
# ~4 GB of reserved, inaccessible address space: what importing CUDA's torch does to a process on a GPU machine
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_int, ctypes.c_long]
PROT_NONE, MAP_NORESERVE = 0, 0x4000
RESERVED = libc.mmap(None, 4 << 30, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
assert RESERVED not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()

import _tiny
from transformers import AutoTokenizer
from capo.adapters.trl import CapoGRPOTrainer, CorrectnessReward
from capo.verify import Verifier

verifier = Verifier(workers=1)
verdicts = verifier.verify_batch(["1/2", "3", r"\frac{6}{2}", "0.25"], ["0.5", "4", "3", r"\frac14"])
reward = CorrectnessReward("answer")  # its default verifier, as a user's script gets it
trainer = CapoGRPOTrainer(model=os.environ["MODEL"], reward_funcs=reward, args=_tiny.grpo_args(os.environ["OUT"]),
                          train_dataset=_tiny.dataset(), processing_class=AutoTokenizer.from_pretrained(os.environ["MODEL"]))
trainer.train()
masked = [h["train/masked_frac"] for h in trainer.state.log_history if "train/masked_frac" in h]
print("RESULT " + json.dumps({"verdicts": [str(v) for v in verdicts], "steps": trainer.state.global_step,
                              "n_verdicts": len(reward.last.correct), "masked": masked,
                              "killed": verifier.n_killed}))
'''


def test_unguarded_user_script_with_4gb_reserved_runs_once_and_to_the_end(tiny_model_dir, tmp_path):
    script, counter = tmp_path / "train.py", tmp_path / "counter"
    script.write_text(SCRIPT)
    here = pathlib.Path(__file__).parent
    env = {**os.environ, "COUNTER": str(counter), "MODEL": tiny_model_dir, "OUT": str(tmp_path / "out"),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "MemoryError" not in out
    assert counter.read_text() == "ran\n"  # the top level ran exactly once: no worker re-imported the script
    res = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert res["verdicts"] == ["correct", "incorrect", "correct", "correct"]
    assert res["steps"] == 2 and res["n_verdicts"] == 8 and res["killed"] == 0
    assert len(res["masked"]) == 2  # CAPO's noise mask ran on both steps
