"""mkdocs hook (mkdocs.yml `hooks:`): the training configuration's fields as one table per section, generated at
build time from ``capo.trainer.config.fields_help()``, the same source as ``capo train --help``. A page asks for
the tables with the marker below. The fields are declared as ``knob(default, help)`` (their help lives in the
dataclass field's metadata, which a docstring reader cannot see), hence a hook rather than mkdocstrings."""

from __future__ import annotations

import html
import sys
from pathlib import Path

MARKER = "<!-- capo train fields -->"
SRC = Path(__file__).resolve().parent / "src"


def _cell(text: str) -> str:
    """One table cell: HTML-escaped (help texts quote tags such as <answer>), pipes escaped, on one line."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def fields_tables(rows: list[tuple[str, str, object, str]]) -> str:
    """Markdown: a heading and a table per section, a row per field: flag, type, default, help."""
    out, section = [], None
    for name, help_text, default, type_name in rows:
        sec = name.split(".")[0]
        if sec != section:
            section = sec
            out += [f"\n## `{sec}`\n", "| flag | type | default | what it sets |", "|---|---|---|---|"]
        out.append(f"| `--{name}` | {_cell(type_name)} | `{_cell(repr(default))}` | {_cell(help_text)} |")
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, **kwargs) -> str:
    if MARKER not in markdown:
        return markdown
    if str(SRC) not in sys.path:  # document the checkout being built, whichever capo the environment installed
        sys.path.insert(0, str(SRC))
    from capo.trainer.config import fields_help

    return markdown.replace(MARKER, fields_tables(fields_help()))
