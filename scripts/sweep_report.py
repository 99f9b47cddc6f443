"""Turn a sweep's records (scripts/sweep.py) into the tables, the curves and the forest plot, with the training seed
as the unit.

    python scripts/sweep_report.py sweeps/records/NAME [sweeps/records/NAME2 ...] --reference grpo [--out DIR]
    python scripts/sweep_report.py docs/figures/compare/default-summary.json --compare-summary --reference grpo

Prints, and writes to OUT/summary.md and OUT/summary.json:
- per-seed final held-out values of each method;
- mean and sd over seeds;
- each method minus the reference, paired by training seed: mean difference, its sd, a 95% t-interval over the
  seeds (n_seeds - 1 degrees of freedom), the two-sided paired t-test p-value and, per measure, that p-value
  Holm-adjusted over the methods compared with the reference (statsmodels `multipletests`: many methods make many
  tests, and at 5% some exclude 0 by chance); only seeds that every compared method finished enter;
- the power analysis: how many seeds a paired t-test needs to detect a difference of --effect (default 0.03) with
  80% power at the 5% level, given the observed sd of the paired difference (statsmodels `TTestPower`);
- with the sweep's base records (`base.json`, spec `base: true`; `base-drawD.json` too with `base: N`): each method's
  change from the start, final - base (the initial model under the same evaluation): with one draw a 95% t-interval
  over the method's seeds, with several Welch's t-interval of the seed mean minus the draws' mean;
- for runs whose periodic curve starts at step 0: the change along that curve (last periodic evaluation - step 0).
Figures: OUT/curves.png (small multiples: each method's held-out accuracy and AUC-mean during training over the
reference's, mean, a band of +-1 sd over seeds and each seed), OUT/plane.png (every method on the final accuracy /
AUC-mean plane: each seed, the mean +-1 sd, the start) and OUT/forest.png (one panel per measure: the paired
seed-level differences with their t-intervals; intervals from fewer than 3 seeds are cut at the panel's edge).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import BASE  # noqa: E402  the base job's method name, as scripts/sweep.py writes its record

MEASURES = ("accuracy", "auc_mean", "auroc", "ece", "brier", "aurc", "verbal_ece", "majority_vote",
            "perplexity_consistency")
CURVES = ("eval/accuracy", "eval/auc_mean")


# Settings that may differ between the records of one comparison: the method itself (every `algo.*` key), the seed,
# and knobs that change neither the method nor the sampling distribution (where a run writes, how often it saves,
# threads, the KV-cache layout, gradient-accumulation micro-batches, the extra step-0 evaluation, which leaves the
# training untouched: tests/trainer). Everything else must be equal.
FREE = ("algo", "run.seed", "run.out_dir", "run.save_every", "run.keep_checkpoints", "run.resume", "run.progress",
        "run.threads", "run.eval_at_start", "rollout.kv_cache", "optim.micro_batch_size")


def comparable(rec: dict, sections: tuple[str, ...] | None = None) -> dict:
    """What must agree for records to enter one comparison: the preset, the final evaluation and every training
    setting of the record's config outside :data:`FREE` (only ``sections`` of the config when given), and the device
    it ran on (a GPU's sampling stream and float summation differ from a CPU's)."""
    cfg = {f"{sec}.{k}": v for sec, body in (rec.get("config") or {}).items()
           if isinstance(body, dict) and (sections is None or sec in sections) for k, v in body.items()}
    cfg = {k: v for k, v in sorted(cfg.items()) if k not in FREE and k.split(".")[0] not in FREE}
    settings = rec.get("settings") or {}
    device = (rec.get("machine") or {}).get("device", "cpu")  # records before 2026-11-25 name none: all ran on a CPU
    return {"preset": settings.get("preset"), "eval": settings.get("eval"), "device": device, "config": cfg}


def _check_same(recs: list[tuple[Path, dict]], what: str, sections: tuple[str, ...] | None = None) -> None:
    """Exit naming the first two records whose settings differ outside :data:`FREE`."""
    (p0, r0), *rest = recs
    c0 = comparable(r0, sections)
    for p, r in rest:
        c = comparable(r, sections)
        if c != c0:
            diff = [k for k in ("preset", "eval", "device") if c[k] != c0[k]] + sorted(
                k for k in set(c["config"]) | set(c0["config"]) if c["config"].get(k) != c0["config"].get(k))
            sys.exit(f"{p} and {p0}: {what} differ in {', '.join(diff)}; one comparison needs the same preset, "
                     f"evaluation and training settings except the method and {', '.join(FREE[1:])}")


def load_records(*folders: Path) -> dict[str, dict[int, dict]]:
    """method -> seed -> record, from one sweep's folder or several (e.g. more methods run by a second spec against
    the first one's reference): every record must share the preset, the evaluation and the training settings outside
    :data:`FREE`, and a (method, seed) may come from one folder only. The base records are read by
    :func:`load_base`."""
    out: dict[str, dict[int, dict]] = {}
    paths: dict[tuple[str, int], Path] = {}
    for folder in folders:
        files = sorted(Path(folder).glob("*.json"))
        if not files:
            sys.exit(f"{folder}: no records (*.json) found")
        for p in files:
            rec = json.loads(p.read_text())
            if rec["method"] == BASE:
                continue
            key = (rec["method"], rec["seed"])
            if key in paths:
                sys.exit(f"{p} and {paths[key]}: {key[0]} seed {key[1]} twice (one record per method and seed)")
            paths[key] = p
            out.setdefault(rec["method"], {})[rec["seed"]] = rec
    if not out:
        sys.exit(f"{', '.join(map(str, folders))}: only base records, no method's")
    _check_same([(paths[m, s], out[m][s]) for m, s in paths], "training records")
    return out


def load_base(*folders: Path) -> list[dict]:
    """The base records (the preset's initial model under the same held-out evaluation: `base.json` and, with spec
    `base: N`, the further draws `base-drawD.json`) of the first folder that has any; [] when none has. Every draw
    must agree in preset, evaluation (its seed aside), model and data with the others and with other folders'."""
    found = []
    for f in folders:
        found += [(p, json.loads(p.read_text())) for p in sorted(Path(f).glob(f"{BASE}*.json"))
                  if p.stem == BASE or p.stem.startswith(f"{BASE}-draw")]
    if not found:
        return []
    _check_same([(p, _without_eval_seed(r)) for p, r in found], "base records", sections=("model", "data"))
    first = Path(found[0][0]).parent
    draws = [((r.get("settings") or {}).get("eval", {}).get("seed", 0), r) for p, r in found if Path(p).parent == first]
    seeds = [seed for seed, _ in draws]
    if len(set(seeds)) != len(seeds):
        sys.exit(f"{first}: two base records with the same evaluation seed ({seeds}); each draw needs its own")
    return [r for _, r in sorted(draws, key=lambda d: d[0])]


