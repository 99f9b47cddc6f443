"""Turn response texts into verdicts: extracted answer, correctness (math-verify), verbal confidence, format."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from capo.verify import Verdict, Verifier, extract_answer, extract_rlcr


@dataclass
class Graded:
    """Per-response verdicts, N rows. confidence is NaN where the response has no valid <confidence>."""

    answers: list[str | None]
    verdicts: list[Verdict]
    correct: torch.Tensor  # [N] bool
    confidence: torch.Tensor  # [N] float32
    format_ok: torch.Tensor  # [N] bool (RLCR tags well formed)
    reward_errors: int = 0  # user reward function failures scored 0 (algo.reward_errors=zero)


def grade(texts: Sequence[str], golds: Sequence[str], answer_format: str, verifier: Verifier) -> Graded:
    """Extract each response's answer (``answer_format``: auto, rlcr, boxed, gsm8k) and judge it against its gold."""
    parses = [extract_rlcr(t) for t in texts]
    answers = [extract_answer(t, answer_format) for t in texts]
    verdicts = verifier.verify_batch(answers, list(golds))
    correct = torch.tensor([v == Verdict.CORRECT for v in verdicts], dtype=torch.bool)
    conf = torch.tensor([float("nan") if p.confidence is None else p.confidence for p in parses], dtype=torch.float32)
    fmt = torch.tensor([p.format_ok for p in parses], dtype=torch.bool)
    return Graded(answers, verdicts, correct, conf, fmt)
