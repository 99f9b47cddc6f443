"""The mutation-testing score table of docs/testing.md, generated from docs/data/mutation.json.

The data file holds each module's scores (the columns of the table) and every survivor left, with the reason it was
left; the page shows only the table, between the markers ``<!-- mutation-table -->`` and
``<!-- /mutation-table -->``. After a mutation run (``make mutate``), edit the module's entry in the data file and run

    python scripts/mutation_table.py            # rewrite the table in docs/testing.md
    python scripts/mutation_table.py --check    # exit 1 if the page's table differs from the data

``tests/test_mutation_table.py`` runs the check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "mutation.json"
PAGE = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- mutation-table -->", "<!-- /mutation-table -->"
HEADER = ("| module (files mutated) | mutants | before | after | survivors left | run time (first run; reruns) |\n"
          "|---|---:|---:|---:|---:|---:|")


def _pct(x: float, note: str | None = None) -> str:
    return f"{x:.1f}%" + (f" ({note})" if note else "")


def render(data: dict) -> str:
    """The Markdown table of ``data["modules"]``, one row per module in the data's order, and the total."""
    rows = [HEADER]
    for m in data["modules"]:
        if m["mutants"] is None:  # a configured module not run yet: say so, with why
            rows.append(f"| `{m['module']}` ({m['files']}) | -- | | | {m['not_run']} | |")
            continue
        rows.append(f"| `{m['module']}` ({m['files']}) | {m['mutants']} | {_pct(m['before'], m.get('before_note'))} "
                    f"| **{_pct(m['after'])}** | {m['left']}: {m['left_note']} | {m['run_time']} |")
    total = sum(m["mutants"] or 0 for m in data["modules"])
    rows.append(f"| all {len(data['modules'])} modules | {total} | | | | |")
    return "\n".join(rows)


def replace_table(page: str, table: str) -> str:
    """``page`` with the text between the markers replaced by ``table``; a page without both markers is an error."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN} ... {END} block for the mutation table")
    return page[:start + len(BEGIN)] + "\n\n" + table + "\n\n" + page[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page's table differs from the data")
    a = ap.parse_args(argv)
    page = PAGE.read_text()
    new = replace_table(page, render(json.loads(DATA.read_text())))
    if a.check:
        if new != page:
            print(f"{PAGE.relative_to(ROOT)}: the mutation table differs from {DATA.relative_to(ROOT)}; "
                  "run python scripts/mutation_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
