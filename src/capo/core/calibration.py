"""Calibration metrics: how well a confidence score separates, and predicts, correct from incorrect responses.

Every function is pure: 1-D inputs of shape [N] (N responses; B questions with G_b responses each, identified by
``group_ids``), computed in float64 on the inputs' device, returning Python floats or small frozen dataclasses of
tensors. Inputs may be torch tensors, numpy arrays or lists (converted with ``torch.as_tensor``; lists go through
numpy first so Python floats stay float64). Nothing here logs, reads a config or touches a global RNG; the
bootstrap takes an explicit seed or ``torch.Generator``.

Two kinds of confidence (docs/papers.md, "Measuring calibration"):

- a *score* only needs an order (AUROC, AUC-mean, selective curves, AURC): the mean token log-prob ``lpm`` is used
  as is;
- a *probability* in [0, 1] is needed by ECE, Brier and reliability curves: for perplexity confidence this is
  ``confidence_from_logprob(lpm) = exp(lpm)``, the geometric-mean token probability (= 1 / PPL).

Conventions fixed here (each one is tested):

- ``correct`` is bool, or numbers that are all 0/1. Scores must not be NaN (+-inf is allowed and ordered);
  probabilities must lie in [0, 1]. Every metric raises ``ValueError`` on N = 0.
- AUROC ties count 1/2; AUROC of a sample without both classes is NaN.
- ECE binning matches torchmetrics ``BinaryCalibrationError`` (see :func:`ece`): bins [e_k, e_{k+1}), and a
  confidence of exactly 1.0 forms its own bin.
- AURC is the mean selective risk over coverages k/N, k = 1..N, with ties in confidence broken by their expectation
  (see :func:`aurc`).

Metrics return Python floats (one device sync per call): they are evaluation-time summaries, not training losses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from capo.core import checks

F64 = torch.float64

__all__ = [
    "AucMean",
    "PairedDifference",
    "Reliability",
    "Selective",
    "auc_mean",
    "aurc",
    "auroc",
    "bootstrap_ci",
    "bootstrap_draws",
    "percentile_interval",
    "brier",
    "confidence_from_logprob",
    "debiased_l2_ce",
    "e_aurc",
    "ece",
    "group_index",
    "mce",
    "paired_difference",
    "prr",
    "reliability_curve",
    "selective_curve",
    "smooth_ece",
    "summarize",
]


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Arbitrary labels [N] -> (sorted unique labels [G], contiguous index 0..G-1 per response [N])."""
    labels, inv = torch.unique(group_ids, sorted=True, return_inverse=True)
    return labels, inv


# ----------------------------------------------------------------------------------------------------------------
# ranking: AUROC and AUC-mean
# ----------------------------------------------------------------------------------------------------------------


