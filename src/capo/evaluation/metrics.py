"""All evaluation metrics from generation rows (one row per response): calibration, test-time scaling, counts.

Every key is defined in docs/metrics.md (section "Evaluation metrics", namespace ``eval/``).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, NamedTuple

import torch

from capo.core import calibration as cal
from capo.core import voting
from capo.evaluation.bootstrap import QuestionBootstrap
from capo.evaluation.estimators import estimator_table, unavailable_estimators
from capo.evaluation.lengths import length_check
from capo.tasks.stochastic import stated_means_summary, stated_question_means
from capo.rollout.grading import answer_classes

if TYPE_CHECKING:
    from capo.verify import Verifier

__all__ = ["columns", "compute_metrics", "pass_ks", "reliability_points", "row_rates"]


def pass_ks(k: int) -> list[int]:
    """The k' at which pass@k' / mean@k' are reported: 1, 2, 4, ... up to k, and k itself."""
    out, j = [], 1
    while j < k:
        out.append(j)
        j *= 2
    out.append(k)
    return out


def _finite(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))) else float(x)


def _curve_points(x: torch.Tensor, y: torch.Tensor, max_points: int = 200) -> dict:
    n = x.numel()
    if n > max_points:
        idx = torch.linspace(0, n - 1, max_points).round().long()
        x, y = x[idx], y[idx]
    return {"x": [float(v) for v in x.tolist()], "y": [float(v) for v in y.tolist()]}


class _Columns(NamedTuple):
    """The per-row tensors the metrics are computed from (one entry per generation row)."""

    n_prompts: int
    g: torch.Tensor  # prompt index, numbered by first occurrence
    c: torch.Tensor  # verdict == "correct"
    lpm: torch.Tensor  # mean token log-prob; -inf for an empty response
    verbal: torch.Tensor  # verbal confidence; NaN where absent
    has_verbal: bool  # any row has a verbal confidence
    aids: torch.Tensor  # answer equivalence class within its prompt (-1 = none)


def _columns(rows: list[dict]) -> _Columns:
    pids: dict[str, int] = {}
    for r in rows:
        pids.setdefault(str(r["prompt_id"]), len(pids))
    g = torch.tensor([pids[str(r["prompt_id"])] for r in rows], dtype=torch.int64)
    c = torch.tensor([r["verdict"] == "correct" for r in rows], dtype=torch.bool)
    lpm = torch.tensor(
        [(-math.inf if r["mean_logprob"] is None else float(r["mean_logprob"])) for r in rows], dtype=torch.float64
    )
    conf_raw = [r.get("confidence") for r in rows]
    has_verbal = any(q is not None for q in conf_raw)
    verbal = torch.tensor([math.nan if q is None else float(q) for q in conf_raw], dtype=torch.float64)
    aids = torch.tensor([int(r["answer_id"]) for r in rows], dtype=torch.int64)
    return _Columns(len(pids), g, c, lpm, verbal, has_verbal, aids)


columns = _columns  # public: the per-row tensors of generation rows (capo.evaluation.compare resamples them)


def _bootstrap_metrics(cols: _Columns, n_boot: int, seed: int) -> dict:
    """Bootstrap intervals of AUC-mean and accuracy over questions (cluster bootstrap); none for one question."""
    if not (n_boot > 0 and cols.n_prompts > 1):
        return {}
    boot = QuestionBootstrap(cols.g, n_boot, seed)
    m = {}
    m["auc_mean_ci_low"], m["auc_mean_ci_high"] = boot.auc_mean_ci(cols.lpm, cols.c)
    m["accuracy_ci_low"], m["accuracy_ci_high"] = boot.mean_ci(cols.c)
    return m


def _path_ids(rows: list[dict], g: torch.Tensor) -> torch.Tensor:
    """One id per unique sampled path: identical texts of one prompt are one path."""
    path_key: dict[tuple[int, str], int] = {}
    return torch.tensor([path_key.setdefault((int(gi), r["text"]), len(path_key)) for gi, r in zip(g.tolist(), rows)])


