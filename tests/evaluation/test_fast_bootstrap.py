"""The per-question-sum bootstrap of ``capo eval`` (capo.evaluation.bootstrap) against the reference: the core's
replicate-by-replicate ``bootstrap_ci`` re-running each metric on each replicate's rows, same seed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from capo.core import calibration as cal
from capo.evaluation.bootstrap import QuestionBootstrap


def _data(seed: int, n_groups: int = 40, k: int = 6, ties: bool = True):
    gen = torch.Generator().manual_seed(seed)
    g = torch.arange(n_groups).repeat_interleave(k) * 7 + 3  # arbitrary, non-contiguous labels
    s = -torch.rand(g.numel(), generator=gen, dtype=torch.float64) * 3
    if ties:  # rounded scores tie within and across questions; a few empty responses (-inf)
        s = torch.round(s * 4) / 4
        s[torch.rand(g.numel(), generator=gen) < 0.05] = -math.inf
    p = torch.rand(n_groups, generator=gen).repeat_interleave(k)  # some questions all right or all wrong
    c = torch.rand(g.numel(), generator=gen) < torch.where(p < 0.2, 0.0, torch.where(p > 0.8, 1.0, p))
    return s, c, g


@pytest.mark.parametrize("seed,ties", [(0, True), (1, True), (2, False)])
def test_intervals_equal_the_replicate_by_replicate_reference(seed, ties):
    s, c, g = _data(seed, ties=ties)
    boot = QuestionBootstrap(g, n_boot=300, seed=seed)
    ref_auc_mean = cal.bootstrap_ci(lambda x, y, z: cal.auc_mean(x, y, z).value, s, c, group_ids=g, n_boot=300,
                                    seed=seed, pass_group_ids=True)
    ref_auroc = cal.bootstrap_ci(lambda x, y: cal.auroc(x, y), s, c, group_ids=g, n_boot=300, seed=seed)
    ref_acc = cal.bootstrap_ci(lambda y: float(y.to(torch.float64).mean()), c, group_ids=g, n_boot=300, seed=seed)
    for got, ref in ((boot.auc_mean_ci(s, c), ref_auc_mean), (boot.auroc_ci(s, c), ref_auroc),
                     (boot.mean_ci(c), ref_acc)):
        assert got == pytest.approx(ref, abs=1e-12, rel=0)
        assert ref[0] < ref[1]  # a real interval, not (nan, nan)


def test_auroc_chunks_give_the_same_interval(monkeypatch):
    """The AUROC runs the replicates in chunks; a chunk of one replicate gives the same interval."""
    import capo.evaluation.bootstrap as fb

    s, c, g = _data(3)
    whole = QuestionBootstrap(g, n_boot=50, seed=0).auroc_ci(s, c)
    monkeypatch.setattr(fb, "CHUNK_CELLS", 1)
    assert QuestionBootstrap(g, n_boot=50, seed=0).auroc_ci(s, c) == pytest.approx(whole, abs=1e-15, rel=0)


def test_replicates_without_both_classes_are_dropped():
    """One question, all correct: every replicate is NaN, as the reference gives (NaN, NaN)."""
    g = torch.zeros(4, dtype=torch.int64)
    s = torch.tensor([-1.0, -2.0, -0.5, -0.1], dtype=torch.float64)
    c = torch.ones(4, dtype=torch.bool)
    boot = QuestionBootstrap(g, n_boot=20, seed=0)
    assert all(math.isnan(v) for v in boot.auroc_ci(s, c) + boot.auc_mean_ci(s, c))


def _rows(n_prompts: int = 30, k: int = 5, seed: int = 0) -> list[dict]:
    s, c, g = _data(seed, n_groups=n_prompts, k=k)
    gen = torch.Generator().manual_seed(seed + 100)
    rows = []
    for i in range(g.numel()):
        lps = (-torch.rand(int(torch.randint(1, 6, (1,), generator=gen)), generator=gen, dtype=torch.float64)).tolist()
        rows.append({"prompt_id": f"p{int(g[i])}", "text": f"t{i}", "verdict": "correct" if c[i] else "incorrect",
                     "mean_logprob": None if math.isinf(s[i]) else float(s[i]),
                     "n_tokens": 0 if math.isinf(s[i]) else 3,
                     "answer_id": i % 3, "confidence": None, "token_logprobs": [] if math.isinf(s[i]) else lps})
    return rows


def test_eval_metrics_intervals_equal_the_reference():
    """compute_metrics' intervals (eval/auc_mean_ci_*, eval/accuracy_ci_*, the estimator table's auroc_ci and
    auc_mean_ci) equal the core's replicate-by-replicate bootstrap of the same measures, same seed."""
    from capo.evaluation.metrics import columns, compute_metrics

    rows = _rows()
    res = compute_metrics(rows, n_boot=200, seed=5)
    m, cols = res["metrics"], columns(rows)
    ref = cal.bootstrap_ci(lambda x, y, z: cal.auc_mean(x, y, z).value, cols.lpm, cols.c, group_ids=cols.g,
                           n_boot=200, seed=5, pass_group_ids=True)
    assert (m["auc_mean_ci_low"], m["auc_mean_ci_high"]) == pytest.approx(ref, abs=1e-12, rel=0)
    ref = cal.bootstrap_ci(lambda y: float(y.to(torch.float64).mean()), cols.c, group_ids=cols.g, n_boot=200, seed=5)
    assert (m["accuracy_ci_low"], m["accuracy_ci_high"]) == pytest.approx(ref, abs=1e-12, rel=0)
    s = torch.tensor([sum(r["token_logprobs"]) for r in rows], dtype=torch.float64)  # the sum_logprob estimator
    s[s == 0] = -math.inf  # an empty response: ranked below every other one
    lpm_row = res["curves"]["estimators"]["sum_logprob"]
    ref = cal.bootstrap_ci(lambda x, y: cal.auroc(x, y), s, cols.c, group_ids=cols.g, n_boot=200, seed=5)
    assert tuple(lpm_row["auroc_ci"]) == pytest.approx(ref, abs=1e-12, rel=0)
    ref = cal.bootstrap_ci(lambda x, y, z: cal.auc_mean(x, y, z).value, s, cols.c, group_ids=cols.g, n_boot=200,
                           seed=5, pass_group_ids=True)
    assert tuple(lpm_row["auc_mean_ci"]) == pytest.approx(ref, abs=1e-12, rel=0)


