"""Seed-level statistics of a sweep, with the training seed as the unit: per-method means and sds, each method minus
the reference paired by seed (95% t-interval, paired t-test p, Holm-adjusted p over the methods, the seeds a paired
t-test needs for a given difference at 80% power), the change from the start (the base model's draws) and along the
periodic held-out curve. The intervals come from :mod:`capo.evaluation.stats` (scipy), power analysis and Holm's
adjustment from statsmodels."""

from __future__ import annotations

import numpy as np

from capo.evaluation.stats import finite_values, usable

MEASURES = ("accuracy", "auc_mean", "auroc", "ece", "brier", "aurc", "verbal_ece", "majority_vote",
            "perplexity_consistency", "stochastic_ece", "stochastic_rate_error", "stochastic_auroc", "answer_ece",
            "answer_rate_error", "answer_auroc")
# measures only some tasks have (the stochastic task's; answer_* its binary variant's): a report's tables show them
# only where a method has them
OPTIONAL_MEASURES = ("stochastic_ece", "stochastic_rate_error", "stochastic_auroc", "answer_ece", "answer_rate_error",
                     "answer_auroc")
# the two measures a report leads with (per-seed table, the reading at a glance, the curves): accuracy and AUC-mean;
# for stochastic outcomes (records with the stated-probability measures) the stated probability's ECE and |m - p_c|
HEADLINE_PAIR = ("accuracy", "auc_mean")
STOCHASTIC_PAIR = ("stochastic_ece", "stochastic_rate_error")
# the binary variant: the calibration of the model's own probability of the outcome (what a correctness reward
# breaks) and of its stated confidence (what RLCR's Brier term trains)
BINARY_PAIR = ("answer_ece", "verbal_ece")
LABELS = {"accuracy": "accuracy", "auc_mean": "AUC-mean", "stochastic_ece": "stated-probability ECE",
          "stochastic_rate_error": "mean |stated - true rate|", "answer_ece": "predicted-outcome ECE",
          "verbal_ece": "stated-confidence ECE"}


def headline_pair(methods: dict) -> tuple[str, str]:
    """:data:`BINARY_PAIR` when a method of the summary's ``methods`` has the predicted outcome's ECE,
    :data:`STOCHASTIC_PAIR` when one has the stated-probability ECE, else :data:`HEADLINE_PAIR`."""
    if any("answer_ece" in v for v in methods.values()):
        return BINARY_PAIR
    return STOCHASTIC_PAIR if any("stochastic_ece" in v for v in methods.values()) else HEADLINE_PAIR


def from_base(records: dict, bases: list[dict], effect: float) -> dict:
    """Per method and measure: final - base. With one base draw, a one-sample t-interval over the method's seeds of
    final - that draw (the draw's own sampling noise is then not in the interval: it shifts every seed's change
    alike); with several, the difference of the method's seed mean and the base draws' mean, Welch's t-interval
    (:func:`capo.evaluation.stats.two_sample_interval`: the seeds' and the draws' variances both count). A seed or
    draw without a value of the measure is left out of it (the seed listed under ``left_out``), as in :func:`paired`."""
    from capo.evaluation.stats import two_sample_interval

    out = {}
    for m, by_seed in records.items():
        out[m] = {}
        for k in MEASURES:
            b = finite_values([r["final"].get(k) for r in bases])
            measured = [s for s in sorted(by_seed) if k in by_seed[s]["final"]]
            seeds = [s for s in measured if usable(by_seed[s]["final"][k])]
            if not b or not seeds:
                continue
            a, kept = [float(by_seed[s]["final"][k]) for s in seeds], _kept(seeds, measured, sorted(by_seed))
            if len(b) == 1:
                out[m][k] = {**kept, "base_draws": 1, **seed_paired([x - b[0] for x in a], effect)}
                continue
            w = two_sample_interval(a, b)
            out[m][k] = {**kept, "base_draws": len(b), "n_seeds": len(a), "mean": float(np.mean(a) - np.mean(b)),
                         **({"sd": sd_or_none(a), "low": w["low"], "high": w["high"], "p": w["p"]} if w else {})}
    return out


CURVE_MEASURES = ("accuracy", "auc_mean", "auroc", "stochastic_ece", "stochastic_rate_error", "answer_ece")


def along_curve(records: dict, effect: float) -> dict:
    """Per method and measure: the last periodic evaluation minus the step-0 one, over the seeds whose curve has a step-0
    row and the measure at both ends (a one-sample t-interval; the others listed under ``left_out``). The periodic
    evaluation (the held-out split's first ``data.n_eval`` problems, ``run.eval_samples`` each, seeded by the
    training seed) draws other samples than the final one, so this is a second held-out reading of "how far training
    moved it", not the same one."""
    out = {}
    for m, by_seed in records.items():
        rows = {s: r["curves"].get("eval") or [] for s, r in by_seed.items()}
        ends = {s: (ev[0], ev[-1]) for s, ev in sorted(rows.items()) if ev and ev[0]["step"] == 0 and len(ev) > 1}
        out[m] = {}
        for k in CURVE_MEASURES:
            measured = [s for s, e in ends.items() if all("eval/" + k in e[i] for i in (0, 1))]
            seeds = [s for s in measured if all(usable(ends[s][i]["eval/" + k]) for i in (0, 1))]
            if seeds:
                out[m][k] = {**_kept(seeds, measured, list(ends)), "last_step": sorted({ends[s][1]["step"] for s in seeds}),
                             **seed_paired([ends[s][1]["eval/" + k] - ends[s][0]["eval/" + k] for s in seeds], effect)}
    return out


