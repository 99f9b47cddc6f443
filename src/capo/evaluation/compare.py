"""Comparing evaluated models: means over seeds, paired per-prompt bootstrap differences, and the generated headline.

A *model* is the set of eval runs whose names differ only in a ``-seedN`` suffix (``capo-seed0``, ``capo-seed1``).
Differences between two models are *paired*: each bootstrap draw resamples the held-out prompts both models
answered (with replacement), recomputes every measure of both models on the drawn prompts (mean over seeds) with
the one metric function :func:`capo.core.calibration.summarize`, and takes the difference; the interval is the
2.5-97.5 percentile of the draws. The headline sentence is written from these numbers only.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from capo.core import calibration as cal
from capo.core import voting
from capo.core.checks import did_you_mean, is_int
from capo.errors import ConfigError, DataError
from capo.evaluation.metrics import assign_answer_ids, columns, stochastic_columns
from capo.evaluation.stats import seed_paired_interval
from capo.rundir import read_jsonl
from capo.tasks import stochastic as stochastic_task
from capo.tasks.stochastic import stochastic_summary

__all__ = ["MEASURES", "MIN_PROMPTS", "Model", "Comparison", "compare", "headline", "model_name", "prompts_behind",
           "paired_columns", "run_columns", "seed_of", "too_few", "training_seeds"]

# (metrics key, readable name, +1 = higher is better / -1 = lower is better): the measures the headline covers
MEASURES = [
    ("accuracy", "accuracy", 1),
    ("auc_mean", "AUC-mean", 1),
    ("auroc", "AUROC", 1),
    ("ece", "ECE of exp(lpm)", -1),
    ("brier", "Brier of exp(lpm)", -1),
    ("verbal_ece", "ECE of verbal confidence", -1),
    ("verbal_brier", "Brier of verbal confidence", -1),
    ("aurc", "AURC of lpm", -1),
    ("majority_vote", "majority-vote accuracy", 1),
    ("max_confidence_lpm", "accuracy of the most confident sample (lpm)", 1),
    ("confidence_weighted_vote", "verbal-confidence-weighted vote accuracy", 1),
    *(m for m in stochastic_task.MEASURES if m[0] in stochastic_task.PAIRED),  # the stochastic task's
]


# The fewest prompts a measure must draw on before a reading names a winner -- the conclusion's best model, a report's
# shaded best value, a paired comparison (report, `capo demo`'s terminal); below it the reading says that there are too
# few prompts instead. A prompt enters AUC-mean when it has right and wrong answers (`auc_mean_groups`), every other
# measure through all its prompts (`n_groups`). docs/metrics.md, "Uncertainty" (its "Readings from too few
# prompts").
MIN_PROMPTS = 10


def prompts_behind(metrics: dict, key: str) -> int | None:
    """How many prompts one run's measure ``key`` drew on: ``KEY_groups`` where the metrics count them (AUC-mean's
    mixed prompts), else every prompt (``n_groups``); None when the metrics say neither."""
    n = metrics.get(f"{key}_groups", metrics.get("n_groups"))
    return int(n) if isinstance(n, (int, float)) and math.isfinite(n) else None


def too_few(n: int | None) -> bool:
    """Whether a reading drawn from ``n`` prompts must not name a winner (:data:`MIN_PROMPTS`; None: not known)."""
    return n is not None and n < MIN_PROMPTS


def seed_of(run_name: str) -> str:
    """The training seed of a run name (``"capo-seed3"`` -> ``"3"``), or the name itself."""
    m = re.search(r"-seed(\d+)", run_name)
    return m.group(1) if m else run_name


def training_seeds(m: Model) -> int:
    """How many training seeds model ``m``'s runs are (two checkpoints of one run, ``grpo-seed0`` and
    ``grpo-seed0 (2)``, are one seed)."""
    return len({seed_of(r.name) for r in m.runs})


def model_name(run_name: str) -> str:
    """``"capo-seed0"``, ``"capo-seed1 (training)"``, ``"capo-seed0 (2)"`` -> ``"capo"``; other names are their own
    model."""
    return re.sub(r"(-seed\d+)?( \(.*\))?$", "", run_name) or run_name


@dataclass
class _Seed:
    """One eval run's generation rows as tensors, with each prompt's row indices (for resampling prompts)."""

    cols: object
    rows_of: dict[str, torch.Tensor]
    stochastic: object = None  # metrics.StochasticColumns of stochastic outcomes, else None
    n_bins: int = 10  # the ECE bins the run's own metrics.json used (its config.json), so each draw measures the same


@dataclass
class Model:
    name: str
    runs: list = field(default_factory=list)  # RunInfo of each seed
    seeds: list[_Seed] = field(default_factory=list)

    def mean(self, key: str) -> float | None:
        vals = [r.metrics.get(key) for r in self.runs]
        vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
        return sum(vals) / len(vals) if len(vals) == len(self.runs) and vals else None


@dataclass
class Comparison:
    models: list[Model]
    reference: str  # the model differences are reported against ("base" when there is one)
    prompts: int  # prompts common to every model (the bootstrap resamples these)
    n_boot: int
    draws: dict[str, dict[str, torch.Tensor]]  # model -> measure -> [n_boot] values on the resampled prompts
    # model -> each run's (in the order of Model.runs) measure -> value on the shared prompts; only where some run
    # holds other prompts too (else each run's metrics.json is over just those prompts)
    points: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def seed_diff(self, a: str, b: str, key: str) -> dict | None:
        """Model a minus model b on ``key`` with the training seed as the unit: per-seed differences (runs paired by
        their ``-seedN``; a model of one run without a training seed, e.g. the base, is subtracted from every seed)
        and their t-interval (:func:`capo.evaluation.stats.seed_paired_interval`), each run's value over the prompts
        every model holds, as :meth:`diff`'s. A model of one run without a training seed (the base) is paired with
        every seed of the other, on either side. None with fewer than 2 paired seeds, when the two models ran
        different seeds (the interval would be over other runs than :meth:`diff`'s mean), or when a model has two
        runs of one seed (which of them pairs is not known)."""
        shared = self._on_shared(a, key) is not None and self._on_shared(b, key) is not None
        va, vb = self._by_seed(a, key, shared), self._by_seed(b, key, shared)
        if va is None or vb is None:
            return None
        va, vb = _spread(va, vb), _spread(vb, va)
        if set(va) != set(vb):  # an interval over the seeds both ran would not describe the difference beside it
            return None
        diffs = [va[s] - vb[s] for s in sorted(va, key=str)
                 if isinstance(va[s], (int, float)) and isinstance(vb[s], (int, float))]
        return seed_paired_interval(diffs)

    def diff(self, a: str, b: str, key: str) -> tuple[float, float, float] | None:
        """(value, low, high) of model a minus model b on ``key`` over the prompts every model holds (means over
        seeds), interval from the paired bootstrap of those prompts: the value from each run's metrics.json when
        every run holds just those prompts, else recomputed on them (as each draw is). None when either lacks the
        measure."""
        va, vb = self._model(a).mean(key), self._model(b).mean(key)
        if va is None or vb is None:
            return None
        pa, pb = self._on_shared(a, key), self._on_shared(b, key)
        if pa is not None and pb is not None:
            va, vb = sum(pa) / len(pa), sum(pb) / len(pb)
        d = self.draws.get(a, {}).get(key), self.draws.get(b, {}).get(key)
        if d[0] is None or d[1] is None:
            return va - vb, math.nan, math.nan
        diffs = d[0] - d[1]
        diffs = diffs[~torch.isnan(diffs)]
        if diffs.numel() < 10:
            return va - vb, math.nan, math.nan
        lo, hi = cal.percentile_interval(diffs, 0.05)
        return va - vb, lo, hi

    def prompts_behind(self, name: str, key: str) -> int | None:
        """The fewest prompts model ``name``'s ``key`` drew on in any of its runs, at most the shared prompts."""
        ns = [n for r in self._model(name).runs if (n := prompts_behind(r.metrics, key)) is not None]
        return min([*ns, self.prompts]) if ns else None

    def prompts_between(self, a: str, b: str, key: str) -> int | None:
        """The prompts a comparison of models a and b on ``key`` draws on: the fewer of the two (None: unknown)."""
        return min((n for n in (self.prompts_behind(a, key), self.prompts_behind(b, key)) if n is not None),
                   default=None)

    def _model(self, name: str) -> Model:
        return next(m for m in self.models if m.name == name)

    def values(self, key: str) -> dict[str, float]:
        """Model -> its value of ``key``, the mean over its runs: over the prompts every model holds when each model
        has them there (some run holds other prompts too), else each run's metrics.json; the values the headline
        ranks, as :meth:`diff` subtracts them. Models without the measure are left out."""
        shared = self._all_shared(key)
        if shared is not None:
            return {n: sum(v) / len(v) for n, v in shared.items()}
        return {m.name: v for m in self.models if (v := m.mean(key)) is not None}

    def run_values(self, name: str, key: str) -> list:
        """Each of model ``name``'s runs' ``key``, over the shared prompts as :meth:`values` takes them."""
        shared = self._all_shared(key)
        return shared[name] if shared is not None else [r.metrics.get(key) for r in self._model(name).runs]

    def _all_shared(self, key: str) -> dict[str, list[float]] | None:
        """Model -> each run's ``key`` over the shared prompts when every model has them (:meth:`_on_shared`), else
        None."""
        shared = {m.name: self._on_shared(m.name, key) for m in self.models}
        return shared if self.points and all(v is not None for v in shared.values()) else None

    def _on_shared(self, name: str, key: str) -> list[float] | None:
        """Each of model ``name``'s runs' ``key`` over the prompts every model holds; None where every run holds
        just those prompts (metrics.json is over them) or a value is not finite."""
        vals = [p.get(key) for p in self.points.get(name, [])]
        return vals if vals and all(v is not None and math.isfinite(v) for v in vals) else None

    def _by_seed(self, name: str, key: str, shared: bool = False) -> dict | None:
        """Training seed -> the value of ``key`` of model ``name``'s run: over the prompts every model holds with
        ``shared``, else its metrics.json's (None when two runs share a seed)."""
        runs = self._model(name).runs
        vals = self._on_shared(name, key) if shared else [r.metrics.get(key) for r in runs]
        out = {seed_of(r.name): v for r, v in zip(runs, vals)}
        return out if len(out) == len(runs) else None


def _spread(v: dict, other: dict) -> dict:
    """A model's values by training seed; a single run without a seed (the base) stands for every seed of ``other``."""
    if len(v) == 1 and not next(iter(v)).isdigit():
        (only,) = v.values()
        return {s: only for s in other}
    return v


def _load_seed(run_dir: Path) -> _Seed | None:
    gen = Path(run_dir) / "generations.jsonl"
    if not gen.is_file():
        return None
    settings = _eval_settings(run_dir)
    try:
        rows = read_jsonl(gen)
        if rows and any("answer_id" not in r for r in rows):  # capo eval computes the classes after writing rows
            _answer_ids(rows, settings.get("answer_format"))
        cols = columns(rows) if rows else None
    except (DataError, KeyError, TypeError, ValueError):
        return None  # no intervals for this run rather than no report
    if cols is None:
        return None
    idx: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        idx.setdefault(str(r["prompt_id"]), []).append(i)
    n_bins = settings.get("n_bins", 10)
    return _Seed(cols, {p: torch.tensor(v) for p, v in idx.items()}, stochastic_columns(rows),
                 n_bins if is_int(n_bins) and n_bins >= 1 else 10)


def _eval_settings(run_dir: Path) -> dict:
    """The settings a ``capo eval`` run was graded with (its config.json: ``answer_format``, ``n_bins``, ...); {}
    when unknown."""
    try:
        out = json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def _answer_ids(rows: list[dict], answer_format: str | None = None) -> None:
    """The votes' answer classes, by the same function and verifier ``capo eval`` uses for metrics.json."""
    from capo.verify import Verifier

    for r in rows:
        r.setdefault("answer", None)
    with Verifier(workers=1) as verifier:
        assign_answer_ids(rows, verifier, answer_format)


def _measures_on(seed: _Seed, drawn: list[str]) -> dict[str, float]:
    """Every measure of one run on the drawn prompts (a prompt drawn twice counts as two prompts)."""
    ix = torch.cat([seed.rows_of[p] for p in drawn])
    g = torch.cat([torch.full((len(seed.rows_of[p]),), j) for j, p in enumerate(drawn)])
    c = seed.cols
    lpm, ok, aids = c.lpm[ix], c.c[ix], c.aids[ix]
    s = cal.summarize(lpm, ok, g, verbal_conf=c.verbal[ix] if c.has_verbal else None, n_bins=seed.n_bins)
    s["majority_vote"] = voting.majority_vote(aids, ok, g).accuracy
    s["max_confidence_lpm"] = voting.max_confidence(aids, ok, g, torch.where(torch.isinf(lpm), torch.full_like(lpm, -1e4), lpm)).accuracy
    if c.has_verbal:
        s["confidence_weighted_vote"] = voting.confidence_weighted_vote(aids, ok, g,
                                                                        torch.nan_to_num(c.verbal[ix], nan=0.0)).accuracy
    if (st := seed.stochastic) is not None:
        s |= stochastic_summary(st.stated[ix], st.outcome[ix], g, st.rate[ix],
                                chosen=None if st.chosen is None else st.chosen[ix], n_bins=seed.n_bins)
    return {k: s.get(k, math.nan) for k, _, _ in MEASURES}


def _on_prompts(m: Model, prompts: list[str]) -> dict[str, float]:
    """Every measure of model ``m`` on ``prompts``: the mean over its seeds."""
    per_seed = [_measures_on(s, prompts) for s in m.seeds]
    return {k: sum(p[k] for p in per_seed) / len(per_seed) for k, _, _ in MEASURES}


def _shared_points(models: list[Model], common: list[str]) -> dict[str, list[dict[str, float]]]:
    """Each run's measures over the prompts every model holds, where some run holds other prompts too; else {}
    (each run's metrics.json is already over just those prompts)."""
    if not common or all(set(s.rows_of) == set(common) for m in models for s in m.seeds):
        return {}
    return {m.name: [_measures_on(s, common) for s in m.seeds] for m in models}


def _bootstrap(models: list[Model], prompts: list[str], n_boot: int, seed: int) -> dict:
    out = {m.name: {k: torch.empty(n_boot, dtype=torch.float64) for k, _, _ in MEASURES} for m in models}
    for b, draw in enumerate(cal.bootstrap_draws(len(prompts), n_boot, seed)):  # the core's resampling scheme
        drawn = [prompts[i] for i in draw.tolist()]
        for m in models:
            for k, v in _on_prompts(m, drawn).items():
                out[m.name][k][b] = v
    return out


def compare(evals: list, n_boot: int = 200, seed: int = 0, reference: str | None = None) -> Comparison:
    """Group eval runs (RunInfo) into models and bootstrap every measure over the prompts they share.

    ``reference``: the model the paired differences are taken against (a model name: a run name without its
    ``-seedN`` suffix); default "base" when there is one, else the first model."""
    models: dict[str, Model] = {}
    for r in evals:
        models.setdefault(model_name(r.name), Model(model_name(r.name))).runs.append(r)
    ms = list(models.values())
    for m in ms:
        m.seeds = [_load_seed(r.path) if len(ms) > 1 else None for r in m.runs]  # one model: nothing to compare
    if reference is not None and reference not in models:
        raise ConfigError(f"reference model {reference!r} is not among the compared models"
                          f"{did_you_mean(reference, list(models))}; models: {', '.join(models)}")
    ref = reference or ("base" if "base" in models else ms[0].name)
    usable = [m for m in ms if all(s is not None for s in m.seeds)]
    common = sorted(set.intersection(*[set(s.rows_of) for m in usable for s in m.seeds])) if usable else []
    draws = _bootstrap(usable, common, n_boot, seed) if len(common) > 1 and n_boot > 0 else {}
    return Comparison(ms, ref, len(common), n_boot, draws, _shared_points(usable, common))


def _fmt(v: float) -> str:
    return f"{v:+.3f}"


def _interval(lo: float, hi: float) -> tuple[str, bool]:
    if math.isnan(lo):
        return "no interval", False
    excl = lo > 0 or hi < 0
    return f"95% interval [{lo:+.3f}, {hi:+.3f}], {'excludes' if excl else 'includes'} 0", excl


HEADLINE = (("auc_mean", "AUC-mean"), ("accuracy", "accuracy"))  # the headline calibration measure, then accuracy
# stochastic outcomes (every model has it): the stated probabilities' calibration, best and worst model (lower = better)
STOCHASTIC_HEADLINE = stochastic_task.MEASURES[0][:2]


def _versus_reference(cmp: Comparison, key: str, label: str, sign: int = 1,
                      runner_up: bool = True) -> tuple[str, str] | None:
    """(plain, html) sentence: the model with the highest (``sign`` 1) or lowest (-1) value of ``key`` against the
    reference, by how much, and whether the paired interval excludes 0; when the reference is that model, the
    runner-up against it (``runner_up``), or nothing."""
    vals = sorted(((v, n) for n, v in cmp.values(key).items()), key=lambda t: -sign * t[0])
    if len(vals) < 2 or cmp.reference not in {n for _, n in vals} or (vals[0][1] == cmp.reference and not runner_up):
        return None
    best_v, best = vals[0]
    other = best if best != cmp.reference else vals[1][1]
    few = _too_few_sentence(cmp, key, label, (other, cmp.reference))
    if few:
        return few, html.escape(few)
    d = cmp.diff(other, cmp.reference, key)
    iv, excl = _interval(d[1], d[2])
    esc = html.escape
    if best == cmp.reference:
        word = "beats" if sign == 1 else "is below"
        plain = (f"No model {word} {cmp.reference} on {label} ({best_v:.3f}); the next, {other}, is {_fmt(d[0])} "
                 f"({iv}).")
        htm = (f"No model {word} <b>{esc(cmp.reference)}</b> on {esc(label)} ({best_v:.3f}); the next, "
               f"{esc(other)}, is {_fmt(d[0])} ({esc(iv)}).")
        return plain, htm
    most = "highest" if sign == 1 else "lowest"
    plain = f"{best} has the {most} {label} ({best_v:.3f}), {_fmt(d[0])} vs {cmp.reference} ({iv})."
    strong, end = ("<strong>", "</strong>") if excl else ("", "")
    htm = (f"<b>{esc(best)}</b> has the {most} {esc(label)} ({best_v:.3f}), {strong}{_fmt(d[0])}{end} vs "
           f"{esc(cmp.reference)} ({esc(iv)}).")
    return plain, htm


def _too_few_sentence(cmp: Comparison, key: str, label: str, names) -> str | None:
    """The sentence that replaces a winner when one of the models ``names`` drew ``key`` from too few prompts."""
    n, name = min(((cmp.prompts_behind(m, key), m) for m in names), key=lambda t: (t[0] is None, t[0] or 0))
    if not too_few(n):
        return None
    return (f"Too few prompts to compare {label}: the comparison with {name} rests on {n} of {cmp.prompts} "
            f"prompts (a comparison needs at least {MIN_PROMPTS}).")


def headline(cmp: Comparison) -> tuple[str, str]:
    """The conclusion in at most three sentences, as (plain text, HTML), written from the numbers: the best model on
    the headline calibration measure (AUC-mean) and on accuracy against the reference, by how much and whether the
    paired interval excludes 0 (stochastic outcomes: the lowest and the highest ECE of the per-question stated
    probability instead); then what the intervals resample. Every other measure is in the tables."""
    plain, htm = [], []
    key = STOCHASTIC_HEADLINE[0]
    stochastic = all(m.mean(key) is not None for m in cmp.models)
    lines = ([(key, STOCHASTIC_HEADLINE[1], -1, True), (key, STOCHASTIC_HEADLINE[1], 1, False)] if stochastic else
             [(k, label, 1, True) for k, label in HEADLINE])
    for key, label, sign, runner_up in lines:
        s = _versus_reference(cmp, key, label, sign, runner_up)
        if s:
            plain.append(s[0])
            htm.append(s[1])
    n_seeds = max((training_seeds(m) for m in cmp.models), default=0)
    repeats = [m.name for m in cmp.models if training_seeds(m) < len(m.runs)]
    again = f" ({', '.join(repeats)}: several evaluations of one seed, averaged)" if repeats else ""
    tail = (f"{len(cmp.models)} models on {cmp.prompts} shared held-out prompts"
            f"{f', mean over up to {n_seeds} training seeds' if n_seeds > 1 else ''}{again}; intervals: 95% "
            f"bootstrap over prompts ({cmp.n_boot} draws), not over training seeds.")
    return " ".join(plain + [tail]), " ".join(htm + [html.escape(tail)])


def run_columns(run_dir: Path, text: str = "", subset: str = "all") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lpm [N] float64, correct [N] bool, prompt index [N]) of an eval run's rows in ``subset``: "all", "with"
    (prompts that contain ``text``) or "without"; an empty response's lpm is -inf; prompts indexed in sorted id order.
    One run's own columns; two runs to pair: :func:`paired_columns`."""
    rows = _subset_rows(run_dir, text, subset)
    return _columns(rows, {p: i for i, p in enumerate(sorted({str(r["prompt_id"]) for r in rows}))})


