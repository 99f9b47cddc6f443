"""Functions stay readable: none in src/ is longer than 60 lines (docstring included)."""

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "capo"
LIMIT = 60


def test_no_function_over_60_lines():
    long = []
    for f in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = node.end_lineno - first + 1
                if n > LIMIT:
                    long.append(f"{f.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)
