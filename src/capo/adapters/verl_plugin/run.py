"""The state of one verl run and of one advantage call, as objects (the plugin's modules keep none).

:class:`CapoRun` is one training run's state: CAPO's mask thresholds (quantile ones freeze on the run's first batch)
and the verifier SEED-GRPO's clusters use. verl's trainer object owns it (:meth:`CapoRun.of`): the v1 trainer's
advantage step reads it from ``self``; the legacy trainer's ``fit`` makes its run the current one for the duration
of training (:meth:`CapoRun.active`). A ``compute_advantage`` call outside any run (e.g. a test) is a run of its own.

:class:`BatchContext` is what capo's estimators see of the batch during one ``compute_advantage`` call (verl passes
custom estimators only rewards, mask, uids and config).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from capo.rollout.step import MaskThresholds

__all__ = ["BatchContext", "CapoRun", "batch_context", "current_batch"]

_MASK_KEYS = ("noise_mask", "mask_low", "mask_high", "mask_q_low", "mask_q_high")


class CapoRun:
    """One verl run's state. ``verifier``: a capo Verifier to use (default: one started on first use, closed by
    :meth:`close`)."""

    _current: contextvars.ContextVar = contextvars.ContextVar("capo_verl_run", default=None)

    def __init__(self, verifier=None):
        self._masks: dict[tuple, MaskThresholds] = {}
        self._verifier, self._owns_verifier = verifier, verifier is None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, owner) -> CapoRun:
        """The run owned by ``owner`` (verl's trainer object), created on first use."""
        run = owner.__dict__.get("_capo_run")
        if run is None:
            run = owner.__dict__["_capo_run"] = cls()
        return run

    @classmethod
    def current(cls) -> CapoRun | None:
        """The run made current by :meth:`active` (the legacy trainer's ``fit``), or None."""
        return cls._current.get()

    @contextlib.contextmanager
    def active(self) -> Iterator[CapoRun]:
        token = CapoRun._current.set(self)
        try:
            yield self
        finally:
            CapoRun._current.reset(token)

    def mask(self, opts: dict, engine: str) -> MaskThresholds:
        """The run's thresholds for this mask configuration (``opts``: algorithm.capo's noise_mask, resolved and on,
        and its mask_* knobs)."""
        key = tuple(opts[k] for k in _MASK_KEYS)
        with self._lock:
            if key not in self._masks:
                self._masks[key] = MaskThresholds(*key, engine=engine)
            return self._masks[key]

    def verifier(self):
        with self._lock:
            if self._verifier is None:
                from capo.verify import Verifier

                self._verifier = Verifier(workers=1)
            return self._verifier

    def close(self) -> None:
        """Stop the verifier this run started (a verifier passed in stays the caller's)."""
        if self._owns_verifier and self._verifier is not None:
            self._verifier.close()
            self._verifier = None


@dataclass
class BatchContext:
    """What capo's estimators see of the batch during one compute_advantage call."""

    data: Any  # verl's DataProto
    run: CapoRun
    temperature: float | None = None  # the rollout temperature verl's log-probs were computed at
    # the reward function's per-row values from the v1 trainer's extra_fields (legacy trainer: data.non_tensor_batch)
    extra: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)  # the batch metrics (v1: merged into verl's step metrics)


_BATCH: contextvars.ContextVar = contextvars.ContextVar("capo_verl_batch", default=None)


@contextlib.contextmanager
def batch_context(ctx: BatchContext) -> Iterator[BatchContext]:
    """Expose ``ctx`` to capo's estimators for the duration."""
    token = _BATCH.set(ctx)
    try:
        yield ctx
    finally:
        _BATCH.reset(token)


def current_batch() -> BatchContext | None:
    return _BATCH.get()
