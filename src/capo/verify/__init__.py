"""Answer extraction and mathematical-equivalence verification.

- :mod:`capo.verify.extract`: ``extract_boxed``, ``extract_gsm8k``, ``extract_rlcr``, ``extract_answer`` (pure,
  linear-time string functions).
- :mod:`capo.verify.verifier`: :class:`Verifier` runs math-verify in sandboxed worker processes with a hard
  per-call timeout and returns a :class:`Verdict` for every input (:class:`WorkerError` when its workers cannot
  start, with their own exception).
"""

from capo.verify.extract import (
    ANSWER_FORMATS,
    DEFAULT_ANSWER_FORMAT,
    STATED_FORMATS,
    RlcrParse,
    extract_answer,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    extract_outcome,
    extract_percent,
    extract_rlcr,
    normalize_number,
)
from capo.verify.verifier import Verdict, Verifier, WorkerError, looks_like_code

__all__ = [
    "ANSWER_FORMATS",
    "DEFAULT_ANSWER_FORMAT",
    "STATED_FORMATS",
    "RlcrParse",
    "Verdict",
    "Verifier",
    "WorkerError",
    "extract_answer",
    "extract_boxed",
    "extract_gsm8k",
    "extract_last_number",
    "extract_outcome",
    "extract_percent",
    "extract_rlcr",
    "looks_like_code",
    "normalize_number",
]