def _scaling_metrics(rows: list[dict], cols: _Columns, lpm_finite: torch.Tensor) -> dict:
    """Test-time scaling: mean@k, pass@k' and the accuracy of each voting / selection rule."""
    c, g, aids = cols.c, cols.g, cols.aids
    counts = Counter(int(x) for x in g.tolist())
    k_min = min(counts.values())
    m = {"k_min": float(k_min), "mean_at_k": voting.mean_at_k(c, g)}
    for kk in pass_ks(k_min):
        m[f"pass_at_{kk}"] = voting.mean_pass_at_k(c, g, kk)
    m["majority_vote"] = voting.majority_vote(aids, c, g).accuracy
    path_ids = _path_ids(rows, g)
    m["perplexity_consistency"] = voting.perplexity_consistency(aids, c, g, lpm_finite, path_ids=path_ids).accuracy
    m["max_confidence_lpm"] = voting.max_confidence(aids, c, g, lpm_finite).accuracy
    if cols.has_verbal:
        vq = torch.nan_to_num(cols.verbal, nan=0.0)
        m["confidence_weighted_vote"] = voting.confidence_weighted_vote(aids, c, g, vq).accuracy
        m["max_confidence_verbal"] = voting.max_confidence(aids, c, g, cols.verbal).accuracy  # NaN: below any q
    return m


def _count_metrics(rows: list[dict]) -> dict:
    """Verdict counts, the fraction that hit the length limit, mean length and empty responses."""
    m = {}
    verdicts = Counter(r["verdict"] for r in rows)
    for v in ("correct", "incorrect", "unparsable", "timeout"):
        m[f"verdict_{v}"] = float(verdicts.get(v, 0))
    fin = Counter(r.get("finish_reason") for r in rows)
    m["finish_length_frac"] = fin.get("length", 0) / len(rows)
    known = [int(r["n_tokens"]) for r in rows if r.get("n_tokens") is not None]
    m["mean_tokens"] = sum(known) / len(known) if known else math.nan
    m["empty_responses"] = float(sum(1 for n in known if n == 0))
    return m


def reliability_points(confidence, correct, n_bins: int = 10) -> dict:
    """The reliability diagram's points (``bin_edges``, per-bin mean ``confidence``, ``accuracy`` and ``count``; the
    form :func:`capo.evaluation.plots.plot_reliability_panels` draws) of confidences [M] in [0, 1] against 0/1
    outcomes [M], in ``n_bins`` equal-width bins, the binning of `capo eval`'s ECE."""
    conf = torch.as_tensor(confidence, dtype=torch.float64)
    return _reliability_points(cal.reliability_curve(conf, torch.as_tensor(correct, dtype=torch.float64),
                                                     n_bins=n_bins))


def _reliability_points(rel) -> dict:
    return {
        "bin_edges": [float(x) for x in rel.bin_edges.tolist()],
        "confidence": [_finite(x) for x in rel.bin_confidence.tolist()],
        "accuracy": [_finite(x) for x in rel.bin_accuracy.tolist()],
        "count": [int(x) for x in rel.bin_count.tolist()],
    }


def _verbal_curves(cols: _Columns, n_bins: int) -> dict:
    """Reliability and precision-coverage of the verbal confidence, over the rows that have one."""
    present = ~torch.isnan(cols.verbal)
    if not bool(present.any()):
        return {}
    verbal, c = cols.verbal[present], cols.c[present]
    curves = {"reliability_verbal": _reliability_points(cal.reliability_curve(verbal, c, n_bins=n_bins))}
    vsel = cal.selective_curve(verbal, c)
    curves["selective_verbal"] = _curve_points(vsel.coverage, vsel.precision)
    return curves


def _per_prompt_accuracy(rows: list[dict]) -> dict:
    per_prompt = defaultdict(list)
    for r in rows:
        per_prompt[str(r["prompt_id"])].append(r["verdict"] == "correct")
    return {pid: sum(v) / len(v) for pid, v in per_prompt.items()}


def _curves(rows: list[dict], cols: _Columns, lpm_finite: torch.Tensor, n_bins: int) -> dict:
    """Plot data: reliability diagrams, confidence histograms, precision-coverage curves, per-prompt accuracy."""
    lpm, c = cols.lpm, cols.c
    finite = ~torch.isinf(lpm)
    p = torch.where(finite, torch.exp(lpm), torch.zeros_like(lpm))
    curves: dict = {
        "reliability": _reliability_points(cal.reliability_curve(p, c, n_bins=n_bins)),
        "hist": {"correct": [float(x) for x in p[c].tolist()], "incorrect": [float(x) for x in p[~c].tolist()]},
    }
    sel = cal.selective_curve(lpm_finite, c)
    curves["selective"] = _curve_points(sel.coverage, sel.precision)
    if cols.has_verbal:
        curves.update(_verbal_curves(cols, n_bins))
    curves["per_prompt_accuracy"] = _per_prompt_accuracy(rows)
    return curves


