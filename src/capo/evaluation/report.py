"""Self-contained HTML reports: one eval run, or several eval/train runs side by side (``capo report``).

The page has no scripts and no external resources: plots are PNGs embedded as base64 data URIs, and every string
that comes from a run (model text, names, paths) is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from pathlib import Path

from capo.errors import DataError
from capo.evaluation import plots

__all__ = ["RunInfo", "load_run", "render_report", "write_report"]

# (key, label, format) of the headline table, in order
SUMMARY_KEYS = [
    ("n", "responses", "{:.0f}"),
    ("n_groups", "prompts", "{:.0f}"),
    ("accuracy", "accuracy (pooled)", "{:.4f}"),
    ("mean_at_k", "mean@k", "{:.4f}"),
    ("auc_mean", "AUC-mean (lpm)", "{:.4f}"),
    ("auc_mean_groups", "prompts in AUC-mean", "{:.0f}"),
    ("auroc", "AUROC pooled (lpm)", "{:.4f}"),
    ("ece", "ECE exp(lpm)", "{:.4f}"),
    ("brier", "Brier exp(lpm)", "{:.4f}"),
    ("aurc", "AURC (lpm)", "{:.4f}"),
    ("mean_confidence", "mean exp(lpm)", "{:.4f}"),
    ("verbal_ece", "ECE verbal", "{:.4f}"),
    ("verbal_brier", "Brier verbal", "{:.4f}"),
    ("verbal_auroc", "AUROC verbal", "{:.4f}"),
    ("verbal_auc_mean", "AUC-mean verbal", "{:.4f}"),
    ("verbal_missing", "verbal confidence missing", "{:.0f}"),
]
SCALING_KEYS = [
    ("majority_vote", "majority vote"),
    ("perplexity_consistency", "perplexity consistency"),
    ("max_confidence_lpm", "max confidence (lpm)"),
    ("confidence_weighted_vote", "confidence-weighted vote (verbal)"),
    ("max_confidence_verbal", "max confidence (verbal)"),
]
CI_KEYS = [
    ("auc_mean_ci_low", "AUC-mean 95% CI low"),
    ("auc_mean_ci_high", "AUC-mean 95% CI high"),
    ("accuracy_ci_low", "accuracy 95% CI low"),
    ("accuracy_ci_high", "accuracy 95% CI high"),
]
COUNT_KEYS = [
    ("verdict_correct", "correct"),
    ("verdict_incorrect", "incorrect"),
    ("verdict_unparsable", "unparsable"),
    ("verdict_timeout", "timeout"),
    ("empty_responses", "empty responses"),
    ("finish_length_frac", "hit max tokens (frac)"),
    ("mean_tokens", "mean tokens"),
]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots figure{margin:0}
.plots img{max-width:480px;border:1px solid #eee}
pre{white-space:pre-wrap;word-break:break-word;max-height:220px;overflow:auto;background:#fafafa;margin:0;
font-size:12px}
.muted{color:#777;font-size:12px}
"""


class RunInfo:
    """What a report shows about one run directory."""

    def __init__(self, name: str, path: Path, kind: str, metrics: dict, curves: dict, config: dict,
                 examples: list[dict], train_series: dict | None = None):
        self.name, self.path, self.kind = name, path, kind
        self.metrics, self.curves, self.config = metrics, curves, config
        self.examples, self.train_series = examples, train_series or {}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None