def paired_columns(run_a: Path, run_b: Path, text: str = "", subset: str = "all") -> tuple[tuple, tuple]:
    """:func:`run_columns` of two eval runs on the prompts both hold, indexed alike (index i is one prompt in both,
    by its id): the inputs of :func:`capo.core.calibration.paired_difference` (``capo report --split-on``, the demo's
    terminal). Indexing each run by its own sorted ids paired different prompts when the runs' prompt sets differ."""
    rows_a, rows_b = _subset_rows(run_a, text, subset), _subset_rows(run_b, text, subset)
    shared = sorted({str(r["prompt_id"]) for r in rows_a} & {str(r["prompt_id"]) for r in rows_b})
    ids = {p: i for i, p in enumerate(shared)}
    return _columns(rows_a, ids), _columns(rows_b, ids)


def _paired(run_a: Path, run_b: Path, text: str, subset: str, n_boot: int, seed: int) -> cal.PairedDifference:
    xa, xb = paired_columns(run_a, run_b, text, subset)
    return cal.paired_difference(*xa, *xb, n_boot=n_boot, seed=seed)


def _subset_rows(run_dir: Path, text: str, subset: str) -> list[dict]:
    rows = read_jsonl(Path(run_dir) / "generations.jsonl")
    return [r for r in rows if subset == "all" or ((text in r["prompt"]) == (subset == "with"))]


