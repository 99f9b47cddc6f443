"""A sweep's statistics (:mod:`capo.sweep.analysis`) as Markdown tables: the reading at a glance, per seed, mean
(sd), the paired differences, the change from the start and along the curve; one run's curve; and the seed-paired
table of a ``capo report --figures`` summary."""

from __future__ import annotations

import json
from pathlib import Path

from capo.errors import DataError, is_real
from capo.sweep.analysis import (LABELS, MEASURES, OPTIONAL_MEASURES, headline_pair, mean_or_none, seed_paired,
                                 usable)

# the measures of a `capo report --figures` summary the seed-paired table reads, in its order
COMPARE_MEASURES = ("accuracy", "auc_mean", "auroc", "ece", "brier", "verbal_ece")


def check_compare_summary(path: Path, data) -> None:
    """Refuse (:class:`DataError`, naming the file and what is wrong) JSON that is not the shape
    :func:`from_compare_summary` reads: a mapping of model -> {measure: one number or null per run, ``seeds``: each
    run's training seed as text}, every model with at least one of :data:`COMPARE_MEASURES` and its lists one entry
    per run. Any other JSON (a list, a sweep's own summary.json, a hand-edited entry) ended in a traceback half-way
    through the table, or in an empty one. Measures the table does not read are left unchecked: a newer writer may
    add some."""
    import reprlib

    what = f"{path}: not a `capo report --figures` summary"
    if not isinstance(data, dict) or not data:
        got = ("an empty mapping" if isinstance(data, dict) else "a list" if isinstance(data, list)
               else reprlib.repr(data))
        raise DataError(f"{what}: expected a mapping of model name -> measure -> per-run values, got {got}")
    for name, entry in data.items():
        if not isinstance(entry, dict):
            got = "a list" if isinstance(entry, list) else f"a {type(entry).__name__}"
            raise DataError(f"{what}: model {name!r} maps measures to per-run lists, got {got}")
        read = [k for k in COMPARE_MEASURES if k in entry]
        if not read:
            raise DataError(f"{what}: model {name!r} has none of the measures {', '.join(COMPARE_MEASURES)}")
        for key in read:
            if not isinstance(entry[key], list) or not all(v is None or is_real(v) for v in entry[key]):
                raise DataError(f"{what}: {name}.{key} must be a list of numbers or nulls, one per run, got "
                                f"{reprlib.repr(entry[key])}")
        seeds = entry.get("seeds")
        if seeds is not None and not (isinstance(seeds, list) and all(isinstance(s, str) for s in seeds)):
            raise DataError(f"{what}: {name}.seeds must be a list of training seeds as text (\"0\"), one per run, "
                            f"got {reprlib.repr(seeds)}")  # 0 and "0" would never pair: the writer's is text
        runs = len(seeds) if seeds is not None else len(entry[read[0]])
        if bad := next((k for k in read if len(entry[k]) != runs), None):
            lists = f"{runs} seeds" if seeds is not None else f"{runs} {read[0]} values"
            raise DataError(f"{what}: model {name!r} lists {lists} but {len(entry[bad])} {bad} values: each list has "
                            "one entry per run")


