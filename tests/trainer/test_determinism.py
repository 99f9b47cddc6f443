"""Two runs of the same RLCR configuration give identical metrics and weights (recorded results reproduce).

The embedded default model in RLCR's format, so the verbalized-confidence path (parsed <confidence>, Brier term,
non-binary rewards) is exercised. One run in this process, one in a fresh `capo train` process (a fresh
interpreter: other hash seeds, other allocation addresses, its own verifier workers), same thread count.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from capo.trainer.config import load_config
from capo.trainer.loop import Trainer

TINY_RLCR = {"algo.name": "rlcr", "run.steps": 3, "rollout.prompts_per_step": 4, "rollout.group_size": 4,
             "data.n_eval": 4, "run.eval_samples": 2, "run.eval_every": 2, "run.threads": 1, "run.progress": False}


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _weights_digest(run: Path) -> str:
    ck = run / "checkpoints" / "step-000003" / "model.safetensors"
    from safetensors.torch import load_file

    state = load_file(ck)
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode() + state[k].numpy().tobytes())
    return h.hexdigest()


def test_two_rlcr_runs_give_identical_metrics_and_weights(tmp_path):
    threads = torch.get_num_threads()
    try:
        Trainer(load_config("default", {**TINY_RLCR, "run.out_dir": str(tmp_path / "a")})).train()
    finally:
        torch.set_num_threads(threads)
    args = [f"--{k}={v}" for k, v in {**TINY_RLCR, "run.out_dir": str(tmp_path / "b")}.items()]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "12345"}
    r = subprocess.run([sys.executable, "-m", "capo.cli", "train", "--config", "default", *args], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert [x["step"] for x in a] == [1, 2, 3]
    # the RLCR path really ran: parsed confidences, Brier term in the reward, no verifier timeouts
    assert all(x["train/format_ok_frac"] > 0.5 for x in a)
    assert any(x["train/reward_mean"] != x["train/accuracy"] for x in a)
    assert all(x["train/verify_timeouts"] == 0 for x in a)
    assert "eval/accuracy" in a[1] and "eval/accuracy" in a[2]
    for ra, rb in zip(a, b, strict=True):
        assert ra == rb, {k: (ra[k], rb.get(k)) for k in ra if ra[k] != rb.get(k)}  # bit-identical, no tolerance
    assert _weights_digest(tmp_path / "a") == _weights_digest(tmp_path / "b")
