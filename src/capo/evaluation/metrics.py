"""All evaluation metrics from generation rows (one row per response): calibration, test-time scaling, counts.

Every key is defined in docs/metrics.md (section "Evaluation metrics", namespace ``eval/``).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import torch

from capo.core import calibration as cal
from capo.core import voting

__all__ = ["compute_metrics", "pass_ks"]


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


def compute_metrics(rows: list[dict], *, n_bins: int = 10, n_boot: int = 1000, seed: int = 0) -> dict:
    """Metrics of a complete set of generation rows.

    Each row needs ``prompt_id``, ``verdict``, ``mean_logprob`` (None only for an empty response, which is
    scored as -inf: confidence 0), ``answer_id`` (equivalence class within its prompt, -1 = none), ``text``;
    optional ``confidence`` (verbal, None when absent). Returns ``{"metrics": {...flat floats...}, "curves":
    {...plot data...}}``; non-finite values are stored as None (JSON null).
    """
    if not rows:
        raise ValueError("no generation rows to compute metrics from")
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

    m: dict[str, float | None] = {}
    summ = cal.summarize(lpm, c, g, verbal_conf=verbal if has_verbal else None, n_bins=n_bins)
    for key, v in summ.items():
        m[key] = v
    # bootstrap intervals over questions (cluster bootstrap)
    if n_boot > 0 and len(pids) > 1:
        lo, hi = cal.bootstrap_ci(lambda s, cc, gg: cal.auc_mean(s, cc, gg).value, lpm, c, group_ids=g,
                                  n_boot=n_boot, seed=seed, pass_group_ids=True)
        m["auc_mean_ci_low"], m["auc_mean_ci_high"] = lo, hi
        lo, hi = cal.bootstrap_ci(lambda cc: float(cc.to(torch.float64).mean()), c, group_ids=g, n_boot=n_boot, seed=seed)
        m["accuracy_ci_low"], m["accuracy_ci_high"] = lo, hi
    # test-time scaling
    counts = Counter(int(x) for x in g.tolist())
    k_min = min(counts.values())
    m["k_min"] = float(k_min)
    m["mean_at_k"] = voting.mean_at_k(c, g)
    for kk in pass_ks(k_min):
        m[f"pass_at_{kk}"] = voting.mean_pass_at_k(c, g, kk)
    m["majority_vote"] = voting.majority_vote(aids, c, g).accuracy
    # perplexity consistency over unique sampled paths: identical texts of one prompt are one path
    path_key: dict[tuple[int, str], int] = {}
    path_ids = torch.tensor([path_key.setdefault((int(gi), r["text"]), len(path_key)) for gi, r in zip(g.tolist(), rows)])
    lpm_finite = torch.where(torch.isinf(lpm), torch.full_like(lpm, -1e4), lpm)
    m["perplexity_consistency"] = voting.perplexity_consistency(aids, c, g, lpm_finite, path_ids=path_ids).accuracy
    m["max_confidence_lpm"] = voting.max_confidence(aids, c, g, lpm_finite).accuracy
    if has_verbal:
        vq = torch.nan_to_num(verbal, nan=0.0)
        m["confidence_weighted_vote"] = voting.confidence_weighted_vote(aids, c, g, vq).accuracy
        m["max_confidence_verbal"] = voting.max_confidence(aids, c, g, vq).accuracy
    # counts
    verdicts = Counter(r["verdict"] for r in rows)
    for v in ("correct", "incorrect", "unparsable", "timeout"):
        m[f"verdict_{v}"] = float(verdicts.get(v, 0))
    fin = Counter(r.get("finish_reason") for r in rows)
    m["finish_length_frac"] = fin.get("length", 0) / len(rows)
    known = [int(r["n_tokens"]) for r in rows if r.get("n_tokens") is not None]
    m["mean_tokens"] = sum(known) / len(known) if known else math.nan
    m["empty_responses"] = float(sum(1 for n in known if n == 0))
    # plot data
    finite = ~torch.isinf(lpm)
    p = torch.where(finite, torch.exp(lpm), torch.zeros_like(lpm))
    rel = cal.reliability_curve(p, c, n_bins=n_bins)
    curves: dict = {
        "reliability": {
            "bin_edges": [float(x) for x in rel.bin_edges.tolist()],
            "confidence": [_finite(x) for x in rel.bin_confidence.tolist()],
            "accuracy": [_finite(x) for x in rel.bin_accuracy.tolist()],
            "count": [int(x) for x in rel.bin_count.tolist()],
        },
        "hist": {"correct": [float(x) for x in p[c].tolist()], "incorrect": [float(x) for x in p[~c].tolist()]},
    }
    sel = cal.selective_curve(lpm_finite, c)
    curves["selective"] = _curve_points(sel.coverage, sel.precision)
    if has_verbal:
        present = ~torch.isnan(verbal)
        if bool(present.any()):
            vrel = cal.reliability_curve(verbal[present], c[present], n_bins=n_bins)
            curves["reliability_verbal"] = {
                "bin_edges": [float(x) for x in vrel.bin_edges.tolist()],
                "confidence": [_finite(x) for x in vrel.bin_confidence.tolist()],
                "accuracy": [_finite(x) for x in vrel.bin_accuracy.tolist()],
                "count": [int(x) for x in vrel.bin_count.tolist()],
            }
            vsel = cal.selective_curve(verbal[present], c[present])
            curves["selective_verbal"] = _curve_points(vsel.coverage, vsel.precision)
    per_prompt = defaultdict(list)
    for r in rows:
        per_prompt[str(r["prompt_id"])].append(r["verdict"] == "correct")
    curves["per_prompt_accuracy"] = {pid: sum(v) / len(v) for pid, v in per_prompt.items()}
    return {"metrics": {k: _finite(v) for k, v in m.items()}, "curves": curves}
