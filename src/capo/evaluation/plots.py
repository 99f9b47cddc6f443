"""PNG plots from the ``curves`` of metrics.json: one run, or several overlaid. Drawn on matplotlib ``Figure``
objects with their own Agg canvas: the process's matplotlib backend is never switched."""

from __future__ import annotations

import io
import os
from pathlib import Path

from capo.evaluation.stats import proportion_interval

__all__ = ["plot_acc_vs_auc", "plot_bands", "plot_hist", "plot_paired", "plot_reliability", "plot_reliability_panels",
           "plot_selective", "plot_training", "png_bytes"]


def _subplots(*args, layout: str | None = None, **kwargs):
    """A figure and its axes without pyplot: a ``matplotlib.figure.Figure`` with an Agg canvas of its own, so drawing
    never switches the process's matplotlib backend (a user's interactive session keeps its own) and needs no
    closing. Arguments as ``Figure.subplots``; ``figsize`` and ``layout`` go to the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", None), layout=layout)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(*args, **kwargs)


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _bar(v: float, lo: float, hi: float) -> list[list[float]]:
    """matplotlib's [[below], [above]] error-bar lengths for an interval (lo, hi) around v, never negative: a
    percentile bootstrap interval need not contain its point estimate, and the bar then stops at the point."""
    return [[max(v - lo, 0.0)], [max(hi - v, 0.0)]]


def _save(data: bytes, path: Path | None) -> bytes:
    if path is not None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return data


def plot_reliability(runs: dict[str, dict], path: Path | None = None, key: str = "reliability",
                     title: str = "Reliability diagram (perplexity confidence exp(lpm))") -> bytes:
    """Accuracy vs mean confidence per bin, one line per run (marker size ~ bin count); the diagonal is perfect."""
    fig, ax = _subplots(figsize=(5, 4.5))
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="perfect calibration")
    single = len(runs) == 1
    for name, curves in runs.items():
        rel = curves.get(key)
        if not rel:
            continue
        pts = [(c, a, n) for c, a, n in zip(rel["confidence"], rel["accuracy"], rel["count"]) if c is not None and n > 0]
        if not pts:
            continue
        xs, ys, ns = zip(*pts)
        tot = sum(ns)
        ax.plot(xs, ys, "-o", lw=1.5, label=name, markersize=3)
        ax.scatter(xs, ys, s=[20 + 300 * n / tot for n in ns], alpha=0.35)
        if single:
            edges = rel["bin_edges"]
            lefts = edges[:-1]
            widths = [max(b - a, 0.01) for a, b in zip(edges[:-1], edges[1:])]
            accs = [a if a is not None else 0 for a in rel["accuracy"]]
            ax.bar(lefts, accs, width=widths, align="edge", alpha=0.15, color="C0", edgecolor="C0")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return _save(png_bytes(fig), path)


def plot_selective(runs: dict[str, dict], path: Path | None = None, key: str = "selective",
                   title: str = "Precision-coverage (answer the most confident first)") -> bytes:
    """Precision (accuracy on answered) vs coverage, thresholding the confidence score; one line per run."""
    fig, ax = _subplots(figsize=(5, 4.5))
    for name, curves in runs.items():
        sel = curves.get(key)
        if not sel or not sel["x"]:
            continue
        ax.plot(sel["x"], sel["y"], "-", lw=1.5, label=name)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("coverage (fraction answered)")
    ax.set_ylabel("precision (accuracy on answered)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    return _save(png_bytes(fig), path)


def plot_hist(curves: dict, path: Path | None = None, title: str = "Confidence exp(lpm): correct vs incorrect") -> bytes:
    """Histograms of the perplexity confidence of correct and incorrect responses."""
    fig, ax = _subplots(figsize=(5, 3.5))
    h = curves.get("hist", {})
    bins = [i / 20 for i in range(21)]
    for label, color in (("correct", "C2"), ("incorrect", "C3")):
        vals = h.get(label, [])
        if vals:
            ax.hist(vals, bins=bins, alpha=0.55, color=color, label=f"{label} (n={len(vals)})")
    ax.set_xlim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("responses")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(png_bytes(fig), path)


def plot_acc_vs_auc(points: dict[str, dict], path: Path | None = None) -> bytes:
    """Accuracy (x) against AUC-mean (y), one point per model (mean over seeds) with its 95% interval bars, and
    each seed as a small point. ``points[name]``: acc, auc, acc_lo, acc_hi, auc_lo, auc_hi (None = no bar) and
    seeds [(acc, auc), ...]."""
    from matplotlib import colormaps

    many = len(points) > 10  # the default cycle has 10 colours: switch to 20 distinct ones and a larger figure
    fig, ax = _subplots(figsize=(7, 6) if many else (5, 4.5))
    for i, (name, p) in enumerate(points.items()):
        col = colormaps["tab20"](i % 20) if many else f"C{i}"
        xerr = _bar(p["acc"], p["acc_lo"], p["acc_hi"]) if p.get("acc_lo") is not None else None
        yerr = _bar(p["auc"], p["auc_lo"], p["auc_hi"]) if p.get("auc_lo") is not None else None
        ax.errorbar([p["acc"]], [p["auc"]], xerr=xerr, yerr=yerr, fmt="o", color=col, ms=8, capsize=3, label=name)
        if len(p.get("seeds", [])) > 1:
            xs, ys = zip(*p["seeds"])
            ax.scatter(xs, ys, s=12, color=col, alpha=0.5)
        ax.annotate(name, (p["acc"], p["auc"]), textcoords="offset points", xytext=(6, 6), fontsize=8, color=col)
    ax.axhline(0.5, ls=":", color="grey", lw=1)
    ax.set_xlabel("accuracy (higher is better)")
    ax.set_ylabel("AUC-mean, lpm (higher is better)")
    ax.set_title("Accuracy vs calibration (95% bootstrap intervals; small dots: seeds)", fontsize=9)
    if points:
        ax.legend(fontsize=8, loc="best")
    return _save(png_bytes(fig), path)


FOREST_FONT_PT = 13  # tick labels and panel titles of the forest plot; the report shows it at full width (>= table text)
FOREST_COLS = 4  # panels per row: a row of 4 stays legible at the report's width


def plot_paired(panels: dict[str, dict[str, tuple[float, float, float]]], reference: str,
                path: Path | None = None, interval: str = "95% bootstrap interval over prompts") -> bytes:
    """Forest plot of paired differences against ``reference``: one panel per measure (``panels[label][model]`` =
    (difference, low, high) of model minus reference, a 95% interval), one row per model, at most
    :data:`FOREST_COLS` panels per row; filled red where the interval excludes 0. The label says which direction is
    better; ``interval`` names what the intervals resample."""
    models = list(dict.fromkeys(m for rows in panels.values() for m in rows))
    cols = min(FOREST_COLS, max(1, len(panels)))
    nrows = -(-len(panels) // cols)
    fig, axes = _subplots(nrows, cols, figsize=(3.1 * cols + 1.6, nrows * (0.34 * len(models) + 1.1) + 0.5),
                             sharey=True, squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (label, rows) in zip(axes.flat, panels.items()):
        for y, m in enumerate(models):
            if m not in rows:
                continue
            v, lo, hi = rows[m]
            ok = lo == lo and hi == hi  # no NaN
            excl = ok and (lo > 0 or hi < 0)
            ax.errorbar([v], [y], xerr=_bar(v, lo, hi) if ok else None, fmt="o", color="C3" if excl else "C0",
                        mfc=None if excl else "white", capsize=3, ms=6)
        ax.axvline(0.0, color="grey", lw=1, ls=":")
        ax.set_title(label, fontsize=FOREST_FONT_PT)
        ax.tick_params(labelsize=FOREST_FONT_PT)
    for r in range(nrows):
        axes[r][0].set_yticks(range(len(models)), models, fontsize=FOREST_FONT_PT)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"Paired differences vs {reference} ({interval}; filled red: excludes 0)",
                 fontsize=FOREST_FONT_PT + 1)
    return _save(png_bytes(fig), path)


def plot_reliability_panels(runs: dict[str, dict], path: Path | None = None, key: str = "reliability",
                            title: str = "confidence exp(lpm)") -> bytes:
    """One reliability panel per run: accuracy per confidence bin (each bar spans its bin; the bin of confidences
    exactly 1, [1, 1], a thin bar at 1) with a Wilson 95% interval and the bin's response count printed above; the
    diagonal is perfect calibration."""
    names = [n for n, c in runs.items() if c.get(key)]
    cols = min(4, max(1, len(names)))
    rows = max(1, -(-len(names) // cols))
    fig, axes = _subplots(rows, cols, figsize=(3.2 * cols, 3.1 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for i, (ax, name) in enumerate(zip(axes.flat, names)):
        rel = runs[name][key]
        edges = rel["bin_edges"]
        ax.plot([0, 1], [0, 1], "--", color="grey", lw=1)
        for lo_e, hi_e, conf, acc, n in zip(edges[:-1], edges[1:], rel["confidence"], rel["accuracy"], rel["count"]):
            if not n or acc is None:
                continue
            lo, hi = proportion_interval(acc * n, n)
            ax.bar((lo_e + hi_e) / 2, acc, width=max(hi_e - lo_e, 0.02) * 0.9, color=f"C{i}", alpha=0.55)
            ax.errorbar([(lo_e + hi_e) / 2], [acc], yerr=_bar(acc, lo, hi), color="k", lw=0.8, capsize=2)
            ax.text((lo_e + hi_e) / 2, min(hi + 0.02, 0.97), str(n), ha="center", fontsize=6)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(title, fontsize=8)
        ax.set_ylabel("accuracy", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("Reliability: accuracy per bin, Wilson 95% interval, responses per bin", fontsize=9)
    fig.tight_layout()
    return _save(png_bytes(fig), path)


def _smooth(ys: list[float], window: int) -> list[float]:
    """Trailing moving average over up to ``window`` points."""
    out, acc = [], []
    for y in ys:
        acc.append(y)
        acc = acc[-window:]
        out.append(sum(acc) / len(acc))
    return out


def plot_training(series: dict[str, list[tuple[list, list]]], key: str, path: Path | None = None) -> bytes:
    """Training curve of ``key``, one colour per model: each seed's raw values faint, the mean over seeds smoothed
    (trailing moving average over ~10% of the steps) as a line, and a band from the lowest to the highest seed
    (smoothed) where there are several seeds. Steps are integers. Held-out eval keys (few points) are drawn as
    markers joined by lines, unsmoothed."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = _subplots(figsize=(5, 3.5))
    sparse = all(len(xs) <= 6 for runs in series.values() for xs, _ in runs)
    for i, (name, runs) in enumerate(series.items()):
        col = f"C{i}"
        steps = sorted(set.intersection(*[set(xs) for xs, _ in runs]))
        by_seed = [dict(zip(xs, ys)) for xs, ys in runs]
        mean = [sum(s[x] for s in by_seed) / len(by_seed) for x in steps]
        if sparse:
            ax.plot(steps, mean, "-o", color=col, lw=1.5, ms=4, label=name)
            continue
        w = max(1, len(steps) // 10)
        for xs, ys in runs:
            ax.plot(xs, ys, "-", color=col, lw=0.7, alpha=0.25)
        ax.plot(steps, _smooth(mean, w), "-", color=col, lw=2, label=f"{name} ({len(runs)} seed{'s' * (len(runs) > 1)})")
        if len(runs) > 1:
            lo = _smooth([min(s[x] for s in by_seed) for x in steps], w)
            hi = _smooth([max(s[x] for s in by_seed) for x in steps], w)
            ax.fill_between(steps, lo, hi, color=col, alpha=0.15, lw=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(f"{key}" + ("" if sparse else " (line: smoothed mean over seeds; faint: raw)"), fontsize=9)
    if series:
        ax.legend(fontsize=7)
    return _save(png_bytes(fig), path)


def plot_bands(runs: dict[str, list[tuple[list[float], list[float]]]], path: Path | None, title: str, xlabel: str,
               ylabel: str, reference: float | None = None, reference_label: str = "base") -> bytes:
    """One line per name (the mean over its runs at each x every run has) with a band from the min to the max over
    the runs (seeds); ``reference`` draws a dashed horizontal line (e.g. the base model's value)."""
    fig, ax = _subplots(figsize=(5, 3.5))
    for k, (name, curves) in enumerate(runs.items()):
        common = sorted(set.intersection(*(set(xs) for xs, _ in curves))) if curves else []
        if not common:
            continue
        at = [dict(zip(xs, ys)) for xs, ys in curves]
        vals = [[c[x] for c in at] for x in common]
        ax.plot(common, [sum(v) / len(v) for v in vals], "-o", lw=1.5, markersize=3, color=f"C{k}",
                label=f"{name} (n={len(curves)})")
        if len(curves) > 1:
            ax.fill_between(common, [min(v) for v in vals], [max(v) for v in vals], color=f"C{k}", alpha=0.2)
    if reference is not None:
        ax.axhline(reference, ls="--", color="grey", lw=1, label=reference_label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(png_bytes(fig), path)
