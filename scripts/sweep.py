"""Run a training sweep (methods x seeds) resumably, one job per CPU core, keeping a small record of each run.

    python scripts/sweep.py run SPEC.yaml [--jobs 2] [--commit] [--max-runs N]
    python scripts/sweep.py status SPEC.yaml

A spec (YAML) names a preset, the methods (each a dict of config overrides), the training seeds, common overrides and
the held-out evaluation. Each (method, seed) job trains with `capo train` into `runs/sweeps/NAME/METHOD-seedS`
(checkpoints every `save_every` steps, so a killed job resumes from its last checkpoint), evaluates the final
checkpoint with `capo eval` on the held-out split, and writes `sweeps/records/NAME/METHOD-seedS.json`: the job's
settings and their hash, the final held-out metrics, the training curves (every logged `eval/*` row and a few
`train/`/`calib/` series) and the per-response (prompt, correct, lpm) of the final evaluation, so that every
seed-level and prompt-level statistic can be recomputed without the checkpoints. A job whose record exists with the
same settings hash is skipped: re-running the command continues a killed or cut-off sweep, and with `--commit` each
record is committed as it lands, so a fresh clone resumes from the repository. Records whose hash differs from the
spec (the spec was edited) are reported and never silently mixed: delete them to rerun. With `base: true` the sweep
also evaluates the preset's initial model under the same held-out evaluation (`base.json`: the start that
`sweep_report.py` measures each method's change from); `base: N` draws that evaluation N times with evaluation seeds
`eval.seed`, `eval.seed + 1`, ... (`base.json`, `base-draw1.json`, ...): one draw is itself a random sample, and the
change from the start is only as exact as the start's estimate. A job being run is claimed
with `RUN_DIR/sweep.lock` (pid and host), so a second `sweep.py run` of the same spec -- started to use another core,
or by mistake -- skips the jobs another live process holds instead of training into the same folder; a lock left by
a process that died is taken over. The record is also kept in the run folder (`RUN_DIR/record.json`): a process
whose records folder lacks it (a second checkout sharing `--runs-root`) copies that one, byte for byte, instead of
evaluating the finished run again under its own name and wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SERIES = ("train/accuracy", "train/reward_mean", "train/response_len", "train/masked_frac", "calib/auc_mean",
                "calib/auroc", "calib/ece",
                "policy/entropy", "policy/kl", "time/step")
EVAL_DEFAULTS = {"problems": 100, "k": 8, "batch_size": 64, "seed": 0}
BASE = "base"  # the job that evaluates the preset's initial model (spec `base: true`); no training, no seed
RUN_RECORD = "record.json"  # a finished run's record, kept in its run folder too (read by checkouts sharing the folder)


@dataclass(frozen=True)
class Job:
    """One (method, seed) training run of a sweep and where its files go."""

    sweep: str
    method: str
    seed: int | None  # None: a base job
    preset: str
    overrides: dict
    eval: dict
    run_dir: Path
    record: Path
    settings_hash: str = field(default="")
    draw: int = 0  # a base job: which draw of the base evaluation (evaluation seed eval.seed + draw)

    @property
    def name(self) -> str:
        if self.method == BASE:
            return f"{BASE}-draw{self.draw}" if self.draw else BASE
        return f"{self.method}-seed{self.seed}"


def load_spec(path: Path) -> dict:
    """Read and validate a sweep spec; raises SystemExit with a message naming the bad key."""
    spec = yaml.safe_load(Path(path).read_text()) or {}
    allowed = {"name", "preset", "steps", "overrides", "methods", "seeds", "eval", "save_every", "description", "base"}
    unknown = set(spec) - allowed
    if unknown:
        sys.exit(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    for key in ("name", "preset", "methods", "seeds"):
        if not spec.get(key):
            sys.exit(f"{path}: '{key}' is required")
    if BASE in (spec.get("methods") or {}):
        sys.exit(f"{path}: '{BASE}' is the initial model's evaluation (`base: true`), not a method name")
    b = spec.get("base", False)
    if not (isinstance(b, bool) or (isinstance(b, int) and b >= 1)):
        sys.exit(f"{path}: 'base' must be true, false or a number of draws >= 1, got {b!r}")
    if not isinstance(spec["methods"], dict) or not all(isinstance(v, dict) for v in spec["methods"].values()):
        sys.exit(f"{path}: 'methods' maps each method name to a dict of config overrides")
    if not all(isinstance(s, int) for s in spec["seeds"]):
        sys.exit(f"{path}: 'seeds' must be a list of integers")
    bad_eval = set(spec.get("eval") or {}) - set(EVAL_DEFAULTS)
    if bad_eval:
        sys.exit(f"{path}: unknown eval key(s) {sorted(bad_eval)}; allowed: {sorted(EVAL_DEFAULTS)}")
    return spec


def jobs(spec: dict, runs_root: Path, records_root: Path) -> list[Job]:
    """Every (method, seed) job of the spec, seeds outermost so that a partial sweep has whole seeds; first, with
    `base: true` or `base: N`, the base jobs: the preset's initial model under the same held-out evaluation, drawn N
    times (1 for true) with evaluation seeds eval.seed + 0, 1, ...: the start that "change from the start" is measured
    against, estimated like any other sampled evaluation."""
    ev = {**EVAL_DEFAULTS, **(spec.get("eval") or {})}

    def job(method: str, seed: int | None, ov: dict, evs: dict = ev, draw: int = 0, **extra) -> Job:
        settings = {"preset": spec["preset"], "overrides": ov, "eval": evs, **extra}
        h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        j = Job(spec["name"], method, seed, spec["preset"], ov, evs, Path(), Path(), h, draw)
        return dataclasses.replace(j, run_dir=runs_root / spec["name"] / j.name,
                                   record=records_root / spec["name"] / f"{j.name}.json")

    n_base = int(spec.get("base") or 0)  # true -> 1
    out = [job(BASE, None, dict(spec.get("overrides") or {}), {**ev, "seed": ev["seed"] + d}, d, base=True)
           for d in range(n_base)]
    for seed in spec["seeds"]:
        for method, m_over in spec["methods"].items():
            ov = {**(spec.get("overrides") or {}), **m_over, "run.seed": seed}
            if spec.get("steps"):
                ov["run.steps"] = spec["steps"]
            ov["run.save_every"] = spec.get("save_every", 10)
            out.append(job(method, seed, ov))
    return out


def state(job: Job) -> str:
    """'done' (record with this settings hash), 'stale' (record from other settings) or 'todo'."""
    if not job.record.exists():
        return "todo"
    try:
        rec = json.loads(job.record.read_text())
    except json.JSONDecodeError:
        return "todo"
    return "done" if rec.get("settings_hash") == job.settings_hash else "stale"


def _capo(args: list[str], log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "a") as f:
        r = subprocess.run([sys.executable, "-m", "capo.cli", *args], stdout=f, stderr=subprocess.STDOUT, env=env,
                           cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"`capo {' '.join(args[:1])}` failed (exit {r.returncode}); see {log}")


def _holder(lock: Path) -> str | None:
    """Who holds a job's lock: "pid@host" of a live process, None when free or left by a dead process (this host)."""
    try:
        pid, host = lock.read_text().split("@", 1)
        pid_i = int(pid)
    except (OSError, ValueError):
        return None  # gone, or torn (written by a process killed mid-write): free
    if host.strip() != socket.gethostname():
        return f"{pid_i}@{host.strip()}"  # another machine sharing the folder: cannot check, so held
    try:
        os.kill(pid_i, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return f"{pid_i}@{host.strip()}"


def claim(job: Job) -> str | None:
    """Take the job's lock; returns None when taken, else the live holder ("pid@host") and the job is left alone."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    lock = job.run_dir / "sweep.lock"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = _holder(lock)
            if holder is not None:
                return holder
            lock.unlink(missing_ok=True)  # stale: its process died
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}@{socket.gethostname()}")
        return None
    return _holder(lock) or "another process (the lock changed hands twice)"


def run_job(job: Job) -> dict | str:
    """Claim the job, train (resuming from the last checkpoint), evaluate the final checkpoint, write the record.
    Returns the record, or why it was left alone: another live process runs it, or another process finished it
    after this one listed its jobs (the list is made once, at the start; a finished job is never run again)."""
    holder = claim(job)
    if holder is not None:
        return f"run by another sweep process ({holder})"
    try:
        now = state(job)
        if now != "todo":
            return f"finished by another sweep process ({now} record {job.record})"
        return _train_eval_record(job)
    finally:
        (job.run_dir / "sweep.lock").unlink(missing_ok=True)


def _train_eval_record(job: Job) -> dict:
    kept = job.run_dir / RUN_RECORD
    text = kept.read_text() if kept.exists() else ""
    if text and _settings_hash_of(text) == job.settings_hash:  # finished by a process with another records folder
        _write_record(job.record, text)
        return json.loads(text)
    log = job.run_dir / "sweep.log"
    t0 = time.perf_counter()
    if job.method == BASE:  # no training: the preset's initial model, its settings resolved as `capo train` would
        from capo.trainer.config import load_config

        cfg = json.loads(json.dumps(load_config(job.preset, job.overrides).to_dict()))
        model = cfg["model"]["path"]
    else:
        flags = [x for k, v in job.overrides.items() for x in (f"--{k}", str(v))]
        _capo(["train", "--config", job.preset, *flags, "--run.out_dir", str(job.run_dir), "--run.progress",
               "false"], log)
        cfg = yaml.safe_load((job.run_dir / "config.yaml").read_text())
        model = str(job.run_dir / "checkpoints" / f"step-{cfg['run']['steps']:06d}")
    ev = job.eval
    _capo(["eval", "--model", model, "--dataset", cfg["data"]["dataset"], "--split", "test",
           "--limit", str(ev["problems"]), "-k", str(ev["k"]), "--temperature", str(cfg["rollout"]["temperature"]),
           "--max-new-tokens", str(cfg["rollout"]["max_new_tokens"]), "--batch-size", str(ev["batch_size"]),
           "--seed", str(ev["seed"]), "--no-chat-template", "--system-prompt", "",
           "--answer-format", cfg["data"]["answer_format"], "--n-boot", "0", "--no-token-stats",
           "--autocast", "on" if cfg["model"].get("autocast_bf16") else "off",  # the precision it trained in
           "--out", str(job.run_dir / "eval"), "--no-progress"], log)
    record = build_record(job, cfg, time.perf_counter() - t0)
    text = json.dumps(record, separators=(",", ":")) + "\n"
    _write_record(kept, text)
    _write_record(job.record, text)
    return record


def _write_record(path: Path, text: str) -> None:
    from capo.rundir import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def _settings_hash_of(text: str) -> str | None:
    try:
        return json.loads(text).get("settings_hash")
    except json.JSONDecodeError:
        return None  # torn by a kill mid-write: not a record


def build_record(job: Job, cfg: dict, wall_s: float) -> dict:
    """The small, committed summary of a finished job (no checkpoints, no texts)."""
    ev_dir = job.run_dir / "eval"
    metrics = json.loads((ev_dir / "metrics.json").read_text())["metrics"]
    rows = [json.loads(ln) for ln in (ev_dir / "generations.jsonl").read_text().splitlines() if ln.strip()]
    responses = [[str(r["prompt_id"]), int(r["verdict"] == "correct"),
                  None if r["mean_logprob"] is None else round(r["mean_logprob"], 6)] for r in rows]
    curves = {"train": [], "eval": []}
    train_rows = [] if job.method == BASE else (job.run_dir / "metrics.jsonl").read_text().splitlines()
    for ln in train_rows:
        row = json.loads(ln)
        curves["train"].append({"step": row["step"], **{k: row[k] for k in TRAIN_SERIES if k in row}})
        ev = {k: v for k, v in row.items() if k.startswith("eval/")}
        if ev:
            curves["eval"].append({"step": row["step"], **ev})
    return {"sweep": job.sweep, "method": job.method, "seed": job.seed, **({"draw": job.draw} if job.draw else {}),
            "settings_hash": job.settings_hash,
            "settings": {"preset": job.preset, "overrides": job.overrides, "eval": job.eval}, "config": cfg,
            "commit": _git("rev-parse", "HEAD"), "machine": machine(), "wall_s": round(wall_s, 1), "final": metrics,
            "curves": curves,
            "responses": responses}


def machine() -> dict:
    """Where the job ran: the device type the trainer and `capo eval` used (CUDA when visible, as they choose) and the
    versions that shape the numerics. Records from different devices never enter one comparison (sweep_report)."""
    import platform

    import torch
    import transformers

    cuda = torch.cuda.is_available()
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), platform.machine())
    return {"device": "cuda" if cuda else "cpu", "device_name": torch.cuda.get_device_name(0) if cuda else cpu,
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def _git(*args: str) -> str:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip()


def _commit(job: Job) -> None:
    _git("add", str(job.record))
    r = subprocess.run(["git", "commit", "-q", "-m", f"sweep {job.sweep}: record {job.name}", "--", str(job.record)],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"  (git commit of {job.record} failed: {r.stderr.strip() or r.stdout.strip()})", flush=True)


def run(spec: dict, all_jobs: list[Job], n_jobs: int, commit: bool, max_runs: int | None) -> int:
    states = {j.name: state(j) for j in all_jobs}
    for j in all_jobs:
        if states[j.name] == "stale":
            print(f"stale record (settings changed since it was written; delete it to rerun): {j.record}")
    todo = [j for j in all_jobs if states[j.name] == "todo"]
    todo = todo[:max_runs] if max_runs is not None else todo
    n_done = sum(s == "done" for s in states.values())
    print(f"sweep {spec['name']}: {len(all_jobs)} jobs, {n_done} done, {len(todo)} to run now with {n_jobs} job(s) "
          "at a time", flush=True)
    failed = 0
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        futures = {pool.submit(run_job, j): j for j in todo}
        for fut in as_completed(futures):
            j = futures[fut]
            try:
                rec = fut.result()
            except Exception as e:  # noqa: BLE001 - one failed job must not stop the others
                failed += 1
                print(f"  FAILED {j.name}: {e}", flush=True)
                continue
            if isinstance(rec, str):
                print(f"  skipped {j.name}: {rec}", flush=True)
                continue
            f = rec["final"]
            print(f"  done {j.name} in {rec['wall_s'] / 60:.1f} min: accuracy {f['accuracy']:.3f} "
                  f"AUC-mean {f['auc_mean']:.3f}", flush=True)
            if commit:
                _commit(j)
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("run", "status"))
    ap.add_argument("spec", type=Path)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="jobs at a time (default: one per core)")
    ap.add_argument("--commit", action="store_true", help="git-commit each record as it lands")
    ap.add_argument("--max-runs", type=int, default=None, help="run at most this many jobs now (then stop)")
    ap.add_argument("--runs-root", type=Path, default=ROOT / "runs" / "sweeps", help="where run folders go")
    ap.add_argument("--records-root", type=Path, default=ROOT / "sweeps" / "records", help="where records go")
    a = ap.parse_args(argv)
    spec = load_spec(a.spec)
    all_jobs = jobs(spec, a.runs_root, a.records_root)
    if a.command == "status":
        for j in all_jobs:
            print(f"{state(j):6} {j.name}")
        return 0
    if a.jobs < 1:
        sys.exit("--jobs must be >= 1")
    return run(spec, all_jobs, a.jobs, a.commit, a.max_runs)


if __name__ == "__main__":
    sys.exit(main())
