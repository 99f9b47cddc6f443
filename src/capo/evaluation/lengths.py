"""Response lengths within a question and what they do to CAPO's ranking score: the check that tells a user which
case of capo's fixed-point derivation their task is in (docs/papers.md, "CAPO's fixed point on a stochastic outcome,
in general", items 2, 3 and 6), measured on any ``capo eval`` run with several responses per question (best: the
model a run would start from).

- Lengths that never vary within a question (a one-decision answer in a fixed format): the whole-sequence score of
  ``capo_sum`` and lpm differ only by a constant factor per question, and ``capo_sum``'s fixed point on a stochastic
  outcome is the outcome's rate (without an asymmetric noise mask).
- Lengths that vary (reasoning traces): the sum ranks long responses low whatever their correctness
  (``sum_len_corr`` < 0), its gaps between a correct and an incorrect response are large against tau, so its
  logistic weights saturate and it acts mainly on misranked pairs (``saturated``), and its advantage pushes towards
  longer responses (``length_push`` > 0). Those are the mechanisms of the price the derivation predicts.

Definitions: docs/metrics.md, "Response lengths and CAPO's score".
"""

from __future__ import annotations

import math

import torch

from capo.core import capo_advantage
from capo.core.presets import ALGORITHMS

__all__ = ["CAPO_SCORE_FORMS", "SATURATED_GAP", "length_check"]

F64 = torch.float64
# the two forms of CAPO's score compared, each with its preset's advantage settings (one source: the presets)
CAPO_SCORE_FORMS = ("capo", "capo_sum")
# a (correct, incorrect) pair is saturated when |score gap| / tau > 3: CAPO's logistic weight sigma(gap / tau) is then
# below 0.047 (the pair already ranked right: almost no push) or above 0.953
SATURATED_GAP = 3.0


def length_check(rows: list[dict]) -> dict:
    """The lengths of ``rows`` (generation rows: ``prompt_id``, ``verdict``, ``n_tokens``, ``mean_logprob``) within
    each question, and what each form of CAPO's score (:data:`CAPO_SCORE_FORMS`) makes of them; {} when no question
    has two scored responses or a row has no ``n_tokens``. Rows with no finite mean log-prob (empty responses) are left
    out. Keys: ``questions`` (with >= 2 scored responses), ``mean_tokens``, ``len_sd_within`` (mean within-question
    sample sd of the token count), ``len_varies`` (share of questions whose responses differ in length),
    ``sum_len_corr`` (Pearson correlation of the within-question-centred sum log-prob and length; None when lengths
    never vary), and per form: ``tau``, ``score``, ``pairs`` ((correct, incorrect) pairs within a question),
    ``saturated`` (their share with |gap| / tau > :data:`SATURATED_GAP`), ``length_push`` (sum_i A_i (|o_i| - mean_q
    |o|) / sum_i |A_i| over questions with both verdicts, in tokens per unit |A|: > 0 favours longer responses; None
    unless every question has the same number of scored responses, as CAPO's groups do)."""
    if not rows or any(r.get("n_tokens") is None for r in rows):
        return {}
    keep = [r for r in rows if r["mean_logprob"] is not None and math.isfinite(float(r["mean_logprob"]))]
    ids: dict[str, list[int]] = {}
    for i, r in enumerate(keep):
        ids.setdefault(str(r["prompt_id"]), []).append(i)
    groups = [ix for ix in ids.values() if len(ix) >= 2]
    if not groups:
        return {}
    order = torch.tensor([i for ix in groups for i in ix])
    gid = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(ix) for ix in groups]))  # [N]
    n = torch.tensor([float(keep[i]["n_tokens"]) for i in order.tolist()], dtype=F64)  # [N]
    lpm = torch.tensor([float(keep[i]["mean_logprob"]) for i in order.tolist()], dtype=F64)  # [N]
    c = torch.tensor([keep[i]["verdict"] == "correct" for i in order.tolist()])  # [N]
    out = {"questions": len(groups), "mean_tokens": float(n.mean()), **_spread(n, lpm * n, gid, len(groups))}
    sizes = {len(ix) for ix in groups}
    g = sizes.pop() if len(sizes) == 1 else None  # CAPO's groups are all one size
    for name in CAPO_SCORE_FORMS:
        kw = ALGORITHMS[name].get("advantage_kwargs", {})
        form = {"tau": float(kw["tau"]), "score": kw.get("score", "mean")}
        form.update(_saturation(lpm * n if form["score"] == "sum" else lpm, c, gid, form["tau"]))
        form["length_push"] = _length_push(c, lpm, n, g, kw)
        out[name] = form
    return out


def _centred(x: torch.Tensor, gid: torch.Tensor, n_groups: int) -> torch.Tensor:
    """x [N] minus its question's mean."""
    count = torch.bincount(gid, minlength=n_groups).to(F64)
    return x - (torch.zeros(n_groups, dtype=F64).scatter_add_(0, gid, x) / count)[gid]


def _spread(n: torch.Tensor, total: torch.Tensor, gid: torch.Tensor, n_groups: int) -> dict:
    """Within-question length sd and variation, and the correlation of the sum log-prob with length."""
    count = torch.bincount(gid, minlength=n_groups).to(F64)
    dn, ds = _centred(n, gid, n_groups), _centred(total, gid, n_groups)
    sd = (torch.zeros(n_groups, dtype=F64).scatter_add_(0, gid, dn * dn) / (count - 1)).sqrt()  # [Q]
    den = float((dn * dn).sum().sqrt() * (ds * ds).sum().sqrt())
    return {"len_sd_within": float(sd.mean()), "len_varies": float((sd > 0).to(F64).mean()),
            "sum_len_corr": float((dn * ds).sum()) / den if den > 0 else None}


def _saturation(s: torch.Tensor, c: torch.Tensor, gid: torch.Tensor, tau: float) -> dict:
    """(correct, incorrect) pairs within a question and the share whose |score gap| / tau exceeds SATURATED_GAP;
    s, c, gid [N] with each question's rows contiguous."""
    count = torch.bincount(gid)  # [Q]
    start = torch.cumsum(count, 0) - count
    pos = torch.arange(len(gid)) - start[gid]  # [N] place within the question
    shape = (len(count), int(count.max()))
    s_pad = torch.zeros(shape, dtype=F64).index_put_((gid, pos), s)  # [Q, G_max]
    right = torch.zeros(shape, dtype=torch.bool).index_put_((gid, pos), c)
    wrong = torch.zeros(shape, dtype=torch.bool).index_put_((gid, pos), ~c)
    pair = right[:, :, None] & wrong[:, None, :]  # [Q, G_i, G_j]: correct i, incorrect j
    gap = (s_pad[:, :, None] - s_pad[:, None, :])[pair] / tau
    return {"pairs": int(pair.sum()),
            "saturated": float((gap.abs() > SATURATED_GAP).to(F64).mean()) if gap.numel() else None}


def _length_push(c: torch.Tensor, lpm: torch.Tensor, n: torch.Tensor, g: int | None, kw: dict) -> float | None:
    """sum_i A_i (|o_i| - mean |o|) / sum_i |A_i| over questions with both verdicts (CAPO's advantage, no mask)."""
    if g is None:
        return None
    a = capo_advantage(c.to(F64), g, scores=lpm, lengths=n, **kw)  # [N]
    cg = c.view(-1, g)
    mixed = (cg.any(1) & ~cg.all(1)).repeat_interleave(g)  # [N]
    centred = n - n.view(-1, g).mean(1).repeat_interleave(g)
    den = float(a[mixed].abs().sum())
    return float((a * centred)[mixed].sum()) / den if den > 0 else None
