"""Links and citations into the documents resolve, and no page grows into a notebook.

- Every `[text](#anchor)` and `[text](file.md#anchor)` in the Markdown files names a heading that exists.
- Every place that cites a section of a page by its name in double quotes after the page's path
  (`docs/testing.md, "Mutation testing"`, `results/facts.md "Facts: the step"`, `findings.md ("...")`) names a page
  that exists and one of its headings (a prefix of it is enough). Pages are reorganised as results arrive; a renamed
  heading or a moved section must take its references along.
- Every `docs/....md` path named in the code or the documents exists (CHANGELOG.md, which is history, may name pages
  that were).
- No page under docs/ is longer than 800 lines: findings read in minutes, details are split by question.
- No citation in the code or the documents points outside the repository (a private notes file, an issue number)."""

import re
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKDOWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "sweeps" / "README.md", *sorted(DOCS.rglob("*.md"))]
CITING = [*MARKDOWN, *sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "src").rglob("*.yaml")),
          *sorted((ROOT / "scripts").glob("*.py")), *sorted((ROOT / "tests").rglob("*.py")),
          *sorted((ROOT / "benchmarks").glob("*.py"))]
CITING.remove(Path(__file__).resolve())  # this file's examples cite pages that do not exist, on purpose
LINK = re.compile(r"\]\(([^)\s]*?)#([^)\s]+)\)")
# page.md, "Name" / page.md "Name" / page.md ("Name"), the page given by a path (docs/results/x.md, results/x.md,
# x.md); the name may wrap onto the next line, and inside a Python string its quotes may be escaped (\"Name\")
CITATION = re.compile(r'(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md),?\s+\(?\\?"([^"\\]+)\\?"')
# a docs page named by its path from the repository root
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/(?:[\w.-]+/)*[\w.-]+\.md\b")
MAX_PAGE_LINES = 800


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
    # the rules the other tests rely on, on headings of the kinds the pages use (numbers, code, parentheses)
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


def cited_page(name: str, citing: Path, root: Path = ROOT) -> Path | None:
    """The page a citation names: a path from the repository root, from the citing file's folder, or from docs/."""
    for base in (root, citing.parent, root / "docs"):
        if (base / name).is_file():
            return base / name
    return None


def bad_citations(path: Path, root: Path = ROOT) -> list[str]:
    """Each citation in ``path`` whose page does not exist or has no heading starting with the cited name."""
    bad = []
    for name, cited in CITATION.findall(path.read_text()):
        cited = " ".join(cited.split())  # a name wrapped over two lines
        page = cited_page(name, path, root)
        if page is None:
            bad.append(f"{path.relative_to(root)}: {name} does not exist (cited for {cited!r})")
        elif not any(h.startswith(cited) for h in headings(page.read_text())):
            bad.append(f"{path.relative_to(root)}: {name} has no heading starting with {cited!r}")
    return bad


def test_a_citation_of_a_missing_page_or_heading_is_reported(tmp_path):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "facts.md").write_text("# Facts\n## Facts: the step\n")
    (tmp_path / "docs" / "findings.md").write_text("# Findings\n## What did not hold\n")
    code = tmp_path / "code.py"
    code.write_text('"""docs/results/facts.md, "Facts: the step"; results/facts.md ("Facts: the"); findings.md "What\n'
                    '    did not hold"""\nmsg = "(docs/results/facts.md, \\"Facts: the step\\")"\n'
                    '# docs/results/facts.md, "Facts: the sweep"; docs/results.md, "Facts: the step"\n')
    assert bad_citations(code, tmp_path) == [
        "code.py: docs/results/facts.md has no heading starting with 'Facts: the sweep'",
        "code.py: docs/results.md does not exist (cited for 'Facts: the step')"]


def test_cited_sections_exist():
    bad = [b for path in CITING for b in bad_citations(path)]
    assert not bad, "citations of pages or headings that do not exist:\n" + "\n".join(bad)


def missing_pages(path: Path, root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}: {m}" for m in DOCS_PATH.findall(path.read_text()) if not (root / m).is_file()]


def test_a_named_docs_page_exists(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "findings.md").write_text("# Findings\n")
    doc = tmp_path / "d.py"
    doc.write_text("see docs/findings.md and docs/results.md; mydocs/x.md is not a docs page\n")
    assert missing_pages(doc, tmp_path) == ["d.py: docs/results.md"]


def test_docs_pages_named_in_the_code_and_documents_exist():
    bad = [b for path in CITING if path.name != "CHANGELOG.md" for b in missing_pages(path)]
    assert not bad, "docs pages that do not exist:\n" + "\n".join(bad)


def long_pages(root: Path = ROOT) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for p in sorted((root / "docs").rglob("*.md"))
            if (n := len(p.read_text().splitlines())) > MAX_PAGE_LINES]


def test_a_long_page_is_reported(tmp_path):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "short.md").write_text("line\n" * MAX_PAGE_LINES)
    (tmp_path / "docs" / "results" / "long.md").write_text("line\n" * (MAX_PAGE_LINES + 1))
    assert long_pages(tmp_path) == [f"docs/results/long.md: {MAX_PAGE_LINES + 1} lines"]


def test_no_docs_page_is_longer_than_800_lines():
    bad = long_pages()
    assert not bad, f"pages over {MAX_PAGE_LINES} lines (split them by question):\n" + "\n".join(bad)