def paired(records: dict, method: str, reference: str, measure: str, effect: float) -> dict:
    """Seed-paired difference method - reference over the seeds both finished and both have a value of ``measure``
    for: a seed where either could not compute it (an AUC of a model whose answers were all wrong, or all right) is
    left out of every number and listed under ``left_out``, one whose record has no such key (nothing to compute it
    from, or written before it existed) under ``unmeasured`` (the report names both), never a reason to drop the
    measure."""
    both = sorted(set(records[method]) & set(records[reference]))
    measured = [s for s in both if all(measure in records[m][s]["final"] for m in (method, reference))]
    value = {(m, s): records[m][s]["final"][measure] for m in (method, reference) for s in measured}
    seeds = [s for s in measured if usable(value[method, s]) and usable(value[reference, s])]
    return {**_kept(seeds, measured, both),
            **seed_paired([value[method, s] - value[reference, s] for s in seeds], effect)}


def _kept(seeds: list, measured: list, candidates: list) -> dict:
    """``seeds`` (those a reading uses) and, when there are any, ``left_out`` (measured seeds without a value: the
    measure could not be computed for that model) and ``unmeasured`` (candidates whose records have no such key: the
    evaluation had nothing to compute it from, e.g. no stated confidence, or predates the measure)."""
    left_out = [s for s in measured if s not in seeds]
    unmeasured = [s for s in candidates if s not in measured]
    return {"seeds": list(seeds)} | ({"left_out": left_out} if left_out else {}) | (
        {"unmeasured": unmeasured} if unmeasured else {})


def seed_paired(diffs, effect: float) -> dict:
    """Per-seed differences -> mean, sd, 95% t-interval and p (capo.evaluation.stats.seed_paired_interval, the one
    implementation the report uses too) and the seeds a paired t-test needs for ``effect`` at 80% power: the smallest
    whole number of seeds with at least that power (capo.evaluation.stats.seeds_for_power; None with sd 0, which no
    test needs more seeds for, or above ``SEEDS_MOST``, said by ``seeds_over``). A non-finite difference (a measure a
    seed could not compute) is left out of every number, the count and the mean included."""
    from capo.evaluation.stats import SEEDS_MOST, seed_paired_interval, seeds_for_power

    d = finite_values(diffs)
    out = {"n_seeds": len(d), "diffs": d, "mean": float(np.mean(d)) if d else None}
    r = seed_paired_interval(d)
    if r is not None:
        need = seeds_for_power(effect, r["sd"]) if r["sd"] > 0 else None
        out |= {"sd": r["sd"], "low": r["low"], "high": r["high"], "p": r["p"], "seeds_needed": need}
        if need is None and r["sd"] > 0:
            out["seeds_over"] = SEEDS_MOST
    return out



def measures_of(records: dict) -> tuple[str, ...]:
    """:data:`MEASURES` less the optional ones no record has (a report of other tasks shows no stochastic column)."""
    return tuple(k for k in MEASURES if k not in OPTIONAL_MEASURES
                 or any(r["final"].get(k) is not None for by_seed in records.values() for r in by_seed.values()))


def summary(records: dict, reference: str, effect: float, base: list[dict] | None = None) -> dict:
    per_method, measures = {}, measures_of(records)
    for m, by_seed in records.items():
        vals = {k: [by_seed[s]["final"].get(k) for s in sorted(by_seed)] for k in measures}
        per_method[m] = {"seeds": sorted(by_seed),
                         **{k: {"per_seed": v, "mean": mean_or_none(v), "sd": sd_or_none(v)} for k, v in vals.items()}}
    diffs = {m: {k: paired(records, m, reference, k, effect) for k in MEASURES if _has(records, m, reference, k)}
             for m in records if m != reference}
    holm(diffs)
    out = {"reference": reference, "effect": effect, "methods": per_method, "paired": diffs,
           "along_curve": along_curve(records, effect)}
    if base:
        out |= {"base": {k: mean_or_none([b["final"].get(k) for b in base]) for k in measures},
                "base_sd": {k: sd_or_none([b["final"].get(k) for b in base]) for k in measures},
                "base_draws": len(base), "from_base": from_base(records, base, effect)}
    return out


def holm(diffs: dict, measures=MEASURES) -> None:
    """Add ``p_holm`` to each paired difference: its p-value Holm-adjusted over the methods that have one for the
    same measure (the family: every method against the one reference on one measure). ``diffs``:
    {method: {measure: paired difference}}."""
    from statsmodels.stats.multitest import multipletests

    for k in measures:
        family = [d[k] for d in diffs.values() if k in d and d[k].get("p") is not None]
        if family:
            adjusted = multipletests([d["p"] for d in family], method="holm")[1]
            for d, p in zip(family, adjusted):
                d["p_holm"] = float(p)


def _has(records, m, ref, k) -> bool:
    """Whether ``m`` and ``ref`` both have ``k`` on a seed they share (a measure of the task, not one no record of
    theirs has)."""
    return any(usable(records[m][s]["final"].get(k)) and usable(records[ref][s]["final"].get(k))
               for s in set(records[m]) & set(records[ref]))


def mean_or_none(v):
    v = finite_values(v)
    return float(np.mean(v)) if v else None


def sd_or_none(v):
    v = finite_values(v)
    return float(np.std(v, ddof=1)) if len(v) > 1 else None

