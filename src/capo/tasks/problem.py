"""The record every dataset loader produces, and what every task generated in code shares: its splits
(:data:`SPLITS`, :func:`check_split`), its per-question random stream and the validation of its
``data.task_options``."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

SPLITS = ("train", "eval")  # the splits of every task generated in code


@dataclass(frozen=True)
class Problem:
    """One prompt with its gold answer.

    ``answer`` is the gold final answer as a string (e.g. ``"42"`` or ``"\\frac{1}{2}"``), already extracted from
    any worked solution. ``meta`` holds optional extra fields (level, subject, source row); ``meta["group"]``, when
    set, is the category ``capo eval`` breaks its metrics down by (facts: the relation).
    """

    id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False)


def check_split(split: str) -> None:
    """ValueError naming ``split`` and the allowed ones unless it is one of :data:`SPLITS`."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not allowed; allowed values: {', '.join(SPLITS)}")


def question_rng(task: str, split: str, seed: int, i: int) -> random.Random:
    """Question ``i``'s own random stream for (``task``, ``split``, ``seed``): seeded by the sha256 of the four, so
    question i does not depend on how many are drawn and the splits and seeds draw independently."""
    h = hashlib.sha256(f"{task}/{split}/{seed}/{i}".encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


def fill_options(task: str, defaults: dict, options: dict | None, value: Callable[[str, object], object]) -> dict:
    """``defaults`` updated with ``options`` (a task's ``data.task_options``); ConfigError naming an unknown key.
    ``value(key, val)`` returns the value to keep, or raises ConfigError naming ``data.task_options.<key>``."""
    from capo.errors import ConfigError

    opts = dict(defaults)
    for key, val in (options or {}).items():
        if key not in defaults:
            raise ConfigError(f"data.task_options: unknown key {key!r} for {task!r}; allowed keys: "
                              f"{', '.join(defaults)}")
        opts[key] = value(key, val)
    return opts
