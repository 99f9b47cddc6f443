"""The record every dataset loader produces."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One prompt with its gold answer.

    ``answer`` is the gold final answer as a string (e.g. ``"42"`` or ``"\\frac{1}{2}"``), already extracted from
    any worked solution. ``meta`` holds optional extra fields (level, subject, source row).
    """

    id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False)
