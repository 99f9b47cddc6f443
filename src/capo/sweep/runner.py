"""Run a sweep's jobs resumably, one job per CPU core, keeping a small record of each finished run.

Each (method, seed) job trains with ``capo train`` into ``RUNS_ROOT/NAME/METHOD-seedS`` (checkpoints every
``save_every`` steps, so a killed job resumes from its last checkpoint), evaluates the final checkpoint with
``capo eval`` on the held-out split, and writes ``RECORDS_ROOT/NAME/METHOD-seedS.json``: the job's settings and
their hash, the final held-out metrics, the training curves (every logged ``eval/*`` row and a few
``train/``/``calib/`` series) and the per-response (prompt, correct, lpm) of the final evaluation, so that every
seed-level and prompt-level statistic can be recomputed without the checkpoints. A job whose record exists with the
same settings hash is skipped: running the command again continues a killed or cut-off sweep, and with ``commit``
each record is committed (in the git repository that holds the records) as it lands, so a fresh clone resumes from
the repository.

A job being run is claimed with ``RUN_DIR/sweep.lock`` (pid and host), so a second ``capo sweep run`` of the same
spec -- started to use another core, or by mistake -- skips the jobs another live process holds instead of training
into the same folder; a lock left by a process that died is taken over. The record is also kept in the run folder
(``RUN_DIR/record.json``): a process whose records folder lacks it (a second checkout sharing the runs root) copies
that one, byte for byte, instead of evaluating the finished run again under its own name and wall time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from capo.sweep.spec import BASE, Job, state

TRAIN_SERIES = ("train/accuracy", "train/reward_mean", "train/response_len", "train/masked_frac", "calib/auc_mean",
                "calib/auroc", "calib/ece",
                "policy/entropy", "policy/kl", "time/step")
RUN_RECORD = "record.json"  # a finished run's record, kept in its run folder too (read by checkouts sharing the folder)
LOCK = "sweep.lock"


def _capo(args: list[str], log: Path) -> None:
    """Run one ``capo`` subcommand in a subprocess (this Python, one thread per job), appending its output to log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "a") as f:
        r = subprocess.run([sys.executable, "-m", "capo.cli", *args], stdout=f, stderr=subprocess.STDOUT, env=env)
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
    lock = job.run_dir / LOCK
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
        (job.run_dir / LOCK).unlink(missing_ok=True)


def _train_eval_record(job: Job) -> dict:
    kept = job.run_dir / RUN_RECORD
    text = kept.read_text() if kept.exists() else ""
    if text and _settings_hash_of(text) == job.settings_hash:  # finished by a process with another records folder
        _write_record(job.record, text)
        return json.loads(text)
    log = job.run_dir / "sweep.log"
    t0 = time.perf_counter()
    cfg, model = _train(job, log)
    _capo(_eval_args(job, cfg, model), log)
    record = build_record(job, cfg, time.perf_counter() - t0)
    text = json.dumps(record, separators=(",", ":")) + "\n"
    _write_record(kept, text)
    _write_record(job.record, text)
    return record


def _train(job: Job, log: Path) -> tuple[dict, str]:
    """Train the job's model with ``capo train`` (a base job: none, the preset's initial model with its settings
    resolved as ``capo train`` would); returns the resolved config and the model ``capo eval`` evaluates."""
    if job.method == BASE:
        from capo.trainer.config import load_config

        cfg = json.loads(json.dumps(load_config(job.preset, job.overrides).to_dict()))
        return cfg, cfg["model"]["path"]
    import yaml

    flags = [x for k, v in job.overrides.items() for x in (f"--{k}", str(v))]
    _capo(["train", "--config", job.preset, *flags, "--run.out_dir", str(job.run_dir), "--run.progress", "false"], log)
    cfg = yaml.safe_load((job.run_dir / "config.yaml").read_text())
    return cfg, str(job.run_dir / "checkpoints" / f"step-{cfg['run']['steps']:06d}")


