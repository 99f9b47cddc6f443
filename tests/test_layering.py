"""The architecture is enforced: lower layers never import higher ones, and the core imports no engine."""

import ast
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "capo"
ORDER = ["core", "verify", "tasks", "rollout", "evaluation", "trainer", "adapters", "sweep", "cli"]
# what each layer may import from capo (besides itself and the leaf modules capo.errors, capo.processes, capo.rundir
# and capo.settings); docs/architecture.md states the same table
ALLOWED = {
    "core": set(),
    "verify": {"core"},
    "tasks": {"core", "verify"},
    "rollout": {"core", "verify", "tasks"},
    "evaluation": {"core", "verify", "tasks", "rollout"},
    "trainer": {"core", "verify", "tasks", "rollout"},
    "adapters": {"core", "verify", "rollout"},
    "sweep": {"evaluation", "trainer"},  # runs `capo train` / `capo eval` in subprocesses; reads their outputs
    "cli": set(ORDER),
}
# top-level modules any layer may use, and what of capo each imports
LEAVES = {"errors.py": set(), "processes.py": set(), "rundir.py": {"errors"}, "settings.py": set()}
FORBIDDEN_IN_CORE = {"transformers", "trl", "verl", "accelerate", "datasets", "math_verify", "matplotlib"}


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_layers_import_only_downwards():
    bad = []
    for layer in ORDER:
        for f in (SRC / layer).rglob("*.py"):
            for mod in _imports(f):
                parts = mod.split(".")
                if parts[0] == "capo" and len(parts) > 1 and parts[1] in ORDER and parts[1] != layer:
                    if parts[1] not in ALLOWED[layer]:
                        bad.append(f"{f.relative_to(SRC)} imports {mod}")
                if layer == "core" and parts[0] in FORBIDDEN_IN_CORE:
                    bad.append(f"{f.relative_to(SRC)} imports {mod}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_layer_table_is_complete_and_leaves_import_no_layer():
    """Every package under capo/ is in the table, and the leaf modules import nothing of capo but other leaves."""
    packages = {d.name for d in SRC.iterdir() if d.is_dir() and (d / "__init__.py").exists()}
    assert packages - {"assets", "presets"} == set(ORDER)
    modules = {f.name for f in SRC.glob("*.py")} - {"__init__.py"}
    assert modules == set(LEAVES), modules
    for leaf, allowed in LEAVES.items():
        used = {m.split(".")[1] for m in _imports(SRC / leaf) if m.startswith("capo.")}
        assert used <= allowed, f"{leaf} imports {used - allowed}"


def test_docs_state_the_same_table():
    """docs/architecture.md's layer table lists the same 'may import' sets as ALLOWED."""
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    rows = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`capo.") and cells[0].rstrip("`").split(".")[1] in ORDER:
            rows[cells[0].strip("`").split(".")[1]] = {x.strip() for x in cells[2].split(",")} - {"torch", "numpy",
                                                                                                     "stdlib", "—"}
    assert set(rows) == set(ORDER), sorted(rows)
    for layer in ORDER:
        want = set(ORDER) - {layer} if layer == "cli" else ALLOWED[layer]
        got = set(ORDER) - {layer} if rows[layer] == {"everything"} else rows[layer]
        assert got == want, f"docs/architecture.md: {layer} may import {sorted(got)}, the test says {sorted(want)}"


def test_importing_core_loads_no_engine():
    code = (
        "import sys, capo.core; bad = [m for m in sys.modules if m.split('.')[0] in "
        f"{sorted(FORBIDDEN_IN_CORE)!r} or m.startswith(('capo.trainer', 'capo.cli', 'capo.adapters'))]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out


def _module_graph() -> dict[str, set[str]]:
    """capo module -> the capo modules it imports (any import in the file, lazy ones included; a name imported from
    a package counts as its submodule when one of that name exists; package __init__ files are left out)."""
    mods = {".".join(("capo", *f.relative_to(SRC).with_suffix("").parts)): f for f in SRC.rglob("*.py")
            if f.name != "__init__.py"}
    graph = {}
    for name, f in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods}
                deps |= {node.module} & set(mods)
        graph[name] = deps - {name}
    return graph


def test_no_import_circles():
    """No module reaches itself through imports (lazy imports inside functions included): a circle hides a layer
    boundary inside a package and makes import order matter."""
    graph, circles = _module_graph(), []
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                circles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not circles, "import circles:\n" + "\n".join(circles)

