"""`capo eval --generations` gives the numbers it gave before it was made fast (100k rows in a minute).

A small generations file that reaches every branch of the fast path (all four per-token lists, tied and empty
responses, a ``-Infinity`` log-prob and a 23-digit gold answer that only the standard library's JSON reads exactly,
integers inside a per-token list, verbal confidences on some rows, unicode) is evaluated, and every metric and curve
must equal, to 1e-9, the values capo computed at commit 817fa95, before the speed-up (``tests/data/generations_pinned
.json``); the rows written to ``generations.jsonl`` must hold the same values (a digest of their parsed values).

The pinned values were written by that commit's code with
``PYTHONPATH=<a checkout of 817fa95>/src python tests/evaluation/test_generations_pinned.py --write``; rewrite them only
for a deliberate change of a metric, and say so. Rewritten once: 2026-11-28, for `weighted_vote` of the probability
estimators (an empty response had switched their weights to exp(s - max) in every question): the four
`curves/estimators/*/weighted_vote` values of tail, bottom_group, lowest_group and self_certainty changed, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import tempfile
from pathlib import Path

import torch

from capo.evaluation.run import EvalSettings, run_eval
from capo.rundir import read_jsonl_rows

PINNED = Path(__file__).resolve().parents[1] / "data" / "generations_pinned.json"
N_BOOT = 300
# curves added after the pin, each tested on its own (the lengths check: tests/evaluation/test_lengths.py)
NEWER_CURVES = ("lengths",)


def write_generations(path: Path, questions: int = 30, k: int = 6) -> None:
    """The file of the module docstring: ``questions`` x ``k`` rows, seeded."""
    rng = random.Random(52)
    lines = []
    for i in range(questions * k):
        q, j = divmod(i, k)
        gold = "12345678901234567890123" if q == 3 else str(q * 7)
        p_right = (0.0, 1.0, 0.5)[q % 3] if q < 6 else 0.6
        ans = gold if rng.random() < p_right else str(int(gold) + rng.randint(1, 2))
        n = 0 if (q, j) == (5, 2) else rng.randint(3, 30)
        row = {"prompt_id": f"q{q}" if q % 4 else q, "sample_idx": j, "prompt": f"Combien font {q} x 7 ? é",
               "gold": int(gold) if q == 3 else gold,
               "text": "" if n == 0 else (f"Réponse : \\boxed{{{ans}}}." if (q, j) != (7, 1) else "no answer"),
               "token_logprobs": [round(-rng.expovariate(4.0), 2) for _ in range(n)],
               "token_entropy": [round(rng.expovariate(1.0), 3) for _ in range(n)],
               "token_kl_uniform": [round(rng.expovariate(0.5), 3) for _ in range(n)],
               "token_topk_conf": [round(rng.expovariate(0.3), 2) for _ in range(n)],
               "finish_reason": "length" if j == k - 1 and q % 5 == 0 else "stop"}
        if (q, j) == (8, 0):
            row["token_logprobs"][1] = -math.inf
        if (q, j) == (9, 4):
            row["token_entropy"][0] = 0  # an integer: read as 0.0
        if q % 2 and j < 4:
            row["confidence"] = round(rng.random(), 2)
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    path.write_text("".join(lines), encoding="utf-8")


def evaluate(tmp: Path) -> dict:
    """{metrics, curves, rows_sha256} of ``capo eval --generations`` on the file (timings and config left out)."""
    gen = tmp / "in.jsonl"
    write_generations(gen)
    run_eval(EvalSettings(generations=str(gen), n_boot=N_BOOT, verify_workers=1), tmp / "run", progress=False)
    payload = json.loads((tmp / "run" / "metrics.json").read_text())
    rows = read_jsonl_rows(tmp / "run" / "generations.jsonl")
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    return {"metrics": {k: v for k, v in payload["metrics"].items() if not k.startswith("time_")},
            "curves": {k: v for k, v in payload["curves"].items() if k not in NEWER_CURVES}, "rows_sha256": digest}


def differences(got, want, path: str = "", tol: float = 1e-9) -> list[str]:
    """Where two JSON values differ: numbers by more than ``tol`` (NaN equals NaN), anything else at all."""
    if isinstance(want, dict) and isinstance(got, dict):
        if got.keys() != want.keys():
            return [f"{path}: keys differ: {sorted(got.keys() ^ want.keys())}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}/{k}", tol)]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items, pinned {len(want)}"]
        return [d for i, (x, y) in enumerate(zip(got, want)) for d in differences(x, y, f"{path}[{i}]", tol)]
    numbers = (int, float)
    if isinstance(got, numbers) and isinstance(want, numbers) and bool not in (type(got), type(want)):
        same = (math.isnan(got) and math.isnan(want)) or got == want or abs(got - want) <= tol
        return [] if same else [f"{path}: {got!r}, pinned {want!r}"]
    return [] if got == want else [f"{path}: {got!r}, pinned {want!r}"]


def test_every_metric_curve_and_row_equals_the_pinned_values(tmp_path):
    want = json.loads(PINNED.read_text())
    got = evaluate(tmp_path)
    assert len(got["curves"]["estimators"]) == 10  # every estimator ran, verbal included
    bad = differences(got, want)
    assert not bad, f"{len(bad)} values differ from the pinned ones, e.g.:\n" + "\n".join(bad[:20])


def test_the_comparison_can_fail():
    """A change of 1e-8 in one interval end, a dropped key, or one changed row is caught."""
    want = json.loads(PINNED.read_text())
    moved = json.loads(PINNED.read_text())
    moved["curves"]["estimators"]["lpm"]["auroc_ci"][0] += 1e-8
    assert differences(moved, want) == ["/curves/estimators/lpm/auroc_ci[0]: "
                                         f"{moved['curves']['estimators']['lpm']['auroc_ci'][0]!r}, pinned "
                                         f"{want['curves']['estimators']['lpm']['auroc_ci'][0]!r}"]
    del moved["metrics"]["auroc"]
    assert differences(moved, want)[-1] == "/metrics: keys differ: ['auroc']"
    assert differences({**want, "rows_sha256": "0"}, want) == [f"/rows_sha256: '0', pinned {want['rows_sha256']!r}"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        PINNED.write_text(json.dumps(evaluate(Path(d)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINNED}")
