"""Mutation testing of capo's core, verifier, metrics, step and the trainer's loss assembly with mutmut 3, one module
at a time (`make mutate`).

Each module in ``MODULES`` is mutated in its own scratch copy of the repository (``src/`` and ``tests/`` copied to
``<workdir>/<module>``, a ``[tool.mutmut]`` section appended to the copied pyproject.toml), against only the test
files that exercise it, so one module takes minutes rather than the whole suite per mutant (a module listed in
``FUNCTIONS`` is mutated in the functions named there only). mutmut then runs, for
each mutant, only the tests that call the mutated function. A module listed in ``ENGINE_TESTS`` (the verl plugin) runs
its survivors again in the engine's own environment (``.venv-verl``, created by ``scripts/engine-env.sh`` if missing,
mutmut installed in it), against the tests that need the engine. The script prints a table of scores and writes each
module's surviving mutants (with their diffs) to ``<out>/<module>.survivors.txt``. The recorded scores and the
survivors left, each with the reason it was left, are ``docs/data/mutation.json``; after a run, update the module's
entry there and run ``python scripts/mutation_table.py`` to regenerate the table in docs/testing.md.

    python scripts/mutate.py                       # every module (hours on 2 cores: docs/testing.md,
                                                   # "Mutation testing", gives each module's time)
    python scripts/mutate.py --module verify --module metrics
    python scripts/mutate.py --list                # the module -> files / tests map

Score = detected / (detected + survived + no tests), where detected = killed + timeout (a mutant that makes a
test hang is caught). Lines that only build an error message (``raise ...Error(...)``) and ``__all__`` are not
mutated: their text is not computation, and tests match messages only loosely.

Not in CI and not in ``make test`` (it takes long). Needs the ``mutate`` extra (``pip install -e '.[mutate]'``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# module -> (files to mutate, relative to the repository root; the test files that exercise them; extra pytest
# arguments, e.g. a -k expression that leaves out a slow end-to-end test another subset covers)
MODULES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "core.advantages": (
        ["src/capo/core/advantages.py", "src/capo/core/advantage_variants.py", "src/capo/core/masks.py",
         "src/capo/core/dapo.py", "src/capo/core/rewards.py", "src/capo/core/scores.py"],
        ["tests/core/test_advantages.py", "tests/core/test_advantage_variants.py",
         "tests/core/test_masks_dapo_rewards.py", "tests/core/test_reward_variants.py",
         "tests/core/test_advantage_step.py",  # masks.default_noise_mask & co. are tested with the step
         "tests/core/test_input_errors.py"],
        [],
    ),
    "core.losses": (
        ["src/capo/core/losses.py", "src/capo/core/loss_variants.py", "src/capo/core/rollout_correction.py"],
        ["tests/core/test_losses.py", "tests/core/test_loss_variants.py", "tests/core/test_rollout_correction.py",
         "tests/core/test_losses_inputs.py"],
        [],
    ),
    "core.step": (
        ["src/capo/core/step.py", "src/capo/core/registry.py", "src/capo/core/presets.py"],
        ["tests/core/test_advantage_step.py", "tests/core/test_step_edges.py"],
        [],
    ),
    "core.calibration": (
        ["src/capo/core/calibration.py"],
        ["tests/core/test_calibration.py", "tests/core/test_calibration_extended.py",
         "tests/core/test_calibration_edges.py", "tests/core/test_calibration_device.py"],
        [],
    ),
    "tasks.stochastic": (
        ["src/capo/tasks/stochastic.py"],
        ["tests/tasks/test_stochastic_measures.py", "tests/tasks/test_stochastic_task.py",
         "tests/tasks/test_stochastic_binary.py"],
        [],
    ),
    "core.voting": (
        ["src/capo/core/voting.py", "src/capo/core/confidence.py"],
        ["tests/core/test_voting.py", "tests/core/test_voting_confidence.py", "tests/core/test_confidence.py",
         "tests/core/test_voting_inputs.py"],
        [],
    ),
    "core.checks": (
        ["src/capo/core/checks.py"],
        ["tests/core/test_calibration.py", "tests/core/test_advantages.py", "tests/core/test_losses.py",
         "tests/core/test_voting.py", "tests/core/test_checks.py"],
        [],
    ),
    "rollout.step": (
        ["src/capo/rollout/step.py"],
        ["tests/rollout/test_step_metrics.py", "tests/adapters/test_method_inputs.py",
         "tests/adapters/test_calib_paths.py"],
        [],
    ),
    "evaluation.metrics": (
        ["src/capo/evaluation/metrics.py"],
        ["tests/evaluation/test_metrics_generations.py"],
        ["-k", "not end_to_end"],  # the `capo eval --generations` run starts verifier workers (~10 s a mutant)
    ),
    "evaluation.stats": (
        ["src/capo/evaluation/stats.py"],
        ["tests/evaluation/test_stats.py"],
        [],
    ),
    "verify.extract": (
        ["src/capo/verify/extract.py"],
        ["tests/verify/test_extract.py", "tests/verify/test_extract_strict.py",
         "tests/verify/test_extract_boxed_edges.py"],
        [],
    ),
    # the verifier's parent side, verifier.py and the worker pool _pool.py (the worker module runs in child processes, where mutmut cannot see which test
    # reached a function, so it is not mutated here); each mutant starts fresh worker processes (seconds)
    "verify.verifier": (
        ["src/capo/verify/verifier.py", "src/capo/verify/_pool.py"],
        ["tests/verify/test_verifier.py", "tests/verify/test_verifier_verdicts.py",
         "tests/verify/test_integer_shortcut.py", "tests/verify/test_worker_failures.py"],
        ["-k", "not canary and not sympy_guard"],  # security canaries: they judge nothing the other tests miss
    ),
    # the trainer's loss assembly: the functions of loop.py named in FUNCTIONS, against hand-computed gradients of a
    # table policy (no model, no verifier: seconds a mutant)
    "trainer.loss": (
        ["src/capo/trainer/loop.py"],
        ["tests/trainer/test_loss_assembly.py"],
        [],
    ),
    # the adapters' reward glue (no engine needed): the shared scoring of texts, verl's compute_score functions and
    # TRL's reward classes (the functions named in FUNCTIONS), against hand-computed rewards and the advantages the
    # trainer, TRL and verl must agree on
    "adapters.rewards": (
        ["src/capo/adapters/_common.py", "src/capo/adapters/verl_plugin/rewards.py", "src/capo/adapters/trl.py"],
        ["tests/adapters/test_stated_rewards.py", "tests/adapters/test_method_inputs.py"],
        [],
    ),
    # the TRL adapter's training glue (the functions named in FUNCTIONS: CapoGRPOTrainer's methods, the config's,
    # mask_thresholds): what builds capo's step inputs inside TRL's loop and hands the advantages back. Each test
    # trains TRL's GRPOTrainer on a tiny model for a few steps (seconds); the multi-process tests run under
    # `accelerate launch`, where mutmut cannot see which test reached a function, so they are left out
    "adapters.trl": (
        ["src/capo/adapters/trl.py"],
        ["tests/adapters/test_trl.py", "tests/adapters/test_trl_paths.py", "tests/adapters/test_trl_methods.py",
         "tests/adapters/test_trl_internals.py", "tests/adapters/test_calib_paths.py",
         "tests/adapters/test_trl_reference.py"],
        ["-k", "not two_processes"],
    ),
    # the verl plugin's glue (the functions named in FUNCTIONS): the estimator body that builds capo's step inputs
    # from verl's batch (groups from uids, padding rows, verdicts, log-probs, reward extras) and the compute_advantage
    # wrappers that show the batch to it. Run here against the tests that call the estimator with a stand-in for
    # verl's DataProto, then (ENGINE_TESTS) the survivors inside verl itself, in .venv-verl
    "adapters.verl": (
        ["src/capo/adapters/verl_plugin/estimators.py", "src/capo/adapters/verl_plugin/patch.py"],
        ["tests/adapters/test_verl_glue.py", "tests/adapters/test_method_inputs.py",
         "tests/adapters/test_calib_paths.py"],
        [],
    ),
}

# modules whose tests also run in an engine's own environment (``sh scripts/engine-env.sh <engine>``, which pins
# what capo's main environment cannot hold): the mutants the main run leaves alive are run again there, in a scratch
# copy of their own, against these tests; a mutant either run detects is detected
ENGINE_TESTS: dict[str, dict[str, tuple[list[str], list[str]]]] = {
    # the two tests of the example files (examples/verl, not in the scratch copy) judge nothing of the glue
    "adapters.verl": {"verl": (["tests/adapters/test_verl.py", "tests/adapters/test_verl_glue.py",
                                "tests/adapters/test_method_inputs.py", "tests/adapters/test_calib_paths.py"],
                               ["-k", "not reward_file_loaded_by_path and not example_launch_script"])},
}

# modules mutated in some functions only (mutmut mutant-name globs); the other functions of their files are not run
# and not counted. ``xǁClassǁmethod`` is mutmut's name of a method.
FUNCTIONS: dict[str, list[str]] = {
    "trainer.loss": [f"capo.trainer.loop.xǁTrainerǁ{f}__mutmut_*"
                     for f in ("update", "_micro_step", "_mismatch", "_micro_batches")],
    "adapters.rewards": ["capo.adapters._common.*", "capo.adapters.verl_plugin.rewards.*",
                         "capo.adapters.trl.x_capo_preset__mutmut_*",
                         *(f"capo.adapters.trl.xǁ{c}ǁ*" for c in ("_TextReward", "RLCRReward", "PPOCReward",
                                                                  "LogScoreReward", "BrierScoreReward",
                                                                  "CorrectnessReward"))],
    "adapters.trl": ["capo.adapters.trl.xǁCapoGRPOTrainerǁ*", "capo.adapters.trl.xǁCapoAdvantageConfigǁ*",
                     "capo.adapters.trl.x_mask_thresholds__mutmut_*"],
    # not _make_estimator, _wrap, _patch_module, register: they run once, when the plugin loads (at import, before
    # mutmut selects a mutant); the per-call bodies they install are the functions below
    "adapters.verl": [*(f"capo.adapters.verl_plugin.estimators.x_{f}__mutmut_*"
                        for f in ("_settings", "_old_key", "_options", "_padding_rows", "_grouped_rows", "_ctx_values",
                                  "_verdicts", "_floats", "_check_temperature", "_log_probs", "_step_batch", "_estimate")),
                      *(f"capo.adapters.verl_plugin.patch.x_{f}__mutmut_*"
                        for f in ("_name", "_check_name", "_compute_advantage", "_v1_extra", "_v1_compute_advantage"))],
}

# mutmut stops a mutant's tests after (their estimated time + 1 s) x multiplier x 2 seconds (default multiplier 15):
# the verifier's mutants that make the pool wait forever (a deadline never reached) hung 25 min each at the default
TIMEOUT_MULTIPLIER: dict[str, float] = {"verify.verifier": 3.0}

# lines (and the statements that start on them) never mutated: error messages and export lists
DO_NOT_MUTATE_PATTERNS = [r"^\s*raise \w+(Error|Exception)\(", r"^__all__\b"]

DETECTED = {"killed", "timeout", "caught by type check"}
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          37: "caught by type check", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}


def mutmut_section(files: list[str], tests: list[str], pytest_args: list[str],
                   timeout_multiplier: float | None = None) -> str:
    """The ``[tool.mutmut]`` TOML section of one module's scratch copy."""
    q = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    timeout = "" if timeout_multiplier is None else f"timeout_multiplier = {float(timeout_multiplier)}\n"
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = {q(files)}\n"
        f"do_not_mutate_patterns = {q(DO_NOT_MUTATE_PATTERNS)}\n"
        f"pytest_add_cli_args_test_selection = {q(tests)}\n"
        f"pytest_add_cli_args = {q(['-p', 'no:cacheprovider', '-m', 'not slow', *pytest_args])}\n"
        'process_isolation = "forkserver"\n'  # torch is not fork-safe after the stats run
        "use_git_change_detection = false\n"
        + timeout
    )


