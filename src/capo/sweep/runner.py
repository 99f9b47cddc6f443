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

A record is written only for a model trained with the record's settings: before ``capo train`` starts, the run folder
is marked with the job's settings, their hash and the resolved training config (``RUN_DIR/settings.json``), and a
folder started with other settings -- the same job before its spec was edited, or another method's or seed's
checkpoints -- is refused (:func:`run_dir_problem`), never resumed or evaluated as this job's. A folder from before
the mark is judged by the ``config.yaml`` its last ``capo train`` wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from capo.errors import DataError
from capo.rundir import atomic_write_text, read_jsonl, read_jsonl_rows, yaml_loads
from capo.sweep.records import differing_keys, flat_config, setting_defaults
from capo.sweep.spec import BASE, Job, record_state, same_settings

TRAIN_SERIES = ("train/accuracy", "train/reward_mean", "train/response_len", "train/masked_frac",
                "train/masked_frac_correct", "train/masked_frac_incorrect", "calib/auc_mean",
                "calib/auroc", "calib/ece",
                "policy/entropy", "policy/kl", "time/step")
RUN_RECORD = "record.json"  # a finished run's record, kept in its run folder too (read by checkouts sharing the folder)
LOCK = "sweep.lock"
EVALUATED = "evaluated.json"  # in RUN_DIR/eval: the model and the sha256 of the weights its rows are of
RUN_SETTINGS = "settings.json"  # the run folder's settings mark: the job's settings, their hash and resolved config
CODE_LOG = "code.jsonl"  # in the run folder: the code each `capo` subprocess of the job started under, a line each
# what a finished job's run folder keeps once its record is written (``capo sweep run --keep``, ``capo sweep prune``)
KEEP = ("all", "final", "weights", "none")
DEFAULT_KEEP = "final"
KEEP_HELP = ("what a finished job's run folder keeps of its checkpoints once its record is written: all (every one "
             "the trainer kept), final (the last, resumable), weights (the last checkpoint's model alone: loadable "
             "with from_pretrained, not resumable; a 135M model's 0.5 GB instead of 1.6 GB) or none")
EVAL_FLAGS = {"problems": "--limit", "k": "-k", "batch_size": "--batch-size", "seed": "--seed"}  # spec eval -> flag


class _Children:
    """The ``capo`` subprocesses this runner's jobs wait on, so that a runner stopped by a signal or an error stops them
    too: left alone, a job's ``capo train`` went on training without its runner (no record would ever be written)
    and held its run folder's lock against the next runner."""

    def __init__(self):
        self.lock, self.live, self.stopping = threading.Lock(), set(), False

    def reset(self) -> None:
        """A new sweep in this process (``capo sweep run`` once per spec; tests): children may start again."""
        with self.lock:
            self.stopping = False

    def start(self, cmd: list[str], **kw) -> subprocess.Popen:
        with self.lock:
            if self.stopping:
                raise RuntimeError("the sweep is stopping: no new `capo` process")
            p = subprocess.Popen(cmd, **kw)
            self.live.add(p)
            return p

    def done(self, p: subprocess.Popen) -> None:
        with self.lock:
            self.live.discard(p)

    def stop(self) -> None:
        """SIGTERM to every live child (it exits at once; its run resumes from its last checkpoint), and no new one."""
        with self.lock:
            self.stopping = True
            for p in self.live:
                if p.poll() is None:
                    p.terminate()


CHILDREN = _Children()