def row_rates(rows: list[dict]) -> torch.Tensor | None:
    """[N] each row's true rate (stochastic outcomes: rows carrying ``rate``), NaN where absent; None when none has."""
    if not any(r.get("rate") is not None for r in rows):
        return None
    return torch.tensor([math.nan if r.get("rate") is None else float(r["rate"]) for r in rows], dtype=torch.float64)


class StochasticColumns(NamedTuple):
    """Rows of a stochastic-outcome task as the per-question measures read them ([N] each): ``rate`` the true rate,
    ``stated`` the stated probability of a = 1 (NaN where invalid), ``outcome`` the fixed outcome a, ``chosen`` the
    predicted outcome (1.0 / 0.0 / NaN; the binary variant only, else None)."""

    rate: torch.Tensor
    stated: torch.Tensor
    outcome: torch.Tensor
    chosen: torch.Tensor | None


def _nan(x) -> float:
    return math.nan if x is None else float(x)


def stochastic_columns(rows: list[dict]) -> StochasticColumns | None:
    """The stochastic-outcome columns of generation rows (the grader's ``stated`` / ``outcome`` / ``chosen``,
    written by ``capo eval``); None without rates. Rows written before those fields existed (the ``percent`` format
    only) read ``confidence`` as the stated probability and the verdict as the outcome, as they were graded."""
    rate = row_rates(rows)
    if rate is None:
        return None
    if all("outcome" in r for r in rows):
        stated = torch.tensor([_nan(r.get("stated")) for r in rows], dtype=torch.float64)
        outcome = torch.tensor([bool(r["outcome"]) for r in rows], dtype=torch.bool)
    else:
        stated = torch.tensor([_nan(r.get("confidence")) for r in rows], dtype=torch.float64)
        outcome = torch.tensor([r["verdict"] == "correct" for r in rows], dtype=torch.bool)
    chosen = (torch.tensor([_nan(r.get("chosen")) for r in rows], dtype=torch.float64)
              if any("chosen" in r for r in rows) else None)
    return StochasticColumns(rate, stated, outcome, chosen)


def _stochastic(rows: list[dict], cols: _Columns, n_bins: int) -> tuple[dict, dict]:
    """(metrics, curves) of stated probabilities of stochastic outcomes: :func:`capo.tasks.stochastic.
    stochastic_summary` and the reliability diagram of each question's mean stated probability
    (``reliability_stated``; with the binary variant also ``reliability_answer``, of each question's frequency of
    predicting 1). Empty without rates."""
    st = stochastic_columns(rows)
    if st is None:
        return {}, {}
    m, a, p = stated_question_means(st.stated, st.outcome, cols.g, st.rate)
    metrics = stated_means_summary(m, a, p, n_bins=n_bins)
    curves = {"reliability_stated": _reliability_points(cal.reliability_curve(m, a, n_bins=n_bins))} if m.numel() else {}
    if st.chosen is not None:
        m, a, p = stated_question_means(st.chosen, st.outcome, cols.g, st.rate)
        metrics |= stated_means_summary(m, a, p, n_bins=n_bins, prefix="answer")
        if m.numel():
            curves["reliability_answer"] = _reliability_points(cal.reliability_curve(m, a, n_bins=n_bins))
    return metrics, curves


def by_group(rows: list[dict], cols: _Columns, n_bins: int) -> dict:
    """The calibration summary (:func:`capo.core.calibration.summarize`: accuracy, AUC-mean of lpm and the questions
    it used, pooled AUROC, ECE / Brier of exp(lpm), verbal metrics when stated) of the rows of each ``group`` (a
    question's category, e.g. the facts task's relation), sorted by group; {} when no row has one. Non-finite values
    as None."""
    names = sorted({str(r["group"]) for r in rows if r.get("group") is not None})
    out = {}
    for name in names:
        idx = torch.tensor([i for i, r in enumerate(rows) if r.get("group") is not None and str(r["group"]) == name])
        summary = cal.summarize(cols.lpm[idx], cols.c[idx], cols.g[idx],
                                verbal_conf=cols.verbal[idx] if cols.has_verbal else None, n_bins=n_bins)
        out[name] = {k: _finite(v) for k, v in summary.items()}
    return out


