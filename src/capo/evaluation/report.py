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
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from capo.errors import DataError
from capo.evaluation import compare, plots
from capo.evaluation.lengths import CAPO_SCORE_FORMS, length_reading
from capo.rundir import read_jsonl_rows, yaml_loads
from capo.tasks import stochastic as stochastic_task

__all__ = ["RunInfo", "draw_safely", "load_run", "render_report", "write_report"]

# (key, label, format) of the headline table, in order
SUMMARY_KEYS = [
    ("n", "responses", "{:.0f}"),
    ("n_groups", "prompts", "{:.0f}"),
    ("accuracy", "accuracy (pooled)", "{:.3f}"),
    ("mean_at_k", "mean@k", "{:.3f}"),
    ("auc_mean", "AUC-mean (lpm)", "{:.3f}"),
    ("auc_mean_groups", "prompts in AUC-mean", "{:.0f}"),
    ("auroc", "AUROC pooled (lpm)", "{:.3f}"),
    ("ece", "ECE exp(lpm)", "{:.3f}"),
    ("brier", "Brier exp(lpm)", "{:.3f}"),
    ("aurc", "AURC (lpm)", "{:.3f}"),
    ("mean_confidence", "mean exp(lpm)", "{:.3f}"),
    ("verbal_ece", "ECE verbal", "{:.3f}"),
    ("verbal_brier", "Brier verbal", "{:.3f}"),
    ("verbal_auroc", "AUROC verbal", "{:.3f}"),
    ("verbal_auc_mean", "AUC-mean verbal", "{:.3f}"),
    ("verbal_missing", "verbal confidence missing", "{:.0f}"),
    *((key, label, "{:.3f}") for key, label, _ in stochastic_task.MEASURES),  # the stochastic task's own measures
]
SCALING_KEYS = [
    ("majority_vote", "majority vote"),
    ("perplexity_consistency", "perplexity consistency"),
    ("max_confidence_lpm", "max confidence (lpm)"),
    ("confidence_weighted_vote", "confidence-weighted vote (verbal)"),
    ("max_confidence_verbal", "max confidence (verbal)"),
]
COUNT_KEYS = [
    ("verdict_correct", "correct", "{:.0f}"),
    ("verdict_incorrect", "incorrect", "{:.0f}"),
    ("verdict_unparsable", "unparsable", "{:.0f}"),
    ("verdict_timeout", "timeout", "{:.0f}"),
    ("empty_responses", "empty responses", "{:.0f}"),
    ("finish_length_frac", "hit max tokens (fraction)", "{:.3f}"),
    ("mean_tokens", "mean tokens", "{:.1f}"),
]
# +1: higher is better, -1: lower is better (the arrow in each row label; the best value per row is marked)
BETTER = {"accuracy": 1, "mean_at_k": 1, "auc_mean": 1, "auroc": 1, "ece": -1, "brier": -1, "aurc": -1,
          "verbal_ece": -1, "verbal_brier": -1, "verbal_auroc": 1, "verbal_auc_mean": 1,
          **{key: better for key, _, better in stochastic_task.MEASURES},
          **{k: 1 for k, _ in SCALING_KEYS}}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots figure{margin:0}
