"""Verdicts that reach a user through the verifier's public API only (``verify_batch``, ``verify``, ``gold_parses``,
``equivalence_classes``): unparsable answers and golds, timeouts inside a batch, the integer shortcut's edges.

Each case is hand-chosen so that a plausible bug (a mutant of the verifier) changes the expected list; the inputs
below were checked against math-verify 0.8: ``\\text{}`` and ``}{`` do not parse, ``9^{9^{9^{9}}}`` times out.
"""

import pytest

from capo.verify import Verdict, Verifier

C, I, U, T = Verdict.CORRECT, Verdict.INCORRECT, Verdict.UNPARSABLE, Verdict.TIMEOUT
UNPARSABLE = [r"\text{}", "}{"]  # math-verify extracts nothing from either


@pytest.mark.parametrize("bad", UNPARSABLE)
def test_unparsable_answer_is_unparsable_not_incorrect(verifier, bad):
    # a wrong-but-parsable answer next to it is INCORRECT: the two verdicts must not be merged
    assert verifier.verify_batch([bad, "3", r"\frac{1}{2}"], [r"\frac{1}{2}", "4", "0.5"]) == [U, I, C]


@pytest.mark.parametrize("bad", UNPARSABLE)
def test_unparsable_gold_makes_the_item_unparsable(verifier, bad):
    # the worker reports "gold_unparsable"; verify_batch maps it to UNPARSABLE, whatever the prediction
    assert verifier.verify_batch([r"\frac{1}{2}", "0.5", "7"], [bad, bad, "7.0"]) == [U, U, C]
    assert verifier.verify(r"\frac{1}{2}", bad) is U


def test_gold_parses_reports_each_gold(verifier):
    assert verifier.gold_parses([r"\frac{1}{2}", r"\text{}", "}{", "  42 ", "x+1"]) == [True, False, False, True, True]
    assert verifier.gold_parses([]) == []


def test_refused_inputs_never_reach_a_worker(verifier):
    long = "1" * (verifier.max_answer_chars + 1)
    ok = "1" * verifier.max_answer_chars  # exactly at the limit: judged (an integer literal, equal to itself)
    assert verifier.verify_batch([long, ok, "2", "2"], ["1", ok, long, None]) == [U, C, U, U]


def test_integer_shortcut_edges(verifier):
    # integer literals are compared as integers (sign, leading zeros) without a worker; a non-integer goes to one
    preds = ["-3", "+3", "007", "3", " 3 ", "3.0", "31"]
    golds = ["3", "3", "7", "-3", "3", "3", "3"]
    assert verifier.verify_batch(preds, golds) == [I, C, C, I, C, C, I]


def test_timeout_inside_a_batch_keeps_order_and_the_other_verdicts(verifier):
    # the enormous power exceeds the time bound; the items around it are judged normally and stay in place
    preds = [r"\frac{1}{2}", r"9^{9^{9^{9}}}", "3", r"\text{}"]
    golds = ["0.5", "5", "4", "1"]
    killed = verifier.n_killed
    assert verifier.verify_batch(preds, golds) == [C, T, I, U]
    assert verifier.n_killed == killed  # the in-worker (soft) alarm stopped it, before the hard limit: no restart


def test_equivalence_classes_unparsable_and_timeout_answers(verifier):
    # unparsable answers and an answer whose comparison times out get -1; the rest are classed by first occurrence
    answers = [r"\text{}", "2", r"9^{9^{9^{9}}}", r"\frac{4}{2}", "}{", "5", "2.0"]
    killed = verifier.n_killed
    assert verifier.equivalence_classes(answers) == [-1, 0, -1, 0, -1, 1, 0]
    assert verifier.n_killed == killed  # the soft alarm stopped the enormous power's probe: no worker killed


def test_equivalence_classes_compare_each_pair_of_distinct_answers_once(verifier):
    # 3 distinct parsable answers (the repeat is deduplicated first): 3 comparisons in the last dispatch, not 6 or 9
    assert verifier.equivalence_classes([r"\frac{1}{2}", "0.5", "x", r"\frac{1}{2}"]) == [0, 0, 1, 0]
    assert len(verifier.last_elapsed) == 3


def test_no_shortcut_verifier_judges_integers_in_a_worker():
    with Verifier(workers=1, timeout_s=3.0, exact_match_shortcut=False) as v:
        assert v.verify_batch(["007", "-3", r"\text{}"], ["7", "3", "1"]) == [C, I, U]
        assert v.equivalence_classes(["3", "03", "4", None]) == [0, 0, 1, -1]


def test_equivalence_classes_integer_literals(verifier):
    # distinct strings that are equal integers ("3", "03"; "4", "+4") share a class without a worker; a pair of
    # unequal integers ("3", "4") does not stop the search for "3"'s other partners ("3.0", compared by math-verify)
    assert verifier.equivalence_classes(["3", "4", "03", "3.0", "+4", "x"]) == [0, 1, 0, 0, 1, 2]
    assert verifier.equivalence_classes_batch([["7", "07"], ["5", "6", "5.0"]]) == [[0, 0], [0, 1, 0]]


@pytest.mark.parametrize("cpus, workers", [(1, 1), (2, 2), (8, 4), (None, 1)])
def test_default_worker_count_is_the_cpu_count_up_to_4(monkeypatch, cpus, workers):
    import capo.verify.verifier

    monkeypatch.setattr(capo.verify.verifier.os, "cpu_count", lambda: cpus)
    assert Verifier().workers == workers  # workers start lazily: nothing is started here


def test_documented_defaults_and_knobs():
    v = Verifier()  # workers start lazily: nothing is started here
    assert (v.timeout_s, v.max_answer_chars, v.memory_limit_mb, v.float_rounding, v.startup_timeout_s) == (
        5.0, 1000, 4096, 6, 120.0)
    assert v.exact_match_shortcut is True
    assert v.n_killed == 0 and v.last_elapsed == []
    # the in-worker (soft) limit is a grace period before the hard one: a quarter of it, at most 1 s
    assert Verifier(timeout_s=2.0).grace_s == 0.5 and Verifier(timeout_s=8.0).grace_s == 1.0
    w = Verifier(workers=3, timeout_s=0.5, max_answer_chars=10, memory_limit_mb=None, float_rounding=2)
    assert (w.workers, w.timeout_s, w.max_answer_chars, w.memory_limit_mb, w.float_rounding) == (3, 0.5, 10, None, 2)
    assert w.verify_batch(["1" * 11, "12"], ["1", "12"]) == [U, C]  # the length limit, judged without a worker
    assert w._pool.n_started == 0 and w._pool.workers == []  # nothing was sent to a worker: none was started
