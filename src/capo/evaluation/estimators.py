"""The confidence-estimator table of ``capo eval``: every estimator of :mod:`capo.core.confidence` that the
generation rows allow, scored side by side on the same responses.

For each estimator (definitions in docs/metrics.md, section "Confidence estimators"): pooled AUROC and AUC-mean with
cluster-bootstrap intervals over questions, ECE and Brier where the score is a probability, AURC, PRR, and the
accuracy of DeepConf's confidence-filtered vote and of the confidence-weighted vote. Missing values: a token-level
estimator gives NaN for an empty response, ranked below every other response (and probability 0); a missing verbal
confidence is left out of the verbal row, as in the ``verbal_*`` metrics.
"""

from __future__ import annotations

import math
from array import array

import torch

from capo.core import calibration as cal
from capo.core import voting
from capo.core.confidence import ConfidenceInputs, compute_confidence
from capo.evaluation.bootstrap import QuestionBootstrap

__all__ = ["ESTIMATOR_KNOBS", "estimator_inputs", "estimator_table", "float_values", "unavailable_estimators"]

F64 = torch.float64
# per-token fields of a generation row -> ConfidenceInputs field
TOKEN_FIELDS = {"token_logprobs": "token_logp", "token_entropy": "entropy", "token_kl_uniform": "kl_uniform",
                "token_topk_conf": "topk_conf"}
# estimator -> (the rows' per-token fields it needs, its probability for ECE / Brier: "identity" for scores in
# [0, 1], "exp" for lpm (exp(lpm), the geometric-mean token probability, as eval/ece), None: no probability)
ESTIMATORS = {
    "lpm": (("token_logprobs",), "exp"), "sum_logprob": (("token_logprobs",), None),
    "min_token_prob": (("token_logprobs",), "identity"), "neg_entropy": (("token_entropy",), None),
    "self_certainty": (("token_kl_uniform",), None), "tail": (("token_topk_conf",), None),
    "bottom_group": (("token_topk_conf",), None), "lowest_group": (("token_topk_conf",), None),
    "verbal": ((), "identity"), "consistency": ((), "identity"),
}
# eval setting -> (estimator, its knob): the DeepConf window / fraction / tail length
ESTIMATOR_KNOBS = {"conf_window": (("bottom_group", "lowest_group"), "window"), "conf_fraction": (("bottom_group",),
                   "fraction"), "conf_tail": (("tail",), "k")}


def float_values(lists: list[list]) -> torch.Tensor:
    """The numbers of ``lists`` concatenated, as float64 [sum of lengths]: each converted as ``float()`` converts it
    (what ``torch.tensor(..., dtype=float64)`` gives, 4x faster on a long list). TypeError for an entry that is not a
    number, OverflowError for an integer beyond the float range."""
    buf = array("d")
    for v in lists:
        buf.fromlist(v)
    return torch.frombuffer(buf, dtype=F64) if len(buf) else torch.zeros(0, dtype=F64)