def _without_eval_seed(rec: dict) -> dict:
    settings = rec.get("settings") or {}
    return {**rec, "settings": {**settings, "eval": {k: v for k, v in (settings.get("eval") or {}).items()
                                                     if k != "seed"}}}


def from_base(records: dict, bases: list[dict], effect: float) -> dict:
    """Per method and measure: final - base. With one base draw, a one-sample t-interval over the method's seeds of
    final - that draw (the draw's own sampling noise is then not in the interval: it shifts every seed's change
    alike); with several, the difference of the method's seed mean and the base draws' mean, Welch's t-interval
    (:func:`capo.evaluation.stats.two_sample_interval`: the seeds' and the draws' variances both count)."""
    from capo.evaluation.stats import two_sample_interval

    out = {}
    for m, by_seed in records.items():
        out[m] = {}
        for k in MEASURES:
            b = [r["final"].get(k) for r in bases]
            a = [by_seed[s]["final"].get(k) for s in sorted(by_seed)]
            if None in a or None in b:
                continue
            if len(b) == 1:
                out[m][k] = {"seeds": sorted(by_seed), "base_draws": 1, **seed_paired([x - b[0] for x in a], effect)}
                continue
            w = two_sample_interval(a, b)
            out[m][k] = {"seeds": sorted(by_seed), "base_draws": len(b), "n_seeds": len(a),
                         "mean": float(np.mean(a) - np.mean(b)),
                         **({"sd": _sd(a), "low": w["low"], "high": w["high"], "p": w["p"]} if w else {})}
    return out


CURVE_MEASURES = ("accuracy", "auc_mean", "auroc")


