"""The integer-literal shortcut decides exactly what math-verify decides."""

import random

from capo.verify import Verdict, Verifier


def test_integer_shortcut_agrees_with_math_verify():
    rng = random.Random(0)
    preds, golds = [], []
    for _ in range(60):
        a = rng.randint(-50, 50)
        b = a if rng.random() < 0.5 else rng.randint(-50, 50)
        fa = rng.choice(["{}", "+{}", "0{}"]) if a >= 0 else "{}"
        preds.append(fa.format(a))
        golds.append(str(b))
    with Verifier(workers=2, exact_match_shortcut=False) as slow:
        want = slow.verify_batch(preds, golds)
        want_classes = slow.equivalence_classes(preds[:12])
    with Verifier(workers=2) as fast:
        got = fast.verify_batch(preds, golds)
        got_classes = fast.equivalence_classes(preds[:12])
        assert fast._pool.n_started == 0  # no worker was ever started: every judgement took the shortcut
    assert got == want
    assert got_classes == want_classes
    assert Verdict.INCORRECT in got and Verdict.CORRECT in got
