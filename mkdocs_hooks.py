"""mkdocs hook (mkdocs.yml `hooks:`): tables generated at build time from capo itself, so a page cannot drift from
the code. A page asks for one with its marker:

- ``<!-- capo train fields -->``: the training configuration's fields, one table per section, from
  ``capo.trainer.config.fields_help()`` (the source of ``capo train --help``). The fields are declared as
  ``knob(default, help)``: their help lives in the dataclass field's metadata, which a docstring reader cannot see.
- ``<!-- capo registries -->``: every name of ``capo.core``'s registries and the function it names, as a
  cross-reference that the strict build checks against the API reference.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent / "src"


def _cell(text: str) -> str:
    """One table cell: HTML-escaped (help texts quote tags such as <answer>), pipes escaped, on one line."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def fields_tables() -> str:
    """Markdown: a heading and a table per section, a row per field: flag, type, default, help."""
    from capo.trainer.config import fields_help

    out, section = [], None
    for name, help_text, default, type_name in fields_help():
        sec = name.split(".")[0]
        if sec != section:
            section = sec
            out += [f"\n## `{sec}`\n", "| flag | type | default | what it sets |", "|---|---|---|---|"]
        out.append(f"| `--{name}` | {_cell(type_name)} | `{_cell(repr(default))}` | {_cell(help_text)} |")
    return "\n".join(out) + "\n"


def registry_tables() -> str:
    """Markdown: a table per registry of ``capo.core``, a row per name: the name and the function it looks up."""
    import capo.core as core

    out = []
    for attr in ("ADVANTAGES", "POLICY_LOSSES", "REWARDS", "CONFIDENCES"):
        reg = getattr(core, attr)
        out += [f"\n### `{attr}` ({reg.kind})\n", "| name | function |", "|---|---|"]
        for name in reg.names():
            fn = reg.get(name)
            path = f"{fn.__module__}.{fn.__qualname__}"
            out.append(f"| `{name}` | [`{fn.__name__}`][{path}] |")
    return "\n".join(out) + "\n"


TABLES = {"<!-- capo train fields -->": fields_tables, "<!-- capo registries -->": registry_tables}


def on_page_markdown(markdown: str, **kwargs) -> str:
    for marker, table in TABLES.items():
        if marker in markdown:
            if str(SRC) not in sys.path:  # document the checkout being built, whichever capo the venv installed
                sys.path.insert(0, str(SRC))
            markdown = markdown.replace(marker, table())
    return markdown