def along_curve(records: dict, effect: float) -> dict:
    """Per method and measure: the last periodic evaluation minus the step-0 one, over the seeds whose curve has a
    step-0 row (a one-sample t-interval). The periodic evaluation (the held-out split's first ``data.n_eval`` problems,
    ``run.eval_samples`` each, seeded by the training seed) draws other samples than the final one, so this is a
    second held-out reading of "how far training moved it", not the same one."""
    out = {}
    for m, by_seed in records.items():
        rows = {s: r["curves"].get("eval") or [] for s, r in by_seed.items()}
        ends = {s: (ev[0], ev[-1]) for s, ev in rows.items() if ev and ev[0]["step"] == 0 and len(ev) > 1}
        out[m] = {k: {"seeds": sorted(ends), "last_step": sorted({e[1]["step"] for e in ends.values()}),
                      **seed_paired([ends[s][1]["eval/" + k] - ends[s][0]["eval/" + k] for s in sorted(ends)], effect)}
                  for k in CURVE_MEASURES
                  if ends and all(e[i].get("eval/" + k) is not None for e in ends.values() for i in (0, 1))}
    return out


def paired(records: dict, method: str, reference: str, measure: str, effect: float) -> dict:
    """Seed-paired difference method - reference over the seeds both finished."""
    seeds = sorted(set(records[method]) & set(records[reference]))
    d = [records[method][s]["final"][measure] - records[reference][s]["final"][measure] for s in seeds]
    return {"seeds": seeds, **seed_paired(d, effect)}


def seed_paired(diffs, effect: float) -> dict:
    """Per-seed differences -> mean, sd, 95% t-interval and p (capo.evaluation.stats.seed_paired_interval, the one
    implementation the report uses too) and the seeds a paired t-test needs for ``effect`` at 80% power."""
    from statsmodels.stats.power import TTestPower

    from capo.evaluation.stats import seed_paired_interval

    d = [float(x) for x in diffs]
    out = {"n_seeds": len(d), "diffs": d, "mean": float(np.mean(d)) if d else None}
    r = seed_paired_interval(d)
    if r is not None:
        need = None
        if r["sd"] > 0:
            # the solver warns (and returns NaN) when 2 seeds already suffice; record=True keeps it silent even when
            # statsmodels' first import of its warning class adds an "always" filter inside this block
            with warnings.catch_warnings(record=True):
                need = float(TTestPower().solve_power(effect_size=effect / r["sd"], alpha=0.05, power=0.8))
            need = None if math.isnan(need) else need
        out |= {"sd": r["sd"], "low": r["low"], "high": r["high"], "p": r["p"], "seeds_needed": need}
    return out


def from_compare_summary(path: Path, reference: str, effect: float) -> str:
    """Seed-paired table from a `scripts/compare_table.py` summary JSON (model -> measure -> per-seed list, the same
    seeds in the same order for every trained model)."""
    data = json.loads(Path(path).read_text())
    lines = [f"| model | measure | seeds | difference vs {reference} [95% t-interval over seeds] | sd | p |",
             "|---|---|---|---|---|---|"]
    for m in sorted(data):
        if m in (reference, "base"):
            continue
        for k in ("accuracy", "auc_mean", "auroc", "ece", "brier", "verbal_ece"):
            a, b = data[m].get(k), data[reference].get(k)
            if not a or not b or len(a) != len(b) or None in a or None in b:
                continue
            d = seed_paired([x - y for x, y in zip(a, b)], effect)
            if "sd" in d:
                lines.append(f"| {m} | {k} | {d['n_seeds']} | {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | "
                             f"{d['sd']:.3f} | {d['p']:.3g} |")
    return "\n".join(lines) + "\n"


def summary(records: dict, reference: str, effect: float, base: list[dict] | None = None) -> dict:
    per_method = {}
    for m, by_seed in records.items():
        vals = {k: [by_seed[s]["final"].get(k) for s in sorted(by_seed)] for k in MEASURES}
        per_method[m] = {"seeds": sorted(by_seed),
                         **{k: {"per_seed": v, "mean": _mean(v), "sd": _sd(v)} for k, v in vals.items()}}
    diffs = {m: {k: paired(records, m, reference, k, effect) for k in MEASURES if _has(records, m, reference, k)}
             for m in records if m != reference}
    _holm(diffs)
    out = {"reference": reference, "effect": effect, "methods": per_method, "paired": diffs,
           "along_curve": along_curve(records, effect)}
    if base:
        out |= {"base": {k: _mean([b["final"].get(k) for b in base]) for k in MEASURES},
                "base_sd": {k: _sd([b["final"].get(k) for b in base]) for k in MEASURES},
                "base_draws": len(base), "from_base": from_base(records, base, effect)}
    return out


