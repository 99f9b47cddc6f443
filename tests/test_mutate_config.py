"""scripts/mutate.py's configuration is sane (the mutation run itself is `make mutate`, not part of the tests)."""

import fnmatch
import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load():
    spec = importlib.util.spec_from_file_location("capo_mutate_script", ROOT / "scripts" / "mutate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_module_names_existing_files_and_tests():
    m = load()
    for name, (files, tests, pytest_args) in m.MODULES.items():
        assert files and tests, name
        for f in files + tests:
            assert (ROOT / f).is_file(), f"{name}: {f} does not exist"
        assert all(f.startswith("src/capo/") and f.endswith(".py") for f in files), name
        assert all(t.startswith("tests/") for t in tests), name
        section = tomllib.loads(m.mutmut_section(files, tests, pytest_args, m.TIMEOUT_MULTIPLIER.get(name)))
        section = section["tool"]["mutmut"]
        assert section["only_mutate"] == files and section["pytest_add_cli_args_test_selection"] == tests
        assert section.get("timeout_multiplier") == m.TIMEOUT_MULTIPLIER.get(name)
    assert set(m.TIMEOUT_MULTIPLIER) <= set(m.MODULES)
    engines = (ROOT / "scripts" / "engine-env.sh").read_text()
    for name, by_engine in m.ENGINE_TESTS.items():
        assert name in m.MODULES, name
        for engine, (tests, _) in by_engine.items():
            assert f"\n    {engine}) REQ=" in engines, f"{name}: scripts/engine-env.sh makes no {engine} environment"
            assert tests and all((ROOT / t).is_file() for t in tests), f"{name}: {tests}"


def test_the_core_verifier_metrics_and_step_are_mutated_each_function_by_one_module():
    m = load()
    mutated = {f for files, _, _ in m.MODULES.values() for f in files}
    core = {f"src/capo/core/{p.name}" for p in (ROOT / "src/capo/core").glob("*.py") if p.name != "__init__.py"}
    assert core <= mutated, f"core files not in any module: {sorted(core - mutated)}"
    for f in ["src/capo/verify/verifier.py", "src/capo/evaluation/metrics.py", "src/capo/evaluation/stats.py",
              "src/capo/rollout/step.py"]:
        assert f in mutated
    # a file in two modules only where each mutates its own functions (FUNCTIONS), none in both
    owners = {f: [mod for mod, (files, _, _) in m.MODULES.items() if f in files] for f in mutated}
    for f, mods in owners.items():
        if len(mods) > 1:
            assert all(mod in m.FUNCTIONS for mod in mods), f"{f} is in {mods}, not all limited to functions"
            names = [g.replace("*", "x") for mod in mods for g in m.FUNCTIONS[mod]]  # a mutant name per glob
            for name in names:
                hits = [mod for mod in mods if any(fnmatch.fnmatch(name, g) for g in m.FUNCTIONS[mod])]
                assert len(hits) == 1, f"{name} would be mutated by {hits}"


def test_score_counts_timeouts_as_detected_and_no_tests_as_missed():
    m = load()
    assert m.score({"killed": 6, "timeout": 1, "survived": 2, "no tests": 1, "not checked": 5}) == 0.7
    assert m.counts_of({"a": "killed", "b": "survived", "c": "killed"}) == {"killed": 2, "survived": 1}


def test_function_restrictions_name_functions_that_exist():
    """Each glob of FUNCTIONS is ``<file's module>.*`` (all of one file), ``<module>.x_<function>__mutmut_*`` or
    ``<module>.x\u01c1<Class>\u01c1<method or *>``, naming a file of the module and a function / class in it."""
    m = load()
    for module, globs in m.FUNCTIONS.items():
        files = {f.removeprefix("src/").removesuffix(".py").replace("/", "."): (ROOT / f).read_text()
                 for f in m.MODULES[module][0]}
        for g in globs:
            dotted = next((d for d in files if g.startswith(d + ".")), None)
            assert dotted, f"{module}: {g} names none of its files"
            rest, source = g.removeprefix(dotted + "."), files[dotted]
            if rest == "*":
                continue
            if rest.startswith("x\u01c1"):
                cls, _, method = rest.removeprefix("x\u01c1").partition("\u01c1")
                assert f"class {cls}(" in source or f"class {cls}:" in source, f"{module}: no class {cls}"
                name = method.removesuffix("__mutmut_*")
                assert name == "*" or f"    def {name}(" in source, f"{module}: {name} is not a method of {cls}"
            else:
                assert rest.startswith("x_") and rest.endswith("__mutmut_*"), g
                assert f"\ndef {rest[2:].removesuffix('__mutmut_*')}(" in source, f"{module}: {g} names no function"