def load_run(run_dir: Path, name: str | None = None, n_examples: int = 0) -> RunInfo:
    """Read an eval run (``metrics.json``) or a training run (``metrics.jsonl``) directory."""
    run_dir = Path(run_dir)
    name = name or run_dir.name
    if not run_dir.is_dir():
        raise DataError(f"run directory {run_dir} does not exist")
    mj = run_dir / "metrics.json"
    if mj.exists():
        data = _read_json(mj)
        cfg = data.get("config", {})
        examples = []
        gen = run_dir / "generations.jsonl"
        if n_examples and gen.exists():
            with gen.open() as f:
                for line in f:
                    try:
                        examples.append(json.loads(line))
                    except json.JSONDecodeError:
                        break
                    if len(examples) >= n_examples:
                        break
        return RunInfo(name, run_dir, "eval", data.get("metrics", {}), data.get("curves", {}), cfg, examples)
    tj = run_dir / "metrics.jsonl"
    if tj.exists():
        rows = []
        for i, line in enumerate(tj.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line of a crashed run
        if not rows:
            raise DataError(f"{tj} has no rows")
        last = rows[-1]
        metrics = {k: v for k, v in last.items() if isinstance(v, (int, float))}
        series: dict[str, tuple[list, list]] = {}
        for key in sorted({k for r in rows for k in r if isinstance(r.get(k), (int, float)) and k != "step"}):
            pts = [(r["step"], r[key]) for r in rows if "step" in r and isinstance(r.get(key), (int, float))
                   and not (isinstance(r[key], float) and math.isnan(r[key]))]
            if len(pts) >= 2:
                series[key] = ([p[0] for p in pts], [p[1] for p in pts])
        return RunInfo(name, run_dir, "train", metrics, {}, {}, [], series)
    raise DataError(
        f"{run_dir} is not a complete run directory: it has neither metrics.json (a finished `capo eval`) nor "
        "metrics.jsonl (a `capo train` run)"
    )


def _fmt(v, fmt: str = "{:.4f}") -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "&ndash;"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return html.escape(str(v))


def _img(data: bytes, alt: str) -> str:
    b64 = base64.b64encode(data).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}"></figure>'


