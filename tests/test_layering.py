"""The architecture is enforced: lower layers never import higher ones, and the core imports no engine."""

import ast
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "capo"
ORDER = ["core", "verify", "tasks", "evaluation", "trainer", "adapters", "cli"]
# what each layer may import from capo (besides itself and capo.errors)
ALLOWED = {
    "core": set(),
    "verify": {"core"},
    "tasks": {"core", "verify"},
    "evaluation": {"core", "verify", "tasks"},
    "trainer": {"core", "verify", "tasks", "evaluation"},
    "adapters": {"core", "verify", "tasks"},
    "cli": set(ORDER),
}
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


def test_importing_core_loads_no_engine():
    code = (
        "import sys, capo.core; bad = [m for m in sys.modules if m.split('.')[0] in "
        f"{sorted(FORBIDDEN_IN_CORE)!r} or m.startswith(('capo.trainer', 'capo.cli', 'capo.adapters'))]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