def _holm(diffs: dict) -> None:
    """Add ``p_holm`` to each paired difference: its p-value Holm-adjusted over the methods that have one for the
    same measure (the family: every method against the one reference on one measure)."""
    from statsmodels.stats.multitest import multipletests

    for k in MEASURES:
        family = [d[k] for d in diffs.values() if k in d and d[k].get("p") is not None]
        if family:
            adjusted = multipletests([d["p"] for d in family], method="holm")[1]
            for d, p in zip(family, adjusted):
                d["p_holm"] = float(p)


def _has(records, m, ref, k) -> bool:
    return all(r["final"].get(k) is not None for x in (m, ref) for r in records[x].values())


def _mean(v):
    v = [x for x in v if x is not None]
    return float(np.mean(v)) if v else None


def _sd(v):
    v = [x for x in v if x is not None]
    return float(np.std(v, ddof=1)) if len(v) > 1 else None


def markdown(s: dict) -> str:
    ref, lines = s["reference"], []
    seeds = sorted({x for m in s["methods"].values() for x in m["seeds"]})
    lines += ["Per seed (final held-out accuracy / AUC-mean)", "",
              "| method | " + " | ".join(str(x) for x in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for m, v in s["methods"].items():
        cells = {sd: f"{a:.3f} / {u:.3f}" for sd, a, u in zip(v["seeds"], v["accuracy"]["per_seed"],
                                                                 v["auc_mean"]["per_seed"])}
        lines.append(f"| {m} | " + " | ".join(cells.get(x, "-") for x in seeds) + " |")
    lines += ["", "Mean (sd over seeds)", "", "| method | seeds | " + " | ".join(MEASURES) + " |",
              "|---|---|" + "---|" * len(MEASURES)]
    for m, v in s["methods"].items():
        lines.append(f"| {m} | {len(v['seeds'])} | " + " | ".join(_ms(v[k]["mean"], v[k]["sd"]) for k in MEASURES)
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
                             f"| {d['sd']:.3f} | {d['p']:.3g} | {d['p_holm']:.3g} | {_n(d['seeds_needed'])} |")
    return "\n".join(_glance_lines(s) + lines + _from_base_lines(s) + _along_curve_lines(s.get("along_curve") or {})) \
        + "\n"


def _glance_lines(s: dict) -> list[str]:
    """The reading at a glance, one row per method: accuracy and AUC-mean minus the reference (paired by seed), and
    the AUC-mean's change from the start and along the periodic curve, each mean [95% interval] (over the method's
    seeds; "-" where there is none)."""
    ref = s["reference"]
    cols = [("paired", "accuracy", f"accuracy - {ref}"), ("paired", "auc_mean", f"AUC-mean - {ref}"),
            ("from_base", "auc_mean", "AUC-mean change from the start"),
            ("along_curve", "auc_mean", "AUC-mean along the periodic curve")]
    cols = [c for c in cols if c[0] in s]
    lines = ["At a glance: mean [95% interval over training seeds] (details in the tables below; each reading uses the "
             "seeds it can: paired ones, or those whose curve starts at step 0)", "",
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
                      for k, v in s["base"].items() if k in ("accuracy", "auc_mean", "auroc") and v is not None)
    how = ("one draw of the base evaluation, so its own sampling noise is not in the interval; mean [95% t-interval "
           "over seeds], p (one-sample t-test)" if n == 1 else
           f"mean of {n} draws of the base evaluation; method's seed mean - base mean [95% Welch t-interval: the "
           "seeds' and the draws' variances], p (Welch's t-test)")
    lines = ["", f"Change from the start, method - base (the initial model on the same evaluation: {start}; {how})",
             "", "| method | measure | seeds | change [95% CI] | sd over seeds | p |", "|---|---|---|---|---|---|"]
    for m, by_k in s["from_base"].items():
        for k, d in by_k.items():
            if k in ("accuracy", "auc_mean", "auroc", "ece", "brier") and d["mean"] is not None:
                lines.append(f"| {m} | {k} | {d['n_seeds']} | {_ci_cells(d)} |")
    return lines


def _along_curve_lines(along: dict) -> list[str]:
    rows = [(m, k, d) for m, by_k in along.items() for k, d in by_k.items()]
    if not rows:
        return []
    lines = ["", "Change along the periodic held-out curve, last evaluation - step 0 (the trainer's periodic "
             "evaluation, not the final one; seeds whose curve starts at step 0): mean [95% t-interval over seeds], p", "",
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
        ta = _mean([r.get("train/accuracy") for r in window])
        tl = _mean([r.get("train/response_len") for r in window])
        cells = [f"{ev.get('eval/' + k):.3f}" if ev.get("eval/" + k) is not None else "-"
                 for k in ("accuracy", "auc_mean", "auroc", "ece", "brier", "entropy")]
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {'-' if ta is None else f'{ta:.3f}'} | "
                     f"{'-' if tl is None else f'{tl:.1f}'} |")
        prev = step
    return "\n".join(lines) + "\n"


def _n(x) -> str:
    return "<= 2" if x is None else f"{x:.0f}"


def _ms(m, sd) -> str:
    return "-" if m is None else f"{m:.3f}" + (f" ({sd:.3f})" if sd is not None else "")


def plot_curves(records: dict, reference: str, path: Path) -> None:
    """Small multiples: for each method, its held-out accuracy and AUC-mean curves (thin: each seed; thick: the mean;
    band: +-1 sd over seeds) over the reference's (grey), so that eleven methods stay readable."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    others = [m for m in sorted(records) if m != reference] or [reference]
    pairs_per_row = 2 if len(others) > 1 else 1
    rows = math.ceil(len(others) / pairs_per_row)
    fig = Figure(figsize=(7 * pairs_per_row, 2.6 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 2 * pairs_per_row, sharex=True, squeeze=False)
    panels = {(i, j): axes[i // pairs_per_row, 2 * (i % pairs_per_row) + j]  # (method, measure) -> its panel
              for i in range(len(others)) for j in range(len(CURVES))}
    for i, m in enumerate(others):
        for j, key in enumerate(CURVES):
            ax = panels[i, j]
            if m != reference:
                _draw_curve(ax, records[reference], key, "0.55", f"{reference} ({len(records[reference])})", seeds=False)
            _draw_curve(ax, records[m], key, "C0" if j == 0 else "C3", f"{m} ({len(records[m])})", seeds=True)
            ax.set_title(f"{m}: {key.split('/')[1]}", fontsize=9)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7, loc="lower right" if j == 0 else "lower left")
    for ax in axes.flat[2 * len(others):]:
        ax.set_visible(False)
    for j in range(len(CURVES)):  # one y range per measure, so panels compare at a glance
        col = [panels[i, j] for i in range(len(others))]
        lims = np.array([ax.get_ylim() for ax in col])
        for ax in col:
            ax.set_ylim(lims[:, 0].min(), lims[:, 1].max())
    for ax in axes[-1]:
        ax.set_xlabel("training step", fontsize=8)
    fig.suptitle(f"held-out curves vs {reference} (thick: mean over seeds, band: +-1 sd, thin: each seed; "
                 "legend: seeds)", fontsize=10)
    fig.savefig(path, dpi=100)


def _draw_curve(ax, by_seed: dict, key: str, color: str, label: str, *, seeds: bool) -> None:
    """One method's curve of ``key``: mean over seeds with a +-1 sd band, and each seed thin when ``seeds``."""
    steps = sorted({r["step"] for rec in by_seed.values() for r in rec["curves"]["eval"]})
    ys = np.array([[_at(rec, st, key) for st in steps] for rec in by_seed.values()], dtype=float)
    with warnings.catch_warnings():  # a step no seed reached is NaN, not an error
        warnings.simplefilter("ignore", RuntimeWarning)
        mu = np.nanmean(ys, axis=0)
        sd = np.nanstd(ys, axis=0, ddof=1) if len(ys) > 1 else np.zeros(len(steps))
    if seeds:
        for y in ys:
            ax.plot(steps, y, color=color, lw=0.6, alpha=0.45)
    ax.plot(steps, mu, color=color, lw=2, label=label)
    ax.fill_between(steps, mu - sd, mu + sd, color=color, alpha=0.15, lw=0)


def _at(rec, step, key):
    for r in rec["curves"]["eval"]:
        if r["step"] == step:
            return r.get(key, np.nan)
    return np.nan


PLANE = ("accuracy", "auc_mean")


def plane_points(s: dict) -> dict:
    """The final evaluation's accuracy / AUC-mean plane: ``methods`` maps each method to its seeds' (accuracy,
    AUC-mean) points and the mean and sd over seeds of each axis (sd None with one seed); ``start`` is the base's
    draws' mean and sd (None without base records)."""
    methods = {}
    for m, v in s["methods"].items():
        pts = [(a, u) for a, u in zip(v["accuracy"]["per_seed"], v["auc_mean"]["per_seed"])
               if a is not None and u is not None]
        if pts:
            xs, ys = zip(*pts)
            methods[m] = {"seeds": pts, "mean": (_mean(xs), _mean(ys)), "sd": (_sd(xs), _sd(ys))}
    start = None
    if s.get("base") and all(s["base"].get(k) is not None for k in PLANE):
        start = {"mean": tuple(s["base"][k] for k in PLANE), "sd": tuple(s["base_sd"].get(k) for k in PLANE),
                 "draws": s["base_draws"]}
    return {"methods": methods, "start": start}


_PALETTE = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9", "navy")  # tab10 without its grey, which is GRPO's


def plot_plane(s: dict, path: Path) -> None:
    """Every method on one accuracy / AUC-mean plane (final held-out evaluation): each seed a small point, the mean
    over seeds a large one with +-1 sd bars on both axes; the start (the base's draws) a black star with its sd and
    a dotted line at its AUC-mean. Up and to the right is better on both."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = plane_points(s)
    fig = Figure(figsize=(8.5, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ref = s["reference"]
    order = [m for m in [ref] + sorted(set(pts["methods"]) - {ref}) if m in pts["methods"]]
    for i, m in enumerate(order):  # colour and marker both cycle, so that eleven methods stay apart
        p, color, marker = pts["methods"][m], "0.35" if m == ref else _PALETTE[i % len(_PALETTE)], "os^Dv<>"[i % 7]
        ax.plot(*zip(*p["seeds"]), marker, color=color, ms=4, alpha=0.45, ls="none")
        ax.errorbar(*p["mean"], xerr=p["sd"][0] or 0, yerr=p["sd"][1] or 0, fmt=marker, color=color, ms=9,
                    capsize=3, mec="black", mew=0.6, label=f"{m} ({len(p['seeds'])} seeds)")
    if pts["start"]:
        p = pts["start"]
        ax.errorbar(*p["mean"], xerr=p["sd"][0] or 0, yerr=p["sd"][1] or 0, fmt="*", color="black", ms=14,
                    capsize=3, label=f"start: base model ({p['draws']} draw{'s' * (p['draws'] > 1)})")
        ax.axhline(p["mean"][1], color="black", lw=0.8, ls=":")
    ax.set_xlabel("final held-out accuracy")
    ax.set_ylabel("final held-out AUC-mean (per-prompt AUROC of exp(lpm))")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("accuracy vs AUC-mean after training (small: each seed; large: mean, bars +-1 sd over seeds)",
                 fontsize=10)
    fig.savefig(path, dpi=100)


FOREST = ("accuracy", "auc_mean", "auroc", "ece", "brier")


def plot_forest(s: dict, path: Path) -> bool:
    """One panel per measure, one row per method: the paired difference from the reference with its t-interval over
    seeds. Each panel's x range fits the methods with at least 3 paired seeds; a wider interval (2 seeds: t = 12.7)
    is cut at the edge and marked with an arrow, so that it cannot hide the powered ones. False (nothing drawn) when
    no method has a paired interval."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paired = {m: {k: d for k, d in by_k.items() if "sd" in d and k in FOREST} for m, by_k in s["paired"].items()}
    methods = [m for m, by_k in paired.items() if by_k]
    measures = [k for k in FOREST if any(k in paired[m] for m in methods)]
    if not methods:
        return False
    fig = Figure(figsize=(2.5 * len(measures) + 1.6, 0.42 * len(methods) + 1.3), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(measures), sharey=True, squeeze=False)[0]
    for j, (ax, k) in enumerate(zip(axes, measures)):
        rows = [(i, paired[m][k]) for i, m in enumerate(methods) if k in paired[m]]
        lim = _forest_limit([d for _, d in rows])
        for i, d in rows:
            _forest_row(ax, i, d, lim, f"C{j}")
        ax.axvline(0, color="grey", lw=1)
        ax.set_xlim(-lim, lim)
        ax.set_title(k, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.locator_params(axis="x", nbins=5)
    labels = [f"{m} ({len(next(iter(paired[m].values()))['seeds'])} seeds)" for m in methods]
    axes[0].set_yticks(range(len(methods)), labels, fontsize=8)
    axes[0].set_ylim(len(methods) - 0.5, -0.5)
    fig.supxlabel(f"difference vs {s['reference']} (95% t-interval over training seeds, paired; "
                  "arrow: interval cut at the panel's edge)", fontsize=8)
    fig.savefig(path, dpi=110)
    return True


def _forest_limit(ds: list[dict]) -> float:
    """Half-width of a panel's x range: the widest reach of the intervals with >= 3 seeds (of all when none has)."""
    powered = [d for d in ds if len(d["seeds"]) >= 3] or ds
    reach = max(max(abs(d["low"]), abs(d["high"])) for d in powered)
    return max(1.15 * reach, 0.02) if math.isfinite(reach) else 1.0


def _forest_row(ax, i: int, d: dict, lim: float, color: str) -> None:
    lo, hi, mu = (float(np.clip(v, -lim, lim)) for v in (d["low"], d["high"], d["mean"]))
    ax.plot([lo, hi], [i, i], color=color, lw=1.5)
    ax.plot([mu], [i], "o", color=color, ms=5)
    for edge, cut, marker in ((-lim, d["low"] < -lim, "<"), (lim, d["high"] > lim, ">")):
        if cut:
            ax.plot([edge], [i], marker, color=color, ms=6, clip_on=False)
    if abs(d["mean"]) > lim:  # the mean itself is off the panel: print it
        ax.annotate(f"mean {d['mean']:+.2f}", (mu, i), xytext=(-4 if mu > 0 else 4, 5), textcoords="offset points",
                    ha="right" if mu > 0 else "left", fontsize=6, color=color)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", type=Path, nargs="+", help="a sweep's record folder (sweeps/records/NAME), or several "
                    "whose records share preset, evaluation and training settings (one comparison); with "
                    "--compare-summary one scripts/compare_table.py *-summary.json")
    ap.add_argument("--compare-summary", action="store_true", help="read a compare_table summary JSON instead")
    ap.add_argument("--reference", default="grpo", help="the method every other is paired against")
    ap.add_argument("--effect", type=float, default=0.03, help="difference the power analysis is for")
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default: docs/figures/sweeps/NAME, names joined by + for several folders)")
    ap.add_argument("--base-draws", type=int, default=None, help="use only the first N draws of the base evaluation "
                    "(by sampling seed; default: all)")
    ap.add_argument("--curve-tables", action="store_true", help="also print each run's held-out curve as a table")
    a = ap.parse_args(argv)
    if a.base_draws is not None and a.base_draws < 1:
        ap.error("--base-draws must be >= 1")
    if a.compare_summary:
        if len(a.records) != 1:
            ap.error("--compare-summary reads one summary JSON")
        print(from_compare_summary(a.records[0], a.reference, a.effect))
        return 0
    records = load_records(*a.records)
    if a.reference not in records:
        sys.exit(f"--reference {a.reference!r} has no records; methods: {', '.join(sorted(records))}")
    name = "+".join(r.name for r in a.records)
    out = a.out or Path(__file__).resolve().parent.parent / "docs" / "figures" / "sweeps" / name
    out.mkdir(parents=True, exist_ok=True)
    s = summary(records, a.reference, a.effect, load_base(*a.records)[:a.base_draws])
    md = markdown(s)
    (out / "summary.md").write_text(md)
    (out / "summary.json").write_text(json.dumps(s, indent=1))
    print(md)
    if a.curve_tables:
        for m in sorted(records):
            for seed in sorted(records[m]):
                print(curve_table(records[m][seed]))
    plot_curves(records, a.reference, out / "curves.png")
    plot_plane(s, out / "plane.png")
    figures = [out / "curves.png", out / "plane.png"]
    if plot_forest(s, out / "forest.png"):
        figures.append(out / "forest.png")
    else:
        (out / "forest.png").unlink(missing_ok=True)  # nothing paired: no stale plot from an earlier run
    print("figures: " + ", ".join(map(str, figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
