"""Benchmark: the hf engine's two decoding loops on identical work, ``generate`` (transformers, a log-prob hook) vs
capo's static-cache loop (``rollout.decode``: on a GPU each step's forward is a CUDA graph; on the CPU it runs
eagerly, where no graphs exist).

Work: the reasoning testbed's shape by default: the shipped word-problems model (6 layers, width 256), B = 16
word-problem prompts x G = 8 samples x up to T = 128 new tokens (``--batch``, ``--new-tokens``), fp32 (``--bf16``
adds bf16 autocast runs). Both loops sample at the same seed, so on the CPU they draw the very same tokens (checked
and printed: same work); on a GPU the compiled kernels' summation order may flip a near-tie in a few rows (the
fraction of identical rows is printed). Each variant's first call is reported apart (the loop compiles its step
there on a GPU); then ``--reps`` interleaved calls, medians reported. ``--train-steps N`` also times N trainer steps
of the word_problems preset (``--preset``) with each loop, one run after the other (``time/rollout``, and ``time/step``
less evaluation and checkpoint, from its metrics; medians over the steps after the first). CPU runs use one thread
(``--threads``).

    python benchmarks/decode_loop.py                       # testbed shape, fp32
    python benchmarks/decode_loop.py --bf16 --train-steps 4
    python benchmarks/decode_loop.py --model default --batch 8 --new-tokens 40 --reps 5
    python benchmarks/decode_loop.py --backend inductor    # the CPU loop compiled by inductor (first call compiles)

Prints ``RATIO rollout generate/loop [precision]: X`` (> 1: the loop is faster) and the train-step ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import add_quick  # noqa: E402

LOOPS = {"generate": "generate", "loop": "graph"}  # variant -> rollout.decode


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_rollouts(a, model, tok, prompts: list[str], autocast: str) -> dict:
    """First call and median of ``a.reps`` interleaved calls of each loop; whether their tokens agree."""
    from capo.rollout import HFEngine

    device = next(model.parameters()).device
    engines = {v: HFEngine(model, tok, autocast=autocast, decode=d) for v, d in LOOPS.items()}
    if a.backend:  # the loop's step compiled with this torch.compile backend (fullgraph), e.g. inductor on the CPU
        from capo.rollout.decode import StaticDecoder

        engines["loop"]._decoder = StaticDecoder(model, backend=a.backend)
    times: dict[str, list[float]] = {v: [] for v in LOOPS}
    first, outs = {}, {}
    for rep in range(a.reps + 1):
        for v, engine in engines.items():
            _sync(device)
            t0 = time.perf_counter()
            outs[v] = engine.sample(prompts, k=a.group, max_new_tokens=a.new_tokens, seed=100 + rep)
            _sync(device)
            dt = time.perf_counter() - t0
            if rep:
                times[v].append(dt)
            else:
                first[v] = dt
    g, lp = outs["generate"].response_ids, outs["loop"].response_ids
    t = min(g.shape[1], lp.shape[1])  # rows identical over the shorter width (a longer one has padding there)
    same = float((g[:, :t] == lp[:, :t]).all(1).float().mean())
    return {"first_s": first, "median_s": {v: statistics.median(x) for v, x in times.items()},
            "tokens": {v: int(o.response_mask.sum()) for v, o in outs.items()}, "same_rows": same}


def _train_step(row: dict) -> float:
    """A step's seconds without its evaluation and checkpoint (the last step evaluates)."""
    return row["time/step"] - row.get("time/eval", 0.0) - row.get("time/save", 0.0)