.plots img{max-width:520px;border:1px solid #eee}.plots.wide img{max-width:1100px}
figure.full{width:100%}figure.full img{width:100%;max-width:1100px}
pre{white-space:pre-wrap;word-break:break-word;max-height:220px;overflow:auto;background:#fafafa;margin:0;
font-size:12px}
.muted{color:#777;font-size:12px}
.headline{font-size:15px;line-height:1.5;background:#f5f8ff;border-left:4px solid #3b6fd8;padding:10px 14px;margin:12px 0}
td.best{font-weight:bold;background:#eef7ee}.ci{color:#666;font-size:11px}td.sig{font-weight:bold}
.few{color:#a60;font-size:11px}
"""


@dataclass
class RunInfo:
    """What a report shows about one run directory (``kind``: "eval" or "train")."""

    name: str
    path: Path
    kind: str
    metrics: dict
    curves: dict
    config: dict
    examples: list[dict]
    train_series: dict = field(default_factory=dict)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None


def _method_seed(train_dir: Path) -> str | None:
    """``ALGO-seedN`` from a training run's config.yaml (algo.name, run.seed); None when there is none to read."""
    import yaml

    try:
        cfg = yaml_loads((train_dir / "config.yaml").read_text())
        return f"{cfg['algo']['name']}-seed{int(cfg['run']['seed'])}"
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def run_label(run_dir: Path) -> str:
    """A run's name in a report, from its config: a training run's method and seed (``grpo-seed0 (training)``), an
    eval run's those of the training run whose checkpoint it evaluated (``grpo-seed0``, as `capo demo` names them,
    so that seeds group into one model); the folder name when the config names no method (e.g. a base model)."""
    run_dir = Path(run_dir)
    if (run_dir / "config.yaml").is_file():
        label = _method_seed(run_dir)
        return f"{label} (training)" if label else run_dir.name
    model = None
    for f in (run_dir / "config.json", run_dir / "metrics.json"):
        try:
            data = json.loads(f.read_text())
            model = data.get("model") or (data.get("config") or {}).get("model")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        if model:
            break
    ckpt = Path(str(model)) if model else None
    label = _method_seed(ckpt.parent.parent) if ckpt is not None and ckpt.parent.name == "checkpoints" else None
    return label or run_dir.name or str(run_dir)


def load_run(run_dir: Path, name: str | None = None, n_examples: int = 0) -> RunInfo:
    """Read an eval run (``metrics.json``) or a training run (``metrics.jsonl``) directory."""
    run_dir = Path(run_dir)
    name = name or run_dir.name
    if not run_dir.is_dir():
        raise DataError(f"run directory {run_dir} " + ("is a file: give the run's folder (the one holding "
                                                       "metrics.json or metrics.jsonl)" if run_dir.is_file()
                                                       else "does not exist"))
    mj = run_dir / "metrics.json"
    if mj.exists():
        data = _read_json(mj)
        if not (isinstance(data, dict) and all(isinstance(data.get(k, {}), dict) for k in ("config", "metrics",
                                                                                           "curves"))):
            raise DataError(f"{mj}: not a capo eval result (a JSON object whose config, metrics and curves are "
                            "objects)")
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
        rows = read_jsonl_rows(tj)  # up to a torn last line of a crashed run
        if not rows:
            raise DataError(f"{tj} has no rows")
        bad = next((i for i, r in enumerate(rows, 1) if not isinstance(r, dict)), None)
        if bad is not None:
            raise DataError(f"{tj} line {bad}: not a metrics row (a JSON object)")
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


def _fmt(v, fmt: str = "{:.3f}") -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "&ndash;"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return html.escape(str(v))


def _img(data: bytes, alt: str, full: bool = False) -> str:
    """An embedded PNG; ``full``: drawn at the page's full width (the forest plot)."""
    b64 = base64.b64encode(data).decode("ascii")
    cls = " class='full'" if full else ""
    return f'<figure{cls}><img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}"></figure>'


def _few(metrics: dict, key: str) -> int | None:
    """The prompts a value drew on when they are too few to name it best (compare.MIN_PROMPTS), else None."""
    n = compare.prompts_behind(metrics, key)
    return n if compare.too_few(n) else None


def _few_note(n: int | None) -> str:
    return "" if n is None else (f" <span class='few' title='fewer than {compare.MIN_PROMPTS} prompts: never shaded "
                                 f"best'>(from {n} prompt{'s' if n != 1 else ''}: too few to compare)</span>")


def _cell(r: RunInfo, key: str, fmt: str, best: bool, few: int | None = None) -> str:
    """One value, with its 95% bootstrap interval in the same cell when the run has one, and a note when it drew on
    too few prompts (``few``) to be compared."""
    v = r.metrics.get(key)
    lo, hi = r.metrics.get(f"{key}_ci_low"), r.metrics.get(f"{key}_ci_high")
    ci = f" <span class='ci'>[{_fmt(lo, fmt)}, {_fmt(hi, fmt)}]</span>" if lo is not None and hi is not None else ""
    cls = ' class="best"' if best else ""
    return f"<td{cls}>{_fmt(v, fmt)}{ci}{_few_note(few)}</td>"


def _best_index(vals: list, sign: int | None) -> int | None:
    """Index of the best finite value of a row (None: no direction, fewer than 2 values, or a tie)."""
    ok = [(v, i) for i, v in enumerate(vals) if isinstance(v, (int, float)) and math.isfinite(v)]
    if sign is None or len(ok) < 2:
        return None
    ok.sort(key=lambda t: -sign * t[0])
    return None if ok[0][0] == ok[1][0] else ok[0][1]


def _table(runs: list[RunInfo], keys, caption: str) -> str:
    """Rows = metrics (readable name, raw key on hover, arrow = better direction), columns = runs; the best value
    per row is marked."""
    rows = []
    for item in keys:
        key, label = item[0], item[1]
        fmt = item[2] if len(item) > 2 else "{:.3f}"
        vals = [r.metrics.get(key) for r in runs]
        if all(v is None for v in vals):
            continue
        sign = BETTER.get(key)
        few = [None if sign is None else _few(r.metrics, key) for r in runs]  # a count has no direction
        best = _best_index([None if f is not None else v for v, f in zip(vals, few)], sign)
        arrow = {1: " &uarr;", -1: " &darr;"}.get(sign, "")
        cells = "".join(_cell(r, key, fmt, i == best, few[i]) for i, r in enumerate(runs))
        rows.append(f'<tr><th class="l" title="{html.escape(key)}">{html.escape(label)}{arrow}</th>{cells}</tr>')
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


def _eval_tables(evals: list[RunInfo], cmp) -> str:
    """Calibration (values with intervals), paired differences, test-time scaling and response counts."""
    ks = sorted({int(k.split("_")[-1]) for r in evals for k in r.metrics if k.startswith("pass_at_")})
    return "".join([
        "<h2>Calibration and accuracy</h2><p class='muted'>&uarr; higher is better, &darr; lower is better; the best "
        "value per row is shaded; [..] 95% bootstrap interval over prompts. Hover a name for its metrics key.</p>",
        _table(evals, SUMMARY_KEYS, "metric"),
        _paired_table(cmp),
        "<h2>Test-time scaling</h2>",
        _table(evals, [(f"pass_at_{k}", f"pass@{k}") for k in ks] + SCALING_KEYS, "accuracy"),
        "<h2>Responses</h2>",
        _table(evals, COUNT_KEYS, "count"),
    ])


# (key, label, higher is better) of the confidence-estimator tables (capo.evaluation.estimators)
ESTIMATOR_COLUMNS = [("auroc", "AUROC", True), ("auc_mean", "AUC-mean", True), ("ece", "ECE", False),
                     ("brier", "Brier", False), ("prr", "PRR", True), ("filtered_vote", "filtered vote", True),
                     ("weighted_vote", "weighted vote", True)]


def _est_cell(e: dict | None, key: str, best: bool, few: int | None = None) -> str:
    v = None if e is None else e.get(key)
    ci = None if e is None else e.get(f"{key}_ci")
    txt = _fmt(v, "{:.3f}")
    if ci and all(isinstance(x, (int, float)) and math.isfinite(x) for x in ci):
        txt += f" <span class='muted'>[{ci[0]:.3f}, {ci[1]:.3f}]</span>"
    return f"<td>{'<b>' + txt + '</b>' if best else txt}{_few_note(few)}</td>"


def _est_few(r: RunInfo, e: dict | None, key: str) -> int | None:
    """:func:`_few` of one estimator's entry (its AUC-mean counts its own mixed prompts; the rest, the run's)."""
    return None if e is None else _few({"n_groups": r.metrics.get("n_groups"), **e}, key)


def _best(vals: list, higher: bool, few: list | None = None) -> float | None:
    """The best finite value of ``vals``, leaving out those drawn from too few prompts (``few``: not None)."""
    ok = [v for i, v in enumerate(vals) if isinstance(v, (int, float)) and math.isfinite(v)
          and (few is None or few[i] is None)]
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
    for r in evals:  # e.g. a vLLM run: no per-token entropy recorded, so no neg_entropy / self_certainty
        gone = r.curves.get("estimators_unavailable") or {}
        if gone:
            parts.append(f"<p class='muted unavailable'>Not available for {html.escape(r.name)}: " + "; ".join(
                f"{html.escape(n)} ({html.escape(why)})" for n, why in gone.items()) + ".</p>")
    if len(evals) == 1:
        t, r = tabs[0], evals[0]
        head = "".join(f"<th>{lab} {'&uarr;' if up else '&darr;'}</th>" for _, lab, up in ESTIMATOR_COLUMNS)
        few = {k: [_est_few(r, t[n], k) for n in names] for k, _, _ in ESTIMATOR_COLUMNS}
        best = {k: _best([t[n].get(k) for n in names], up, few[k]) for k, _, up in ESTIMATOR_COLUMNS}
        body = [f"<tr><th class='l'>{html.escape(n)}</th>"
                + "".join(_est_cell(t[n], k, best[k] is not None and few[k][i] is None and t[n].get(k) == best[k],
                                    few[k][i]) for k, _, _ in ESTIMATOR_COLUMNS) + "</tr>" for i, n in enumerate(names)]
        parts.append(f"<table class='metrics estimators'><thead><tr><th class='l'>estimator</th>{head}</tr></thead>"
                     f"<tbody>{''.join(body)}</tbody></table>")
        return "".join(parts)
    for key, lab, up in ESTIMATOR_COLUMNS:
        head = "".join(f"<th>{html.escape(r.name)}</th>" for r in evals)
        body = []
        for n in names:
            vals = [t.get(n, {}).get(key) for t in tabs]
            few = [_est_few(r, t.get(n), key) for r, t in zip(evals, tabs)]
            b = _best(vals, up, few)
            body.append(f"<tr><th class='l'>{html.escape(n)}</th>"
                        + "".join(_est_cell(t.get(n), key, b is not None and f is None and v == b, f)
                                  for t, v, f in zip(tabs, vals, few)) + "</tr>")
        parts.append(f"<table class='metrics estimators'><thead><tr><th class='l'>{lab} "
                     f"{'&uarr;' if up else '&darr;'}</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    return "".join(parts)


# (key, label, format) of the lengths table; per form of CAPO's score (capo.evaluation.lengths) two more columns
LENGTH_COLUMNS = [("questions", "questions", "{:d}"), ("mean_tokens", "tokens", "{:.1f}"),
                  ("len_sd_within", "length sd within a question", "{:.2f}"),
                  ("len_varies", "questions whose lengths vary", "{:.0%}"),
                  ("sum_len_corr", "corr(sum log-prob, length)", "{:+.2f}")]


def _lengths_section(evals: list[RunInfo]) -> str:
    """Response lengths within a question and what CAPO's two scores make of them (one row per run), with each
    run's reading: the check of which case of CAPO's fixed point the task is in."""
    checks = [(r, r.curves.get("lengths") or {}) for r in evals]
    checks = [(r, c) for r, c in checks if c]
    if not checks:
        return ""
    forms = [f for f in CAPO_SCORE_FORMS if f in checks[0][1]]
    head = "".join(f"<th>{lab}</th>" for _, lab, _ in LENGTH_COLUMNS) + "".join(
        f"<th>{f}: saturated pairs</th><th>{f}: length push</th>" for f in forms)
    body = "".join(
        f"<tr><th class='l'>{html.escape(r.name)}</th>" + "".join(f"<td>{_fmt(c.get(k), fmt)}</td>"
                                                                for k, _, fmt in LENGTH_COLUMNS)
        + "".join(f"<td>{_fmt(c[f].get('saturated'), '{:.0%}')}</td><td>{_fmt(c[f].get('length_push'), '{:+.2f}')}</td>"
                  for f in forms) + "</tr>" for r, c in checks)
    readings = "".join(f"<p class='lengths-reading'>{html.escape(r.name) + ': ' if len(checks) > 1 else ''}"
                       f"{html.escape(length_reading(c))}</p>" for r, c in checks)
    return ("<h2>Response lengths and CAPO's score</h2><p class='muted'>Which case of CAPO's fixed point the task is "
            "in (docs/papers.md, &lsquo;CAPO's fixed point on a stochastic outcome, in general&rsquo;; definitions: "
            "docs/metrics.md, &lsquo;Response lengths and CAPO's score&rsquo;); best read on the model a run starts "
            f"from.</p>{readings}<table class='metrics lengths'><thead><tr><th class='l'>run</th>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _paired_table(cmp) -> str:
    """Each model minus the reference model, paired over the same prompts: value [95% interval]; bold where the
    interval excludes 0."""
    others = [m for m in cmp.models if m.name != cmp.reference]
    if not others or not cmp.draws:
        return ""
    head = "".join(f"<th>{html.escape(m.name)} &minus; {html.escape(cmp.reference)}</th>" for m in others)
    rows = []
    for key, label, sign in compare.MEASURES:
        if all(cmp.diff(m.name, cmp.reference, key) is None for m in others):
            continue
        cells = []
        for m in others:
            d = cmp.diff(m.name, cmp.reference, key)
            if d is None:
                cells.append("<td>&ndash;</td>")
                continue
            n = cmp.prompts_between(m.name, cmp.reference, key)
            if compare.too_few(n):
                cells.append(f"<td>{d[0]:+.3f}{_few_note(n)}</td>")
                continue
            sig = not math.isnan(d[1]) and (d[1] > 0 or d[2] < 0)
            cls = ' class="sig"' if sig else ""
            s = cmp.seed_diff(m.name, cmp.reference, key)
            seeds = ("" if s is None else f"<br><span class='ci'>seeds [{s['low']:+.3f}, {s['high']:+.3f}] "
                     f"n={s['n']}</span>")
            cells.append(f"<td{cls}>{d[0]:+.3f} <span class='ci'>prompts [{d[1]:+.3f}, "
                         f"{d[2]:+.3f}]</span>{seeds}</td>")
        arrow = " &uarr;" if sign > 0 else " &darr;"
        rows.append(f'<tr><th class="l" title="{key}">{html.escape(label)}{arrow}</th>{"".join(cells)}</tr>')
    return (f"<h2>Paired differences against {html.escape(cmp.reference)}</h2><p class='muted'>prompts: 95% "
            f"bootstrap interval, the same {cmp.prompts} prompts resampled for both models ({cmp.n_boot} draws, mean "
            "over seeds; bold: it excludes 0) -- it says nothing about retraining with another seed. seeds (where a "
            "model has 2 or more training seeds): 95% t-interval over the per-seed differences on the same prompts, "
            "the training seed as the unit (n seeds) -- the interval to compare methods by.</p><table class='metrics paired'><thead><tr><th class='l'>difference</th>"
            f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


PAIRED_PLOT = (("accuracy", "accuracy (+ better)"), ("auc_mean", "AUC-mean (+ better)"),
               ("ece", "ECE exp(lpm) (- better)"), ("verbal_ece", "verbal ECE (- better)"),
               ("aurc", "AURC (- better)"), ("majority_vote", "majority vote (+ better)"))


def paired_panels(cmp) -> dict:
    """{panel label: {model: (difference, low, high)}} against the reference, for :func:`plots.plot_paired`, without
    the comparisons drawn from too few prompts (compare.too_few); empty when fewer than two models are compared
    against it (the paired table says it then)."""
    others = [m.name for m in cmp.models if m.name != cmp.reference]
    if len(others) < 2 or not cmp.draws:
        return {}
    out = {}
    for key, label in PAIRED_PLOT:
        rows = {m: d for m in others if (d := cmp.diff(m, cmp.reference, key)) is not None
                and not compare.too_few(cmp.prompts_between(m, cmp.reference, key))}  # as the paired table says
        if rows:
            out[label] = rows
    return out


def _acc_auc_points(cmp) -> dict:
    pts = {}
    accs, aucs = cmp.values("accuracy"), cmp.values("auc_mean")  # over the prompts the draws resample
    for m in cmp.models:
        acc, auc = accs.get(m.name), aucs.get(m.name)
        if acc is None or auc is None:
            continue
        p = {"acc": acc, "auc": auc,
             "seeds": list(zip(cmp.run_values(m.name, "accuracy"), cmp.run_values(m.name, "auc_mean")))}
        dr = cmp.draws.get(m.name)
        if dr is not None:
            for key, short in (("accuracy", "acc"), ("auc_mean", "auc")):
                x = dr[key][~dr[key].isnan()]
                if x.numel() >= 10:
                    p[f"{short}_lo"], p[f"{short}_hi"] = (float(v) for v in x.quantile(torch.tensor([0.025, 0.975],
                                                                                                  dtype=x.dtype)))
        pts[m.name] = p
    return pts



# (metrics.json key, column header) of the methods table: test-time scaling at k = the eval's samples per prompt
METHODS_TABLE = (("accuracy", "accuracy"), ("auc_mean", "AUC-mean"), ("auroc", "pooled AUROC"), ("ece", "ECE"),
                 ("brier", "Brier"), ("verbal_ece", "verbal ECE"), ("verbal_brier", "verbal Brier"), ("aurc", "AURC"),
                 ("majority_vote", "maj. vote"), ("perplexity_consistency", "ppl. consistency"),
                 ("max_confidence_lpm", "max-lpm pick"), ("confidence_weighted_vote", "verbal-weighted vote"),
                 ("pass_at_8", "pass@8"))


def _mean_sd(xs: list) -> str:
    xs = [x for x in xs if isinstance(x, (int, float)) and x == x]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.3f}" + (f" ({statistics.stdev(xs):.3f})" if len(xs) > 1 else "")


def markdown_tables(cmp) -> str:
    """A comparison as Markdown: every :data:`METHODS_TABLE` measure's mean (sd over seeds) per model; each model
    minus the reference with its 95% paired bootstrap interval over prompts (bold: the interval excludes 0); the
    generated conclusion (:func:`compare.headline`)."""
    own = " (each run's metrics.json, over its own prompts: they differ)" if cmp.points else ""
    lines = [f"{len(cmp.models)} models, {cmp.prompts} shared held-out prompts; mean (sd over seeds){own}", "",
             "| model | seeds | " + " | ".join(h for _, h in METHODS_TABLE) + " |",
             "|---|---|" + "---|" * len(METHODS_TABLE)]
    for m in cmp.models:
        runs = "" if compare.training_seeds(m) == len(m.runs) else f" ({len(m.runs)} runs)"  # checkpoints of one
        lines.append(f"| {m.name} | {compare.training_seeds(m)}{runs} | "
                     + " | ".join(_mean_sd([r.metrics.get(k) for r in m.runs]) for k, _ in METHODS_TABLE) + " |")
    lines += ["", f"Paired difference vs {cmp.reference} (model - {cmp.reference}; 95% bootstrap interval over the "
              f"{cmp.prompts} prompts, {cmp.n_boot} draws, mean over seeds; **bold**: the interval excludes 0)", "",
              "| model | " + " | ".join(lbl for _, lbl, _ in compare.MEASURES) + " |",
              "|---|" + "---|" * len(compare.MEASURES)]
    for name in [m.name for m in cmp.models if m.name != cmp.reference]:
        cells = []
        for key, _, _ in compare.MEASURES:
            d = cmp.diff(name, cmp.reference, key)
            n = cmp.prompts_between(name, cmp.reference, key)
            if d is None:
                cells.append("-")
            elif compare.too_few(n):  # no reading names a winner there (docs/metrics.md): never bold
                cells.append(f"{d[0]:+.3f} (from {n} prompts: too few to compare)")
            else:
                text = f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
                cells.append(f"**{text}**" if d[1] > 0 or d[2] < 0 else text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", compare.headline(cmp)[0]]) + "\n"


def write_comparison_files(cmp, folder: Path, prefix: str) -> list[Path]:
    """Write a comparison's data, then its figures, into ``folder``: ``PREFIX-summary.json`` (model -> measure ->
    one value per seed run, :data:`METHODS_TABLE`'s measures, and ``seeds``: each run's training seed, in the same
    order, so ``capo sweep report --compare-summary`` pairs runs by seed, not by position),
    ``PREFIX-acc_vs_auc.png`` and ``PREFIX-paired_vs_REFERENCE.png`` (the report's two comparison figures; the
    second only when two or more models are compared against the reference, as in the report itself)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = folder / f"{prefix}-summary.json"
    summary.write_text(json.dumps({m.name: {"seeds": [compare.seed_of(r.name) for r in m.runs],
                                            **{k: [r.metrics.get(k) for r in m.runs] for k, _ in METHODS_TABLE}}
                                   for m in cmp.models}, indent=1))
    figures = [folder / f"{prefix}-acc_vs_auc.png"]
    plots.plot_acc_vs_auc(_acc_auc_points(cmp), figures[0])
    if panels := paired_panels(cmp):  # none with one model against the reference: the paired table says it
        figures.append(folder / f"{prefix}-paired_vs_{cmp.reference}.png")
        plots.plot_paired(panels, cmp.reference, figures[1])
    return [summary, *figures]

def _eval_plots(evals: list[RunInfo], cmp) -> str:
    """The three figures a comparison is read from: accuracy vs AUC-mean per model, precision-coverage of every
    model on one plot, reliability panels with counts and intervals (verbal too when present)."""
    curves = {r.name: r.curves for r in evals}
    parts = ["<h2>Figures</h2><div class='plots'>",
             _img(plots.plot_acc_vs_auc(_acc_auc_points(cmp)), "accuracy vs AUC-mean"),
             _img(plots.plot_selective(curves), "precision-coverage curve")]
    if any("selective_verbal" in c for c in curves.values()):
        parts.append(_img(plots.plot_selective(curves, key="selective_verbal",
                                               title="Precision-coverage (verbal confidence)"),
                          "precision-coverage curve verbal"))
    parts.append("</div><div class='plots wide'>")
    forest = paired_panels(cmp)
    if forest:  # full width: its text must read at least as large as the tables'
        parts.append(_img(plots.plot_paired(forest, cmp.reference), "paired differences", full=True))
    parts.append(_img(plots.plot_reliability_panels(curves), "reliability diagrams"))
    if any("reliability_verbal" in c for c in curves.values()):
        parts.append(_img(plots.plot_reliability_panels(curves, key="reliability_verbal", title="verbal confidence"),
                          "reliability diagrams verbal"))
    if any("reliability_stated" in c for c in curves.values()):
        parts.append(_img(plots.plot_reliability_panels(curves, key="reliability_stated",
                                                        title="per-question mean stated probability"),
                          "reliability diagrams stated probability"))
    if any("reliability_answer" in c for c in curves.values()):
        parts.append(_img(plots.plot_reliability_panels(curves, key="reliability_answer",
                                                        title="per-question frequency of predicting 1"),
                          "reliability diagrams predicted outcome"))
    parts.append("</div>")
    return "".join(parts)


# Training-dynamics curves: held-out accuracy and calibration of exp(lpm) as accuracy rises, then the
# rollout-side ones.
TRAIN_CURVES = ("eval/accuracy", "eval/auc_mean", "eval/auroc", "eval/ece", "eval/brier", "eval/entropy",
                "calib/auc_mean", "train/accuracy", "train/reward_mean", "policy/entropy", "calib/verbal_ece")


def _train_section(trains: list[RunInfo]) -> str:
    """Training curves (smoothed mean over seeds over the faint raw values, band over seeds), then the last logged
    step's metrics."""
    parts = ["<h2>Training</h2><div class='plots'>"]
    groups: dict[str, list[RunInfo]] = {}
    for r in trains:
        groups.setdefault(compare.model_name(r.name), []).append(r)
    for key in [k for k in TRAIN_CURVES if any(k in r.train_series for r in trains)]:
        series = {name: [r.train_series[key] for r in rs if key in r.train_series] for name, rs in groups.items()}
        parts.append(_img(plots.plot_training({n: s for n, s in series.items() if s}, key), f"training curve {key}"))
    parts.append("</div><h3>Last logged step</h3>")
    keys = sorted({k for r in trains for k in r.metrics if k.startswith(("eval/", "calib/", "train/"))})
    integral = {k for k in keys if all(isinstance(r.metrics.get(k), int) or (isinstance(r.metrics.get(k), float)
                                           and r.metrics[k].is_integer()) for r in trains if k in r.metrics)}
    rows = [(k, k, "{:.0f}" if k in integral else "{:.3f}") for k in keys]
    parts.append(_table(trains, [("step", "step", "{:.0f}")] + rows, "metric"))
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


def render_report(runs: list[RunInfo], title: str = "capo report", comparison=None) -> str:
    """The HTML page for one or more runs: the generated conclusion first, then the figures, then the tables.
    ``comparison``: a :func:`capo.evaluation.compare.compare` of the eval runs, if already computed."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    evals = [r for r in runs if r.kind == "eval"]
    trains = [r for r in runs if r.kind == "train"]
    if evals:
        cmp = comparison or compare.compare(evals)
        if len(cmp.models) > 1:
            parts.append(f"<p class='headline' id='headline'>{compare.headline(cmp)[1]}</p>")
        parts.append(_eval_plots(evals, cmp))
        parts.append(_eval_tables(evals, cmp))
        parts.append(_estimators_section(evals))
        parts.append(_lengths_section(evals))
    if trains:
        parts.append(_train_section(trains))
    parts.append("<h2>Runs</h2>" + _runs_table(runs))
    ex_runs = [r for r in evals if r.examples]
    if ex_runs:
        parts.append(_examples_section(ex_runs))
    parts.append("<p class='muted'>Metric definitions: docs/metrics.md (namespace eval/). Perplexity confidence is "
                 "exp(mean token log-prob); ranking metrics use the mean log-prob itself.</p></body></html>")
    return "".join(parts)


def write_report(runs: list[RunInfo], out: Path, title: str = "capo report", comparison=None) -> Path:
    """Render and write atomically (temp file + os.replace)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_report(runs, title, comparison), encoding="utf-8")
    os.replace(tmp, out)
    return out


def draw_safely(draw, what: str, rerender: str) -> bool:
    """Run ``draw()`` (figures, a report) after a run's results are saved; if it fails, print one line that says
    what failed, that every result is kept, and the command that draws it again, and return False."""
    try:
        draw()
    except Exception as e:  # noqa: BLE001 - drawing must never cost a finished run its results
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"capo: {what} could not be drawn ({type(e).__name__}: {msg}); every result is saved. "
              f"Draw it again with: {rerender}", file=sys.stderr, flush=True)
        return False
    return True
