"""Run logging: metrics.jsonl (one row per step), TensorBoard scalars, and the progress bar's headline metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

from capo.rundir import atomic_write_text, read_jsonl_rows


class PolicyMeans:
    """The ``policy/*`` means of one update (docs/metrics.md): each optimizer step's value pools its micro-batches and
    processes, each micro-batch's mean weighted by its real tokens (or its responses with a token, for a loss's
    per-response metrics), so it is the step's mean over real tokens whatever the micro-batch size (a mean of
    micro-batch means weighted by rows was not); the update's value is the mean over the optimizer steps taken (a
    step skipped for a NaN/inf gradient counts nowhere)."""

    def __init__(self):
        self.steps: list[dict[str, list[float]]] = []  # per step taken: key -> [weighted sum, weight]
        self.step: dict[str, list[float]] = {}  # the optimizer step under way

    def add(self, metrics: dict[str, tuple[float, float]]) -> None:
        """One micro-batch's ``{key: (mean, count)}``."""
        for k, (v, w) in metrics.items():
            s = self.step.setdefault(k, [0.0, 0.0])
            s[0], s[1] = s[0] + v * w, s[1] + w

    def end_step(self, taken: bool) -> None:
        if taken:  # every process takes the same steps: the gradient norm is of the all-reduced gradient
            self.steps.append(self.step)
        self.step = {}

    def result(self, acc) -> dict[str, float]:
        """Every key's mean over the steps taken, each step's over all processes (every process calls this, one
        without a row joining with nothing)."""
        import torch
        from accelerate.utils import gather_object

        keys = sorted({k for st in self.steps for k in st})
        if acc.num_processes > 1:
            keys = sorted({k for ks in gather_object([keys]) for k in ks})
        if not keys or not self.steps:
            return {}
        sums = torch.tensor([[st.get(k, [0.0, 0.0]) for k in keys] for st in self.steps], dtype=torch.float64,
                            device=acc.device)  # [steps, keys, 2]
        sums = (acc.reduce(sums, "sum") if acc.num_processes > 1 else sums).cpu()
        has = sums[..., 1] > 0
        per_step = torch.where(has, sums[..., 0] / sums[..., 1].clamp(min=1e-300), torch.zeros((), dtype=sums.dtype))
        n = has.sum(0)
        return {k: float(per_step[:, i].sum() / n[i]) if n[i] > 0 else math.nan for i, k in enumerate(keys)}


class MetricsLogger:
    """Appends one JSON row per step to RUN/metrics.jsonl and mirrors scalars to TensorBoard (RUN/tb).

    On resume from step s, rows with step > s (written after the checkpoint by the interrupted run) are dropped
    first, so the file of a resumed run equals that of an uninterrupted one.
    """

    def __init__(self, run_dir: Path, start_step: int, enabled: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.start_step = start_step
        self.last_step = -1  # the step of the last row kept (-1: none)
        self.tb = None
        self.f = None

    def __enter__(self):
        if not self.enabled:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # a torn last line from a crash is dropped with the rows past the checkpoint
            keep = [r for r in read_jsonl_rows(self.path) if isinstance(r, dict) and r.get("step", math.inf)
                    <= self.start_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))
            self.last_step = max((r["step"] for r in keep), default=-1)
        self.f = open(self.path, "a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.path.parent / "tb"), purge_step=self.start_step + 1)
        except ImportError:  # pragma: no cover
            self.tb = None
        return self

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.f.write(json.dumps(clean) + "\n")
        self.f.flush()
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, row["step"])

    def __exit__(self, *exc):
        if self.f:
            self.f.close()
        if self.tb is not None:
            self.tb.close()


def progress_info(m: dict) -> str:
    """The headline metrics shown beside the training progress bar."""

    def f(k):
        v = m.get(k)
        return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.3f}"

    return f"acc {f('train/accuracy')} auc_mean {f('calib/auc_mean')} reward {f('train/reward_mean')}"
