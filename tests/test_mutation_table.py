"""docs/testing.md's mutation-testing table is the one docs/data/mutation.json gives (scripts/mutation_table.py), and
the data covers exactly the modules scripts/mutate.py mutates, each survivor filed under one of them."""

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"capo_{name}_script", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_page_shows_the_table_of_the_data():
    t = load("mutation_table")
    page, data = t.PAGE.read_text(), json.loads(t.DATA.read_text())
    assert t.replace_table(page, t.render(data)) == page, "run python scripts/mutation_table.py"
    assert t.main(["--check"]) == 0


def test_a_changed_score_or_a_missing_block_is_caught(tmp_path):
    t = load("mutation_table")
    page, data = t.PAGE.read_text(), json.loads(t.DATA.read_text())
    changed = copy.deepcopy(data)
    changed["modules"][0]["after"] -= 0.1
    assert t.replace_table(page, t.render(changed)) != page
    with pytest.raises(ValueError, match="mutation-table"):
        t.replace_table("# Testing\nno table here\n", t.render(data))


def test_render_by_hand():
    t = load("mutation_table")
    data = {"modules": [{"module": "core.x", "files": "x.py", "mutants": 10, "before": 50.0, "before_note": "8 run",
                         "after": 90.0, "left": 1, "left_note": "equivalent", "run_time": "1 min"}]}
    assert t.render(data).splitlines()[2:] == [
        "| `core.x` (x.py) | 10 | 50.0% (8 run) | **90.0%** | 1: equivalent | 1 min |", "| all 1 modules | 10 | | | | |"]
    data["modules"].append({"module": "tasks.y", "files": "y.py", "mutants": None, "not_run": "not run yet: moved"})
    assert t.render(data).splitlines()[3:] == [
        "| `tasks.y` (y.py) | -- | | | not run yet: moved | |", "| all 2 modules | 10 | | | | |"]


def test_the_data_covers_the_configured_modules_and_files_each_survivor_under_one():
    data = json.loads((ROOT / "docs" / "data" / "mutation.json").read_text())
    names = [m["module"] for m in data["modules"]]
    assert sorted(names) == sorted(load("mutate").MODULES), "docs/data/mutation.json and scripts/mutate.py differ"
    assert len(names) == len(set(names))
    run = [m for m in data["modules"] if m["mutants"] is not None]
    for m in run:
        assert 0 <= m["before"] <= m["after"] <= 100 and m["mutants"] > 0 and 0 <= m["left"] <= m["mutants"], m
    for m in data["modules"]:  # a configured module not run yet says why and carries no score
        if m["mutants"] is None:
            assert m["not_run"] and not {"before", "after", "left"} & set(m), m
    for s in data["survivors"]:
        assert s["modules"] and set(s["modules"]) <= {m["module"] for m in run}, s
        assert s["change"] and s["why"] and s["status"], s
    assert {n for s in data["survivors"] for n in s["modules"]} == {m["module"] for m in run}, \
        "a module without its survivors"
