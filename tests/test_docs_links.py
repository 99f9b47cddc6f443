"""Links into the documents resolve: every `[text](#anchor)` and `[text](file.md#anchor)` in the Markdown files names a
heading that exists, and every place that cites a section of docs/results.md by its name in double quotes after the
file name names one of its headings. docs/results.md is reorganised as results arrive; a renamed heading must
take its references along. And no citation in the code or the documents points outside the repository (a private
notes file, an issue number)."""

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
CITING = [*MARKDOWN, *sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py")),
          *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]
LINK = re.compile(r"\]\(([^)\s]*?)#([^)\s]+)\)")
# results.md, "Name" / results.md "Name" / results.md ("Name"); the name may wrap onto the next line
CITATION = re.compile(r'results\.md,?\s+\(?"([^"]+)"')


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    """The headings of a Markdown text, outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            out.append(m.group(1).strip())
    return out


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown text defines; repeated headings get GitHub's -1, -2, ... suffixes."""
    seen: Counter[str] = Counter()
    out = set()
    for h in headings(text):
        s = slug(h)
        out.add(s if not seen[s] else f"{s}-{seen[s]}")
        seen[s] += 1
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    bad = []
    for target, anchor in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        doc = path if not target else (path.parent / target).resolve()
        if not doc.exists() or anchor not in anchors(doc.read_text()):
            bad.append(f"{path.relative_to(root)}: ({target}#{anchor})")
    return bad


def test_slug_and_anchor_rules():
    # the rules the other tests rely on, on headings of the kinds results.md uses (numbers, code, parentheses)
    text = "# A\n## 1. What capo shows: calibration\n### `capo eval` on GSM8K (k = 4)\n## Reading\n## Reading\n"
    assert anchors(text) == {"a", "1-what-capo-shows-calibration", "capo-eval-on-gsm8k-k--4", "reading", "reading-1"}


def test_broken_link_is_reported(tmp_path):
    doc, other = tmp_path / "d.md", tmp_path / "e.md"
    other.write_text("# Other\n")
    doc.write_text("# Title\n[ok](#title) [bad](#no-such-heading) [web](https://x.org/#frag) [x](e.md#other) "
                   "[y](e.md#title) [z](missing.md#other)\n")
    assert broken_links(doc, tmp_path) == ["d.md: (#no-such-heading)", "d.md: (e.md#title)", "d.md: (missing.md#other)"]


def test_markdown_anchor_links_resolve():
    bad = [b for path in MARKDOWN for b in broken_links(path)]
    assert not bad, "links to headings that do not exist:\n" + "\n".join(bad)


def test_cited_results_sections_exist():
    names = headings((ROOT / "docs" / "results.md").read_text())
    bad = []
    for path in CITING:
        for cited in CITATION.findall(path.read_text()):
            cited = " ".join(cited.split())  # a name wrapped over two lines
            if not any(h.startswith(cited) for h in names):
                bad.append(f"{path.relative_to(ROOT)}: {cited!r}")
    assert not bad, "docs/results.md has no heading starting with:\n" + "\n".join(bad)


# a citation only a reader with the project's private notes or its issue tracker could follow: "algorithms.md
# Sec. 6" (a file outside the repository) or "issue 14" / "issue-18" / "(issue 41)"; CHANGELOG.md may name issues
UNRESOLVABLE = re.compile(r"algorithms\.md|\bissues?[ -]#?\d+", re.IGNORECASE)
READER_FACING = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
                             *sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "src").rglob("*.yaml"))]
                 if p.name != "CHANGELOG.md"]


def unresolvable_citations(path: Path, root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{i}: {m.group(0)!r}" for i, line in enumerate(path.read_text().splitlines(), 1)
            for m in UNRESOLVABLE.finditer(line)]


def test_unresolvable_citation_is_reported(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("see algorithms.md Sec. 10\nas issue 14 found; Issue 18 methods; issue-18 presets (issue 41)\n"
                   "the issue's target; tissue 3; reissued 2 times\n")
    assert unresolvable_citations(doc, tmp_path) == ["d.md:1: 'algorithms.md'", "d.md:2: 'issue 14'",
                                                      "d.md:2: 'Issue 18'", "d.md:2: 'issue-18'", "d.md:2: 'issue 41'"]


def test_citations_resolve_from_the_repository():
    bad = [b for path in READER_FACING for b in unresolvable_citations(path)]
    assert not bad, ("cite the paper (arXiv id, equation) and the docs/ section instead of a file outside the "
                     "repository or an issue number:\n" + "\n".join(bad))
