"""Run logging: metrics.jsonl (one row per step), TensorBoard scalars, and a rich progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLogger:
    """Appends one JSON row per step to RUN/metrics.jsonl and mirrors scalars to TensorBoard (RUN/tb).

    On resume from step s, rows with step > s (written after the checkpoint by the interrupted run) are dropped
    first, so the file of a resumed run equals that of an uninterrupted one.
    """

    def __init__(self, run_dir: Path, start_step: int, enabled: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.start_step = start_step
        self.tb = None
        self.f = None

    def __enter__(self):
        if not self.enabled:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            rows = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
            keep = []
            for ln in rows:
                try:
                    if json.loads(ln)["step"] <= self.start_step:
                        keep.append(ln)
                except (json.JSONDecodeError, KeyError):
                    break  # a torn last line from a crash
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(ln + "\n" for ln in keep))
            tmp.replace(self.path)
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


class Progress:
    """A rich progress bar with rate, ETA and the latest headline metrics."""

    def __init__(self, total: int, start: int, enabled: bool = True, label: str = "train"):
        self.enabled, self.total, self.start, self.label = enabled, total, start, label
        self.bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RP, TextColumn, TimeElapsedColumn
            from rich.progress import TimeRemainingColumn

            self.bar = RP(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                          TextColumn("{task.fields[info]}"), transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total, completed=self.start, info="")
        return self

    def update(self, step: int, m: dict) -> None:
        if self.bar is None:
            return

        def f(k):
            v = m.get(k)
            return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.3f}"

        info = f"acc {f('train/accuracy')} auc {f('calib/auc_mean')} reward {f('train/reward_mean')}"
        self.bar.update(self.task, completed=step, info=info)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