# a citation only a reader with the project's private notes or its issue tracker could follow: the notes file named
# in the pattern (outside the repository) or the word issue with a number after it, spaced, hyphenated, joined or
# underscored as in a test name; CHANGELOG.md (history) may name issues, so it is not read
UNRESOLVABLE = re.compile(r"algorithms\.md|(?<![a-z])issues?[ _-]?#?\d+", re.IGNORECASE)
TEXT = {".md", ".py", ".yaml", ".sh"}
READER_FACING = [ROOT / "README.md", ROOT / "sweeps" / "README.md", *sorted((ROOT / "sweeps").glob("*.yaml")),
                 *(p for folder in ("docs", "src", "tests", "benchmarks", "scripts", "examples", "sweeps/pilots",
                                    "sweeps/analysis") for p in sorted((ROOT / folder).rglob("*")) if p.suffix in TEXT)]
# files whose string literals feed the checker citations on purpose (this file: its tests plant them); their
# comments and docstrings are still read
QUOTES_CITE_ON_PURPOSE = {Path(__file__).resolve()}


def _string_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (line, column) of each string literal in a Python file, docstrings excepted."""
    with path.open("rb") as fh:
        tokens = list(tokenize.tokenize(fh.readline))
    spans, after = [], tokenize.NEWLINE  # a docstring is a string that opens a logical line and ends it
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.STRING and not (after in {tokenize.NEWLINE, tokenize.INDENT, tokenize.ENCODING}
                                                and tokens[i + 1].type == tokenize.NEWLINE):
            spans.append((tok.start, tok.end))
        if tok.type not in {tokenize.NL, tokenize.COMMENT, tokenize.DEDENT}:
            after = tok.type
    return spans


def unresolvable_citations(path: Path, root: Path = ROOT, strings: bool = True) -> list[str]:
    """Each unresolvable citation in a file as 'path:line: match'; ``strings=False`` skips a Python file's string
    literals (docstrings are read)."""
    spans = [] if strings else _string_spans(path)
    return [f"{path.relative_to(root)}:{i}: {m.group(0)!r}" for i, line in enumerate(path.read_text().splitlines(), 1)
            for m in UNRESOLVABLE.finditer(line) if not any(s <= (i, m.start()) < e for s, e in spans)]


def test_unresolvable_citation_is_reported(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("see algorithms.md Sec. 10\nas issue 14 found; Issue 18 methods; issue-18 presets (issue 41)\n"
                   "the issue's target; tissue 3; reissued 2 times\n")
    assert unresolvable_citations(doc, tmp_path) == ["d.md:1: 'algorithms.md'", "d.md:2: 'issue 14'",
                                                      "d.md:2: 'Issue 18'", "d.md:2: 'issue-18'", "d.md:2: 'issue 41'"]


def test_an_issue_number_in_a_test_name_or_a_sweep_comment_is_reported(tmp_path):
    (tmp_path / "tests").mkdir()
    code = tmp_path / "tests" / "test_x.py"
    code.write_text("def test_trl_issue18_estimators():\n    pass\n\n\ndef test_the_Issue_41_scope():\n    pass\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("# Issue #50, item 4: the price of the variant\nname: tissue_3\n")
    assert unresolvable_citations(code, tmp_path) == ["tests/test_x.py:1: 'issue18'", "tests/test_x.py:5: 'Issue_41'"]
    assert unresolvable_citations(spec, tmp_path) == ["spec.yaml:1: 'Issue #50'"]


def test_skipping_string_literals_still_reads_comments_and_docstrings(tmp_path):
    code = tmp_path / "test_checker.py"
    code.write_text('"""Docstring: issue 7."""\n# comment: issue 8\nPLANTED = "issue 9"  # issue 10\n'
                    'def f():\n    """issue 11"""\n    return ("issue 12",\n            "issue 13")\n')
    every = ["issue 7", "issue 8", "issue 9", "issue 10", "issue 11", "issue 12", "issue 13"]
    assert [b.split(": ", 1)[1].strip("'") for b in unresolvable_citations(code, tmp_path)] == every
    assert [b.split(": ", 1)[1].strip("'") for b in unresolvable_citations(code, tmp_path, strings=False)] == [
        "issue 7", "issue 8", "issue 10", "issue 11"]


def test_the_citation_check_reads_tests_scripts_benchmarks_examples_and_sweeps():
    read = {p.relative_to(ROOT).as_posix() for p in READER_FACING}
    for f in ["README.md", "sweeps/README.md", "sweeps/word_grpo_capo.yaml", "src/capo/__init__.py",
              "tests/test_layering.py", "tests/adapters/test_trl_methods.py", "benchmarks/eval_engines.py",
              "scripts/mutate.py", "scripts/gpu-check.sh", "examples/trl/capo_grpo.py",
              "sweeps/pilots/facts_prompt.py", "sweeps/analysis/stochastic_lm_landing.py", "tests/test_docs_links.py"]:
        assert f in read, f
    assert not any(f.startswith("sweeps/records/") or f == "CHANGELOG.md" for f in read)


def test_citations_resolve_from_the_repository():
    bad = [b for path in READER_FACING
           for b in unresolvable_citations(path, strings=path.resolve() not in QUOTES_CITE_ON_PURPOSE)]
    assert not bad, ("cite the paper (arXiv id, equation) and the docs/ section instead of a file outside the "
                     "repository or an issue number:\n" + "\n".join(bad))
