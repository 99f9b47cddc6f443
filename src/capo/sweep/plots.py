"""A sweep's figures (matplotlib ``Figure`` objects, no global backend): the held-out curves as small multiples,
every method on the final accuracy / AUC-mean plane, the forest plot of the paired differences, and each method's
reliability diagram over the final evaluations of all its seeds."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from capo.sweep.analysis import OPTIONAL_MEASURES, mean_or_none, sd_or_none

CURVES = ("eval/accuracy", "eval/auc_mean")


def plot_curves(records: dict, reference: str, path: Path, keys: tuple[str, str] = CURVES) -> None:
    """Small multiples: for each method, its held-out curves of ``keys`` (accuracy and AUC-mean; thin: each seed;
    thick: the mean; band: +-1 sd over seeds) over the reference's (grey), so that eleven methods stay readable."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    others = [m for m in sorted(records) if m != reference] or [reference]
    pairs_per_row = 2 if len(others) > 1 else 1
    rows = math.ceil(len(others) / pairs_per_row)
    fig = Figure(figsize=(7 * pairs_per_row, 2.6 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 2 * pairs_per_row, sharex=True, squeeze=False)
    panels = {(i, j): axes[i // pairs_per_row, 2 * (i % pairs_per_row) + j]  # (method, measure) -> its panel
              for i in range(len(others)) for j in range(len(keys))}
    for i, m in enumerate(others):
        for j, key in enumerate(keys):
            ax = panels[i, j]
            if m != reference:
                _draw_curve(ax, records[reference], key, "0.55", f"{reference} ({len(records[reference])})",
                            seeds=False)
            _draw_curve(ax, records[m], key, "C0" if j == 0 else "C3", f"{m} ({len(records[m])})", seeds=True)
            ax.set_title(f"{m}: {key.split('/')[1]}", fontsize=9)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7, loc="lower right" if j == 0 else "lower left")
    for ax in axes.flat[2 * len(others):]:
        ax.set_visible(False)
    for j in range(len(keys)):  # one y range per measure, so panels compare at a glance
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
            methods[m] = {"seeds": pts, "mean": (mean_or_none(xs), mean_or_none(ys)),
                          "sd": (sd_or_none(xs), sd_or_none(ys))}
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


FOREST = ("accuracy", "auc_mean", "auroc", "ece", "brier", *OPTIONAL_MEASURES)
FOREST_PER_ROW = 4  # panels per row of the forest plot; more measures wrap into further rows


def plot_forest(s: dict, path: Path) -> bool:
    """One panel per measure (:data:`FOREST_PER_ROW` to a row), one line per method: the paired difference from the
    reference with its t-interval over seeds. Each panel's x range fits the methods with at least 3 paired seeds; a
    wider interval (2 seeds: t = 12.7) is cut at the edge and marked with an arrow, so that it cannot hide the powered
    ones. False (nothing drawn) when no method has a paired interval."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paired = {m: {k: d for k, d in by_k.items() if "sd" in d and k in FOREST} for m, by_k in s["paired"].items()}
    methods = [m for m, by_k in paired.items() if by_k]
    measures = [k for k in FOREST if any(k in paired[m] for m in methods)]
    if not methods:
        return False
    cols = min(len(measures), FOREST_PER_ROW)
    n_rows = -(-len(measures) // cols)
    fig = Figure(figsize=(2.5 * cols + 1.6, n_rows * (0.42 * len(methods) + 0.9) + 0.4), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(n_rows, cols, sharey=True, squeeze=False)
    for ax in grid.flat[len(measures):]:
        ax.set_visible(False)
    for j, (ax, k) in enumerate(zip(grid.flat, measures)):
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
    for ax in grid[:, 0]:  # the method names at the start of every row
        ax.set_yticks(range(len(methods)), labels, fontsize=8)
    grid[0, 0].set_ylim(len(methods) - 0.5, -0.5)
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


def pooled_reliability(records: dict, bases: list[dict], reference: str, n_bins: int = 10) -> dict[str, dict]:
    """{panel name: reliability points} of exp(lpm) against correctness over every response of the final held-out
    evaluation of all of a method's seeds (and of all the base's draws, first), the reference next: a description of
    where each method's confidence lands, not a test (responses of one seed are not independent draws)."""
    from capo.evaluation.metrics import reliability_points

    groups = [(f"base ({len(bases)} draw{'s' * (len(bases) != 1)})", bases)] if bases else []
    for m in [reference] + sorted(set(records) - {reference}):
        if m in records:
            groups.append((f"{m} ({len(records[m])} seed{'s' * (len(records[m]) != 1)})", list(records[m].values())))
    out = {}
    for name, recs in groups:
        pairs = [(math.exp(lpm), ok) for r in recs for _, ok, lpm in r.get("responses") or [] if lpm is not None]
        if pairs:
            conf, ok = zip(*pairs)
            out[name] = {"reliability": reliability_points(list(conf), list(ok), n_bins)}
    return out


def plot_reliability(records: dict, bases: list[dict], reference: str, path: Path) -> bool:
    """OUT/reliability.png: :func:`pooled_reliability` as one panel per method; False (nothing drawn) when no
    record keeps its responses' log-probs."""
    from capo.evaluation.plots import plot_reliability_panels

    runs = pooled_reliability(records, bases, reference)
    if not runs:
        return False
    plot_reliability_panels(runs, path, title="confidence exp(lpm), every seed's responses")
    return True