def prepare(module: str, work: Path, engine: str | None = None) -> Path:
    """A scratch copy of src/ and tests/ with the module's mutmut configuration (with ``engine``: its tests in that
    engine's environment, ``ENGINE_TESTS``); returns its directory."""
    files, tests, pytest_args = MODULES[module]
    if engine is not None:
        tests, pytest_args = ENGINE_TESTS[module][engine]
    missing = [t for t in tests if not (ROOT / t).is_file()]
    if missing:  # an older checkout (a "before" measurement): its own tests only
        print(f"{module}: test files not in this checkout, left out: {' '.join(missing)}", flush=True)
        tests = [t for t in tests if t not in missing]
    d = work / (module if engine is None else f"{module}@{engine}")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", d / "src", ignore=ignore)
    shutil.copytree(ROOT / "tests", d / "tests", ignore=ignore)
    text = (ROOT / "pyproject.toml").read_text()
    (d / "pyproject.toml").write_text(text + mutmut_section(files, tests, pytest_args,
                                                                TIMEOUT_MULTIPLIER.get(module)))
    return d


def engine_python(engine: str) -> str:
    """The interpreter of the engine's environment, created if missing (``scripts/engine-env.sh``, idempotent), with
    this environment's mutmut version installed in it."""
    subprocess.run(["sh", str(ROOT / "scripts" / "engine-env.sh"), engine], check=True)
    python = str(ROOT / f".venv-{engine}" / "bin" / "python")
    if subprocess.call([python, "-c", "import mutmut"], stderr=subprocess.DEVNULL) != 0:
        from importlib.metadata import version

        subprocess.run([python, "-m", "pip", "install", "--quiet", f"mutmut=={version('mutmut')}"], check=True)
    return python


