"""One GPU check: what a lent H100/H200 must show, in at most 9 minutes, written to one summary file.

Run it as ``sh scripts/gpu-check.sh [--out DIR]`` on the GPU machine, from the checkout's root. In order:

1. installs what the GPU image lacks (TRL, datasets and math-verify with their small dependencies, pytest if absent)
   from wheels carried beside the checkout (``--wheels``, default ``wheels/``; :data:`DOWNLOAD` fetches them on a
   machine with PyPI), into ``--work``/site, with ``pip install --no-index --no-deps --target``;
2. runs every test that has a CUDA path (:data:`CUDA_TESTS`; the test device is the GPU: tests/_device.py);
3. runs ``benchmarks/decode_loop.py``: ``generate`` against capo's decoding loop with CUDA graphs (``rollout.decode``)
   at the testbed's shape, fp32 and bf16, rollouts and trainer steps;
4. runs ``benchmarks/update_attention.py``: the update's forward + backward in bf16 with and without cuDNN's attention
   and in fp32, each call at a new shape;
5. runs ``benchmarks/trl_vs_capo.py`` at the reasoning testbed's shape with TRL on the GPU too;
6. runs ``capo demo --task word_problems``;
7. writes ``OUT/summary.json``: the machine, the wheels, and per step its command, exit status, seconds, test counts
   and last output lines (full logs in ``OUT/logs``); the demo's own summary.json and the benchmarks' ratios.

Each step has a time cap and the whole a deadline (``--budget-s``, default 540 s): a step cut short is recorded as
timed out, and the check goes on with the next. Without a CUDA GPU it runs nothing and the summary says so (exit 2).

``--dry-run`` does the CPU parts only, in seconds (``make test`` runs it: tests/test_gpu_check.py): the wheel step
for real (nothing to install where everything is present), the tests' collection instead of their run, each command's
flags checked by ``--help``, and the summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# module the GPU image may lack -> the wheel's file-name prefix (distribution name, PEP 427 spelling)
NEEDED = {"trl": "trl", "datasets": "datasets", "dill": "dill", "multiprocess": "multiprocess",
          "math_verify": "math_verify", "latex2sympy2_extended": "latex2sympy2_extended",
          "antlr4": "antlr4_python3_runtime", "pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig",
          "pygments": "pygments"}
# run on a machine with PyPI, in the checkout's root (the GPU machine has Python 3.12 and no network): 2.2 MB for
# capo's needs, 4 MB more for pytest and its dependencies (installed only where the image lacks them)
DOWNLOAD = ("pip download --no-deps --only-binary=:all: --python-version 3.12 --dest wheels trl==1.16.0 "
            "datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 latex2sympy2_extended==1.11.0 "
            "antlr4-python3-runtime==4.13.2 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0")
CUDA_TESTS = ["tests/rollout/test_decode.py", "tests/trainer/test_cuda.py", "tests/evaluation/test_eval_device.py", "tests/adapters/test_trl.py",
              "tests/adapters/test_trl_methods.py", "tests/adapters/test_trl_paths.py", "tests/adapters/test_trl_cuda.py",
              "tests/adapters/test_user_script.py"]  # a user's unguarded TRL script (on the GPU there: _tiny.grpo_args)
NOT_ON_GPU = "not two_processes"  # the multi-process TRL tests run on the CPU by construction (CI runs them)
BENCH = ["benchmarks/trl_vs_capo.py", "--size", "testbed", "--prompts", "word_problems", "--batch", "16",
         "--new-tokens", "128", "--variants", "capo", "trl", "--reps", "1", "--steps", "2", "--warmup", "1"]
# the decoding loops at the testbed's shape (rollout.decode: generate vs capo's loop with CUDA graphs), fp32 and bf16,
# and 4 trainer steps of the word_problems preset with each
DECODE = ["benchmarks/decode_loop.py", "--bf16", "--train-steps", "4", "--reps", "2"]
# the update's forward + backward in bf16 with and without cuDNN's attention, and fp32, at a new shape each call: the
# candidate cause of the bf16 update's 9x (docs/performance.md)
UPDATE = ["benchmarks/update_attention.py"]
CAPS = {"cuda_tests": 210, "decode_loop": 170, "update_attention": 60, "trl_vs_capo": 120, "demo": 80}  # seconds per
# step; the deadline caps
# them all


@dataclass
class Step:
    name: str
    cmd: list[str]
    limit_s: float = 0.0
    rc: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    counts: dict = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


def machine() -> dict:
    """Python, torch and the GPU (None when torch sees none)."""
    info = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        info.update(torch=torch.__version__, cuda_build=torch.version.cuda, cuda_available=torch.cuda.is_available())
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info.update(torch=None, cuda_available=False, gpu=None)
    return info


def install_wheels(wheels: Path, site: Path, extra: list[str]) -> dict:
    """Install, from ``wheels``, the wheel of every needed module this interpreter cannot import (``extra``: more
    modules, for the dry run's test). Returns what was present, installed and still missing."""
    needed = {**NEEDED, **{m: m for m in extra}}
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    pick = [f for f in files if f.name.split("-")[0].lower() in {needed[m].lower() for m in missing}]
    out = {"wheels_dir": str(wheels), "present": [m for m in needed if m not in missing], "installed": [],
           "missing": [], "download_command": DOWNLOAD}
    if pick:
        site.mkdir(parents=True, exist_ok=True)
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                            "--target", str(site), *map(str, pick)], capture_output=True, text=True)
        out["pip_rc"], out["pip_tail"] = p.returncode, (p.stdout + p.stderr).splitlines()[-5:]
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    got = {f.name.split("-")[0].lower() for f in pick}
    out["installed"] = [m for m in missing if needed[m].lower() in got and importlib.util.find_spec(m) is not None]
    out["missing"] = [m for m in missing if m not in out["installed"]]
    return out