def _group_auc(
    scores: torch.Tensor, correct: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group Mann-Whitney AUC, vectorised: float64 [N], bool [N], int64 labels [N] -> (labels [G], AUC [G]).

    One lexicographic sort by (group, score); within each group, average (mid-)ranks of the scores give
    U = R_1 - n_1 (n_1 + 1) / 2 and AUC = U / (n_1 n_0), which counts a tied (correct, incorrect) pair as 1/2.
    NaN for a group without both classes. O(N log N), no Python loop over groups.
    """
    n = scores.numel()
    dev = scores.device
    # lexicographic sort by (group, score): stable sort by score, then stable sort by group
    o1 = torch.argsort(scores, stable=True)
    order = o1[torch.argsort(group_ids[o1], stable=True)]
    s, gl, c = scores[order], group_ids[order], correct[order].to(F64)  # [N] each, grouped and score-sorted
    new_group = torch.ones(n, dtype=torch.bool, device=dev)
    new_group[1:] = gl[1:] != gl[:-1]
    g = torch.cumsum(new_group.to(torch.int64), 0) - 1  # [N] contiguous group index 0..G-1
    labels = gl[new_group]  # [G] sorted unique labels
    n_groups = labels.numel()
    new_block = new_group.clone()
    new_block[1:] |= s[1:] != s[:-1]  # `!=`, not diff: -inf == -inf is a tie
    block = torch.cumsum(new_block.to(torch.int64), 0) - 1  # [N] tie-block id
    n_per_group = torch.bincount(g, minlength=n_groups)  # [G]
    group_start = torch.cumsum(n_per_group, 0) - n_per_group  # [G]
    pos = (torch.arange(n, device=dev) - group_start[g] + 1).to(F64)  # [N] 1-based rank within group
    n_blocks = int(block[-1]) + 1
    block_sum = torch.zeros(n_blocks, dtype=F64, device=dev).scatter_add_(0, block, pos)
    block_cnt = torch.bincount(block, minlength=n_blocks).to(F64)
    rank = (block_sum / block_cnt)[block]  # [N] mid-rank within group
    r1 = torch.zeros(n_groups, dtype=F64, device=dev).scatter_add_(0, g, rank * c)  # [G]
    n1 = torch.zeros(n_groups, dtype=F64, device=dev).scatter_add_(0, g, c)  # [G]
    n0 = n_per_group.to(F64) - n1
    both = (n1 > 0) & (n0 > 0)
    auc = (r1 - n1 * (n1 + 1) / 2) / torch.where(both, n1 * n0, torch.ones_like(n1))
    return labels, torch.where(both, auc, torch.full_like(auc, math.nan))


def auroc(scores, correct) -> float:
    """Pooled AUROC = P(score of a correct response > score of an incorrect one), ties counting 1/2.

    AUROC = (R_1 - n_1 (n_1 + 1) / 2) / (n_1 n_0)   (Mann-Whitney U over mid-ranks; Hanley & McNeil 1982),
    where R_1 is the sum of the mid-ranks of the n_1 correct responses among all N, n_0 = N - n_1.
    Relative calibration of CAPO (arXiv 2604.12632, Sec. 3) pooled over all questions (docs/metrics.md,
    "`auroc`").

    Args:
        scores: [N] real scores (any order-carrying confidence, e.g. lpm); NaN is an error, +-inf allowed.
        correct: [N] bool or 0/1.

    Returns:
        AUROC in [0, 1]; NaN when all responses are correct or all incorrect (a class is empty).
        Raises ValueError for N = 0. Invariant under strictly increasing transforms of the scores; O(N log N).
    """
    s = checks.scores("scores", scores)
    c = checks.labels("correct", correct)
    checks.same_shape(scores=s, correct=c)
    checks.nonempty("scores", s)
    one_group = torch.zeros(s.numel(), dtype=torch.int64, device=s.device)
    return float(_group_auc(s, c.to(s.device), one_group)[1][0])


@dataclass(frozen=True)
class AucMean:
    """Result of :func:`auc_mean`.

    value: mean per-question AUC over the questions that have both classes (NaN if none).
    per_group: [G] float64 per-question AUC, NaN for questions without both correct and incorrect responses.
    group_labels: [G] int64 the sorted unique ``group_ids``, aligned with ``per_group``.
    n_groups_used: number of questions that entered ``value``.
    n_groups: number of distinct questions G.
    """

    value: float
    per_group: torch.Tensor
    group_labels: torch.Tensor
    n_groups_used: int
    n_groups: int


def auc_mean(scores, correct, group_ids) -> AucMean:
    """AUC-mean: per-question AUC of the confidence score, averaged over questions with both right and wrong samples.

    AUC_b = P(s_i > s_j | i correct, j incorrect, both answers to question b), ties 1/2 (as :func:`auroc`, within b);
    AUC-mean = (1/|Q|) sum_{b in Q} AUC_b, Q = {questions with >= 1 correct and >= 1 incorrect response}.
    This is the "AUC-mean" of CAPO (arXiv 2604.12632, Sec. 5, evaluation) with s = lpm (docs/metrics.md,
    "`auc_mean`"; how to read it: docs/papers.md, "Measuring calibration").
    Report ``n_groups_used`` with it: Q shrinks as accuracy moves towards 0 or 1.

    Args:
        scores: [N] real scores (NaN is an error).
        correct: [N] bool or 0/1.
        group_ids: [N] integer question labels, arbitrary (not necessarily contiguous or sorted).

    Returns:
        :class:`AucMean`; ``value`` is NaN if no question has both classes. Raises ValueError for N = 0.
        Fully vectorised (one lexicographic sort), O(N log N).
    """
    s = checks.scores("scores", scores)
    c = checks.labels("correct", correct)
    g = checks.group_ids_1d("group_ids", group_ids)
    checks.same_shape(scores=s, correct=c, group_ids=g)
    checks.nonempty("scores", s)
    labels, per_group = _group_auc(s, c.to(s.device), g.to(s.device))
    used = ~torch.isnan(per_group)
    n_used = int(used.sum())
    value = float(per_group[used].mean()) if n_used > 0 else math.nan
    return AucMean(value=value, per_group=per_group, group_labels=labels, n_groups_used=n_used, n_groups=labels.numel())


# ----------------------------------------------------------------------------------------------------------------
# probability metrics: ECE, reliability, Brier
# ----------------------------------------------------------------------------------------------------------------


def _bin_edges(conf: torch.Tensor, src_dtype: torch.dtype, n_bins: int, strategy: str) -> torch.Tensor:
    """Bin edges (float64): bin k is [e_k, e_{k+1}), the last bin is closed [e_{-2}, e_{-1}].

    uniform: e_k = k / n_bins rounded to the input's floating precision (so a float32 0.7 sits on the 0.7 edge),
    followed by a repeated 1.0: n_bins + 2 edges, the last bin [1, 1] holding confidences exactly 1.0 (torchmetrics).
    quantile: the n_bins + 1 quantiles (linear interpolation) of the confidences, e_0 = min, e_{n_bins} = max. The
    position of quantile k / n_bins among the N sorted values, k (N - 1) / n_bins, is taken in integers: where it is
    whole the edge is that value exactly (``torch.quantile`` at ``linspace`` levels put 0.30000000000000004 (N - 1)
    past it and the value into the bin below: N = 31, 10 bins).
    """
    if strategy == "uniform":
        e = (torch.arange(n_bins + 1, dtype=F64, device=conf.device) / n_bins).to(src_dtype).to(F64)
        return torch.cat([e, e[-1:]])
    v = conf.sort().values
    pos = torch.arange(n_bins + 1, device=conf.device) * (v.numel() - 1)
    lo, rem = pos // n_bins, pos % n_bins
    hi = (lo + 1).clamp(max=v.numel() - 1)
    return v[lo] + (rem.to(F64) / n_bins) * (v[hi] - v[lo])


def _binned(conf: torch.Tensor, correct: torch.Tensor, edges: torch.Tensor):
    """Per-bin (count, sum of confidence, number correct) for the bins of :func:`_bin_edges`."""
    nb = edges.numel() - 1
    idx = torch.bucketize(conf, edges[1:-1].contiguous(), right=True)  # [N] in 0..nb-1: #interior edges <= conf
    count = torch.bincount(idx, minlength=nb)
    s_conf = torch.zeros(nb, dtype=F64, device=conf.device).scatter_add_(0, idx, conf)
    s_acc = torch.zeros(nb, dtype=F64, device=conf.device).scatter_add_(0, idx, correct.to(F64))
    return count, s_conf, s_acc


def _check_bins(n_bins, strategy: str) -> None:
    if not checks.is_int(n_bins):
        raise TypeError(f"n_bins must be an int >= 1, got {type(n_bins).__name__}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    checks.choice("strategy", strategy, ("uniform", "quantile"))


def _prob_inputs(confidence, correct):
    q, src = checks.probs("confidence", confidence)
    c = checks.labels("correct", correct)
    checks.same_shape(confidence=q, correct=c)
    checks.nonempty("confidence", q)
    return q, src, c.to(q.device)


def ece(confidence, correct, n_bins: int = 10, strategy: str = "uniform") -> float:
    """Expected calibration error: ECE = sum_b (|B_b| / N) |acc(B_b) - conf(B_b)|  (Guo et al. 2017, Eq. 3).

    acc(B_b) = fraction correct in bin b, conf(B_b) = mean confidence in bin b; empty bins contribute 0.
    Binning (``strategy="uniform"``, the default, matching torchmetrics ``BinaryCalibrationError(norm="l1")``, which
    uses ``torch.bucketize(conf, linspace(0, 1, n_bins + 1), right=True) - 1``): bins are closed on the LEFT,
    [k/n, (k+1)/n) for k = 0..n_bins-1, and a confidence of exactly 1.0 forms an extra bin of its own; a confidence
    of exactly 0 is in the first bin and one exactly on an interior edge k/n is in the bin that starts there.
    Edges are k/n_bins rounded to the input's floating precision; torchmetrics uses ``torch.linspace``, which can be
    1 ulp off k/n (float64, n_bins=10: 0.30000000000000004), so the two can differ only for confidences within one
    ulp of such an edge (e.g. a float64 0.3), where this function bins by the intended edge.
    ``strategy="quantile"``: edges are the confidence quantiles (adaptive ECE, Nguyen & O'Connor 2015), bins
    [q_k, q_{k+1}) with the last closed; tied confidences always share a bin (some bins may then be empty).

    Args:
        confidence: [N] probabilities in [0, 1] (for perplexity confidence use ``confidence_from_logprob(lpm)``).
        correct: [N] bool or 0/1.
        n_bins: number of bins, >= 1. strategy: "uniform" or "quantile".

    Returns:
        ECE in [0, 1]. Raises ValueError for N = 0, NaN or out-of-range confidences, n_bins < 1, an unknown strategy.
    """
    _check_bins(n_bins, strategy)
    q, src, c = _prob_inputs(confidence, correct)
    count, s_conf, s_acc = _binned(q, c, _bin_edges(q, src, n_bins, strategy))
    return float((s_acc - s_conf).abs().sum() / q.numel())


@dataclass(frozen=True)
class Reliability:
    """Reliability diagram data (:func:`reliability_curve`); bin k covers [bin_edges[k], bin_edges[k+1]), the last
    bin is closed. ``len(bin_edges) == len(bin_count) + 1``.

    bin_edges: float64 edges (uniform: n_bins + 2 entries, 0, 1/n, ..., 1, 1 -- the final degenerate bin [1, 1]
        holds confidences exactly 1.0, as in :func:`ece`; quantile: n_bins + 1 entries).
    bin_confidence: float64 mean confidence per bin (NaN for empty bins).
    bin_accuracy: float64 fraction correct per bin (NaN for empty bins).
    bin_count: int64 responses per bin.
    """

    bin_edges: torch.Tensor
    bin_confidence: torch.Tensor
    bin_accuracy: torch.Tensor
    bin_count: torch.Tensor


def reliability_curve(confidence, correct, n_bins: int = 10, strategy: str = "uniform") -> Reliability:
    """Per-bin mean confidence and accuracy, binned exactly as :func:`ece` (so ECE = sum_b count_b/N |acc_b - conf_b|
    over non-empty bins). Shapes: [N], [N] -> bins as described in :class:`Reliability`. Raises as :func:`ece`."""
    _check_bins(n_bins, strategy)
    q, src, c = _prob_inputs(confidence, correct)
    edges = _bin_edges(q, src, n_bins, strategy)
    count, s_conf, s_acc = _binned(q, c, edges)
    denom = count.to(F64)
    empty = count == 0
    nan = torch.full_like(denom, math.nan)
    return Reliability(
        bin_edges=edges,
        bin_confidence=torch.where(empty, nan, s_conf / denom.clamp(min=1)),
        bin_accuracy=torch.where(empty, nan, s_acc / denom.clamp(min=1)),
        bin_count=count,
    )


def mce(confidence, correct, n_bins: int = 10, strategy: str = "uniform") -> float:
    """Maximum calibration error: MCE = max over non-empty bins b of |acc(B_b) - conf(B_b)|  (Naeini et al. 2015;
    Guo et al. 2017, Sec. 2). Bins exactly as :func:`ece` (``strategy="quantile"``: equal-mass bins).

    Args and errors as :func:`ece`. Returns MCE in [0, 1], lower is better; it is driven by the worst bin, however
    few responses it holds (report bin counts with it).
    """
    _check_bins(n_bins, strategy)
    q, src, c = _prob_inputs(confidence, correct)
    count, s_conf, s_acc = _binned(q, c, _bin_edges(q, src, n_bins, strategy))
    gap = (s_acc - s_conf).abs() / count.clamp(min=1).to(F64)  # 0 for empty bins
    return float(gap.max())


def debiased_l2_ce(confidence, correct, n_bins: int = 10, strategy: str = "uniform") -> float:
    """Debiased L2 calibration error (Kumar, Liang & Ma 2019, "Verified uncertainty calibration", Sec. 5):

    CE^2 = sum_b (n_b / N) [ (acc_b - conf_b)^2 - acc_b (1 - acc_b) / (n_b - 1) ]  over bins with n_b >= 2,
    CE = sqrt(max(CE^2, 0)).

    The plug-in (acc_b - conf_b)^2 overestimates the squared gap by the variance of acc_b; the subtracted term is its
    unbiased estimate. A bin with one response has no variance estimate and contributes 0 (as the authors'
    ``calibration`` package, ``unbiased_l2_ce``); torchmetrics' ``debias=True`` instead keeps its plug-in term.
    Bins exactly as :func:`ece` (Kumar et al. recommend ``strategy="quantile"``, equal mass).

    Args and errors as :func:`ece`. Returns CE in [0, 1], lower is better (0 when the estimate of CE^2 is <= 0).
    """
    _check_bins(n_bins, strategy)
    q, src, c = _prob_inputs(confidence, correct)
    count, s_conf, s_acc = _binned(q, c, _bin_edges(q, src, n_bins, strategy))
    nb = count.to(F64)
    acc = s_acc / nb.clamp(min=1)
    gap2 = ((s_acc - s_conf) / nb.clamp(min=1)) ** 2
    term = gap2 - acc * (1 - acc) / (nb - 1).clamp(min=1)
    ce2 = float(torch.where(count >= 2, nb / q.numel() * term, torch.zeros_like(term)).sum())
    return math.sqrt(max(ce2, 0.0))


def _wrapped_gaussian(d: torch.Tensor, sigma: float) -> torch.Tensor:
    """w(d) = sum_k phi_sigma(d - 2k): the Gaussian density wrapped with period 2 (enough images for d in [-1, 2])."""
    k = torch.arange(-(int(math.ceil(4 * sigma)) + 2), int(math.ceil(4 * sigma)) + 3, dtype=F64, device=d.device)
    z = (d[:, None] - 2 * k[None, :]) / sigma
    return torch.exp(-0.5 * z * z).sum(1) / (sigma * math.sqrt(2 * math.pi))


def _full_conv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Full linear convolution of two 1-D float64 tensors via the FFT: [A], [B] -> [A + B - 1]."""
    n = a.numel() + b.numel() - 1
    m = 1 << (n - 1).bit_length()  # a power of two: fast FFT sizes
    return torch.fft.irfft(torch.fft.rfft(a, m) * torch.fft.rfft(b, m), m)[:n]


def _smooth_ece_at(q: torch.Tensor, resid: torch.Tensor, sigma: float) -> float:
    """smECE_sigma = int_0^1 |(1/N) sum_i K_sigma(t, q_i) r_i| dt on a grid of P nodes t_i = i h, h = 1/(P-1).

    K_sigma(t, f) = w(t - f) + w(t + f) is the Gaussian kernel reflected at 0 and 1 (:func:`_wrapped_gaussian`), so
    int_0^1 K(t, f) dt = 1. Each q_i is split linearly between its two neighbouring nodes (exact for q on the grid),
    both sums over nodes are convolutions (FFT), and the integral is the trapezoid rule; h <= sigma / 40 for
    sigma >= 0.001 (P <= 40001).
    """
    p = min(40001, max(1001, math.ceil(40 / sigma) + 1))
    pos = q * (p - 1)
    lo = pos.floor().clamp(max=p - 2).to(torch.int64)
    frac = pos - lo
    s = torch.zeros(p, dtype=F64, device=q.device)
    s.scatter_add_(0, lo, (1 - frac) * resid).scatter_add_(0, lo + 1, frac * resid)
    w = _wrapped_gaussian(torch.arange(-(p - 1), 2 * p - 1, dtype=F64, device=q.device) / (p - 1), sigma)
    diff = _full_conv(s, w[: 2 * p - 1])[p - 1 : 2 * p - 1]  # sum_j w((i - j) h) s_j
    summ = _full_conv(s.flip(0), w[p - 1 :])[p - 1 : 2 * p - 1]  # sum_j w((i + j) h) s_j
    dens = (diff + summ).abs() / q.numel()
    return float((dens.sum() - (dens[0] + dens[-1]) / 2) / (p - 1))


def smooth_ece(confidence, correct, sigma: float | None = None) -> float:
    """Smooth ECE (Blasiok & Nakkiran 2023, "Smooth ECE: principled reliability diagrams via kernel smoothing",
    arXiv 2309.12236; the ``relplot`` package):

    smECE_sigma = int_0^1 | (1/N) sum_i K_sigma(t, q_i) (c_i - q_i) | dt,

    K_sigma the Gaussian kernel of bandwidth sigma reflected at 0 and 1 (so it integrates to 1 over [0, 1]); this
    is the kernel-smoothed residual r(t) weighted by the kernel density of q. Without ``sigma`` the bandwidth is the
    paper's fixed point sigma* with smECE_sigma* = sigma* (smECE_sigma is non-increasing in sigma), found by
    bisection on [1e-3, 1] to 1e-5; a root below 1e-3 is clamped there (as relplot). No binning, continuous in
    the inputs; computed on a grid (see :func:`_smooth_ece_at`), within ~5e-6 of the exact integral.

    Args: confidence [N] probabilities in [0, 1]; correct [N] bool or 0/1; sigma: None (automatic) or > 0.
    Returns smECE in [0, 1], lower is better. Raises ValueError for N = 0 and bad inputs.
    """
    q, _, c = _prob_inputs(confidence, correct)
    resid = c.to(F64) - q
    if sigma is not None:
        return _smooth_ece_at(q, resid, checks.positive("sigma", sigma))
    lo, hi = 1e-3, 1.0  # smECE_sigma - sigma is decreasing: bisect its sign change
    while hi - lo > 1e-5:
        mid = (lo + hi) / 2
        if _smooth_ece_at(q, resid, mid) > mid:
            lo = mid
        else:
            hi = mid
    return _smooth_ece_at(q, resid, (lo + hi) / 2)


def brier(confidence, correct) -> float:
    """Brier score = (1/N) sum_i (q_i - c_i)^2, c_i in {0, 1}  (Brier 1950; the RLCR reward term, arXiv 2507.16806).

    Args: confidence [N] probabilities in [0, 1]; correct [N] bool or 0/1.
    Returns: Brier in [0, 1], lower is better (0.25 for a constant 0.5). Raises ValueError for N = 0 or bad inputs.
    """
    q, _, c = _prob_inputs(confidence, correct)
    return float(((q - c.to(F64)) ** 2).mean())


def confidence_from_logprob(mean_logprob) -> torch.Tensor:
    """exp(lpm): the geometric-mean token probability (= 1 / PPL), the probability used for ECE/Brier of perplexity
    confidence (docs/papers.md, "Measuring calibration"; as in RPC's ``np.exp(mean_logprob)``, arXiv 2502.00511).

    Args: mean_logprob: [N] mean token log-probs, each <= 0 (-inf allowed, giving 0); NaN is an error.
    Returns: float64 [N] in [0, 1].
    """
    lpm = checks.scores("mean_logprob", mean_logprob)
    if bool((lpm > 0).any()):
        i = int((lpm > 0).nonzero()[0])
        raise ValueError(f"mean_logprob must be <= 0 (a mean of log-probabilities), got {float(lpm[i])!r} at index {i}")
    return torch.exp(lpm)


# ----------------------------------------------------------------------------------------------------------------
# selective prediction
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selective:
    """Risk-coverage / precision-coverage curve (:func:`selective_curve`), one point per distinct confidence.

    threshold: [P] float64 distinct confidences, descending; point p answers every response with confidence >= it.
    n_answered: [P] int64 responses answered at that threshold.
    coverage: [P] float64 n_answered / N (increasing, ends at 1).
    precision: [P] float64 accuracy on the answered responses.
    risk: [P] float64 1 - precision (selective risk, computed as errors / n_answered).
    """

    threshold: torch.Tensor
    n_answered: torch.Tensor
    coverage: torch.Tensor
    precision: torch.Tensor
    risk: torch.Tensor


def _sorted_desc(confidence, correct):
    s = checks.scores("confidence", confidence)
    c = checks.labels("correct", correct)
    checks.same_shape(confidence=s, correct=c)
    checks.nonempty("confidence", s)
    order = torch.argsort(s, descending=True, stable=True)
    return s[order], c.to(s.device)[order]


def selective_curve(confidence, correct) -> Selective:
    """Selective prediction: answer only when confidence >= t; sweep t over the distinct confidences (descending).

    For threshold t: n(t) = #{i: q_i >= t}, coverage = n(t)/N, precision = #{correct i: q_i >= t} / n(t),
    risk = 1 - precision (Geifman & El-Yaniv 2017, "Selective classification for deep neural networks"; CAPO's
    precision-coverage curve in arXiv 2604.12632's evaluation). Ties: all responses with equal confidence are
    answered or abstained together, so a point appears only where the threshold changes.

    Args: confidence: [N] real scores (any monotone confidence; NaN is an error); correct: [N] bool or 0/1.
    Returns: :class:`Selective` with P <= N points. Raises ValueError for N = 0.
    """
    s, c = _sorted_desc(confidence, correct)
    n = s.numel()
    last = torch.ones(n, dtype=torch.bool, device=s.device)
    last[:-1] = s[1:] != s[:-1]  # end of each tie block
    k = torch.arange(1, n + 1, device=s.device)
    k_l = k[last]
    n_err = torch.cumsum((~c).to(F64), 0)[last]
    risk = n_err / k_l.to(F64)
    return Selective(
        threshold=s[last],
        n_answered=k_l,
        coverage=k_l.to(F64) / n,
        precision=(k_l.to(F64) - n_err) / k_l.to(F64),
        risk=risk,
    )


def aurc(confidence, correct) -> float:
    """Area under the risk-coverage curve: AURC = (1/N) sum_{k=1}^{N} r_k, r_k = selective risk of the k most
    confident responses (Geifman et al. 2019, "Bias-reduced uncertainty estimation", Sec. 3; the common AURC code).

    Ties: with equal confidences "the k most confident" is not defined, so r_k is its expectation over a uniformly
    random order within each tie block: if the block spans ranks k0+1..k0+m and holds e errors, with E errors ranked
    before it, r_{k0+j} = (E + j e / m) / (k0 + j). This equals the plain formula without ties, the average of it over
    all tie orders, and the risk of :func:`selective_curve` at every threshold point (j = m). Permutation invariant.

    Args: confidence: [N] real scores (NaN is an error); correct: [N] bool or 0/1.
    Returns: AURC in [0, 1], lower is better; for a perfect ranking it is the minimum reachable at that accuracy
    (:func:`e_aurc` subtracts that minimum). Raises ValueError for N = 0.
    """
    s, c = _sorted_desc(confidence, correct)
    n = s.numel()
    dev = s.device
    err = (~c).to(F64)
    first = torch.ones(n, dtype=torch.bool, device=dev)
    first[1:] = s[1:] != s[:-1]
    block = torch.cumsum(first.to(torch.int64), 0) - 1  # [N]
    nb = int(block[-1]) + 1
    m = torch.bincount(block, minlength=nb).to(F64)  # [nb] block sizes
    e = torch.zeros(nb, dtype=F64, device=dev).scatter_add_(0, block, err)  # [nb] errors per block
    k0 = torch.cumsum(m, 0) - m  # responses before each block
    e0 = torch.cumsum(e, 0) - e  # errors before each block
    k = torch.arange(1, n + 1, device=dev).to(F64)  # [N]
    j = k - k0[block]
    r = (e0[block] + j * e[block] / m[block]) / k
    return float(r.mean())


def _aurc_optimal(n: int, n_err: int) -> float:
    """AURC of a perfect ranking (every correct response above every error): (1/N) sum_{k=N-E+1}^{N} (k-(N-E))/k."""
    k = torch.arange(n - n_err + 1, n + 1, dtype=F64, device="cpu")
    return float(((k - (n - n_err)) / k).sum() / n)


def e_aurc(confidence, correct) -> float:
    """Excess AURC: E-AURC = AURC - AURC*, AURC* the AURC of a perfect ranking at the same accuracy (Geifman et al.
    2019, "Bias-reduced uncertainty estimation for deep neural classifiers", Sec. 3).

    AURC* = (1/N) sum_{k=N-E+1}^{N} (k - (N - E)) / k for E errors among N: the discrete value, matching the
    discrete :func:`aurc` (the paper's closed form r + (1 - r) ln(1 - r), r = E/N, is its continuous limit and
    differs by O(log N / N)). Ties as :func:`aurc`.

    Args: confidence [N] real scores (NaN is an error); correct [N] bool or 0/1.
    Returns E-AURC in [0, 1], lower is better, 0 for a perfect ranking (and whenever all responses are correct or
    all wrong). Raises ValueError for N = 0.
    """
    s, c = _sorted_desc(confidence, correct)
    return aurc(s, c) - _aurc_optimal(s.numel(), int((~c).sum()))


def prr(confidence, correct) -> float:
    """Prediction-rejection ratio (Malinin et al. 2017; lm-polygraph's normalised ``PredictionRejectionArea``, Vashurin
    et al. 2025): how much of the gain of the oracle ranking over a random one the confidence achieves,

    PRR = (PRA - PRA_random) / (PRA_oracle - PRA_random),  PRA = (1/N) sum_{k=1}^{N} accuracy of the k most confident,

    i.e. PRA = 1 - :func:`aurc`, PRA_random = accuracy (the expectation over random orders, which lm-polygraph
    estimates with 1000 shuffles), PRA_oracle = 1 - AURC*. Equivalently PRR = 1 - E-AURC / (1 - accuracy - AURC*).

    Args: confidence [N] real scores (NaN is an error); correct [N] bool or 0/1.
    Returns PRR <= 1, higher is better: 1 = oracle ranking, 0 = no better than random, < 0 = worse. NaN when all
    responses are correct or all wrong (nothing to rank; lm-polygraph then returns the raw PRA). Ties count by
    their expectation (:func:`aurc`), where lm-polygraph takes numpy's argsort order. Raises ValueError for N = 0.
    """
    s, c = _sorted_desc(confidence, correct)
    n, n_err = s.numel(), int((~c).sum())
    if n_err in (0, n):
        return math.nan
    random = n_err / n  # AURC of a random order: the expected risk at every coverage
    best = _aurc_optimal(n, n_err)
    return (random - aurc(s, c)) / (random - best)


# ----------------------------------------------------------------------------------------------------------------
# uncertainty: bootstrap over questions, paired differences
# ----------------------------------------------------------------------------------------------------------------


def _generator(seed) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return seed
    if not checks.is_int(seed):
        raise TypeError(f"seed must be an int or a torch.Generator, got {type(seed).__name__}")
    return torch.Generator(device="cpu").manual_seed(seed)


def _check_boot(n_boot, alpha) -> None:
    if not checks.is_int(n_boot) or n_boot < 1:
        raise ValueError(f"n_boot must be an int >= 1, got {n_boot!r}")
    if not (checks.is_real(alpha) and 0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def bootstrap_draws(n_groups: int, n_boot: int, seed: int | torch.Generator = 0) -> torch.Tensor:
    """[n_boot, n_groups] question indices, each row one replicate's draw of n_groups questions uniformly with
    replacement: the one resampling scheme of every prompt bootstrap in capo (:func:`bootstrap_ci`, the model
    comparison). ``seed``: an int or a CPU ``torch.Generator`` (advanced in place)."""
    gen = _generator(seed)
    return torch.randint(n_groups, (n_boot, n_groups), generator=gen, device=gen.device)


def percentile_interval(values: torch.Tensor, alpha: float = 0.05) -> tuple[float, float]:
    """(alpha/2, 1 - alpha/2) quantiles (linear interpolation) of the replicate values, NaN dropped; (NaN, NaN)
    when none is left. The one percentile rule of every bootstrap interval in capo."""
    return _percentile_interval(values, alpha)


def _percentile_interval(values: torch.Tensor, alpha: float) -> tuple[float, float]:
    v = values[~torch.isnan(values)]
    if v.numel() == 0:
        return math.nan, math.nan
    lo_hi = torch.quantile(v, torch.tensor([alpha / 2, 1 - alpha / 2], dtype=F64, device=v.device))
    return float(lo_hi[0]), float(lo_hi[1])


def bootstrap_ci(
    fn: Callable[..., float],
    *arrays,
    group_ids,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int | torch.Generator = 0,
    pass_group_ids: bool = False,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``fn(*arrays)`` resampling questions (groups) with replacement.

    Each replicate draws G question indices uniformly with replacement (G = number of distinct ``group_ids``) and
    keeps every response of each drawn question (a cluster bootstrap: the responses of one question are not
    independent; docs/papers.md, "Measuring calibration"). The interval is the (alpha/2, 1 - alpha/2) quantiles
    (linear interpolation) of the replicate values (Efron & Tibshirani 1993, Ch. 13). Replicates where ``fn``
    returns NaN (e.g. no question with both classes) are dropped; if all are NaN the result is (NaN, NaN).

    Args:
        fn: metric over the resampled arrays, returning a float (or 0-d tensor). With ``pass_group_ids=True`` it is
            called as ``fn(*arrays, new_group_ids)`` where ``new_group_ids`` [N'] labels each draw 0..G-1, so a
            question drawn twice counts as two questions (e.g. ``bootstrap_ci(lambda s, c, g: auc_mean(s, c, g).value,
            s, c, group_ids=g, pass_group_ids=True)``).
        *arrays: [N] inputs of ``fn`` (any dtype), resampled together.
        group_ids: [N] integer question labels.
        n_boot: replicates, >= 1. alpha: in (0, 1); 0.05 gives a 95% interval.
        seed: an int (a fresh ``torch.Generator`` seeded with it) or a CPU ``torch.Generator`` (advanced in place).

    Returns: (low, high).
    """
    _check_boot(n_boot, alpha)
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    g = checks.group_ids_1d("group_ids", group_ids)
    checks.nonempty("group_ids", g)
    ts = [checks.array1d(f"arrays[{i}]", a) for i, a in enumerate(arrays)]
    for i, t in enumerate(ts):
        checks.same_shape(group_ids=g, **{f"arrays[{i}]": t})
    gen = _generator(seed)
    labels, inv = group_index(g.cpu())
    n_groups = labels.numel()
    # padded table of each question's rows: table[q, j] = j-th row of question q, valid[q, j] marks real entries
    order = torch.argsort(inv, stable=True)  # rows grouped by question
    counts = torch.bincount(inv, minlength=n_groups)  # [G]
    starts = torch.cumsum(counts, 0) - counts
    j = torch.arange(int(counts.max()), device="cpu")  # [M]
    valid = j[None, :] < counts[:, None]  # [G, M]
    table = order[torch.where(valid, starts[:, None] + j[None, :], 0)]  # [G, M]
    new_ids = torch.arange(n_groups, device="cpu")[:, None].expand_as(table)  # [G, M] draw position -> new label
    values = torch.empty(n_boot, dtype=F64, device="cpu")
    for b, draw in enumerate(bootstrap_draws(n_groups, n_boot, gen)):  # draw: [G] question indices
        keep = valid[draw]  # [G, M]
        rows = table[draw][keep]  # [N'] response rows of the drawn questions, in draw order
        args = [t[rows.to(t.device)] for t in ts]
        if pass_group_ids:
            args.append(new_ids[keep].to(g.device))
        values[b] = float(fn(*args))
    return _percentile_interval(values, alpha)


@dataclass(frozen=True)
class PairedDifference:
    """Result of :func:`paired_difference` (model A minus model B, per-question AUC).

    value: mean over common questions of AUC_A(b) - AUC_B(b) (NaN if none).
    low, high: percentile bootstrap interval of ``value`` over questions.
    per_group: [K] float64 differences; group_labels: [K] int64 their question labels (sorted).
    n_groups_used: K, the questions where both models have both classes.
    """

    value: float
    low: float
    high: float
    per_group: torch.Tensor
    group_labels: torch.Tensor
    n_groups_used: int


def paired_difference(
    scores_a,
    correct_a,
    group_ids_a,
    scores_b,
    correct_b,
    group_ids_b,
    *,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int | torch.Generator = 0,
) -> PairedDifference:
    """Paired per-question difference of AUC between two models on the same prompts, with a bootstrap interval.

    d_b = AUC_A(b) - AUC_B(b) for each question label b where both models have both right and wrong responses
    (labels in ``group_ids_a`` and ``group_ids_b`` name the same prompts; sample counts may differ);
    value = mean_b d_b. The interval resamples the K common questions with replacement (docs/papers.md, "Measuring
    calibration": paired per-question differences against the base model). Note value != auc_mean(A) -
    auc_mean(B) in general: both means here run over the same question set.

    Shapes: scores_x, correct_x, group_ids_x are [N_x] each. Returns :class:`PairedDifference` (NaNs if K = 0).
    """
    _check_boot(n_boot, alpha)
    gen = _generator(seed)
    ra = auc_mean(scores_a, correct_a, group_ids_a)
    rb = auc_mean(scores_b, correct_b, group_ids_b)
    la, lb = ra.group_labels.cpu(), rb.group_labels.cpu()
    pa, pb = ra.per_group.cpu(), rb.per_group.cpu()
    common = torch.isin(la, lb)
    pos_b = torch.searchsorted(lb, la[common])  # labels are sorted and unique
    d = pa[common] - pb[pos_b]
    keep = ~torch.isnan(d)
    d, labels = d[keep], la[common][keep]
    k = d.numel()
    if k == 0:
        return PairedDifference(math.nan, math.nan, math.nan, d, labels, 0)
    draws = torch.randint(k, (n_boot, k), generator=gen)  # [n_boot, K]
    low, high = _percentile_interval(d[draws].mean(1), alpha)
    return PairedDifference(float(d.mean()), low, high, d, labels, k)


# ----------------------------------------------------------------------------------------------------------------
# everything in one dict
# ----------------------------------------------------------------------------------------------------------------


def summarize(scores_lpm, correct, group_ids, verbal_conf=None, n_bins: int = 10) -> dict[str, float]:
    """All calibration metrics of one set of responses, as a flat dict of floats (callers add ``calib/``/``eval/``).

    Perplexity confidence: ranking metrics use lpm itself (auroc, auc_mean, aurc); probability metrics use
    exp(lpm) (ece, brier, mean_confidence). Keys:
    ``n``, ``n_groups``, ``accuracy`` (pooled fraction correct), ``auc_mean``, ``auc_mean_groups`` (questions used),
    ``auroc``, ``ece``, ``brier``, ``aurc``, ``mean_confidence``;
    with ``verbal_conf`` [N] (probabilities in [0, 1], NaN = missing/unparseable, excluded from every verbal metric):
    ``verbal_missing`` (count of NaN), ``verbal_ece``, ``verbal_brier``, ``verbal_auroc``, ``verbal_aurc``,
    ``verbal_auc_mean``, ``verbal_auc_mean_groups``, ``verbal_mean_confidence`` (all NaN, groups 0, if every one is
    missing).

    Shapes: scores_lpm [N] (each <= 0), correct [N], group_ids [N], verbal_conf [N] or None. Raises ValueError for
    N = 0 and bad inputs (as the individual metrics).
    """
    lpm = checks.scores("scores_lpm", scores_lpm)
    c = checks.labels("correct", correct).to(lpm.device)
    g = checks.group_ids_1d("group_ids", group_ids).to(lpm.device)
    checks.same_shape(scores_lpm=lpm, correct=c, group_ids=g)
    checks.nonempty("scores_lpm", lpm)
    _check_bins(n_bins, "uniform")
    p = confidence_from_logprob(lpm)
    am = auc_mean(lpm, c, g)
    out: dict[str, float] = {
        "n": float(lpm.numel()),
        "n_groups": float(am.n_groups),
        "accuracy": float(c.to(F64).mean()),
        "auc_mean": am.value,
        "auc_mean_groups": float(am.n_groups_used),
        "auroc": auroc(lpm, c),
        "ece": ece(p, c, n_bins=n_bins),
        "brier": brier(p, c),
        "aurc": aurc(lpm, c),
        "mean_confidence": float(p.mean()),
    }
    if verbal_conf is None:
        return out
    v_raw = checks.array1d("verbal_conf", verbal_conf)  # keeps its dtype: ECE edges follow the input precision
    v, _ = checks.probs("verbal_conf", v_raw, allow_nan=True)
    checks.same_shape(scores_lpm=lpm, verbal_conf=v)
    present = ~torch.isnan(v)
    out["verbal_missing"] = float((~present).sum())
    if not bool(present.any()):
        for key in ("ece", "brier", "auroc", "aurc", "auc_mean", "mean_confidence"):
            out[f"verbal_{key}"] = math.nan
        out["verbal_auc_mean_groups"] = 0.0
        return out
    vq, vc, vg = v[present].to(lpm.device), c[present.to(c.device)], g[present.to(g.device)]
    vam = auc_mean(vq, vc, vg)
    out.update(
        verbal_ece=ece(v_raw[present.to(v_raw.device)], vc, n_bins=n_bins),
        verbal_brier=brier(vq, vc),
        verbal_auroc=auroc(vq, vc),
        verbal_aurc=aurc(vq, vc),
        verbal_auc_mean=vam.value,
        verbal_auc_mean_groups=float(vam.n_groups_used),
        verbal_mean_confidence=float(vq.mean()),
    )
    return out
