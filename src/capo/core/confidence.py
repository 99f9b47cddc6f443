"""Per-response confidence estimators: one [N] float64 score per response, higher = more confident.

Each estimator reads what the sampler records for every generated token (all [N, T], N responses, T padded
response tokens, ``mask`` marking the real ones; EOS included when generated) plus per-response extras, bundled in
:class:`ConfidenceInputs`. The per-token quantities and how the sampler computes them (:func:`token_statistics`
computes the last three from the step's logits in one place):

- ``token_logp`` [N, T]: log p_t(y_t), the raw temperature-1 ``log_softmax`` of the sampled token.
- ``entropy`` [N, T]: H_t = -sum_v p_t(v) log p_t(v), entropy of the full temperature-1 next-token distribution.
- ``kl_uniform`` [N, T]: KL(U || p_t) = -log V - (1/V) sum_v log p_t(v), the per-token self-certainty of Kang et al.
  (arXiv 2502.18581), V = the vocabulary size of the logits.
- ``topk_conf`` [N, T]: C_t = -(1/k) sum_{j=1}^{k} log p_t(v_(j)), the negative mean log-prob of the k most likely
  tokens: DeepConf's token confidence (arXiv 2508.15260, Sec. 3; k = 20 there).

Per response: ``verbal`` [N] (verbalized confidence in [0, 1], NaN = missing), ``answer_ids`` [N] (answer
equivalence class within the question, -1 = no answer) and ``group_ids`` [N] (question labels), as in
:mod:`capo.core.voting`.

Conventions (each tested): every estimator returns float64 [N]; an **empty response** (mask row all 0) gets NaN
from every token-based estimator (there is no evidence either way; callers rank it lowest by mapping NaN to -inf,
or drop it); positions with mask 0 never contribute, even when they hold NaN/inf. Estimators are registered in
:data:`capo.core.registry.CONFIDENCES`; :func:`compute_confidence` calls one by name. A missing input raises
``ValueError`` naming the field the sampler must record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from capo.core import checks
from capo.core.registry import CONFIDENCES

F64 = torch.float64

__all__ = [
    "ConfidenceInputs",
    "TokenStatistics",
    "compute_confidence",
    "token_statistics",
    "topk_confidence",
    "TOPK_CONF_K",
]

TOKEN_SIGNALS = ("topk", "logp", "neg_entropy")
TOPK_CONF_K = 20  # k of DeepConf's token confidence C_t (its paper's value): the samplers' default for topk_conf


@dataclass(frozen=True)
class TokenStatistics:
    """Per-token statistics of a next-token distribution (:func:`token_statistics`); each has the logits' leading
    shape (e.g. [N] for one decoding step of N sequences, [N, T] for a whole batch)."""

    entropy: torch.Tensor
    kl_uniform: torch.Tensor
    topk_conf: torch.Tensor


def token_statistics(logits: torch.Tensor, top_k: int = TOPK_CONF_K, *,
                     normalized: bool = False) -> TokenStatistics:
    """Entropy, self-certainty and DeepConf token confidence of the temperature-1 distribution softmax(logits).

    With log p = log_softmax(logits) over the last dimension (V entries), in float32 or wider:
    entropy = -sum_v p_v log p_v;  kl_uniform = KL(U || p) = -log V - mean_v log p_v  (>= 0, 0 iff p is uniform);
    topk_conf = -mean of the ``top_k`` largest log p_v  (>= 0; DeepConf's C_t).

    Use the raw model logits (before temperature, top-p or any logits processor): a -inf logit makes kl_uniform +inf.
    DeepConf reads vLLM's top-k logprobs, which add the sampled token when it is outside the top k (k + 1 values);
    here it is exactly the top k. Cost: one log_softmax, one top-k and two reductions over V per token.

    Args: logits [..., V] floating; top_k in [1, V]; ``normalized=True``: ``logits`` already are log-probs (a
    log_softmax output, e.g. the sampler's), so the normalisation pass is skipped. Returns :class:`TokenStatistics` of shape [...] (float32 for
    half-precision logits, else the logits' dtype).
    """
    checks.tensor("logits", logits, floating=True)
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension, got a 0-d tensor")
    v = logits.shape[-1]
    if not checks.is_int(top_k) or not 1 <= top_k <= v:
        raise ValueError(f"top_k must be an int in [1, V={v}], got {top_k!r}")
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = x if normalized else torch.log_softmax(x, dim=-1)
    entropy = -(logp.exp() * logp).nansum(-1)  # p log p -> 0 where p = 0 (0 * -inf = NaN, dropped by nansum)
    kl = -math.log(v) - logp.mean(-1)
    return TokenStatistics(entropy=entropy, kl_uniform=kl, topk_conf=topk_confidence(logp.topk(top_k, dim=-1).values))


def topk_confidence(top_logp: torch.Tensor) -> torch.Tensor:
    """DeepConf's token confidence C_t = -(1/k) sum_{j=1}^{k} log p_t(v_(j)) (arXiv 2508.15260, Sec. 3) from
    the k largest log-probs of each step's distribution: [..., k] -> [...] (>= 0).

    The one place the formula lives: :func:`token_statistics` passes the top k of a full distribution, the vLLM
    engine the top-k log-probs the engine returns (exactly the k most likely tokens: not the sampled one added).
    """
    checks.tensor("top_logp", top_logp, floating=True)
    if top_logp.dim() < 1 or top_logp.shape[-1] < 1:
        raise ValueError(f"top_logp must have a non-empty last (top-k) dimension, got shape {tuple(top_logp.shape)}")
    return -top_logp.mean(-1)


@dataclass(frozen=True)
class ConfidenceInputs:
    """What the estimators read; any field may be None when no requested estimator needs it.

    token_logp, mask, entropy, kl_uniform, topk_conf: [N, T] (module docstring); verbal, answer_ids, group_ids: [N].
    """

    token_logp: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    kl_uniform: torch.Tensor | None = None
    topk_conf: torch.Tensor | None = None
    verbal: torch.Tensor | None = None
    answer_ids: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None


def compute_confidence(name: str, inputs: ConfidenceInputs, **knobs) -> torch.Tensor:
    """The registered estimator ``name`` on ``inputs`` (knobs such as ``window`` passed on) -> float64 [N]."""
    if not isinstance(inputs, ConfidenceInputs):
        raise TypeError(f"inputs must be a ConfidenceInputs, got {type(inputs).__name__}")
    return CONFIDENCES.get(name)(inputs, **knobs)


# ----------------------------------------------------------------------------------------------------------------
# helpers: one masked per-token quantity, compacted to the left
# ----------------------------------------------------------------------------------------------------------------


def _token_field(x: ConfidenceInputs, field: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float64 [N, T], mask bool [N, T]) for a per-token field; masked-out entries are set to 0."""
    t = getattr(x, field)
    if t is None:
        raise ValueError(f"this estimator needs the per-token `{field}` [N, T], which the sampler did not record")
    if x.mask is None:
        raise ValueError("this estimator needs `mask` [N, T] (1 = a real response token)")
    checks.tensor(field, t, ndim=2, floating=True)
    checks.tensor("mask", x.mask, ndim=2)
    checks.same_shape(mask=x.mask, **{field: t})
    m = x.mask.to(t.device).bool()
    return torch.where(m, t.to(F64), torch.zeros((), dtype=F64, device=t.device)), m


def _signal(x: ConfidenceInputs, token: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token confidence named ``token`` (higher = more confident): topk -> topk_conf (DeepConf C_t),
    logp -> token_logp, neg_entropy -> -entropy."""
    checks.choice("token", token, TOKEN_SIGNALS)
    field = {"topk": "topk_conf", "logp": "token_logp", "neg_entropy": "entropy"}[token]
    v, m = _token_field(x, field)
    return (-v if token == "neg_entropy" else v), m


def _masked_mean(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens of each row, NaN for an empty row: [N, T], [N, T] -> [N]."""
    n = m.sum(-1)
    return torch.where(n > 0, v.sum(-1) / n.clamp(min=1), torch.full_like(v[:, 0], math.nan))


def _compact(v: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's real tokens to the front, keeping their order: -> (values [N, T], lengths L [N]). Rows already
    in that form (right padding, as samplers and generations files give them) are returned as they are."""
    n = m.sum(-1)
    if bool((m == (torch.arange(m.shape[1], device=m.device)[None, :] < n[:, None])).all()):
        return v, n
    order = torch.argsort((~m).to(torch.int8), dim=1, stable=True)
    return torch.gather(v, 1, order), n


def _check_int(name: str, v, low: int = 1) -> int:
    if not checks.is_int(v) or v < low:
        raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    return v


# ----------------------------------------------------------------------------------------------------------------
# estimators from the sampled tokens' log-probs
# ----------------------------------------------------------------------------------------------------------------


@CONFIDENCES.register("lpm")
def lpm(x: ConfidenceInputs) -> torch.Tensor:
    """Mean token log-prob lpm = (1/L) sum_t log p_t(y_t) (CAPO's perplexity confidence, arXiv 2604.12632, Sec. 3;
    = -log PPL). Needs token_logp, mask. [N] in (-inf, 0]; NaN for an empty response (scores.sequence_logprob_mean
    gives 0 there instead; this estimator does not guess)."""
    return _masked_mean(*_token_field(x, "token_logp"))


@CONFIDENCES.register("sum_logprob")
def sum_logprob(x: ConfidenceInputs) -> torch.Tensor:
    """Sequence log-probability sum_t log p_t(y_t) = log P(response | prompt) (lm-polygraph's maximum sequence
    probability, negated there as an uncertainty). Favours short responses. Needs token_logp, mask. NaN if empty."""
    v, m = _token_field(x, "token_logp")
    return torch.where(m.any(-1), v.sum(-1), torch.full_like(v[:, 0], math.nan))


@CONFIDENCES.register("min_token_prob")
def min_token_prob(x: ConfidenceInputs) -> torch.Tensor:
    """Minimum token probability min_t p_t(y_t) = exp(min_t log p_t(y_t)): the weakest sampled token. Needs
    token_logp, mask. [N] in [0, 1]; NaN if empty."""
    v, m = _token_field(x, "token_logp")
    low = torch.where(m, v, torch.full_like(v, math.inf)).min(-1).values
    return torch.where(m.any(-1), low.exp(), torch.full_like(low, math.nan))


@CONFIDENCES.register("neg_entropy")
def neg_entropy(x: ConfidenceInputs) -> torch.Tensor:
    """Negated mean token entropy -(1/L) sum_t H_t, H_t the entropy of the full next-token distribution
    (lm-polygraph's mean token entropy, negated so higher = more confident). Needs entropy, mask. [N] <= 0; NaN if
    empty."""
    v, m = _token_field(x, "entropy")
    return -_masked_mean(v, m)


@CONFIDENCES.register("self_certainty")
def self_certainty(x: ConfidenceInputs) -> torch.Tensor:
    """Self-certainty (Kang, Zhao & Song 2025, arXiv 2502.18581, Eq. 3): (1/L) sum_t KL(U || p_t)
    = -(1/(L V)) sum_t sum_v log(V p_t(v)). Needs kl_uniform, mask. [N] >= 0; NaN if empty."""
    return _masked_mean(*_token_field(x, "kl_uniform"))


@CONFIDENCES.register("tail")
def tail(x: ConfidenceInputs, k: int = 2048, token: str = "topk") -> torch.Tensor:
    """Tail confidence (DeepConf, arXiv 2508.15260, Sec. 3): the mean per-token confidence of the last k real tokens
    (all of them when L < k), where the final answer is written.

    Args: k >= 1 (DeepConf: 2048); token: the per-token confidence averaged: "topk" (DeepConf's C_t, needs
    topk_conf), "logp" (token_logp) or "neg_entropy" (-entropy). Returns [N]; NaN if empty.
    """
    _check_int("k", k)
    cv, n = _compact(*_signal(x, token))
    j = torch.arange(cv.shape[1], device=cv.device)[None, :]
    keep = (j < n[:, None]) & (j >= (n - k)[:, None])
    return _masked_mean(torch.where(keep, cv, torch.zeros_like(cv)), keep)


def _bottom_windows(v: torch.Tensor, m: torch.Tensor, window: int, fraction: float) -> torch.Tensor:
    """Mean of the lowest max(1, floor(W fraction)) of the W = L - window + 1 sliding-window means of each row
    (the mean of all tokens when 0 < L < window, NaN when L = 0): [N, T], [N, T] -> [N]."""
    whole = _masked_mean(v, m)
    if v.shape[1] < window:  # every response shorter than a window
        return whole
    cv, n = _compact(v, m)
    cs = torch.cat([torch.zeros_like(cv[:, :1]), torch.cumsum(cv, 1)], 1)  # [N, T + 1] prefix sums
    means = (cs[:, window:] - cs[:, :-window]) / window  # [N, T - window + 1], window starting at s
    start = torch.arange(means.shape[1], device=cv.device)[None, :]
    n_win = (n - window + 1).clamp(min=0)  # [N] full windows inside each response
    srt = torch.where(start < n_win[:, None], means, torch.full_like(means, math.inf)).sort(1).values
    n_low = torch.floor(n_win.to(F64) * fraction).clamp(min=1).to(torch.int64)  # [N]
    low_sum = torch.cumsum(torch.where(start < n_low[:, None], srt, torch.zeros_like(srt)), 1)[:, -1]
    return torch.where(n >= window, low_sum / n_low, whole)


def _check_fraction(fraction) -> float:
    if not checks.is_real(fraction) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")
    return float(fraction)


@CONFIDENCES.register("bottom_group")
def bottom_group(x: ConfidenceInputs, window: int = 2048, fraction: float = 0.1, token: str = "topk") -> torch.Tensor:
    """Bottom-fraction group confidence (DeepConf, arXiv 2508.15260, Sec. 3): group confidence C_G = mean per-token
    confidence over a sliding window of ``window`` consecutive real tokens (stride 1, full windows only: W = L -
    window + 1 of them); the score is the mean of the lowest max(1, floor(W fraction)) group confidences
    (DeepConf: window 2048, fraction 0.1). A response shorter than the window has one group, all its tokens.

    Args: window >= 1; fraction in [0, 1] (0 -> the single lowest group); token as in :func:`tail`; the per-token
    values must be finite (windows are differences of prefix sums). Returns [N]; NaN if empty.
    """
    _check_int("window", window)
    return _bottom_windows(*_signal(x, token), window, _check_fraction(fraction))


@CONFIDENCES.register("lowest_group")
def lowest_group(x: ConfidenceInputs, window: int = 2048, token: str = "topk") -> torch.Tensor:
    """Lowest group confidence (DeepConf, arXiv 2508.15260, Sec. 3): min over the sliding windows of the group
    confidence, i.e. :func:`bottom_group` keeping one window. Returns [N]; NaN if empty."""
    _check_int("window", window)
    return _bottom_windows(*_signal(x, token), window, 0.0)


# ----------------------------------------------------------------------------------------------------------------
# estimators from per-response inputs
# ----------------------------------------------------------------------------------------------------------------


@CONFIDENCES.register("verbal")
def verbal(x: ConfidenceInputs) -> torch.Tensor:
    """Verbalized confidence q in [0, 1] as stated by the model (RLCR's <confidence>, arXiv 2507.16806), NaN when
    missing or unparseable (an empty response has none). Needs verbal. Returns float64 [N]."""
    if x.verbal is None:
        raise ValueError("this estimator needs `verbal` [N] (the parsed verbalized confidence, NaN = missing)")
    return checks.probs("verbal", x.verbal, allow_nan=True)[0]


@CONFIDENCES.register("consistency")
def consistency(x: ConfidenceInputs) -> torch.Tensor:
    """Answer consistency: the fraction of the n_b responses of the question (itself included) whose answer is in
    the same equivalence class, #{j in b: a_j = a_i} / n_b (the agreement behind self-consistency, Wang et al. 2023,
    arXiv 2203.11171). A response without an answer (a_i = -1, e.g. an empty one) scores 0.

    Needs answer_ids [N] int (>= -1), group_ids [N] int. Returns [N] in {0} u [1/n_b, 1].
    """
    for name in ("answer_ids", "group_ids"):
        if getattr(x, name) is None:
            raise ValueError(f"this estimator needs `{name}` [N] (see capo.core.voting)")
    a = checks.group_ids_1d("answer_ids", x.answer_ids)
    g = checks.group_ids_1d("group_ids", x.group_ids).to(a.device)
    checks.same_shape(answer_ids=a, group_ids=g)
    if bool((a < -1).any()):
        raise ValueError(f"answer_ids must be >= -1 (-1 = no answer), got {int(a.min())}")
    if a.numel() == 0:
        return torch.zeros(0, dtype=F64, device=a.device)
    _, gi = torch.unique(g, return_inverse=True)
    _, ai = torch.unique(a, return_inverse=True)
    _, pair = torch.unique(gi * (int(ai.max()) + 1) + ai, return_inverse=True)  # one id per (question, answer)
    same = torch.bincount(pair)[pair].to(F64)
    size = torch.bincount(gi)[gi].to(F64)
    return torch.where(a >= 0, same / size, torch.zeros_like(same))