def _eval_args(job: Job, cfg: dict, model: str) -> list[str]:
    """``capo eval``'s arguments for the job's final held-out evaluation, sampled as the run trained."""
    ev = job.eval
    return ["eval", "--model", model, "--dataset", cfg["data"]["dataset"], "--split", "test",
            "--limit", str(ev["problems"]), "-k", str(ev["k"]), "--temperature", str(cfg["rollout"]["temperature"]),
            "--max-new-tokens", str(cfg["rollout"]["max_new_tokens"]), "--batch-size", str(ev["batch_size"]),
            "--seed", str(ev["seed"]), "--no-chat-template", "--system-prompt", "",
            "--answer-format", cfg["data"]["answer_format"], "--n-boot", "0", "--no-token-stats",
            "--autocast", "on" if cfg["model"].get("autocast_bf16") else "off",  # the precision it trained in
            "--out", str(job.run_dir / "eval"), "--no-progress"]


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
            "commit": code_commit(), "machine": machine(), "wall_s": round(wall_s, 1), "final": metrics,
            "curves": curves,
            "responses": responses}


def machine() -> dict:
    """Where the job ran: the device type the trainer and `capo eval` used (CUDA when visible, as they choose) and the
    versions that shape the numerics. Records from different devices never enter one comparison
    (:mod:`capo.sweep.records`)."""
    import platform

    import torch
    import transformers

    cuda = torch.cuda.is_available()
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), platform.machine())
    return {"device": "cuda" if cuda else "cpu", "device_name": torch.cuda.get_device_name(0) if cuda else cpu,
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    except OSError as e:  # no git on this machine
        return subprocess.CompletedProcess(["git", *args], 127, "", str(e))


def code_commit() -> str:
    """The code that ran: the git commit of the checkout capo is imported from (an editable install or PYTHONPATH
    checkout, where capo's own files are tracked), else ``capo==VERSION`` (an installed package)."""
    import capo

    here = Path(capo.__file__).resolve().parent
    if _git(here, "ls-files", "--error-unmatch", "__init__.py").returncode == 0:
        return _git(here, "rev-parse", "HEAD").stdout.strip()
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"capo=={version('capo')}"
    except PackageNotFoundError:
        return ""


def commit_record(job: Job) -> None:
    """git-commit the job's record in the repository that holds it (the records' folder, not capo's own)."""
    where, path = job.record.parent.resolve(), str(job.record.resolve())
    _git(where, "add", path)
    r = _git(where, "commit", "-q", "-m", f"sweep {job.sweep}: record {job.name}", "--", path)
    if r.returncode != 0:
        print(f"  (git commit of {job.record} failed: {r.stderr.strip() or r.stdout.strip()})", flush=True)


def run_sweep(name: str, all_jobs: list[Job], n_jobs: int, commit: bool, max_runs: int | None) -> int:
    """Run the jobs not done yet (at most ``max_runs``), ``n_jobs`` at a time; 1 when any failed, else 0."""
    states = {j.name: state(j) for j in all_jobs}
    for j in all_jobs:
        if states[j.name] == "stale":
            print(f"stale record (settings changed since it was written; delete it to rerun): {j.record}")
    todo = [j for j in all_jobs if states[j.name] == "todo"]
    todo = todo[:max_runs] if max_runs is not None else todo
    n_done = sum(s == "done" for s in states.values())
    print(f"sweep {name}: {len(all_jobs)} jobs, {n_done} done, {len(todo)} to run now with {n_jobs} job(s) "
          "at a time", flush=True)
    failed = 0
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        futures = {pool.submit(run_job, j): j for j in todo}
        for fut in as_completed(futures):
            failed += _report_job(futures[fut], fut, commit)
    return 1 if failed else 0


def _report_job(j: Job, fut, commit: bool) -> int:
    """Print one finished job's outcome (and commit its record); 1 when it failed."""
    try:
        rec = fut.result()
    except Exception as e:  # noqa: BLE001 - one failed job must not stop the others
        print(f"  FAILED {j.name}: {e}", flush=True)
        return 1
    if isinstance(rec, str):
        print(f"  skipped {j.name}: {rec}", flush=True)
        return 0
    f = rec["final"]
    shown = (("answer_ece", "verbal_ece") if f.get("answer_ece") is not None else
             ("stochastic_ece", "stochastic_auroc") if f.get("stochastic_ece") is not None else ("accuracy", "auc_mean"))
    print(f"  done {j.name} in {rec['wall_s'] / 60:.1f} min: "
          + " ".join(f"{k} {'n/a' if f.get(k) is None else format(f[k], '.3f')}" for k in shown), flush=True)
    if commit:
        commit_record(j)
    return 0
