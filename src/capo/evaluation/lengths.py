"""Response lengths within a question and what they do to CAPO's ranking score: the check that tells a user which
case of capo's fixed-point derivation their task is in (docs/papers.md, "CAPO's fixed point on a stochastic outcome,
in general", items 2, 3 and 6), measured on any ``capo eval`` run with several responses per question (best: the
model a run would start from).

- Responses of one length within a question (a one-decision answer in a fixed format): the whole-sequence score of
  ``capo_sum`` is lpm times a constant per question, the case the derivation covers; its fixed point on a stochastic
  outcome is then the outcome's rate if the rest of a response does not depend on its answer (and no mask removes
  correct and incorrect responses at different rates).
- Lengths that vary (reasoning traces): the sum ranks long responses low whatever their correctness
  (``sum_len_corr`` < 0), its gaps between a correct and an incorrect response are large against tau, so its
  logistic weights saturate and it acts mainly on misranked pairs (``saturated``), and its advantage pushes towards
  longer responses (``length_push`` > 0). Those are the mechanisms of the price the derivation predicts.

Definitions: docs/metrics.md, "Response lengths and CAPO's score".
"""

from __future__ import annotations

import torch

from capo.core import capo_advantage
from capo.core.advantages import CAPO_SCORES, capo_ranking_scores
from capo.core.presets import ALGORITHMS

__all__ = ["CAPO_SCORE_FORMS", "FEW_VARY", "SATURATED_GAP", "length_check", "length_reading"]

F64 = torch.float64
# the two forms of CAPO's score compared, each with its preset's advantage settings (one source: the presets)
CAPO_SCORE_FORMS = ("capo", "capo_sum")
# a (correct, incorrect) pair is saturated when |score gap| / tau > 3: CAPO's logistic weight sigma(gap / tau) is then
# below 0.047 (the pair already ranked right: almost no push) or above 0.953
SATURATED_GAP = 3.0
# the reading calls a task one of responses of one length when at most this share of its questions has any spread
FEW_VARY = 0.05
_CELLS = 4_000_000  # questions are processed in chunks of at most this many [question, G, G] pair cells


