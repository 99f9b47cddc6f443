"""The sandboxed math-verify verifier: verdicts, equivalence classes, hard timeouts, threads, no code execution."""

import threading
import time

import pytest

from capo.verify import Verdict, Verifier, looks_like_code
from capo.verify import _worker

C, I, U, T = Verdict.CORRECT, Verdict.INCORRECT, Verdict.UNPARSABLE, Verdict.TIMEOUT


@pytest.mark.parametrize(
    "pred, gold, want",
    [
        ("0.5", r"\frac{1}{2}", C),
        (r"\frac{2}{4}", "1/2", C),
        (r"\dfrac{1}{2}", "0.5", C),
        ("1,000", "1000", C),
        ("3", "4", I),
        ("x+1", "1+x", C),
        (r"\sqrt{8}", r"2\sqrt{2}", C),
        (r"\pi", "3.14", I),
        (r"(1, 2)", r"(1,2)", C),
        (r"(2, 1)", r"(1,2)", I),
        (r"\text{(B)}", r"\text{(B)}", C),
        (None, "1", U),
        ("", "1", U),
        ("   ", "1", U),
    ],
)
def test_verdicts(verifier, pred, gold, want):
    assert verifier.verify(pred, gold) is want


def test_batch_keeps_order_and_length(verifier):
    preds = ["1", "2", None, "4", r"\frac{10}{2}"] * 3
    golds = ["1", "3", "3", "4", "5"] * 3
    assert verifier.verify_batch(preds, golds) == [C, I, U, C, C] * 3
    with pytest.raises(ValueError, match="must match"):
        verifier.verify_batch(["1"], ["1", "2"])


def test_exact_match_shortcut_off_still_agrees():
    with Verifier(workers=1, timeout_s=3.0, exact_match_shortcut=False) as v:
        assert v.verify_batch(["7", r"\frac{1}{3}"], ["7", r"\frac{1}{3}"]) == [C, C]
        assert len(v.last_elapsed) == 2  # both went to a worker


def test_equivalence_classes(verifier):
    answers = ["1/2", "0.5", r"\frac{1}{2}", "3", None, "3.0", "  3 ", "", r"\frac{6}{2}", "7"]
    assert verifier.equivalence_classes(answers) == [0, 0, 0, 1, -1, 1, 1, -1, 1, 2]
    assert verifier.equivalence_classes([]) == []
    assert verifier.equivalence_classes([None, None]) == [-1, -1]
    # refused (code-looking) answers get -1
    assert verifier.equivalence_classes(["__import__('os')", "2"]) == [-1, 0]
    assert verifier.equivalence_classes_batch([["1", "1.0"], ["2", "3"]]) == [[0, 0], [0, 1]]


def test_soft_timeout_on_enormous_expression(verifier):
    t = time.perf_counter()
    assert verifier.verify(r"9^{9^{9^{9}}}", "5") is T
    assert time.perf_counter() - t < verifier.timeout_s + 1.0


def test_hard_timeout_kills_a_stuck_worker_and_recovers(verifier):
    killed = verifier.n_killed
    t = time.perf_counter()
    res = verifier._run_tasks([(_worker.stall_task, 60.0), (_worker.stall_task, 0.0)], on_timeout="timeout")
    took = time.perf_counter() - t
    assert res == ["timeout", "finished"]
    assert verifier.n_killed == killed + 1
    assert verifier.timeout_s <= verifier.last_elapsed[0] < verifier.timeout_s + 0.5
    assert took < verifier.timeout_s + 1.0
    # the pool is usable again right away
    assert verifier.verify_batch(["2", "1/3"], ["2", "0.3333333333"]) == [C, C]


def test_hard_timeout_from_a_thread(verifier):
    out = {}

    def target():
        t = time.perf_counter()
        out["res"] = verifier._run_tasks([(_worker.stall_task, 60.0)], on_timeout="timeout")
        out["took"] = time.perf_counter() - t
        out["verdict"] = verifier.verify("0.25", r"\frac14")

    th = threading.Thread(target=target)
    th.start()
    th.join(30)
    assert not th.is_alive()
    assert out["res"] == ["timeout"]
    assert out["took"] < verifier.timeout_s + 1.0
    assert out["verdict"] is C