def _padded(rows: list[dict], field: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A per-token list field of every row as float64 [N, T] (0-padded) and its mask [N, T]."""
    lists = [r[field] for r in rows]
    lens = torch.tensor([len(v) for v in lists], dtype=torch.int64)  # [N]
    mask = torch.arange(int(lens.max()) if lists else 0)[None, :] < lens[:, None]  # [N, T]
    return torch.zeros(mask.shape, dtype=F64).masked_scatter_(mask, float_values(lists)), mask


def _present(rows: list[dict]) -> list[str]:
    """The per-token fields of :data:`TOKEN_FIELDS` that every row carries (as a list)."""
    return [f for f in TOKEN_FIELDS if rows and all(isinstance(r.get(f), list) for r in rows)]


def estimator_inputs(rows: list[dict], group_ids: torch.Tensor, answer_ids: torch.Tensor,
                     verbal: torch.Tensor | None) -> ConfidenceInputs:
    """The :class:`ConfidenceInputs` of generation rows: each per-token field present in every row, padded."""
    fields, mask = {}, None
    for row_field in _present(rows):
        fields[TOKEN_FIELDS[row_field]], m = _padded(rows, row_field)
        mask = m if mask is None else mask
    return ConfidenceInputs(mask=mask, verbal=verbal, answer_ids=answer_ids, group_ids=group_ids, **fields)


def _missing(present: set[str], has_verbal: bool) -> dict[str, str]:
    """{estimator: why it cannot be computed} given the per-token fields every row carries and whether there is a
    verbal-confidence column: the one rule behind the table's estimators and ``estimators_unavailable``."""
    out = {}
    for name, (need, _) in ESTIMATORS.items():
        missing = [f for f in need if f not in present]
        if missing:
            out[name] = f"needs the per-token field(s) {', '.join(missing)} in every row"
        elif name == "verbal" and not has_verbal:
            out[name] = "no row has a verbal confidence"
    return out


def _available(x: ConfidenceInputs) -> list[str]:
    """The estimators whose inputs ``x`` holds (the per-token fields every row had, verbal when given)."""
    present = {f for f, name in TOKEN_FIELDS.items() if getattr(x, name) is not None}
    gone = _missing(present, x.verbal is not None)
    return [n for n in ESTIMATORS if n not in gone]


def unavailable_estimators(rows: list[dict], has_verbal: bool) -> dict[str, str]:
    """{estimator: why it is not in the table} for every estimator the rows do not allow: a per-token field missing
    from some row (the vLLM engine records ``token_topk_conf`` but no ``token_entropy`` / ``token_kl_uniform``;
    ``--no-token-stats`` records none of the statistics) or, for ``verbal``, no row with a verbal confidence."""
    return _missing(set(_present(rows)), has_verbal)


def _vote_weights(s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Non-negative weights that order like the scores within each question: the scores themselves when every finite
    one is >= 0 (probabilities, DeepConf confidences), else exp(s - max of the question) (log-domain scores); an
    empty response's -inf weighs 0 either way (it decides nothing: one empty response used to switch a
    probability's weights to the exponential form in every question)."""
    real = torch.isfinite(s)
    if bool((s[real] >= 0).all()):
        return torch.where(real, s, torch.zeros_like(s))
    _, gi = cal.group_index(g)
    top = torch.full((int(gi.max()) + 1,), -math.inf, dtype=F64).scatter_reduce(0, gi, s, "amax")
    return torch.where(torch.isinf(s), torch.zeros_like(s), torch.exp(s - top[gi]))


def _boot(g: torch.Tensor, n_boot: int, seed: int) -> QuestionBootstrap | None:
    """The question bootstrap of the intervals; None (no intervals) without replicates or with one question."""
    if n_boot <= 0 or int(torch.unique(g).numel()) < 2:
        return None
    return QuestionBootstrap(g, n_boot, seed)


def _row(s: torch.Tensor, prob: str | None, c, g, a, *, keep_fraction: float, n_bins: int,
         boot: QuestionBootstrap | None) -> dict:
    """All table entries of one estimator's scores s [N] (NaN already resolved: finite or -inf); ``boot``: the
    bootstrap over the questions of g (None: no intervals)."""
    finite = torch.where(torch.isinf(s), torch.full_like(s, -1e30), s)  # -inf: ranked below every response
    am = cal.auc_mean(s, c, g)
    out = {"n": s.numel(), "auroc": cal.auroc(s, c), "auc_mean": am.value, "auc_mean_groups": am.n_groups_used,
           "aurc": cal.aurc(finite, c), "prr": cal.prr(finite, c)}
    out["auroc_ci"] = (math.nan, math.nan) if boot is None else boot.auroc_ci(s, c)
    out["auc_mean_ci"] = (math.nan, math.nan) if boot is None else boot.auc_mean_ci(s, c)
    p = None if prob is None else torch.exp(s) if prob == "exp" else torch.where(torch.isinf(s), 0.0, s)
    out["ece"] = None if p is None else cal.ece(p, c, n_bins=n_bins)
    out["brier"] = None if p is None else cal.brier(p, c)
    out["filtered_vote"] = voting.filtered_vote(a, c, g, finite, keep_fraction=keep_fraction).accuracy
    out["weighted_vote"] = voting.weighted_vote(a, c, g, _vote_weights(s, g)).accuracy
    return out


def estimator_table(rows: list[dict], *, group_ids: torch.Tensor, correct: torch.Tensor, answer_ids: torch.Tensor,
                    verbal: torch.Tensor | None, knobs: dict | None = None, keep_fraction: float = voting.KEEP_FRACTION,
                    n_bins: int = 10, n_boot: int = 1000, seed: int = 0) -> dict[str, dict]:
    """{estimator: {metric: value}} for every estimator the rows allow (see the module docstring).

    Shapes: group_ids, correct, answer_ids, verbal [N] (one per row; verbal NaN = missing, None = no verbal column).
    ``knobs``: eval settings named in :data:`ESTIMATOR_KNOBS` (e.g. ``{"conf_window": 64}``).
    """
    x = estimator_inputs(rows, group_ids, answer_ids, verbal)
    per_estimator: dict[str, dict] = {}
    for setting, (names, knob) in ESTIMATOR_KNOBS.items():
        if knobs and knobs.get(setting) is not None:
            for n in names:
                per_estimator.setdefault(n, {})[knob] = knobs[setting]
    table, boot_all = {}, _boot(group_ids, n_boot, seed)  # drawn once for every estimator that keeps all rows
    for name in _available(x):
        s = compute_confidence(name, x, **per_estimator.get(name, {}))
        keep = ~torch.isnan(s) if name == "verbal" else torch.ones_like(correct, dtype=torch.bool)
        s = torch.where(torch.isnan(s), torch.full_like(s, -math.inf), s)
        if not bool(keep.any()):
            continue
        boot = boot_all if bool(keep.all()) else _boot(group_ids[keep], n_boot, seed)
        table[name] = _json_safe(_row(s[keep], ESTIMATORS[name][1], correct.bool()[keep], group_ids[keep],
                                      answer_ids[keep], keep_fraction=keep_fraction, n_bins=n_bins, boot=boot))
    return table


def _json_safe(row: dict) -> dict:
    """Non-finite values (NaN: e.g. AUC-mean with no mixed question; undefined intervals) as None (JSON null)."""
    def f(v):
        if isinstance(v, tuple):
            return [f(x) for x in v]
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return {k: f(v) for k, v in row.items()}