def _table(runs: list[RunInfo], keys, caption: str, with_fmt: bool = True) -> str:
    rows = []
    for item in keys:
        key, label = item[0], item[1]
        fmt = item[2] if with_fmt and len(item) > 2 else "{:.4f}"
        vals = [r.metrics.get(key) for r in runs]
        if all(v is None for v in vals):
            continue
        cells = "".join(f"<td>{_fmt(v, fmt)}</td>" for v in vals)
        rows.append(f'<tr><th class="l" title="{html.escape(key)}">{html.escape(label)}</th>{cells}</tr>')
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
    return (f'<table class="metrics" data-caption="{html.escape(caption)}"><thead><tr><th class="l">{html.escape(caption)}'
            f"</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _runs_table(runs: list[RunInfo]) -> str:
    """One row per run: name, kind, path and the main settings of its config."""
    parts = ["<table class='runs'><thead><tr><th class='l'>run</th><th class='l'>kind</th><th class='l'>path</th>"
             "<th class='l'>model</th><th class='l'>dataset</th><th>k</th><th>T</th></tr></thead><tbody>"]
    for r in runs:
        c = r.config
        parts.append(
            f"<tr><td class='l'>{html.escape(r.name)}</td><td class='l'>{r.kind}</td>"
            f"<td class='l'>{html.escape(str(r.path))}</td><td class='l'>{html.escape(str(c.get('model', '')))}</td>"
            f"<td class='l'>{html.escape(str(c.get('dataset', c.get('generations', ''))))}</td>"
            f"<td>{html.escape(str(c.get('k', '')))}</td><td>{html.escape(str(c.get('temperature', '')))}</td></tr>"
        )
    parts.append("</tbody></table>")
    return "".join(parts)


def _eval_tables(evals: list[RunInfo]) -> str:
    """Calibration, bootstrap intervals, test-time scaling and response counts of the eval runs."""
    ks = sorted({int(k.split("_")[-1]) for r in evals for k in r.metrics if k.startswith("pass_at_")})
    return "".join([
        "<h2>Calibration</h2>",
        _table(evals, SUMMARY_KEYS, "metric"),
        _table(evals, CI_KEYS, "bootstrap over prompts", with_fmt=False),
        "<h2>Test-time scaling</h2>",
        _table(evals, [(f"pass_at_{k}", f"pass@{k}") for k in ks] + SCALING_KEYS, "accuracy", with_fmt=False),
        "<h2>Responses</h2>",
        _table(evals, COUNT_KEYS, "count", with_fmt=False),
    ])


# (key, label, higher is better) of the confidence-estimator tables (capo.evaluation.estimators)
ESTIMATOR_COLUMNS = [("auroc", "AUROC", True), ("auc_mean", "AUC-mean", True), ("ece", "ECE", False),
                     ("brier", "Brier", False), ("prr", "PRR", True), ("filtered_vote", "filtered vote", True),
                     ("weighted_vote", "weighted vote", True)]


def _est_cell(e: dict | None, key: str, best: bool) -> str:
    v = None if e is None else e.get(key)
    ci = None if e is None else e.get(f"{key}_ci")
    txt = _fmt(v, "{:.3f}")
    if ci and all(isinstance(x, (int, float)) and math.isfinite(x) for x in ci):
        txt += f" <span class='muted'>[{ci[0]:.3f}, {ci[1]:.3f}]</span>"
    return f"<td>{'<b>' + txt + '</b>' if best else txt}</td>"


def _best(vals: list, higher: bool) -> float | None:
    ok = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    return (max(ok) if higher else min(ok)) if len(ok) > 1 else None


def _estimators_section(evals: list[RunInfo]) -> str:
    """Confidence estimators side by side: one table of every metric for a single run; for several runs one table
    per metric (estimators x runs). The best value of each column (one run) or row (several) is bold."""
    tabs = [r.curves.get("estimators") or {} for r in evals]
    names = list(dict.fromkeys(n for t in tabs for n in t))
    if not names:
        return ""
    parts = ["<h2>Confidence estimators</h2><p class='muted'>Which signal ranks right answers above wrong ones "
             "(definitions: docs/metrics.md, 'Confidence estimators'; intervals: bootstrap over prompts).</p>"]
    if len(evals) == 1:
        t = tabs[0]
        head = "".join(f"<th>{lab} {'&uarr;' if up else '&darr;'}</th>" for _, lab, up in ESTIMATOR_COLUMNS)
        best = {k: _best([t[n].get(k) for n in names], up) for k, _, up in ESTIMATOR_COLUMNS}
        body = [f"<tr><th class='l'>{html.escape(n)}</th>"
                + "".join(_est_cell(t[n], k, best[k] is not None and t[n].get(k) == best[k])
                          for k, _, _ in ESTIMATOR_COLUMNS) + "</tr>" for n in names]
        parts.append(f"<table class='metrics estimators'><thead><tr><th class='l'>estimator</th>{head}</tr></thead>"
                     f"<tbody>{''.join(body)}</tbody></table>")
        return "".join(parts)
    for key, lab, up in ESTIMATOR_COLUMNS:
        head = "".join(f"<th>{html.escape(r.name)}</th>" for r in evals)
        body = []
        for n in names:
            vals = [t.get(n, {}).get(key) for t in tabs]
            b = _best(vals, up)
            body.append(f"<tr><th class='l'>{html.escape(n)}</th>"
                        + "".join(_est_cell(t.get(n), key, b is not None and v == b) for t, v in zip(tabs, vals))
                        + "</tr>")
        parts.append(f"<table class='metrics estimators'><thead><tr><th class='l'>{lab} "
                     f"{'&uarr;' if up else '&darr;'}</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    return "".join(parts)


def _eval_plots(evals: list[RunInfo]) -> str:
    """Overlaid reliability / precision-coverage plots (lpm, and verbal when any run has it), one histogram per run."""
    parts = ["<h2>Plots</h2><div class='plots'>"]
    curves = {r.name: r.curves for r in evals}
    parts.append(_img(plots.plot_reliability(curves), "reliability diagram"))
    parts.append(_img(plots.plot_selective(curves), "precision-coverage curve"))
    if any("reliability_verbal" in c for c in curves.values()):
        parts.append(_img(plots.plot_reliability(curves, key="reliability_verbal",
                                                 title="Reliability diagram (verbal confidence)"),
                          "reliability diagram verbal"))
        parts.append(_img(plots.plot_selective(curves, key="selective_verbal",
                                               title="Precision-coverage (verbal confidence)"),
                          "precision-coverage curve verbal"))
    for r in evals:
        parts.append(_img(plots.plot_hist(r.curves, title=f"{r.name}: exp(lpm), correct vs incorrect"),
                          f"confidence histogram {r.name}"))
    parts.append("</div>")
    return "".join(parts)


def _train_section(trains: list[RunInfo]) -> str:
    """The last logged step's metrics of the training runs, and their main training curves."""
    parts = ["<h2>Training runs (last logged step)</h2>"]
    keys = sorted({k for r in trains for k in r.metrics if k.startswith(("eval/", "calib/", "train/"))})
    parts.append(_table(trains, [("step", "step", "{:.0f}")] + [(k, k) for k in keys], "metric", with_fmt=True))
    parts.append("<div class='plots'>")
    for key in [k for k in ("calib/auc_mean", "eval/accuracy", "train/accuracy", "train/reward") if
                any(k in r.train_series for r in trains)]:
        series = {r.name: r.train_series[key] for r in trains if key in r.train_series}
        parts.append(_img(plots.plot_lines(series, None, key, "step", key), f"training curve {key}"))
    parts.append("</div>")
    return "".join(parts)


def _example_row(e: dict) -> str:
    return (
        f"<tr><td class='l'><pre>{html.escape(str(e.get('prompt', ''))[:600])}</pre></td>"
        f"<td class='l'><pre>{html.escape(str(e.get('text', ''))[:2000])}</pre></td>"
        f"<td class='l'>{html.escape(str(e.get('answer'))[:200])}</td>"
        f"<td class='l'>{html.escape(str(e.get('gold'))[:200])}</td>"
        f"<td class='l'>{html.escape(str(e.get('verdict')))}</td>"
        f"<td>{_fmt(e.get('mean_logprob'))}</td></tr>"
    )


def _examples_section(ex_runs: list[RunInfo]) -> str:
    """One table of example responses per run."""
    parts = ["<h2>Example responses</h2>"]
    for r in ex_runs:
        parts.append(f"<h3>{html.escape(r.name)}</h3><table class='examples'><thead><tr><th class='l'>prompt</th>"
                     "<th class='l'>response</th><th class='l'>answer</th><th class='l'>gold</th>"
                     "<th class='l'>verdict</th><th>mean log-prob</th></tr></thead><tbody>")
        parts.extend(_example_row(e) for e in r.examples)
        parts.append("</tbody></table>")
    return "".join(parts)


def render_report(runs: list[RunInfo], title: str = "capo report") -> str:
    """The HTML page for one or more runs."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    parts.append(_runs_table(runs))
    evals = [r for r in runs if r.kind == "eval"]
    trains = [r for r in runs if r.kind == "train"]
    if evals:
        parts.append(_eval_tables(evals))
        parts.append(_estimators_section(evals))
        parts.append(_eval_plots(evals))
    if trains:
        parts.append(_train_section(trains))
    ex_runs = [r for r in evals if r.examples]
    if ex_runs:
        parts.append(_examples_section(ex_runs))
    parts.append("<p class='muted'>Metric definitions: docs/metrics.md (namespace eval/). Perplexity confidence is "
                 "exp(mean token log-prob); ranking metrics use the mean log-prob itself.</p></body></html>")
    return "".join(parts)


def write_report(runs: list[RunInfo], out: Path, title: str = "capo report") -> Path:
    """Render and write atomically (temp file + os.replace)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_report(runs, title), encoding="utf-8")
    os.replace(tmp, out)
    return out