def test_concurrent_callers_are_serialised(verifier):
    results = [None] * 4

    def worker(k):
        results[k] = verifier.verify_batch([str(k), str(k + 1)], [str(k), str(k)])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert results == [[C, I]] * 4


def test_constructor_validation():
    with pytest.raises(ValueError, match="workers"):
        Verifier(workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        Verifier(timeout_s=0)
    with pytest.raises(ValueError, match="max_retries"):
        Verifier(max_retries=-1)


@pytest.mark.parametrize(
    "s, code",
    [
        ("__import__('os')", True),
        ("os.system('x')", True),
        ("x.func(1)", True),
        ("$(touch x)", True),
        ("`ls`", True),
        ("1; rm -rf /", True),
        (r"\frac{1}{2}", False),
        (r"\text{(B)}", False),
        ("3.5", False),
        (r"\{1, 2\}", False),
        (r"x \in [0, 1)", False),
        (r"\sqrt{2}/2", False),
    ],
)
def test_looks_like_code(s, code):
    assert looks_like_code(s) is code


# ---------------------------------------------------------------- canary: model text is never executed
PAYLOADS = [
    "__import__('os').system('touch {f}')",
    "__import__(\"os\").system(\"touch {f}\")",
    "exec(\"import os; os.system('touch {f}')\")",
    "eval(\"__import__('os').system('touch {f}')\")",
    "(lambda: __import__('os').system('touch {f}'))()",
    "[c for c in ().__class__.__base__.__subclasses__() if c.__name__=='Popen'][0](['touch','{f}'])",
    "$(touch {f})",
    "`touch {f}`",
    "\\immediate\\write18{{touch {f}}}",
]


def test_canary_model_text_never_executes(verifier, tmp_path):
    paths = [tmp_path / f"CANARY_{i}" for i in range(len(PAYLOADS))]
    texts = []
    for p, payload in zip(paths, PAYLOADS):
        texts.append(payload.format(f=p))
    from capo.verify import extract_answer

    wrapped = [f"The answer is \\boxed{{{t}}}" for t in texts] + [f"<answer>{t}</answer><confidence>1</confidence>" for t in texts]
    preds = [extract_answer(w) for w in wrapped]
    assert all(p is not None for p in preds)
    verdicts = verifier.verify_batch(preds, ["0"] * len(preds))
    assert all(v is not C for v in verdicts)
    # also bypass the parent's refusal filter: hand the raw payloads straight to a worker's math-verify
    raw = verifier._run_tasks(
        [(_worker.verify_task, t, "0", 2.0, 6) for t in texts] + [(_worker.equal_task, t, "0", 2.0, 6) for t in texts],
        on_timeout="timeout",
    )
    assert "correct" not in raw and "equal" not in raw
    time.sleep(0.2)
    assert [p for p in paths if p.exists()] == []


def test_sympy_guard_blocks_sympify_in_worker(verifier, tmp_path):
    """sympy.sympify on raw text evaluates Python; inside a worker the guard blocks it. The second payload
    proves the probe can fail: unguarded sympy (in this test process) really does run the code."""
    canary = tmp_path / "CANARY_sympify"
    payload = f"__import__('os').system('touch {canary}')"
    res = verifier._run_tasks(
        [(_worker.probe_sympify, payload), (_worker.probe_sympify, "x**2 + 1/2"), (_worker.probe_sympify, "x.func")],
        on_timeout="timeout",
    )
    assert res == ["blocked", "evaluated", "blocked"]
    assert not canary.exists()
    import sympy

    control = tmp_path / "CONTROL"
    sympy.sympify(f"__import__('os').system('touch {control}')")  # the unguarded library does execute it
    assert control.exists()


def test_check_generated_code():
    _worker.check_generated_code("Integer (1 )/Symbol ('x' )")
    for bad in ["__import__('os')", "x.y", "(lambda: 1)()", "[c for c in x]", "a[0]", "open('f')", "_private(1)"]:
        with pytest.raises(_worker.UnsafeExpression):
            _worker.check_generated_code(bad)
