"""scripts/mutate.py's configuration is sane (the mutation run itself is `make mutate`, not part of the tests)."""

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
        section = tomllib.loads(m.mutmut_section(files, tests, pytest_args))["tool"]["mutmut"]
        assert section["only_mutate"] == files and section["pytest_add_cli_args_test_selection"] == tests


def test_the_issue_41_scope_is_configured():
    m = load()
    mutated = {f for files, _, _ in m.MODULES.values() for f in files}
    core = {f"src/capo/core/{p.name}" for p in (ROOT / "src/capo/core").glob("*.py") if p.name != "__init__.py"}
    assert core <= mutated, f"core files not in any module: {sorted(core - mutated)}"
    for f in ["src/capo/verify/verifier.py", "src/capo/evaluation/metrics.py", "src/capo/evaluation/stats.py",
              "src/capo/rollout/step.py"]:
        assert f in mutated
    assert len(mutated) == sum(len(files) for files, _, _ in m.MODULES.values()), "a file is in two modules"


def test_score_counts_timeouts_as_detected_and_no_tests_as_missed():
    m = load()
    assert m.score({"killed": 6, "timeout": 1, "survived": 2, "no tests": 1, "not checked": 5}) == 0.7
    assert m.counts_of({"a": "killed", "b": "survived", "c": "killed"}) == {"killed": 2, "survived": 1}


def test_function_restrictions_name_methods_that_exist():
    m = load()
    for module, globs in m.FUNCTIONS.items():
        (path,) = m.MODULES[module][0]
        source = (ROOT / path).read_text()
        dotted = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
        for g in globs:
            assert g.startswith(dotted + ".x\u01c1") and g.endswith("__mutmut_*"), g
            name = g.removesuffix("__mutmut_*").rpartition("\u01c1")[2]
            assert f"    def {name}(" in source, f"{module}: {name} is not a method of {path}"