def _columns(rows: list[dict], ids: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows of the prompts in ``ids`` as (lpm, correct, ids[prompt])."""
    rows = [r for r in rows if str(r["prompt_id"]) in ids]
    lpm = [r["mean_logprob"] if r["mean_logprob"] is not None else float("-inf") for r in rows]
    return (torch.tensor(lpm, dtype=torch.float64),
            torch.tensor([r["verdict"] == "correct" for r in rows], dtype=torch.bool),
            torch.tensor([ids[str(r["prompt_id"])] for r in rows], dtype=torch.long))  # typed: a subset can be empty


def split_table(runs: list, reference: str, text: str, n_boot: int = 1000, seed: int = 0) -> str:
    """Markdown: each eval run's accuracy, AUC-mean of lpm and paired per-prompt AUC-mean difference against the
    ``reference`` run (95% bootstrap interval over prompts, ``n_boot`` draws; prompts used in brackets), on all
    held-out prompts, on the prompts that contain ``text`` and on the others (e.g. ``?``: coin_sum's hidden-coin
    prompts). ``runs``: eval runs (``.name``, ``.path``), exactly one of them of the model ``reference``
    (:func:`model_name`); it comes first, the others by name."""
    ref = [r for r in runs if model_name(r.name) == reference]
    if len(ref) != 1:
        raise ConfigError(f"--split-on compares every run with one reference run (e.g. base); {reference!r} has "
                          f"{len(ref)} runs")
    lines = [f"| model | prompts | accuracy | AUC-mean | paired AUC-mean diff vs {reference} [95% CI] (prompts) |",
             "|---|---|---|---|---|"]
    for label, subset in (("all", "all"), (f"with {text}", "with"), (f"without {text}", "without")):
        base = run_columns(ref[0].path, text, subset)
        if not base[0].numel():  # nothing is printed before the table is whole
            raise ConfigError(f"--split-on {text!r}: {'no' if subset == 'with' else 'every'} held-out prompt of "
                              f"{ref[0].name} contains it, so there is nothing to split; give a text that some prompts "
                              "contain and others do not")
        for r in sorted(runs, key=lambda r: (r is not ref[0], r.name)):
            x = run_columns(r.path, text, subset)
            pd = None if r is ref[0] else _paired(r.path, ref[0].path, text, subset, n_boot, seed)
            diff = "-" if pd is None else f"{pd.value:+.3f} [{pd.low:+.3f}, {pd.high:+.3f}] ({pd.n_groups_used})"
            lines.append(f"| {r.name} | {label} | {float(x[1].double().mean()):.3f} | "
                         f"{cal.auc_mean(*x).value:.3f} | {diff} |")
    return "\n".join(lines) + "\n"
