"""verl's own trainer, ``python -m verl.trainer.main_ppo`` (the v1 sync trainer, Ray, FSDP2 workers, TransferQueue,
agent loop, reward loop, naive weight sync), runs 2 steps of capo's CAPO on a CPU.

Runs in the verl environment (``make test-verl``); skipped where verl is not importable. verl 0.9.1 has no CPU
platform and no CPU rollout: ``verl_cpu_shim`` (test-only, loaded by verl through a ``verl.plugins`` entry point)
adds both without touching verl's files; docs/engines.md lists what each shim works around.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

pytest.importorskip("verl", reason="verl is not installed here; run with .venv-verl (sh scripts/engine-env.sh verl)")

import verl_cpu_shim  # noqa: E402  (tests/adapters is on sys.path: conftest.py)

STEP_LINE = re.compile(r"step:(\d+) - (.*)$")
NUMPY_REPR = re.compile(r"^np\.\w+\((.*)\)$")  # verl prints some values as numpy reprs: np.int32(2)


def _number(text: str) -> float | None:
    try:
        return float(NUMPY_REPR.sub(r"\1", text.strip()))
    except ValueError:
        return None


def step_metrics(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines ``step:N - key:value - ...`` -> {N: {key: value}}."""
    steps = {}
    for line in log.splitlines():
        m = STEP_LINE.search(line)
        if m:
            pairs = (kv.rsplit(":", 1) for kv in m.group(2).split(" - ") if ":" in kv)
            steps[int(m.group(1))] = {k.strip(): x for k, v in pairs if (x := _number(v)) is not None}
    return steps


def test_step_metrics_parses_verls_console_lines():
    log = ("(TaskRunnerV1 pid=1) step:2 - calib/auroc:0.5 - critic/advantages/min:-0.25 - num_turns/max:np.int32(2)"
           " - calib/auc_mean:nan - note:text\nother line")
    got = step_metrics(log)
    assert list(got) == [2] and got[2]["critic/advantages/min"] == -0.25 and got[2]["calib/auroc"] == 0.5
    assert got[2]["num_turns/max"] == 2 and "note" not in got[2]


QUIET_S = 900  # a run that writes nothing for this long is hung (beside two training jobs, Ray's start and its
#                first step were silent for over 300 s)
LIMIT_S = 3600  # and none may run longer, however loaded the machine


def run_watched(argv, env, cwd) -> tuple[int, str]:
    """(exit status, output) of ``argv``, killed when it writes nothing for :data:`QUIET_S` seconds (a hang) or runs
    past :data:`LIMIT_S`. A wall-clock limit near the run's own time (it takes ~90 s alone) failed it on a machine
    busy with two training jobs (over 600 s there); silence, not slowness, is what marks a hang, and Ray's workers
    are silent for minutes on such a machine, hence a long :data:`QUIET_S`."""
    path = cwd / "main_ppo.log"
    with open(path, "w") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        start = last = time.monotonic()
        size = 0
        while proc.poll() is None:
            time.sleep(1.0)
            now, grown = time.monotonic(), path.stat().st_size
            if grown != size:
                size, last = grown, now
            if now - last > QUIET_S or now - start > LIMIT_S:
                proc.kill()
                proc.wait()
                why = f"no output for {QUIET_S} s" if now - last > QUIET_S else f"over {LIMIT_S} s"
                pytest.fail(f"main_ppo killed ({why}):\n" + path.read_text(errors="replace")[-4000:])
    return proc.returncode, path.read_text(errors="replace")


def test_main_ppo_trains_two_capo_steps_on_cpu(tmp_path):
    argv, env = verl_cpu_shim.main_ppo_run(tmp_path, steps=2)
    code, log = run_watched(argv, env, tmp_path)
    assert code == 0, log[-4000:]
    steps = step_metrics(log)
    assert sorted(steps) == [1, 2], log[-4000:]
    for m in steps.values():
        # capo's metrics inside verl's step metrics: verl's advantage step ran capo's CAPO (with its noise mask)
        assert {"calib/accuracy", "calib/auroc", "train/masked_frac"} <= m.keys()
        assert m["response_length/mean"] > 0 and 0 <= m["critic/score/mean"] <= 1
    assert any(m["critic/advantages/max"] > 0 > m["critic/advantages/min"] for m in steps.values())
    assert steps[1]["actor/grad_norm"] > 0
    # step 1's update moved the actor away from the reference, and step 2 sampled with the moved weights (the hf
    # rollout got them through verl's weight sync): rollout-vs-actor KL far below actor-vs-reference KL
    assert steps[2]["actor/kl_loss"] > 0
    assert steps[2]["rollout_corr/k3_kl"] < 0.2 * steps[2]["actor/kl_loss"]
