"""No module in src/ reaches into another module's private names.

A name that starts with one underscore is its module's own; a helper another module needs is made public (named,
documented) where it lives. Checked on the source, lazy imports inside functions included:
- ``from capo.x import _y`` where ``_y`` is a function, class or constant of ``capo.x`` (not a submodule);
- ``from capo.x._p import y`` / ``from capo.x import _p`` (a private module) outside the package ``capo.x``;
- ``m._y`` where ``m`` names another capo module (``from capo import x as m``, ``import capo.x as m``).
A private submodule is its package's: modules of the same package may import it (``capo.verify._worker``).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(src: Path, dotted: str) -> bool:
    p = src.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _inside(mod: str, owner: str) -> bool:
    return mod == owner or mod.startswith(owner + ".")


def _from_import_problems(src: Path, mod: str, pkg: str, node: ast.ImportFrom, aliases: dict) -> list[str]:
    out = []
    parts = node.module.split(".")
    for k, part in enumerate(parts):
        if _private(part) and not _inside(mod, ".".join(parts[:k])):
            out.append(f"from private module {node.module}")
    for a in node.names:
        full = f"{node.module}.{a.name}"
        if _is_module(src, full):
            aliases[a.asname or a.name] = full
            if _private(a.name) and node.module != pkg:
                out.append(f"private module {full} from outside its package")
        elif _private(a.name) and node.module != mod:
            out.append(f"from {node.module} import {a.name}")
    return out


def private_uses(src: Path) -> list[str]:
    """Every use of another module's private name under ``src`` (a folder holding the ``capo`` package)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        mod = _module_name(src, path)
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases: dict[str, str] = {}
        problems: list[tuple[int, str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("capo"):
                problems += [(node.lineno, p) for p in _from_import_problems(src, mod, pkg, node, aliases)]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("capo") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = aliases[node.value.id]
                if _private(node.attr) and target != mod and not _is_module(src, f"{target}.{node.attr}"):
                    problems.append((node.lineno, f"{node.value.id}.{node.attr} of {target}"))
        found += [f"{path.relative_to(src)}:{line}: {what}" for line, what in sorted(problems)]
    return found


def test_no_module_uses_another_modules_private_names():
    found = private_uses(SRC)
    assert not found, "private names used across modules (make the helper public where it lives):\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_private_use(tmp_path):
    files = {
        "capo/__init__.py": "",
        "capo/a/__init__.py": "",
        "capo/a/own.py": "_HELPER = 1\ndef _f():\n    return _HELPER\n",
        "capo/a/_hidden.py": "X = 1\n",
        "capo/a/sibling.py": "from capo.a import _hidden\nfrom capo.a._hidden import X\n",  # same package: fine
        "capo/b/__init__.py": "",
        "capo/b/user.py": ("from capo.a.own import _f\nfrom capo.a import own as o\nfrom capo.a._hidden import X\n"
                           "def g():\n    from capo.a import _hidden\n    return o._HELPER + o.__name__.count('')\n"),
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = private_uses(tmp_path)
    assert all(f.startswith("capo/b/user.py:") for f in found), found
    assert [f.split(": ", 1)[1] for f in found] == [
        "from capo.a.own import _f", "from private module capo.a._hidden",
        "private module capo.a._hidden from outside its package", "o._HELPER of capo.a.own"]
