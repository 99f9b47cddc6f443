"""PNG plots (matplotlib, Agg backend) from the ``curves`` of metrics.json: one run, or several overlaid."""

from __future__ import annotations

import io
import os
from pathlib import Path

__all__ = ["plot_bands", "plot_hist", "plot_reliability", "plot_selective", "png_bytes"]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
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


def plot_lines(series: dict[str, tuple[list[float], list[float]]], path: Path | None, title: str, xlabel: str,
               ylabel: str) -> bytes:
    """Generic overlaid line plot (training curves in comparison reports)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, "-", lw=1.5, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if series:
        ax.legend(fontsize=8)
    return _save(png_bytes(fig), path)


def plot_bands(runs: dict[str, list[tuple[list[float], list[float]]]], path: Path | None, title: str, xlabel: str,
               ylabel: str, reference: float | None = None, reference_label: str = "base") -> bytes:
    """One line per name (the mean over its runs at each x every run has) with a band from the min to the max over
    the runs (seeds); ``reference`` draws a dashed horizontal line (e.g. the base model's value)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
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