def from_compare_summary(path: Path, reference: str, effect: float) -> str:
    """Seed-paired table from a ``capo report --figures`` summary JSON (model -> measure -> per-seed list, with
    ``seeds``: each run's training seed): runs are paired by seed. A file written before ``seeds`` was recorded is
    paired by position, and the table says so."""
    data = json.loads(Path(path).read_text())
    lines = [f"| model | measure | seeds | difference vs {reference} [95% t-interval over seeds] | sd | p |",
             "|---|---|---|---|---|---|"]
    by_position, notes = False, []
    for m in sorted(data):
        if m in (reference, "base"):
            continue
        for k in COMPARE_MEASURES:
            pairs, positional = _seed_pairs(data[m], data[reference], k)
            by_position |= positional and bool(pairs)
            kept = [(x, y) for _, x, y in pairs if usable(x) and usable(y)]
            d = seed_paired([x - y for x, y in kept], effect)
            if "sd" in d:
                lines.append(f"| {m} | {k} | {d['n_seeds']} | {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | "
                             f"{d['sd']:.3f} | {d['p']:.3g} |")
            gone = [str(s) for s, x, y in pairs if not (usable(x) and usable(y))]
            what = "runs (by position)" if positional else "seeds"
            if pairs and "sd" not in d:
                notes.append(f"note: {m} {k}: not shown ({len(kept)} of {len(pairs)} paired {what} have a value of "
                             f"both {m} and {reference}; an interval needs 2)")
            elif gone:
                notes.append(f"note: {m} {k}: {what} {', '.join(gone)} left out (no value of {m} or {reference} "
                             "there: the measure could not be computed for that run)")
    lines += [""] + notes if notes else []
    if by_position:
        lines += ["", f"{path} records no training seeds (written by an older capo): runs were paired by their "
                      "position in each list, which is right only if every model's runs were given in the same seed "
                      "order. Write it again with `capo report --figures` to pair by seed."]
    return "\n".join(lines) + "\n"


def _seed_pairs(a_entry: dict, b_entry: dict, key: str) -> tuple[list, bool]:
    """(seed, a, b) value triples of one measure over the seeds both models ran (a value may be None or NaN: the
    caller leaves it out and says so), and whether they were paired by position (no ``seeds`` recorded; then the
    "seed" is the run's position). No pairs when a model lacks the measure or lists a seed twice."""
    a, b = a_entry.get(key), b_entry.get(key)
    if not a or not b:
        return [], False
    sa, sb = a_entry.get("seeds"), b_entry.get("seeds")
    if sa is None or sb is None:
        return ([(i, x, y) for i, (x, y) in enumerate(zip(a, b))] if len(a) == len(b) else []), True
    if len(set(sa)) != len(sa) or len(set(sb)) != len(sb) or len(sa) != len(a) or len(sb) != len(b):
        return [], False
    va, vb = dict(zip(sa, a)), dict(zip(sb, b))
    return [(s, va[s], vb[s]) for s in sorted(set(va) & set(vb), key=lambda x: (len(str(x)), str(x)))], False


