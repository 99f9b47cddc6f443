"""Checkpoints in Hugging Face format plus the trainer state, written atomically.

Layout: ``RUN/checkpoints/step-000010/`` holds ``model.safetensors`` + config + tokenizer (loadable by
``from_pretrained`` and vLLM without capo), ``trainer_state.pt`` (optimizer, scheduler, step, data position, mask
thresholds) and ``rng_rank{r}.pt`` per process (torch, Python, NumPy and the generation engine's own stream). It is
first written as ``step-000010.tmp`` and renamed when complete, so a crash mid-write never leaves a directory that
looks complete.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from capo.errors import CapoError
from capo.rundir import list_checkpoints

STATE_FILE = "trainer_state.pt"
WEIGHTS_ONLY = "WEIGHTS_ONLY"  # marks a checkpoint whose resume state was removed after its run finished


def rng_state() -> dict:
    """torch's CPU and (where present) CUDA generators, Python's and NumPy's: HF sampling on a GPU draws from CUDA's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []  # absent in checkpoints written before it was saved
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return None
    path = ckpts[-1][1]
    if (path / WEIGHTS_ONLY).exists():
        raise CapoError(f"checkpoint {path} holds only the model weights: its optimizer and RNG state were removed "
                        f"after the run finished ({(path / WEIGHTS_ONLY).read_text().strip()}), so it cannot be "
                        f"resumed; train on from it as a new run with --model.path {path} --run.out_dir NEW_DIR")
    missing = [f for f in (STATE_FILE, "config.json") if not (path / f).is_file()]
    if missing:
        raise CapoError(f"checkpoint {path} is incomplete or corrupt (missing {', '.join(missing)}); delete it to "
                        "resume from the previous one")
    return path


def _fsync_dir(path: Path) -> None:
    for p in [*path.rglob("*"), path]:
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(run_dir: Path, step: int, *, model, tokenizer, state: dict, accelerator, keep: int,
                    engine_rng: dict | None = None, weights: dict | None = None) -> Path:
    """Collective: every process calls it. Returns the final checkpoint path. ``engine_rng``: this process's
    generation engine's own RNG stream (None for an engine that draws from torch's global RNG), kept in its
    ``rng_rank{r}.pt`` under ``"engine"``. ``weights``: the state dict to save as the model (a LoRA run's merged
    weights); None: the model's own."""
    ckdir = Path(run_dir) / "checkpoints"
    final = ckdir / f"step-{step:06d}"
    tmp = ckdir / f"step-{step:06d}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(tmp, safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
    torch.save({**rng_state(), "engine": engine_rng}, tmp / f"rng_rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def strip_resume_state(path: Path, why: str) -> int:
    """Keep only the model (weights, config, tokenizer) of checkpoint ``path``: remove its trainer state and RNG
    files and mark it :data:`WEIGHTS_ONLY` (``why`` is written in the mark), so that it still loads with
    ``from_pretrained`` but a resume names the reason instead of calling it corrupt. Returns the bytes freed."""
    path = Path(path)
    (path / WEIGHTS_ONLY).write_text(why.strip() + "\n")
    freed = 0
    for f in [path / STATE_FILE, *path.glob("rng_rank*.pt")]:
        if f.is_file():
            freed += f.stat().st_size
            f.unlink()
    return freed


def load_state(path: Path, rank: int) -> tuple[dict, dict | None]:
    try:
        state = torch.load(path / STATE_FILE, weights_only=False)
    except Exception as e:  # noqa: BLE001
        raise CapoError(f"checkpoint {path} has an unreadable {STATE_FILE} ({e}); delete the checkpoint") from None
    rng_file = path / f"rng_rank{rank}.pt"
    rng = torch.load(rng_file, weights_only=False) if rng_file.is_file() else None
    return state, rng
