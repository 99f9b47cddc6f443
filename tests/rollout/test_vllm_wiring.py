"""`capo eval --engine vllm` and `capo train --rollout.engine vllm` end to end on a tiny head_dim-32 model: an eval
killed mid-run resumes with no row lost or duplicated, a 2-step training run from the CLI, and exact resume of
training with the vLLM engine (same sampling stream after a resume).

Runs in .venv-vllm (`make test-vllm`); skipped where vLLM is not installed. Engine starts cost 30-80 s each on a
2-core machine, so the module shares one in-process engine and starts only three more (the CLI runs).
The engine is colocated (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; measured: no child process), so the engine's process
is the eval process itself: killing it is killing the engine's worker."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm` (it builds .venv-vllm)")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
REWARDS = str(Path(__file__).parents[1] / "trainer")  # reward_fns.length_reward: a reward a random model varies
sys.path.insert(0, REWARDS)
from tiny_vllm_model import build_tiny_qwen2  # noqa: E402

pytestmark = pytest.mark.timeout(1200)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": os.pathsep.join([REWARDS, *filter(None, [os.environ.get("PYTHONPATH")])])}
N_PROMPTS, K = 40, 2
TRAIN = {"rollout.prompts_per_step": 2, "rollout.group_size": 4, "rollout.max_new_tokens": 12, "data.n_train": 32,
         "data.n_eval": 4, "run.eval_samples": 2, "run.progress": False, "optim.lr": 1e-2, "algo.name": "grpo",
         "algo.reward": "reward_fns:length_reward",
         "run.seed": 3, "run.save_every": 2, "rollout.engine": "vllm"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("vllm_wiring") / "tiny")


@pytest.fixture(scope="module")
def engine(model_dir):
    from capo.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(str(model_dir), dtype="float32", seed=0)


def _eval_argv(model_dir, out):
    return ["eval", "--model", str(model_dir), "--engine", "vllm", "--dataset", "default", "--limit", str(N_PROMPTS),
            "-k", str(K), "--max-new-tokens", "48", "--batch-size", "2", "--verify-workers", "1", "--n-boot", "0",
            "--no-progress", "--out", str(out)]


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def test_eval_killed_mid_run_resumes_without_loss_or_duplicates(engine, model_dir, tmp_path):
    """Also: `capo eval --engine vllm` records the per-token DeepConf confidence by default (token_topk_conf, equal
    to the shared engine's with record_stats) and no entropy field, and metrics.json scores the DeepConf estimators
    and lists the entropy ones as not available."""
    from capo.evaluation.run import EvalSettings, run_eval
    from capo.rundir import read_jsonl_rows

    ref = tmp_path / "ref"  # uninterrupted, in this process, with the shared engine
    s = EvalSettings(model=str(model_dir), engine="vllm", dataset="default", limit=N_PROMPTS, k=K, max_new_tokens=48,
                     batch_size=2, verify_workers=1, n_boot=0)
    engine.record_stats = True  # what `capo eval` asks of the engine it builds (token stats on by default)
    try:
        run_eval(s, ref, progress=False, engine=engine)
    finally:
        engine.record_stats = False
    expected = read_jsonl_rows(ref / "generations.jsonl")
    assert len(expected) == N_PROMPTS * K

    run = tmp_path / "killed"
    p = subprocess.Popen([sys.executable, "-m", "capo.cli", *_eval_argv(model_dir, run)], env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    gen, t0 = run / "generations.jsonl", time.time()
    while p.poll() is None and _lines(gen) < 6 and time.time() - t0 < 600:  # a few batches written, most not
        time.sleep(0.005)
    assert p.poll() is None, "the eval finished before it could be killed: the test proved nothing"
    p.send_signal(signal.SIGKILL)
    p.wait()
    written = _lines(gen)
    assert 0 < written < N_PROMPTS * K and not (run / "metrics.json").exists()

    p = subprocess.run([sys.executable, "-m", "capo.cli", *_eval_argv(model_dir, run)], env=ENV,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    got = read_jsonl_rows(gen)
    key = lambda r: (r["prompt_id"], r["sample_idx"])  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, expected))  # nothing lost, nothing duplicated
    by_key = {key(r): r for r in expected}
    for r in got:  # the same samples as the uninterrupted run (per-batch seeds)
        e = by_key[key(r)]
        assert (r["text"], r["n_tokens"], r["verdict"], r["finish_reason"]) == \
            (e["text"], e["n_tokens"], e["verdict"], e["finish_reason"])
        assert r["sum_logprob"] == pytest.approx(e["sum_logprob"], abs=1e-4)
        assert len(r["token_topk_conf"]) == r["n_tokens"] and "token_entropy" not in r and "token_kl_uniform" not in r
        assert r["token_topk_conf"] == pytest.approx(e["token_topk_conf"], abs=1e-4)
    assert json.loads((run / "config.json").read_text())["engine"] == "vllm"
    curves = json.loads((run / "metrics.json").read_text())["curves"]
    assert {"lpm", "tail", "bottom_group", "lowest_group"} <= set(curves["estimators"])
    assert not {"neg_entropy", "self_certainty"} & set(curves["estimators"])
    assert {"neg_entropy", "self_certainty"} <= set(curves["estimators_unavailable"])
    assert "Not available for" in (run / "report.html").read_text()


def _rows(run):
    return [json.loads(ln) for ln in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def _strip(r):
    return {k: v for k, v in r.items() if not k.startswith(("time/", "eval/"))}


def test_train_cli_two_steps_then_exact_resume(engine, model_dir, tmp_path):
    """`capo train --rollout.engine vllm` for 2 steps (its own engine, from the CLI), resumed to 4 steps in this
    process: the metrics and final weights equal an uninterrupted 4-step run's (same sampling stream)."""
    from safetensors.torch import load_file

    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer

    part = tmp_path / "part"
    argv = [x for k, v in {**TRAIN, "model.path": str(model_dir), "run.out_dir": str(part), "run.steps": 2}.items()
            for x in (f"--{k}", str(v))]
    p = subprocess.run([sys.executable, "-m", "capo.cli", "train", *argv], env=ENV, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    two = _rows(part)
    assert [r["step"] for r in two] == [1, 2]
    print("vLLM engine vs trainer, |log-prob diff| mean / max per step:",
          [(f"{r['rollout/logprob_diff_mean']:.2e}", f"{r['rollout/logprob_diff_max']:.2e}") for r in two])
    for r in two:  # the engine's log-probs are the trainer's up to fp32 numerics
        assert 0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-3
        assert r["policy/updates"] == 1 and r["policy/grad_norm"] > 0

    full = tmp_path / "full"
    engine.seed(TRAIN["run.seed"])  # what a fresh engine of a fresh run starts from (seed + rank 0)
    Trainer(load_config(None, {**TRAIN, "model.path": str(model_dir), "run.out_dir": str(full), "run.steps": 4}),
            engine=engine).train()
    engine.seed(12345)  # the resumed run must take its stream from the checkpoint, not from the engine's state
    Trainer(load_config(None, {**TRAIN, "model.path": str(model_dir), "run.out_dir": str(part), "run.steps": 4}),
            engine=engine).train()
    assert [r["step"] for r in _rows(part)] == [1, 2, 3, 4]
    assert [_strip(r) for r in _rows(full)] == [_strip(r) for r in _rows(part)]
    a = load_file(full / "checkpoints/step-000004/model.safetensors")
    b = load_file(part / "checkpoints/step-000004/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], load_file(model_dir / "model.safetensors")["lm_head.weight"])