def markdown(s: dict) -> str:
    ref, lines = s["reference"], []
    seeds = sorted({x for m in s["methods"].values() for x in m["seeds"]})
    one, two = headline_pair(s["methods"])
    lines += [f"Per seed (final held-out {LABELS[one]} / {LABELS[two]})", "",
              "| method | " + " | ".join(str(x) for x in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for m, v in s["methods"].items():
        cells = {sd: f"{_f(a)} / {_f(u)}" for sd, a, u in zip(v["seeds"], v[one]["per_seed"], v[two]["per_seed"])}
        lines.append(f"| {m} | " + " | ".join(cells.get(x, "-") for x in seeds) + " |")
    shown = [k for k in MEASURES if all(k in v for v in s["methods"].values())]
    lines += ["", "Mean (sd over seeds)", "", "| method | seeds | " + " | ".join(shown) + " |",
              "|---|---|" + "---|" * len(shown)]
    for m, v in s["methods"].items():
        lines.append(f"| {m} | {len(v['seeds'])} | " + " | ".join(_ms(v[k]["mean"], v[k]["sd"]) for k in shown)
                     + " |")
    n = len(s["paired"])
    lines += ["", f"Paired by training seed, method - {ref}: mean [95% t-interval over seeds], p (paired t-test); "
              f"p Holm-adjusted over the {n} method{'s' * (n != 1)} per measure; seeds needed for {s['effect']} at "
              "80% power", "",
              "| method | measure | seeds | difference [95% CI] | sd of difference | p | p (Holm) | seeds needed |",
              "|---|---|---|---|---|---|---|---|"]
    for m, by_k in s["paired"].items():
        for k, d in by_k.items():
            if "sd" in d:
                lines.append(f"| {m} | {k} | {d['n_seeds']} | {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] "
                             f"| {d['sd']:.3f} | {d['p']:.3g} | {d['p_holm']:.3g} | {_n(d)} |")
    return "\n".join(_glance_lines(s) + lines + _from_base_lines(s) + _along_curve_lines(s.get("along_curve") or {})
                     + left_out_lines(s)) + "\n"


SECTIONS = {"paired": "the paired difference with the reference", "from_base": "the change from the start",
            "along_curve": "the change along the periodic curve"}
# the measures the change-from-the-start table shows (the others are in the summary's data only)
FROM_BASE_SHOWN = ("accuracy", "auc_mean", "auroc", "ece", "brier", *OPTIONAL_MEASURES)


def left_out_lines(s: dict) -> list[str]:
    """A note for each mean and reading of the tables that left seeds out: a method (or the reference) has no value
    of the measure there -- an AUC of a model whose answers were all wrong or all right -- or its record has no such
    measure (its evaluation had nothing to compute it from, e.g. no stated confidence, or was written before the
    measure existed). The reading stands on the other seeds, and a reader must know which are not
    in it."""
    def seeds(xs):
        return f"seed{'s' * (len(xs) > 1)} {', '.join(map(str, xs))}"

    notes = [f"note: {m} {k}: mean over {len(v['seeds']) - len(gone)} of its {len(v['seeds'])} seeds ({seeds(gone)}: "
             "no value)" for m, v in s["methods"].items() for k in MEASURES if k in v
             if (gone := [x for x, y in zip(v["seeds"], v[k]["per_seed"]) if not usable(y)])
             and len(gone) < len(v["seeds"])]
    for section, what in SECTIONS.items():
        for m, by_k in (s.get(section) or {}).items():
            whose = f", of {m} or of {s['reference']}" if section == "paired" else ""
            for k, d in by_k.items():
                if section == "from_base" and k not in FROM_BASE_SHOWN:
                    continue
                if d.get("left_out"):
                    notes.append(f"note: {m} {k}: {seeds(d['left_out'])} left out of {what} (no value there{whose}: "
                                 "the measure could not be computed for that model)")
                if d.get("unmeasured"):
                    notes.append(f"note: {m} {k}: {seeds(d['unmeasured'])} not in {what} (no such measure in the "
                                 f"record{whose}: its evaluation had nothing to compute it from, or predates it)")
    return [""] + notes if notes else []


def _glance_lines(s: dict) -> list[str]:
    """The reading at a glance, one row per method: accuracy and AUC-mean minus the reference (paired by seed), and
    the AUC-mean's change from the start and along the periodic curve, each mean [95% interval] (over the method's
    seeds; "-" where there is none)."""
    ref, (one, two) = s["reference"], headline_pair(s["methods"])
    cols = [("paired", one, f"{LABELS[one]} - {ref}"), ("paired", two, f"{LABELS[two]} - {ref}"),
            ("from_base", two if one == "accuracy" else one, f"{LABELS[two if one == 'accuracy' else one]} change "
             "from the start"),
            ("along_curve", two if one == "accuracy" else one, f"{LABELS[two if one == 'accuracy' else one]} along "
             "the periodic curve")]
    cols = [c for c in cols if c[0] in s]
    lines = ["At a glance: mean [95% interval over training seeds; from the start with several base draws, over the "
             "seeds and the draws (Welch)] (details in the tables below; each reading uses the seeds it can: paired "
             "ones, or those whose curve starts at step 0)", "",
             "| method | seeds | " + " | ".join(c[2] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for m, v in s["methods"].items():
        cells = []
        for section, k, _ in cols:
            d = (s[section].get(m) or {}).get(k)
            cells.append("-" if not d or d["mean"] is None else
                         f"{d['mean']:+.3f}" + (f" [{d['low']:+.3f}, {d['high']:+.3f}]" if "low" in d else ""))
        lines.append(f"| {m} | {len(v['seeds'])} | " + " | ".join(cells) + " |")
    return lines + [""]


def _ci_cells(d: dict) -> str:
    """``change [95% CI] | sd | p`` table cells of one interval (mean only where there is none)."""
    if "low" in d:
        return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | {d['sd']:.3f} | {d['p']:.3g}"
    return f"{d['mean']:+.3f} (no interval) | - | -"


def _from_base_lines(s: dict) -> list[str]:
    if "from_base" not in s:
        return []
    n = s["base_draws"]
    start = ", ".join(f"{k} {v:.3f}" + (f" (sd {s['base_sd'][k]:.3f})" if n > 1 else "")
                      for k, v in s["base"].items() if k in ("accuracy", "auc_mean", "auroc", *OPTIONAL_MEASURES)
                      and v is not None)
    how = ("one draw of the base evaluation, so its own sampling noise is not in the interval; mean [95% t-interval "
           "over seeds], p (one-sample t-test)" if n == 1 else
           f"mean of {n} draws of the base evaluation; method's seed mean - base mean [95% Welch t-interval: the "
           "seeds' and the draws' variances], p (Welch's t-test)")
    lines = ["", f"Change from the start, method - base (the initial model on the same evaluation: {start}; {how})",
             "", "| method | measure | seeds | change [95% CI] | sd over seeds | p |", "|---|---|---|---|---|---|"]
    for m, by_k in s["from_base"].items():
        for k, d in by_k.items():
            if k in FROM_BASE_SHOWN and d["mean"] is not None:
                lines.append(f"| {m} | {k} | {d['n_seeds']} | {_ci_cells(d)} |")
    return lines


def _along_curve_lines(along: dict) -> list[str]:
    rows = [(m, k, d) for m, by_k in along.items() for k, d in by_k.items()]
    if not rows:
        return []
    lines = ["", "Change along the periodic held-out curve, last evaluation - step 0 (the trainer's periodic "
             "evaluation, not the final one; seeds whose curve starts at step 0): mean [95% t-interval over seeds], p",
             "",
             "| method | measure | seeds | last step | change [95% CI] | sd | p |", "|---|---|---|---|---|---|---|"]
    for m, k, d in rows:
        lines.append(f"| {m} | {k} | {d['n_seeds']} | {'/'.join(str(x) for x in d['last_step'])} | {_ci_cells(d)} |")
    return lines


def curve_table(rec: dict) -> str:
    """One run's held-out curve as a markdown table: every periodic evaluation row (accuracy, AUC-mean, pooled AUROC,
    ECE, Brier, mean token entropy) with the training accuracy and response length averaged over the steps since the
    previous evaluation."""
    train = rec["curves"]["train"]
    lines = [f"{rec['method']} seed {rec['seed']}", "",
             "| step | accuracy | AUC-mean | pooled AUROC | ECE | Brier | entropy | train accuracy (mean since last) | "
             "response tokens (mean since last) |", "|---|---|---|---|---|---|---|---|---|"]
    prev = 0
    for ev in rec["curves"]["eval"]:
        step = ev["step"]
        window = [r for r in train if prev < r["step"] <= step]
        ta = mean_or_none([r.get("train/accuracy") for r in window])
        tl = mean_or_none([r.get("train/response_len") for r in window])
        cells = [f"{ev.get('eval/' + k):.3f}" if ev.get("eval/" + k) is not None else "-"
                 for k in ("accuracy", "auc_mean", "auroc", "ece", "brier", "entropy")]
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {'-' if ta is None else f'{ta:.3f}'} | "
                     f"{'-' if tl is None else f'{tl:.1f}'} |")
        prev = step
    return "\n".join(lines) + "\n"


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _n(d: dict) -> str:
    """Seeds needed: a number, "> N" above the search's limit, "<= 2" where the sd is 0."""
    x = d.get("seeds_needed")
    if x is None:
        return f"> {d['seeds_over']}" if d.get("seeds_over") else "<= 2"
    return f"{x:.0f}"


def _ms(m, sd) -> str:
    return "-" if m is None else f"{m:.3f}" + (f" ({sd:.3f})" if sd is not None else "")