def compute_metrics(rows: list[dict], *, n_bins: int = 10, n_boot: int = 1000, seed: int = 0,
                    keep_fraction: float = voting.KEEP_FRACTION, conf_knobs: dict | None = None) -> dict:
    """Metrics of a complete set of generation rows.

    Each row needs ``prompt_id``, ``verdict``, ``mean_logprob`` (None only for an empty response, which is
    scored as -inf: confidence 0), ``answer_id`` (equivalence class within its prompt, -1 = none), ``text``;
    optional ``confidence`` (verbal, None when absent) and per-token lists (``token_logprobs``, ``token_entropy``,
    ``token_kl_uniform``, ``token_topk_conf``) for the confidence-estimator table ``curves["estimators"]``
    (:func:`capo.evaluation.estimators.estimator_table`; ``keep_fraction`` and ``conf_knobs`` go to it), and
    ``n_tokens`` for the lengths within each question and what CAPO's two scores make of them, ``curves["lengths"]``
    (:func:`capo.evaluation.lengths.length_check`). Returns ``{"metrics": {...flat floats...}, "curves": {...plot
    data...}}``; non-finite values are stored as None (JSON null).
    """
    if not rows:
        raise ValueError("no generation rows to compute metrics from")
    cols = _columns(rows)
    m: dict[str, float | None] = dict(
        cal.summarize(cols.lpm, cols.c, cols.g, verbal_conf=cols.verbal if cols.has_verbal else None, n_bins=n_bins)
    )
    m.update(_bootstrap_metrics(cols, n_boot, seed))
    # votes and curves rank an empty response (-inf) below every other one
    lpm_finite = torch.where(torch.isinf(cols.lpm), torch.full_like(cols.lpm, -1e4), cols.lpm)
    m.update(_scaling_metrics(rows, cols, lpm_finite))
    m.update(_count_metrics(rows))
    stochastic, stated_curves = _stochastic(rows, cols, n_bins)
    m.update(stochastic)
    curves = _curves(rows, cols, lpm_finite, n_bins) | stated_curves
    curves["estimators"] = estimator_table(
        rows, group_ids=cols.g, correct=cols.c, answer_ids=cols.aids, verbal=cols.verbal if cols.has_verbal else None,
        knobs=conf_knobs, keep_fraction=keep_fraction, n_bins=n_bins, n_boot=n_boot, seed=seed)
    curves["estimators_unavailable"] = unavailable_estimators(rows, cols.has_verbal)
    curves["by_group"] = by_group(rows, cols, n_bins)
    n_tokens = torch.tensor([math.nan if r.get("n_tokens") is None else float(r["n_tokens"]) for r in rows],
                            dtype=torch.float64)
    curves["lengths"] = length_check(cols.g, cols.c, cols.lpm, n_tokens)
    return {"metrics": {k: _finite(v) for k, v in m.items()}, "curves": curves}


def assign_answer_ids(rows: list[dict], verifier: Verifier, answer_format: str | None = None) -> None:
    """Set each row's ``answer_id``: the equivalence class of its extracted answer among the responses to the same
    prompt (-1 = no answer), numbered by first occurrence. Votes read it. Classes are math-verify's, except for the
    short free-text formats (``short``, ``rlcr_short``: facts), whose answers are equal when their normal forms are
    (:func:`capo.verify.short.normalize_short`; :func:`capo.rollout.grading.answer_classes` says what this leaves
    apart that the judge accepts alike)."""
    by_prompt: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_prompt.setdefault(str(r["prompt_id"]), []).append(i)
    groups = list(by_prompt.values())
    answers = [[rows[i]["answer"] for i in idx] for idx in groups]
    classes = answer_classes(answers, verifier, answer_format)
    for idx, ids in zip(groups, classes):
        for i, a in zip(idx, ids):
            rows[i]["answer_id"] = a