def _capo(args: list[str], log: Path) -> None:
    """Run one ``capo`` subcommand in a subprocess (this Python, one thread per job), appending its output to log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "a") as f:
        p = CHILDREN.start([sys.executable, "-m", "capo.cli", *args], stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            code = p.wait()
        finally:
            CHILDREN.done(p)
    if code != 0:
        raise RuntimeError(f"`capo {' '.join(args[:1])}` failed (exit {code}); see {log}")


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds run_sweep, which stops the jobs' processes on its way out


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


def holder(job: Job) -> str | None:
    """The live process running ``job`` ("pid@host"), None when no live process holds its lock. Reads only: unlike
    :func:`claim` it takes nothing (``capo sweep status``)."""
    return _holder(job.run_dir / LOCK)


def claim(job: Job) -> str | None:
    """Take the job's lock; returns None when taken, else the live holder ("pid@host") and the job is left alone.
    The lock appears with its holder already written (a hard link to a written file, which fails when the lock
    exists), so another process never reads it empty and takes it as free."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    lock = job.run_dir / LOCK
    mine = job.run_dir / f".{LOCK}.{os.getpid()}"
    mine.write_text(_me())
    try:
        for _ in range(2):
            try:
                os.link(mine, lock)
            except FileExistsError:
                with _takeover(job):  # one process at a time decides a lock is stale and replaces it
                    holder = _holder(lock)
                    if holder is not None:
                        return holder
                    lock.unlink(missing_ok=True)  # stale: its process died
                    try:
                        os.link(mine, lock)
                    except FileExistsError:
                        continue
                    return None
            return None
        return _holder(lock) or "another process (the lock changed hands twice)"
    finally:
        mine.unlink(missing_ok=True)


def _me() -> str:
    return f"{os.getpid()}@{socket.gethostname()}"