def length_check(group_ids: torch.Tensor, correct: torch.Tensor, lpm: torch.Tensor, n_tokens: torch.Tensor) -> dict:
    """The lengths of the responses within each question and what each form of CAPO's score
    (:data:`CAPO_SCORE_FORMS`) makes of them. group_ids [N] int (the question), correct [N] bool, lpm [N] float64
    (mean log-prob; -inf or NaN: not scored), n_tokens [N] float64 (NaN or < 0: unknown). Responses without a finite
    lpm and a known length are left out; questions with fewer than two of the rest too. {} when none is left.

    Keys: ``questions``, ``mean_tokens`` (over the responses used), ``len_sd_within`` (mean within-question sample
    sd of the length), ``len_varies`` (share of questions whose responses are not all one length), ``sum_len_corr``
    (Pearson correlation of the within-question-centred whole-sequence log-prob lpm * length and the centred length;
    None when either never varies within a question), and per form: ``tau``, ``score``, ``pairs`` ((correct,
    incorrect) pairs within a question), ``saturated`` (their share with |score gap| / tau > :data:`SATURATED_GAP`;
    None without pairs), ``length_push`` (sum_i A_i (|o_i| - mean_q |o|) / sum_i |A_i|, A the form's advantage over
    groups of the question's responses padded to the largest question, as the trainer pads a group: tokens per unit
    |A|, > 0 favours longer responses; None when no question has both verdicts)."""
    g, c, s, n = _questions(group_ids, correct, lpm, n_tokens)
    if g is None:
        return {}
    count = torch.bincount(g)  # [Q]
    out = {"questions": len(count), "mean_tokens": float(n.mean()), **_spread(n, s * n, g, count)}
    forms = {name: ALGORITHMS[name].get("advantage_kwargs", {}) for name in CAPO_SCORE_FORMS}
    sums = {name: torch.zeros(4, dtype=F64) for name in forms}  # pairs, saturated pairs, push numerator, |A| sum
    start = torch.cumsum(count, 0) - count
    g_max = int(count.max())
    step = max(1, _CELLS // g_max ** 2)
    for q0 in range(0, len(count), step):
        q1 = min(q0 + step, len(count))
        rows = slice(int(start[q0]), int(start[q1 - 1] + count[q1 - 1]))
        pad = _Padded(g[rows] - q0, c[rows], s[rows], n[rows], q1 - q0, g_max)
        for name, kw in forms.items():
            sums[name] += pad.sums(kw)
    for name, kw in forms.items():
        pairs, sat, num, den = sums[name].tolist()
        out[name] = {"tau": float(kw["tau"]), "score": kw.get("score", CAPO_SCORES[0]), "pairs": int(pairs),
                     "saturated": sat / pairs if pairs else None, "length_push": num / den if den > 0 else None}
    return out


def _questions(group_ids, correct, lpm, n_tokens):
    """The scored responses of the questions with two or more, sorted by question: (question index 0..Q-1 [M],
    correct [M], lpm [M], length [M]), or four Nones."""
    ok = torch.isfinite(lpm) & torch.isfinite(n_tokens) & (n_tokens >= 0)  # [N] scored, with a known length
    _, q = torch.unique(group_ids, return_inverse=True)  # [N] question index of every row
    ok &= torch.bincount(q, weights=ok.to(F64))[q] >= 2  # in a question with two or more such responses
    if not bool(ok.any()):
        return None, None, None, None
    _, g = torch.unique(group_ids[ok], return_inverse=True)
    order = torch.argsort(g, stable=True)
    return g[order], correct[ok][order], lpm[ok].to(F64)[order], n_tokens[ok].to(F64)[order]


def _centred(x: torch.Tensor, g: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """x [M] minus its question's mean."""
    return x - (torch.zeros(len(count), dtype=F64).index_add_(0, g, x) / count)[g]


def _spread(n: torch.Tensor, total: torch.Tensor, g: torch.Tensor, count: torch.Tensor) -> dict:
    """Within-question length sd and variation, and the correlation of the sum log-prob with length."""
    dn, ds = _centred(n, g, count.to(F64)), _centred(total, g, count.to(F64))
    sd = (torch.zeros(len(count), dtype=F64).index_add_(0, g, dn * dn) / (count - 1)).sqrt()  # [Q]
    den = float((dn * dn).sum().sqrt() * (ds * ds).sum().sqrt())
    return {"len_sd_within": float(sd.mean()), "len_varies": float((sd > 0).to(F64).mean()),
            "sum_len_corr": float((dn * ds).sum()) / den if den > 0 else None}


class _Padded:
    """A chunk of questions as [Q, G_max] rows (padding: not a partner, no verdict), for the pair counts and CAPO's
    advantage of each form."""

    def __init__(self, g, c, lpm, n, n_q: int, g_max: int):
        count = torch.bincount(g, minlength=n_q)
        pos = torch.arange(len(g)) - (torch.cumsum(count, 0) - count)[g]  # [M] place within the question

        def pad(x, fill):
            return torch.full((n_q, g_max), fill, dtype=x.dtype).index_put_((g, pos), x)

        self.g_max, self.real = g_max, pad(torch.ones_like(c), False)
        self.right, self.wrong = pad(c, False), pad(~c, False)
        self.lpm, self.n = pad(lpm, 0.0), pad(n, 0.0)
        self.centred = pad(_centred(n, g, count.to(F64)), 0.0)

    def sums(self, kw: dict) -> torch.Tensor:
        """[4]: (correct, incorrect) pairs, saturated ones, sum_i A_i (|o_i| - mean |o|), sum_i |A_i|."""
        s = capo_ranking_scores(self.lpm.reshape(-1), self.n.reshape(-1), kw.get("score", CAPO_SCORES[0]))
        s = s.view_as(self.lpm)  # [Q, G_max]
        pair = self.right[:, :, None] & self.wrong[:, None, :]  # [Q, G_i, G_j]: correct i, incorrect j
        gap = (s[:, :, None] - s[:, None, :])[pair] / kw["tau"]
        a = capo_advantage(self.right.reshape(-1).to(F64), self.g_max, scores=self.lpm.reshape(-1),
                           lengths=self.n.reshape(-1), partners=self.real.reshape(-1), **kw)  # [Q * G_max]
        return torch.tensor([float(pair.sum()), float((gap.abs() > SATURATED_GAP).sum()),
                             float((a * self.centred.reshape(-1)).sum()), float(a.abs().sum())], dtype=F64)


def length_reading(c: dict) -> str:
    """The reading of a :func:`length_check` in a few sentences: responses of one length (the case the variant's
    derivation covers) or varying ones (the mechanisms of its price, with their sizes); "" for an empty check."""
    if not c:
        return ""
    if c["len_varies"] <= FEW_VARY:
        some = "" if c["len_varies"] == 0 else f" in all but {c['len_varies']:.0%} of the questions"
        return (f"Responses to a question have one length{some}: the case capo_sum's derivation covers (its fixed "
                "point on a stochastic outcome is the outcome's rate if the rest of a response does not depend on "
                "its answer and no mask removes correct and incorrect responses at different rates).")
    parts = [f"Lengths vary within {c['len_varies']:.0%} of the questions (sd {c['len_sd_within']:.1f} tokens): "
             "capo_sum's fixed point is not exactly the rate (docs/papers.md, item 3: sharpened by the spread of the "
             "rest of a response, shifted towards an answer whose responses run longer or vary more)."]
    corr, s, m = c.get("sum_len_corr"), c["capo_sum"], c["capo"]
    if corr is not None and round(corr, 2) != 0:
        parts.append(f"Its sum score ranks long responses {'low' if corr < 0 else 'high'} (correlation {corr:+.2f}).")
    if s["pairs"]:
        push = s["length_push"]
        moves = ("" if push is None or round(push, 2) == 0 else
                 f"; its advantage pushes towards {'longer' if push > 0 else 'shorter'} responses ({push:+.2f} tokens "
                 "per unit |A|)")
        parts.append(f"{s['saturated']:.0%} of its (correct, incorrect) pairs are saturated, against "
                     f"{m['saturated']:.0%} of CAPO's{moves}.")
    else:
        parts.append("No question has both a correct and an incorrect response, so there is no pair to weigh.")
    return " ".join(parts)