def time_training(a, precision: str) -> dict:
    """``a.train_steps`` steps of the ``a.preset`` preset with each loop: median time/rollout and time/step after the
    first step, and how many graphs torch compiled (the loop's step: one per rollout shape)."""
    from torch._dynamo.utils import counters

    from capo.rundir import read_jsonl
    from capo.trainer.config import load_config
    from capo.trainer.loop import Trainer

    out = {}
    for v, decode in LOOPS.items():
        torch._dynamo.reset()  # as in a fresh process: no compiled step from an earlier phase, the recompile limit anew
        before = counters["stats"]["unique_graphs"]
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(a.preset, {"run.steps": a.train_steps, "run.out_dir": tmp, "run.progress": False,
                                                "run.eval_every": 0, "run.save_every": 0, "run.eval_at_start": False,
                                                "rollout.decode": decode,
                                                "run.threads": a.threads, "data.n_eval": 2, "run.eval_samples": 2,
                                                "model.autocast_bf16": precision == "bf16"})
            Trainer(cfg).train()
            rows = read_jsonl(Path(tmp) / "metrics.jsonl")
        rows = [r for r in rows if "time/step" in r]  # training steps only (not a step-0 evaluation's row)
        later = rows[1:] or rows
        out[v] = {"time/rollout": statistics.median(r["time/rollout"] for r in later),
                  "time/step": statistics.median(_train_step(r) for r in later), "first_step_s": _train_step(rows[0]),
                  "compiles": counters["stats"]["unique_graphs"] - before}  # graphs torch.compile built (loop only)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="word_problems", help="a shipped model name or a model folder")
    ap.add_argument("--batch", type=int, default=16, help="prompts per rollout (B)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--new-tokens", type=int, default=128, help="max new tokens per response (T)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per loop after the first")
    ap.add_argument("--bf16", action="store_true", help="also time both loops under bf16 autocast")
    ap.add_argument("--train-steps", type=int, default=0, help="also time this many trainer steps per loop")
    ap.add_argument("--preset", default="word_problems", help="the training preset --train-steps runs")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--backend", default=None, help="compile the loop's step with this torch.compile backend "
                    "(fullgraph; e.g. inductor on the CPU, where the loop otherwise runs eagerly); rollouts only")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (1: OpenMP's spin-waiting makes 2 "
                    "threads many times slower on a shared machine, docs/performance.md)")
    add_quick(ap, model="default", preset="default", batch=4, new_tokens=24, reps=1, train_steps=2)
    a = ap.parse_args(argv)
    from capo.rollout import load_model
    from capo.rollout.engine import resolve_device
    from capo.tasks.generated import GENERATED_TASKS, generated_task

    device = resolve_device(a.device)
    torch.set_num_threads(a.threads)
    model, tok = load_model(a.model)
    model = model.to(device)
    task = generated_task(a.model if a.model in GENERATED_TASKS else "word_problems")
    prompts = [task.prompt(p) for p in task.problems("eval", a.batch, seed=0)]
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"device: {name}; torch {torch.__version__}; model {a.model}; B={a.batch} G={a.group} T<={a.new_tokens}")
    result = {"device": name, "rollouts": {}, "train": {}}
    for precision in ["fp32"] + (["bf16"] if a.bf16 else []):
        r = time_rollouts(a, model, tok, prompts, "on" if precision == "bf16" else "off")
        result["rollouts"][precision] = r
        print(f"  {precision}: first call generate {r['first_s']['generate']:.3f}s loop {r['first_s']['loop']:.3f}s;"
              f" median generate {r['median_s']['generate']:.3f}s loop {r['median_s']['loop']:.3f}s; tokens "
              f"{r['tokens']}; identical rows {r['same_rows']:.3f}")
        print(f"RATIO rollout generate/loop [{precision}]: {r['median_s']['generate'] / r['median_s']['loop']:.2f}")
        if a.train_steps:
            t = time_training(a, precision)
            result["train"][precision] = t
            print(f"  {precision} training: {t}")
            for k in ("time/rollout", "time/step"):
                if k in t["generate"]:
                    print(f"RATIO train {k} generate/loop [{precision}]: {t['generate'][k] / t['loop'][k]:.2f}")
    print("JSON " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