def test_interval_work_does_not_grow_with_the_replicates(monkeypatch):
    """The metric is computed once per measure, not once per replicate: the per-question AUC runs a fixed number of
    times whether there are 20 or 400 replicates (the replicate-by-replicate path ran it ~n_boot times per
    interval: 326 s for 21,104 rows)."""
    from capo.evaluation.metrics import compute_metrics

    calls = []
    real = cal._group_auc
    monkeypatch.setattr(cal, "_group_auc", lambda *a: calls.append(1) or real(*a))
    rows = _rows()
    counts = []
    for n_boot in (20, 400):
        calls.clear()
        compute_metrics(rows, n_boot=n_boot)
        counts.append(len(calls))
    assert counts[0] == counts[1] < 60


@pytest.mark.parametrize("bad,match", [
    ([-0.1, float("nan")], r"line 3: 'token_logprobs' must be a list of numbers <= 0"),
    ([-0.1, True], r"line 3: 'token_logprobs' must be a list of numbers <= 0"),
    ([-0.1, "x"], r"line 3: 'token_logprobs' must be a list of numbers <= 0"),
    ([-0.1, 0.5], r"line 3: 'token_logprobs' must be a list of numbers <= 0"),
])
def test_token_lists_checked_over_the_whole_file_still_name_the_line(tmp_path, bad, match):
    """The per-token lists are checked over all rows at once; a bad value still names its line, and integer entries
    are read as floats."""
    from capo.errors import DataError
    from capo.evaluation.run import _read_generations

    rows = [{"prompt_id": "q", "text": "x", "gold": "1", "token_logprobs": v, "token_entropy": [0, 1.5]}
            for v in ([-0.1, 0], [-1, -2.5], bad)]
    gen = tmp_path / "g.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=match):
        _read_generations(gen)
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    norm = _read_generations(gen)
    assert [x["tokens"]["token_logprobs"] for x in norm] == [[-0.1, 0.0], [-1.0, -2.5]]
    assert all(type(v) is float for x in norm for f in ("token_logprobs", "token_entropy") for v in x["tokens"][f])
    assert [x["sum"] for x in norm] == [-0.1, -3.5]