def statuses(d: Path) -> dict[str, str]:
    """Each mutant's status (killed, survived, no tests, timeout, not checked, ...), from mutmut's ``.meta`` files."""
    out: dict[str, str] = {}
    for meta in sorted((d / "mutants").rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = STATUS.get(code, "suspicious")
    return out


def counts_of(status: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for st in status.values():
        counts[st] = counts.get(st, 0) + 1
    return counts


def score(counts: dict) -> float:
    detected = sum(counts.get(s, 0) for s in DETECTED)
    judged = detected + counts.get("survived", 0) + counts.get("no tests", 0)
    return detected / judged if judged else float("nan")


def _env() -> dict[str, str]:
    """The environment of mutmut and its helpers: offline, one thread, and no PYTHONPATH (the scratch copy's src/
    must come first)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


def _mutmut(module: str, engine: str | None, names: list[str] | None, work: Path, out: Path,
            max_children: int) -> tuple[int, dict[str, str], Path]:
    """mutmut on the mutants ``names`` (all of the module's with an empty list; none with None) in a fresh scratch
    copy, in the main environment or the engine's; returns its exit status, the statuses of the module's mutants
    and the copy's directory."""
    d = prepare(module, work, engine)
    rc = 0
    if names is not None:
        python = sys.executable if engine is None else engine_python(engine)
        with (out / f"{d.name}.log").open("w") as log:  # <module>.log, or <module>@<engine>.log
            rc = subprocess.call([python, "-m", "mutmut", "run", "--max-children", str(max_children), *names],
                                 cwd=d, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    new = statuses(d)
    if module in FUNCTIONS:
        new = {n: st for n, st in new.items() if any(fnmatch.fnmatch(n, g) for g in FUNCTIONS[module])}
    return rc, new, d


def _engine_passes(module: str, status: dict[str, str], work: Path, out: Path, max_children: int) -> int:
    """Run the mutants ``status`` holds alive (survived, no tests) again in each engine environment of the module
    (``ENGINE_TESTS``); a mutant detected there is detected, one that survives there has tests. Updates ``status``,
    returns the worst exit status."""
    rc = 0
    for engine in ENGINE_TESTS.get(module, {}):
        alive = [n for n, st in status.items() if st in ("survived", "no tests")]
        if not alive:
            break
        erc, new, _ = _mutmut(module, engine, alive, work, out, max_children)
        rc = rc or erc
        for n in alive:
            st = new.get(n, "not checked")
            if st in DETECTED or (st == "survived" and status[n] == "no tests"):
                status[n] = st
    return rc


def run_module(module: str, work: Path, out: Path, max_children: int, rerun: bool, also: list[str] = ()) -> dict:
    """Run mutmut on one module (and its survivors in the module's engine environments); with ``rerun``, only on the
    survivors recorded in ``<out>/<module>.json`` by an earlier run on the same source (new tests can only kill
    more; the others keep their recorded status), on the mutants that run never reached ("not checked": a stopped
    run resumes), and on the mutants matching the globs ``also`` (a function whose source changed since the record:
    its mutants are judged afresh)."""
    before = json.loads((out / f"{module}.json").read_text())["status"] if rerun else {}
    if rerun:
        before = {n: st for n, st in before.items() if not any(fnmatch.fnmatch(n, g) for g in also)}
    redo = ("survived", "no tests", "not checked")
    names = [n for n, st in before.items() if st in redo] + list(also) if rerun else FUNCTIONS.get(module, [])
    t0 = time.monotonic()
    rc, new, d = _mutmut(module, None, names if names or not rerun else None, work, out, max_children)
    # a rerun that stopped early (a failed clean run, Ctrl-C) keeps the recorded status of what it did not check
    judged = [n for n in new if n in names or any(fnmatch.fnmatch(n, g) for g in also)]
    status = {**before, **{n: st for n in judged if (st := new[n]) != "not checked"}} if rerun else new
    rc = rc or _engine_passes(module, status, work, out, max_children)
    minutes = (time.monotonic() - t0) / 60
    survivors = [n for n, st in status.items() if st in ("survived", "no tests")]
    show = ("import sys\nfrom mutmut.mutation.diff_apply import get_diff_for_mutant\n"
            "for n in sys.argv[1:]:\n    print(f'# {n}'); print(get_diff_for_mutant(n)); print()\n")
    with (out / f"{module}.survivors.txt").open("w") as f:  # one process for all diffs (`mutmut show` is slow)
        subprocess.run([sys.executable, "-c", show, *survivors], cwd=d, env=_env(), stdout=f, stderr=subprocess.STDOUT)
    res = {"module": module, "rc": rc, "minutes": minutes, "rerun": rerun, "counts": counts_of(status),
           "status": status}
    (out / f"{module}.json").write_text(json.dumps(res, indent=1))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", action="append", choices=sorted(MODULES), help="module(s) to run (default: all)")
    ap.add_argument("--max-children", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "capo-mutate")
    ap.add_argument("--out", type=Path, default=ROOT / "mutation-report")
    ap.add_argument("--rerun-survivors", action="store_true",
                    help="only re-test the survivors (and the mutants not reached) that an earlier run recorded in "
                         "--out (same source, new tests)")
    ap.add_argument("--mutants", action="append", default=[], metavar="GLOB",
                    help="with --rerun-survivors: also judge afresh the mutants whose names match GLOB (mutmut's "
                         "names, e.g. 'capo.tasks.stochastic.x_stated_means_summary__mutmut_*')")
    ap.add_argument("--list", action="store_true", help="print the module -> files / tests map and exit")
    args = ap.parse_args(argv)
    if args.list:
        for m, (files, tests, _) in MODULES.items():
            print(f"{m}\n  mutate: {' '.join(files)}\n  tests:  {' '.join(tests)}")
            if m in FUNCTIONS:
                print(f"  only:   {' '.join(FUNCTIONS[m])}")
            for engine, (tests, _) in ENGINE_TESTS.get(m, {}).items():
                print(f"  then in .venv-{engine}, the survivors against: {' '.join(tests)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for m in args.module or list(MODULES):
        r = run_module(m, args.workdir, args.out, args.max_children, args.rerun_survivors, args.mutants)
        rows.append(r)
        print(f"{m}: {score(r['counts']):.1%} {r['counts']} ({r['minutes']:.1f} min, rc {r['rc']})", flush=True)
    print(f"\n{'module':<20} {'mutants':>8} {'killed':>7} {'survived':>9} {'no tests':>9} {'score':>7} {'min':>6}")
    for r in rows:
        c = r["counts"]
        print(f"{r['module']:<20} {sum(c.values()):>8} {sum(c.get(s, 0) for s in DETECTED):>7} "
              f"{c.get('survived', 0):>9} {c.get('no tests', 0):>9} {score(c):>7.1%} {r['minutes']:>6.1f}")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
