"""Test-time scaling: mean@k, pass@k and answer selection among the k sampled responses of each question.

Pure tensor functions. The evaluation layer extracts each response's final answer and groups equivalent answers
(math-verify) into a per-question equivalence-class id, so nothing here compares strings. Inputs, all [N]:

- ``answer_ids``: int, the class of the response's extracted answer within its question; -1 = no answer extracted.
  Class ids only need to be unique within a question.
- ``correct``: bool or 0/1, whether the response's answer is right.
- ``group_ids``: int question labels, arbitrary (results are ordered by sorted unique label).
- a score: ``mean_logprob`` (lpm, for perplexity consistency), ``confidence`` (verbal q, or any real score, e.g. an
  estimator of :mod:`capo.core.confidence`) or ``weights`` (any non-negative score).

Selection rules, shared by every voter (each tested):

- An answer class with id -1 never wins unless every response of the question has no answer; the question then
  counts as wrong (chosen answer -1).
- Ties in the vote score are broken deterministically by **first occurrence**: the class (or, for
  :func:`max_confidence`, the response) whose first response has the lowest row index wins. Samples are drawn in
  random order, so this is a fair tie-break that does not depend on how class ids were numbered. (The RPC reference
  code instead gives fractional credit 1/#tied; ours is a single deterministic choice.)
- The chosen answer is scored by its representative response: the winning class's first response (by row index)
  for the votes, the selected response itself for :func:`max_confidence`. Responses of one class are expected to
  agree on ``correct``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from capo.core import checks
from capo.core.calibration import group_index, confidence_from_logprob

F64 = torch.float64

__all__ = [
    "KEEP_FRACTION",
    "VoteResult",
    "confidence_weighted_vote",
    "filtered_vote",
    "majority_vote",
    "max_confidence",
    "mean_at_k",
    "mean_pass_at_k",
    "pass_at_k",
    "pass_at_k_batch",
    "perplexity_consistency",
    "weighted_vote",
]


# ----------------------------------------------------------------------------------------------------------------
# mean@k and pass@k
# ----------------------------------------------------------------------------------------------------------------


def _counts(correct, group_ids) -> tuple[torch.Tensor, torch.Tensor]:
    c = checks.labels("correct", correct)
    g = checks.group_ids_1d("group_ids", group_ids)
    checks.same_shape(correct=c, group_ids=g)
    checks.nonempty("correct", c)
    labels, inv = group_index(g.to(c.device))
    n = torch.bincount(inv, minlength=labels.numel())
    k = torch.zeros(labels.numel(), dtype=torch.int64, device=c.device).scatter_add_(0, inv, c.to(torch.int64))
    return n, k


def mean_at_k(correct, group_ids) -> float:
    """mean@k = (1/B) sum_b c_b / n_b: the accuracy of one sample, averaged per question then over the B questions
    (CAPO's "mean@16", arXiv 2604.12632, Sec. 5). Equal to the pooled accuracy when every question has the same
    number of samples. Shapes: correct [N] bool or 0/1, group_ids [N] int. Raises ValueError for N = 0."""
    n, c = _counts(correct, group_ids)
    return float((c.to(F64) / n.to(F64)).mean())


def _check_k(k) -> int:
    if not checks.is_int(k):
        raise TypeError(f"k must be an int >= 1, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021, "Evaluating large language models trained on code", Sec. 2.1):

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i),

    the probability that at least one of k samples drawn without replacement from n (c of them correct) is correct;
    the product form avoids huge binomials. Equals 1 when n - c < k.

    Args: n samples >= 1, c correct in [0, n], k in [1, n] (all ints).
    """
    for name, v in (("n", n), ("c", c)):
        if not checks.is_int(v):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    _check_k(k)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if k > n:
        raise ValueError(f"k must be <= n={n} (pass@k needs at least k samples), got k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_batch(n, c, k: int) -> torch.Tensor:
    """:func:`pass_at_k` for B questions at once: n [B] int samples, c [B] int correct, k int -> float64 [B].

    Same product form, evaluated as a masked [B, max n] product (memory O(B max n)). Raises as :func:`pass_at_k`
    naming the first offending question.
    """
    _check_k(k)
    nt = checks.array1d("n", n)
    ct = checks.array1d("c", c)
    for name, t in (("n", nt), ("c", ct)):
        if t.dtype == torch.bool or t.is_floating_point():
            raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")
    checks.same_shape(n=nt, c=ct)
    nt, ct = nt.to(torch.int64), ct.to(torch.int64).to(nt.device)
    if nt.numel() == 0:
        return torch.zeros(0, dtype=F64, device=nt.device)
    for cond, msg in (
        (nt < 1, "n must be >= 1"),
        ((ct < 0) | (ct > nt), "c must be in [0, n]"),
        (nt < k, f"n must be >= k={k} (pass@k needs at least k samples)"),
    ):
        if bool(cond.any()):
            b = int(cond.nonzero()[0])
            raise ValueError(f"{msg}; question {b} has n={int(nt[b])}, c={int(ct[b])}")
    i = torch.arange(1, int(nt.max()) + 1, device=nt.device).to(F64)  # [max n]
    in_range = (i[None, :] > (nt - ct)[:, None].to(F64)) & (i[None, :] <= nt[:, None].to(F64))  # [B, max n]
    terms = torch.where(in_range, 1.0 - k / i[None, :], torch.ones((), dtype=F64, device=nt.device))
    out = 1.0 - terms.prod(dim=1)
    return torch.where(nt - ct < k, torch.ones_like(out), out)


def mean_pass_at_k(correct, group_ids, k: int) -> float:
    """pass@k averaged over questions: (1/B) sum_b pass@k(n_b, c_b). Every question needs n_b >= k samples.
    Shapes: correct [N] bool or 0/1, group_ids [N] int."""
    n, c = _counts(correct, group_ids)
    return float(pass_at_k_batch(n, c, k).mean())


# ----------------------------------------------------------------------------------------------------------------
# answer selection
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VoteResult:
    """Per-question outcome of a selection rule; B = number of distinct group ids, ordered by label.

    group_labels: [B] int64 sorted unique ``group_ids``.
    chosen_answer: [B] int64 winning class id (-1 when the question has no answer at all).
    chosen_index: [B] int64 row of the representative response (votes: the winning class's first response, for an
        all-unanswered question its first response; :func:`max_confidence`: the selected response).
    correct: [B] bool whether the chosen answer is right (False when chosen_answer is -1).
    accuracy: mean of ``correct`` over the B questions.
    """

    group_labels: torch.Tensor
    chosen_answer: torch.Tensor
    chosen_index: torch.Tensor
    correct: torch.Tensor
    accuracy: float


def _vote_inputs(answer_ids, correct, group_ids, **scores):
    a = checks.array1d("answer_ids", answer_ids)
    if a.dtype == torch.bool or a.is_floating_point():
        raise TypeError(f"answer_ids must have an integer dtype (class ids, -1 = no answer), got {a.dtype}")
    a = a.to(torch.int64)
    c = checks.labels("correct", correct)
    g = checks.group_ids_1d("group_ids", group_ids)
    checks.same_shape(answer_ids=a, correct=c, group_ids=g, **scores)
    checks.nonempty("answer_ids", a)
    if bool((a < -1).any()):
        i = int((a < -1).nonzero()[0])
        raise ValueError(f"answer_ids must be >= -1 (-1 = no answer), got {int(a[i])} at index {i}")
    dev = a.device
    return a, c.to(dev), g.to(dev)


def _select(
    group: torch.Tensor, none: torch.Tensor, missing: torch.Tensor, score: torch.Tensor, first: torch.Tensor
) -> torch.Tensor:
    """Index of the winning candidate per group: lexicographic min of (group, none, missing, -score, first).

    All [K] (candidates); returns [G] candidate indices in group order (every group has >= 1 candidate).
    """
    o = torch.argsort(first, stable=True)
    o = o[torch.argsort(-score[o], stable=True)]
    o = o[torch.argsort(missing[o].to(torch.int8), stable=True)]
    o = o[torch.argsort(none[o].to(torch.int8), stable=True)]
    o = o[torch.argsort(group[o], stable=True)]
    head = torch.ones(o.numel(), dtype=torch.bool, device=o.device)
    head[1:] = group[o][1:] != group[o][:-1]
    return o[head]


def _class_vote(a: torch.Tensor, c: torch.Tensor, g: torch.Tensor, weight: torch.Tensor) -> VoteResult:
    """Sum ``weight`` [N] per (question, answer class); the highest sum wins (rules in the module docstring)."""
    n = a.numel()
    dev = a.device
    labels, inv = group_index(g)
    _, a_dense = torch.unique(a, return_inverse=True)  # class ids may be any ints: densify to keep keys small
    width = int(a_dense.max()) + 1
    key = inv * width + a_dense  # [N] one key per (question, class)
    ukey, kinv = torch.unique(key, sorted=True, return_inverse=True)  # [K], [N]
    n_keys = ukey.numel()
    score = torch.zeros(n_keys, dtype=F64, device=dev).scatter_add_(0, kinv, weight)
    first = torch.full((n_keys,), n, dtype=torch.int64, device=dev).scatter_reduce_(
        0, kinv, torch.arange(n, device=dev), reduce="amin"
    )
    k_group = ukey // width
    k_answer = a[first]  # [K] the class id of each key
    win = _select(k_group, k_answer < 0, torch.zeros_like(k_answer, dtype=torch.bool), score, first)
    chosen = k_answer[win]
    idx = first[win]
    ok = c[idx] & (chosen >= 0)
    return VoteResult(labels, chosen, idx, ok, float(ok.to(F64).mean()))


def majority_vote(answer_ids, correct, group_ids) -> VoteResult:
    """Self-consistency (Wang et al. 2023, arXiv 2203.11171): the answer class with the most responses wins.

    score(a) = #{i in question: answer_i = a}; ties -> first occurrence; -1 only if nothing else.
    Shapes: answer_ids [N] int, correct [N], group_ids [N] -> :class:`VoteResult` over B questions.
    """
    a, c, g = _vote_inputs(answer_ids, correct, group_ids)
    return _class_vote(a, c, g, torch.ones(a.numel(), dtype=F64, device=a.device))


def perplexity_consistency(answer_ids, correct, group_ids, mean_logprob, path_ids=None) -> VoteResult:
    """Perplexity consistency (the PC part of RPC, Zhou et al., NeurIPS 2025, arXiv 2502.00511 / 2510.15444):

    score(a) = sum over the UNIQUE sampled reasoning paths o with answer a of exp(lpm(o)),

    i.e. self-consistency weighted by the geometric-mean token probability, each distinct path counted once
    (the inference-time scaling that CAPO, arXiv 2604.12632, reports; docs/metrics.md, "Test-time scaling"). RPC's
    second component, reasoning pruning (a Weibull mixture that drops low-probability paths), is not applied.

    Args:
        answer_ids, correct, group_ids: [N] as in the module docstring.
        mean_logprob: [N] lpm of each response, <= 0 (NaN is an error).
        path_ids: optional [N] int; responses of one question with the same path id are identical texts and count
            once (the first occurrence's lpm is used). They must share the answer id (ValueError otherwise).
            Without it every response is a distinct path.
    Returns: :class:`VoteResult`. Ties -> first occurrence.
    """
    lpm = checks.scores("mean_logprob", mean_logprob)
    a, c, g = _vote_inputs(answer_ids, correct, group_ids, mean_logprob=lpm)
    w = confidence_from_logprob(lpm).to(a.device)
    if path_ids is not None:
        p = checks.group_ids_1d("path_ids", path_ids).to(a.device)
        checks.same_shape(answer_ids=a, path_ids=p)
        _, gi = group_index(g)
        _, pi = group_index(p)
        _, key = torch.unique(gi * (int(pi.max()) + 1) + pi, return_inverse=True)  # [N] (question, path) id
        n_paths = int(key.max()) + 1
        lo = torch.full((n_paths,), a.numel(), dtype=torch.int64, device=a.device)
        first = lo.scatter_reduce(0, key, torch.arange(a.numel(), device=a.device), reduce="amin")
        a_min = torch.full_like(lo, 1 << 62).scatter_reduce(0, key, a, reduce="amin")
        a_max = torch.full_like(lo, -2).scatter_reduce(0, key, a, reduce="amax")
        if bool((a_min != a_max).any()):
            bad = int(first[(a_min != a_max).nonzero()[0]])
            raise ValueError(
                f"path_ids marks identical responses, which must share one answer id; the path of row {bad} "
                f"(path_ids={int(p[bad])}) has answer ids {int(a_min[key[bad]])} and {int(a_max[key[bad]])}"
            )
        keep = torch.zeros(a.numel(), dtype=torch.bool, device=a.device)
        keep[first] = True
        w = torch.where(keep, w, torch.zeros_like(w))
    return _class_vote(a, c, g, w)


def _check_weights(w: torch.Tensor, where: torch.Tensor) -> None:
    bad = where & ~(torch.isfinite(w) & (w >= 0))
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"vote weights must be finite and >= 0, got {float(w[i])!r} at index {i}; pass a non-negative "
            "transform of the confidence (e.g. exp(lpm) for a log-prob score)"
        )


def weighted_vote(answer_ids, correct, group_ids, weights) -> VoteResult:
    """Confidence-weighted majority vote for any non-negative score: score(a) = sum of w_i over the responses with
    answer a; argmax wins (DeepConf's offline weighted voting, arXiv 2508.15260, Sec. 4, with w = a trace
    confidence from :mod:`capo.core.confidence`; RLCR's with w = verbal q).

    Args: weights [N] finite and >= 0 (ValueError otherwise: transform signed scores first, e.g. exp(lpm));
    NaN = missing, weight 0 (the response still names its class, which can win a tie at score 0 by first
    occurrence). Other shapes as in the module docstring. Returns :class:`VoteResult`.
    """
    w = checks.scores("weights", weights, allow_nan=True)
    a, c, g = _vote_inputs(answer_ids, correct, group_ids, weights=w)
    w = w.to(a.device)
    present = ~torch.isnan(w)
    _check_weights(w, present)
    return _class_vote(a, c, g, torch.where(present, w, torch.zeros_like(w)))


def confidence_weighted_vote(answer_ids, correct, group_ids, confidence) -> VoteResult:
    """Confidence-weighted majority vote (RLCR test time, arXiv 2507.16806): :func:`weighted_vote` with the verbal
    confidences q in [0, 1] as weights (NaN = missing, weight 0). Returns :class:`VoteResult`."""
    q, _ = checks.probs("confidence", confidence, allow_nan=True)
    return weighted_vote(answer_ids, correct, group_ids, q)


def _top_fraction(s: torch.Tensor, cand: torch.Tensor, gi: torch.Tensor, fraction: float) -> torch.Tensor:
    """Candidates at or above their question's (1 - fraction) quantile (linear interpolation, numpy's default):
    float64 [N], bool [N], contiguous question index [N] -> keep bool [N].

    For n candidates sorted ascending v_0..v_{n-1}, conf >= quantile  <=>  conf >= v_ceil(p), p = (n - 1)(1 - f)
    (no value lies strictly between v_floor(p) and v_ceil(p)); p is snapped 1e-9 down against rounding.
    """
    n = s.numel()
    filled = torch.where(cand, s, torch.zeros_like(s))
    o = torch.argsort(filled, stable=True)
    o = o[torch.argsort(cand[o].to(torch.int8), stable=True)]  # non-candidates first within a question
    o = o[torch.argsort(gi[o], stable=True)]
    n_groups = int(gi.max()) + 1
    n_all = torch.bincount(gi, minlength=n_groups)
    n_cand = torch.bincount(gi[cand], minlength=n_groups)
    first_cand = torch.cumsum(n_all, 0) - n_cand  # position in `o` of each question's lowest candidate
    p = (n_cand - 1).clamp(min=0).to(F64) * (1 - fraction)
    at = (first_cand + torch.ceil(p - 1e-9).to(torch.int64)).clamp(max=n - 1)
    return cand & (s >= filled[o][at][gi])


# DeepConf's offline setting (keep the top 10% by confidence): the default of every keep-fraction setting.
KEEP_FRACTION = 0.1


def filtered_vote(answer_ids, correct, group_ids, confidence, keep_fraction: float = KEEP_FRACTION,
                  weighted: bool = False):
    """Confidence-filtered voting (DeepConf offline, arXiv 2508.15260, Sec. 4): per question keep the responses whose
    confidence is at or above the (1 - keep_fraction) quantile of that question's candidates (numpy's linear
    percentile, as DeepConf; ties at the threshold are kept), then majority-vote among them, or with
    ``weighted=True`` weight each kept vote by its confidence (DeepConf's filtered + weighted vote).

    Candidates are the responses with an answer (id >= 0) and a present confidence (not NaN); the rest never vote.
    A question without candidates counts as wrong (chosen answer -1). keep_fraction = 1 keeps every candidate, so
    with no NaN confidence it equals :func:`majority_vote` (``weighted=False``) / :func:`weighted_vote`.

    Args: confidence [N] any real score, higher = more confident (e.g. an estimator of
    :mod:`capo.core.confidence`); NaN = missing. keep_fraction in (0, 1] (DeepConf: 0.1 and 0.9). weighted: the kept
    confidences must then be finite and >= 0. A tie goes to the class whose first kept response comes first. Other
    shapes as in the module docstring. Returns :class:`VoteResult`.
    """
    s = checks.scores("confidence", confidence, allow_nan=True)
    a, c, g = _vote_inputs(answer_ids, correct, group_ids, confidence=s)
    if not checks.is_real(keep_fraction) or not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction must be a number in (0, 1], got {keep_fraction!r}")
    s = s.to(a.device)
    _, gi = group_index(g)
    keep = _top_fraction(s, (a >= 0) & ~torch.isnan(s), gi, float(keep_fraction))
    if weighted:
        _check_weights(s, keep)
        w = torch.where(keep, s, torch.zeros_like(s))
    else:
        w = keep.to(F64)
    return _class_vote(torch.where(keep, a, torch.full_like(a, -1)), c, g, w)


def max_confidence(answer_ids, correct, group_ids, confidence) -> VoteResult:
    """Max-confidence selection (RLCR test time, arXiv 2507.16806): the answer of the single most confident
    response among those with an answer.

    Args: confidence [N] any real score (verbal q or lpm); NaN = missing, ranked below every present score.
    Ties -> the lowest row index. Returns :class:`VoteResult` whose ``chosen_index`` is the selected response.
    """
    s = checks.scores("confidence", confidence, allow_nan=True)
    a, c, g = _vote_inputs(answer_ids, correct, group_ids, confidence=s)
    s = s.to(a.device)
    labels, inv = group_index(g)
    missing = torch.isnan(s)
    score = torch.where(missing, torch.full_like(s, -math.inf), s)  # order only; `missing` ranks NaN below -inf
    win = _select(inv, a < 0, missing, score, torch.arange(a.numel(), device=a.device))
    chosen = a[win]
    ok = c[win] & (chosen >= 0)
    return VoteResult(labels, chosen, win, ok, float(ok.to(F64).mean()))