@contextlib.contextmanager
def _takeover(job: Job):
    """An exclusive ``flock`` on ``RUN_DIR/.LOCK.takeover`` while a stale lock is judged and replaced: two runners
    that both found the lock stale each took it (the second unlinked the first's fresh lock; found by an audit)."""
    import fcntl

    with open(job.run_dir / f".{LOCK}.takeover", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def release(job: Job) -> None:
    """Remove the job's lock if this process still holds it (never another's that took a lock it judged stale)."""
    lock = job.run_dir / LOCK
    try:
        if lock.read_text().strip() == _me():
            lock.unlink(missing_ok=True)
    except OSError:
        pass


def run_job(job: Job, keep: str = DEFAULT_KEEP) -> dict | str:
    """Claim the job, train (resuming from the last checkpoint), evaluate the final checkpoint, write the record.
    Returns the record, or why it was left alone: another live process runs it, or another process finished it
    after this one listed its jobs (the list is made once, at the start; a finished job is never run again)."""
    holder = claim(job)
    if holder is not None:
        return f"run by another sweep process ({holder})"
    try:
        now, why = record_state(job)
        if now == "corrupt":
            raise DataError(corrupt_record(job, why))
        if now != "todo":
            return f"finished by another sweep process ({now} record {job.record})"
        record = _train_eval_record(job)
        try:
            prune_checkpoints(job, keep)
        except OSError as e:  # the record stands; the folder only keeps more than asked
            print(f"  note: {job.name}'s checkpoints were not pruned to --keep {keep}: {e}", flush=True)
        return record
    finally:
        release(job)


def corrupt_record(job: Job, why: str) -> str:
    return (f"{job.record}: corrupt record ({why}); restore it (e.g. `git checkout -- {job.record}`) or delete it "
            "to run the job again")


def kept_record(job: Job) -> str | None:
    """The record the job's run folder keeps (``RUN_DIR/record.json``) when it is this job's: the run finished,
    under this records folder or another checkout's; None when there is none (or a torn or other-settings one)."""
    kept = job.run_dir / RUN_RECORD
    text = kept.read_text() if kept.exists() else ""
    return text if text and _is_record_of(text, job) else None


def _train_eval_record(job: Job) -> dict:
    text = kept_record(job)
    if text:  # finished by a process with another records folder, or its record was deleted here
        _write_record(job.record, text)
        print(f"  note: {job.name}: copied the record its run folder keeps ({job.run_dir / RUN_RECORD}), without "
              "training or evaluating; to run the job anew, move its whole run folder aside", flush=True)
        return json.loads(text)
    resolved = resolved_config(job)
    problem = run_dir_problem(job, resolved)
    if problem:
        raise DataError(problem)
    _mark(job, resolved)
    log = job.run_dir / "sweep.log"
    t0 = time.perf_counter()
    if job.method != BASE:
        note_code(job, "train")
    cfg, model = _train(job, log)
    note_code(job, "eval")
    _capo(_eval_args(eval_settings(job, cfg, model), eval_folder(job, model)), log)
    record = build_record(job, cfg, time.perf_counter() - t0)
    text = json.dumps(record, separators=(",", ":")) + "\n"
    _write_record(job.run_dir / RUN_RECORD, text)
    _write_record(job.record, text)
    return record


def eval_folder(job: Job, model: str) -> Path:
    """``RUN_DIR/eval`` for the final evaluation of ``model``. ``capo eval`` knows a model by its path, and a
    checkpoint trained again at that path (a job started over with ``run.resume: false`` after a kill during its
    evaluation, a training step that is not bit-reproducible) has other weights: the folder is marked with the
    sha256 of the weights it evaluates (:data:`EVALUATED`), and rows of other weights, or of unknown ones, are moved
    aside (``eval.replaced-TIME``), never resumed (they mixed two models' responses in one evaluation)."""
    out = job.run_dir / "eval"
    if job.method == BASE:  # the preset's initial model: nothing trains it
        return out
    digest = weights_digest(Path(model))
    gen = out / "generations.jsonl"
    if gen.exists() and gen.stat().st_size > 0:
        try:
            then = json.loads((out / EVALUATED).read_text()).get("weights_sha256")
        except (OSError, ValueError, AttributeError):
            then = None
        if then != digest:
            stamp = time.strftime('%Y%m%d-%H%M%S')
            names = (out.with_name(f"eval.replaced-{stamp}{f'-{i}' if i else ''}") for i in range(1000))
            aside = next(d for d in names if not d.exists())
            out.rename(aside)
            print(f"  note: {job.name}: {out} held responses of {'other' if then else 'unknown'} weights than "
                  f"{model}'s; moved to {aside}, evaluating anew", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / EVALUATED, json.dumps({"model": model, "weights_sha256": digest}))
    return out


def weights_digest(model_dir: Path) -> str | None:
    """sha256 over a checkpoint's weight files (``*.safetensors``, else ``*.bin``), in name order; None without."""
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def train_flags(job: Job) -> dict[str, str]:
    """The ``--SECTION.FIELD VALUE`` overrides ``capo train`` gets for the job (after ``--config PRESET``)."""
    return {**{k: str(v) for k, v in job.overrides.items()}, "run.out_dir": str(job.run_dir), "run.progress": "false"}


def resolved_config(job: Job) -> dict:
    """The job's training config resolved and validated as ``capo train`` does (:class:`ConfigError` when it would
    refuse it); a base job: the preset's with the spec's common overrides."""
    from capo.trainer.config import load_config

    flags = job.overrides if job.method == BASE else train_flags(job)
    return json.loads(json.dumps(load_config(job.preset, flags).to_dict()))


def progress(job: Job) -> tuple[int, int, bool] | None:
    """How far a training job without its record has come in its run folder: (steps trained, steps asked, whether
    its final evaluation has started); None before its ``capo train`` wrote a config there, and for a base job."""
    cfg = job.run_dir / "config.yaml"
    if job.method == BASE or not cfg.exists():
        return None
    total = int(yaml_loads(cfg.read_text())["run"]["steps"])
    rows = read_jsonl_rows(job.run_dir / "metrics.jsonl")  # a line torn by the live trainer ends the rows
    done = max((int(r["step"]) for r in rows if "time/step" in r), default=0)  # training rows, not step 0's eval
    return done, total, done >= total and (job.run_dir / "eval").exists()


def final_model(job: Job, cfg: dict) -> str:
    """The model the job's final evaluation reads: its last checkpoint, or a base job's initial model."""
    if job.method == BASE:
        return cfg["model"]["path"]
    return str(job.run_dir / "checkpoints" / f"step-{cfg['run']['steps']:06d}")


def _train(job: Job, log: Path) -> tuple[dict, str]:
    """Train the job's model with ``capo train`` (a base job: none, the preset's initial model with its settings
    resolved as ``capo train`` would); returns the resolved config and the model ``capo eval`` evaluates."""
    if job.method == BASE:
        cfg = resolved_config(job)
        return cfg, final_model(job, cfg)
    flags = [x for k, v in train_flags(job).items() for x in (f"--{k}", v)]
    _capo(["train", "--config", job.preset, *flags], log)
    cfg = yaml_loads((job.run_dir / "config.yaml").read_text())
    return cfg, final_model(job, cfg)


def eval_settings(job: Job, cfg: dict, model: str):
    """The job's final held-out evaluation as ``capo eval`` settings: the spec's ``eval`` on the run as it trained
    (:func:`capo.evaluation.run.settings_as_trained`)."""
    from capo.evaluation.run import settings_as_trained

    ev = job.eval
    return settings_as_trained(cfg, model=model, limit=ev["problems"], k=ev["k"], batch_size=ev["batch_size"],
                               seed=ev["seed"])


def _eval_args(s, out: Path) -> list[str]:
    """``capo eval``'s arguments for the settings of :func:`eval_settings` (``--split`` for a named dataset only: a
    file has none)."""
    from capo.evaluation.run import has_splits

    split = ["--split", s.split] if has_splits(s.dataset) else []
    return ["eval", "--model", s.model, "--dataset", s.dataset, *split, "--limit", str(s.limit),
            "-k", str(s.k), "--temperature", str(s.temperature), "--top-p", str(s.top_p),
            "--max-new-tokens", str(s.max_new_tokens), "--batch-size", str(s.batch_size), "--seed", str(s.seed),
            "--prompt-field", s.prompt_field, "--answer-field", s.answer_field,
            "--gold-format", s.gold_format,
            *([] if s.chat_template else ["--no-chat-template"]),
            *([] if s.system_prompt is None else ["--system-prompt", s.system_prompt]),
            *([f"--response-prefix={s.response_prefix}"] if s.response_prefix else []),
            "--answer-format", s.answer_format, "--n-boot", str(s.n_boot),
            *([] if s.token_stats else ["--no-token-stats"]), "--autocast", s.autocast, "--out", str(out),
            "--no-progress"]


def run_dir_problem(job: Job, cfg: dict) -> str | None:
    """Why the job must not train or evaluate in its run folder, or None (a new folder, or one started with this
    job's settings up to its bookkeeping knobs, :func:`capo.trainer.config.bookkeeping`): the folder's mark names
    another resolved training config or final evaluation; a folder without a mark that holds training output is
    judged by its ``config.yaml``."""
    from capo.trainer.config import bookkeeping

    d = job.run_dir
    mark = d / RUN_SETTINGS
    if mark.exists():
        try:
            stored = json.loads(mark.read_text())
            then, then_eval = stored["config"], stored["settings"]["eval"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            return f"{mark}: unreadable settings mark ({e!r}); move or delete {d} to train the job anew"
    elif (d / "config.yaml").exists():
        then, then_eval = yaml_loads((d / "config.yaml").read_text()), job.eval  # capo eval checks its own
    elif (d / "checkpoints").exists() or (d / "metrics.jsonl").exists():
        return f"{d} holds training output but no record of its settings; move or delete it to train the job anew"
    else:
        return None
    # a setting the folder's mark predates ran with what is now its default (as records read them)
    free = bookkeeping(cfg)  # micro-batches count for a batch-dependent loss
    now, then = flat_config(cfg, free), {**setting_defaults(free), **flat_config(then, free)}
    diff = [f"{k}: {then.get(k)!r} -> {now.get(k)!r}" for k in differing_keys(now, then)]
    diff += [f"eval.{k}: {then_eval.get(k)!r} -> {v!r}" for k, v in job.eval.items() if then_eval.get(k) != v]
    if not diff:
        return None
    return (f"{d} was trained with other settings ({', '.join(diff)}); a record is written only for a model trained "
            "with the job's settings: move or delete the folder to train the job anew")


def _mark(job: Job, cfg: dict) -> None:
    """Mark the run folder with the job's settings before anything is trained in it (kept when it exists: the
    settings the folder was started with)."""
    from capo.rundir import atomic_write_text

    mark = job.run_dir / RUN_SETTINGS
    if not mark.exists():
        job.run_dir.mkdir(parents=True, exist_ok=True)
        body = {"settings_hash": job.settings_hash, "settings": job.settings, "config": cfg}
        atomic_write_text(mark, json.dumps(body, indent=1) + "\n")


def _write_record(path: Path, text: str) -> None:
    from capo.rundir import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def _is_record_of(text: str, job: Job) -> bool:
    try:
        rec = json.loads(text)
    except json.JSONDecodeError:
        return False  # torn by a kill mid-write: not a record
    return isinstance(rec, dict) and same_settings(rec, job)


def train_seconds(train_rows: list[dict]) -> float:
    """Seconds a run spent in its training steps, summed over every process that trained it (a resumed run's too,
    where the record's ``wall_s`` is its last process's alone): the ``time/step`` of its training rows, from its
    ``metrics.jsonl`` or a record's ``curves.train``; 0 when none has one."""
    return sum(float(r["time/step"]) for r in train_rows if isinstance(r.get("time/step"), (int, float)))


def build_record(job: Job, cfg: dict, wall_s: float) -> dict:
    """The small, committed summary of a finished job (no checkpoints, no texts). ``wall_s``: this process's wall
    time; ``train_s`` (a training job): its training steps' time over every process (:func:`train_seconds`)."""
    ev_dir = job.run_dir / "eval"
    metrics = json.loads((ev_dir / "metrics.json").read_text())["metrics"]
    rows = read_jsonl(ev_dir / "generations.jsonl")
    responses = [[str(r["prompt_id"]), int(r["verdict"] == "correct"),
                  None if r["mean_logprob"] is None else round(r["mean_logprob"], 6)] for r in rows]
    curves = {"train": [], "eval": []}
    train_rows = [] if job.method == BASE else read_jsonl(job.run_dir / "metrics.jsonl")
    for row in train_rows:
        curves["train"].append({"step": row["step"], **{k: row[k] for k in TRAIN_SERIES if k in row}})
        ev = {k: v for k, v in row.items() if k.startswith("eval/")}
        if ev:
            curves["eval"].append({"step": row["step"], **ev})
    return {"sweep": job.sweep, "method": job.method, "seed": job.seed, **({"draw": job.draw} if job.draw else {}),
            "settings_hash": job.settings_hash,
            "settings": job.settings, "config": cfg,
            **code_fields(job), "machine": machine(), "wall_s": round(wall_s, 1),
            **({} if job.method == BASE else {"train_s": round(train_seconds(train_rows), 1)}), "final": metrics,
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


def code_state() -> dict:
    """{"commit": :func:`code_commit`, "dirty": whether capo's files in that checkout differ from the commit (edited,
    added or deleted; None for an installed package or without git)}."""
    import capo

    commit = code_commit()
    dirty = None
    if commit and not commit.startswith("capo=="):
        r = _git(Path(capo.__file__).resolve().parent, "status", "--porcelain", "--", ".")
        dirty = bool(r.stdout.strip()) if r.returncode == 0 else None
    return {"commit": commit, "dirty": dirty}


def note_code(job: Job, phase: str) -> None:
    """Append the code a phase of the job starts under to its run folder's :data:`CODE_LOG` (a resumed job appends
    again, so a run trained across processes keeps every state it ran under)."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    read_jsonl_rows(job.run_dir / CODE_LOG, repair=True)  # a line a kill tore is cut, not glued to the next one
    with open(job.run_dir / CODE_LOG, "a") as f:
        f.write(json.dumps({"phase": phase, **code_state()}) + "\n")


def code_fields(job: Job) -> dict:
    """A record's ``commit`` (the code its training started under; for a run folder from before :data:`CODE_LOG`,
    the code at the time of writing) and ``code``: every distinct (phase, commit, dirty) the job's subprocesses
    started under, in order."""
    states = []
    for st in read_jsonl_rows(job.run_dir / CODE_LOG):  # a line torn by a kill mid-write ends the rows
        if st not in states:
            states.append(st)
    return {"commit": states[0]["commit"] if states else code_commit(), "code": states}


def commit_problem(records_root: Path) -> str | None:
    """Why ``--commit`` could not commit records under ``records_root`` (not in a git work tree, or no git), or None;
    asked before any job runs rather than after the first one trained."""
    where = Path(records_root).resolve()
    while not where.is_dir():  # the records folder is made by the first record
        where = where.parent
    r = _git(where, "rev-parse", "--is-inside-work-tree")
    if r.returncode == 0 and r.stdout.strip() == "true":
        return None
    return (f"--commit: the records' folder {records_root} is not inside a git work tree "
            f"({(r.stderr or r.stdout).strip() or 'git rev-parse said no'}); run from a repository or leave out --commit")


def commit_record(job: Job) -> None:
    """git-commit the job's record in the repository that holds it (the records' folder, not capo's own)."""
    where, path = job.record.parent.resolve(), str(job.record.resolve())
    _git(where, "add", path)
    r = _git(where, "commit", "-q", "-m", f"sweep {job.sweep}: record {job.name}", "--", path)
    if r.returncode != 0:
        print(f"  (git commit of {job.record} failed: {r.stderr.strip() or r.stdout.strip()})", flush=True)


def prune_checkpoints(job: Job, keep: str) -> int:
    """Reduce a finished job's checkpoints to what ``keep`` (one of :data:`KEEP`) names; the bytes freed. Called only
    once the job's record is written: the record, not the checkpoints, is what every report reads."""
    import shutil

    from capo.trainer.checkpoint import list_checkpoints, strip_resume_state

    if keep not in KEEP:
        raise ValueError(f"keep {keep!r} is not allowed; allowed values: {', '.join(KEEP)}")
    ckpts = [p for _, p in list_checkpoints(job.run_dir)]
    if keep == "all" or not ckpts:
        return 0
    drop = ckpts if keep == "none" else ckpts[:-1]
    freed = sum(_size(p) for p in drop)
    for p in drop:
        shutil.rmtree(p)
    if keep == "weights":
        freed += strip_resume_state(ckpts[-1], f"capo sweep --keep weights, after the record {job.record} was written")
    return freed


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prune_sweep(all_jobs: list[Job], keep: str) -> int:
    """``capo sweep prune``: :func:`prune_checkpoints` on every job whose record is done and that no live process
    holds; one line per job that freed anything, then the total. 0."""
    from capo.sweep.spec import state

    total = 0
    for j in all_jobs:
        if j.method == BASE or state(j) != "done" or not j.run_dir.is_dir():
            continue
        if claim(j) is not None:
            print(f"  skipped {j.name}: held by a live sweep process")
            continue
        try:
            freed = prune_checkpoints(j, keep)
        finally:
            release(j)
        if freed:
            print(f"  {j.name}: freed {freed / 2**30:.2f} GiB")
        total += freed
    print(f"freed {total / 2**30:.2f} GiB (--keep {keep})")
    return 0


def run_sweep(name: str, all_jobs: list[Job], n_jobs: int, commit: bool, max_runs: int | None,
              keep: str = DEFAULT_KEEP) -> int:
    """Run the jobs not done yet (at most ``max_runs``), ``n_jobs`` at a time, each pruned to ``keep`` once its record
    is written (:func:`prune_checkpoints`); 1 when any failed, else 0."""
    found = {j.name: record_state(j) for j in all_jobs}
    states = {name: st for name, (st, _) in found.items()}
    for j in all_jobs:
        if states[j.name] == "stale":
            print(f"stale record (settings changed since it was written; delete it to rerun): {j.record}")
        elif states[j.name] == "corrupt":  # never rewritten: `capo sweep run` refuses to start (capo.sweep.preflight)
            print(f"skipped {j.name}: {corrupt_record(j, found[j.name][1])}")
    todo = [j for j in all_jobs if states[j.name] == "todo"]
    todo = todo[:max_runs] if max_runs is not None else todo
    n_done = sum(s == "done" for s in states.values())
    print(f"sweep {name}: {len(all_jobs)} jobs, {n_done} done, {len(todo)} to run now with {n_jobs} job(s) "
          "at a time", flush=True)
    CHILDREN.reset()
    failed, pool = 0, ThreadPoolExecutor(max_workers=n_jobs)
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set a signal handler
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        futures = {pool.submit(run_job, j, keep): j for j in todo}
        for fut in as_completed(futures):
            failed += _report_job(futures[fut], fut, commit)
    except BaseException:  # SIGTERM, Ctrl-C or an error: the jobs' `capo` processes stop with the runner
        CHILDREN.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # jobs not started never start
        if main_thread:  # a handler not set from Python reads back as None
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
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
    took = f"in {rec['wall_s'] / 60:.1f} min"
    if rec.get("train_s", 0) > rec["wall_s"]:  # resumed: this process did only part of the training
        took += f" (trained {rec['train_s'] / 60:.1f} min over every process)"
    print(f"  done {j.name} {took}: "
          + " ".join(f"{k} {'n/a' if f.get(k) is None else format(f[k], '.3f')}" for k in shown), flush=True)
    if commit:
        commit_record(j)
    return 0