def plan(py: str, work: Path, dry: bool) -> list[Step]:
    """The steps, in order. Dry run: collect the tests, check each command's flags with ``--help``."""
    tests = [py, "-m", "pytest", "-p", "no:cacheprovider", *CUDA_TESTS, "-k", NOT_ON_GPU]
    tests += ["--collect-only", "-q"] if dry else ["-v", "-rfEs"]
    demo = [py, "-m", "capo.cli", "demo", "--task", "word_problems", "--out", str(work / "demo")]
    bench, decode, update = [py, *BENCH], [py, *DECODE], [py, *UPDATE]
    if dry:
        demo, bench, decode, update = demo + ["--help"], bench + ["--help"], decode + ["--help"], update + ["--help"]
    return [Step("cuda_tests", tests), Step("decode_loop", decode), Step("update_attention", update),
            Step("trl_vs_capo", bench), Step("demo", demo)]


def step_env(site: Path, work: Path) -> dict:
    paths = [str(ROOT / "src"), str(site), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "CAPO_BENCH_CACHE": str(work / "bench_cache")}


def run_step(step: Step, env: dict, logs: Path, limit_s: float) -> None:
    """Run one step with its log in ``logs``; a step past ``limit_s`` is killed and marked timed out."""
    step.limit_s = round(limit_s, 1)
    log = logs / f"{step.name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(step.cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            step.rc = p.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)  # the step's own process group: pytest / the benchmark and their children
            step.rc, step.timed_out = p.wait(), True
    step.seconds = round(time.perf_counter() - t0, 1)
    text = log.read_text(errors="replace")
    step.tail = text.splitlines()[-15:]
    if step.name == "cuda_tests":
        step.counts = test_counts(text)


def test_counts(text: str) -> dict:
    """Outcomes from pytest's verbose lines (counted even when the run was cut short), or the collected count."""
    counts: dict[str, int] = {}
    for outcome in re.findall(r"::\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", text):
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    m = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
    if m:
        counts["collected"] = int(m.group(1))
    return counts


def extras(work: Path, steps: list[Step]) -> dict:
    """The demo's summary.json and the benchmark's result lines, where they were written."""
    out = {}
    demo = work / "demo" / "summary.json"
    if demo.is_file():
        out["demo_summary"] = json.loads(demo.read_text())
    bench = next((s for s in steps if s.name == "trl_vs_capo"), None)
    if bench is not None:
        out["trl_vs_capo_lines"] = [ln for ln in bench.tail if ln.startswith(("RATIO", "device:", "  capo", "  trl"))]
    decode = next((s for s in steps if s.name == "decode_loop"), None)
    if decode is not None:
        out["decode_loop_lines"] = [ln for ln in decode.tail if ln.startswith(("RATIO", "device:", "  fp32", "  bf16"))]
    update = next((s for s in steps if s.name == "update_attention"), None)
    if update is not None:
        out["update_attention_lines"] = [ln for ln in update.tail if ln.startswith(("RATIO", "device:", "  "))]
    return out


def gpu_note(gpu: str | None, dry: bool) -> str:
    """One line for the summary: where the check ran, and what it cannot say."""
    if dry:
        return "dry run: nothing ran on a GPU" + ("" if gpu else " (no CUDA GPU visible here)")
    return f"ran on {gpu}" if gpu else "no CUDA GPU visible: nothing ran (--dry-run checks the CPU parts)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the CPU parts only, in seconds (make test)")
    ap.add_argument("--out", default="runs/gpu-check", help="summary.json and logs/ (small: bring it back)")
    ap.add_argument("--work", default=None, help="the demo's runs, benchmark assets, the installed wheels "
                    "(default: OUT/work)")
    ap.add_argument("--wheels", default=str(ROOT / "wheels"), help="folder of the carried wheels")
    ap.add_argument("--budget-s", type=float, default=540.0, help="deadline for all steps together")
    ap.add_argument("--also-need", action="append", default=[], metavar="MODULE",
                    help="another module to install from --wheels if absent (for the dry run's test)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(a.out).resolve()
    work = Path(a.work).resolve() if a.work else out / "work"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    summary = {"dry_run": a.dry_run, "budget_s": a.budget_s, "machine": machine()}
    gpu = summary["machine"]["gpu"]
    summary["gpu_note"] = gpu_note(gpu, a.dry_run)
    summary["wheels"] = install_wheels(Path(a.wheels), work / "site", a.also_need)
    steps = plan(sys.executable, work, a.dry_run) if (gpu or a.dry_run) else []
    env = step_env(work / "site", work)
    for s in steps:
        left = a.budget_s - (time.perf_counter() - t0)
        run_step(s, env, out / "logs", min(CAPS[s.name], left) if not a.dry_run else min(120, left))
    summary["steps"] = [asdict(s) for s in steps]
    summary.update(extras(work, steps), total_s=round(time.perf_counter() - t0, 1))
    ok = bool(steps) and all(s.rc == 0 for s in steps) and not summary["wheels"]["missing"]
    summary["ok"] = ok
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"gpu-check: {summary['gpu_note']}; " + "; ".join(
        f"{s.name} rc={s.rc} {s.seconds}s{' TIMED OUT' if s.timed_out else ''} {s.counts or ''}" for s in steps)
        + f" -> {out / 'summary.json'}")
    return 0 if ok else (2 if not steps else 1)


if __name__ == "__main__":
    sys.exit(main())
