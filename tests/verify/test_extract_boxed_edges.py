"""Edges of ``extract_boxed``, ``normalize_number`` and ``extract_answer``'s empty answers that the first tests left
open (mutation testing: the ``verify.extract`` survivors, docs/testing.md "Mutation testing")."""

import pytest

from capo.verify.extract import _match_braces, extract_answer, extract_boxed, extract_last_number, normalize_number


@pytest.mark.parametrize("text, want", [
    (r"x\boxed{5}", "5"),  # the box starts at index 1
    (r"\fbox{\fbox{1}+1}", r"\fbox{1}+1"),  # the outer box: the search starts at the first \fbox
    (r"\boxed{\boxed{1}+2}", r"\boxed{1}+2"),  # a box nested in a chosen box is part of its content
    (r"\boxed{ \boxed{1} + 2 }", r"\boxed{1} + 2"),  # content starting with a box but not only one box
    (r"\boxed{\boxed{1}} \boxed{3}", "3"),  # a later top-level box after a nested one wins
    (r"\boxed{1 \boxed{2}", "2"),  # an unclosed box before a complete one is skipped
    (r"\boxed{1}\boxed 2", "2"),  # a bare box right after the closing brace is later
    (r"\boxed{\boxed 1 + 2}", r"\boxed 1 + 2"),  # a bare box inside a braced one is content
    (r"\boxed 1 \boxed{2}", "2"),
    (r"\boxed{2} \boxed 1", "1"),
])
def test_extract_boxed_takes_the_last_top_level_box(text, want):
    assert extract_boxed(text) == want


def test_match_braces_pairs_unescaped_braces_from_start():
    assert _match_braces("{a{b}}") == {0: 5, 2: 4}  # default start 0: the brace at index 0 counts
    assert _match_braces("{a}{b}", 3) == {3: 5}  # braces before start are not scanned
    assert _match_braces("{a}{b}", 1) == {3: 5}
    assert _match_braces(r"\{x}{y}") == {4: 6}  # \{ is no brace; the lone } is unmatched
    assert _match_braces("{{}") == {1: 2}  # an unmatched opener is absent


@pytest.mark.parametrize("s, want", [
    ("1 234", "1234"), (" 1 234 . ", "1234"), ("10X", "10X"), ("1.5X", "1.5X"), (" 7x ", "7x"),
    (".0", "0"), (".000", "0"), ("0.0", "0"), ("-0.0", "0"), ("-.0", "0"), ("-.00", "0"), ("$-.0", "0"),
    ("-.50", "-.5"), ("100", "100"), ("-100.0", "-100"),
])
def test_normalize_number_edges(s, want):
    assert normalize_number(s) == want


def test_a_negative_zero_without_leading_digit_is_zero():
    """Found by the mutation analysis: "-.0" was normalised to "-" (the sign left after its zeros were cut)."""
    assert extract_last_number("so x = -.0") == "0"
    assert extract_answer("#### -.00", "gsm8k") == "0"


@pytest.mark.parametrize("fmt", ["boxed", "auto"])
def test_an_empty_box_is_no_answer_and_takes_the_fallback(fmt):
    assert extract_boxed(r"\boxed{}") == ""
    assert extract_answer(r"\boxed{}", fmt) is None
    assert extract_answer(r"\boxed{ } after 5 steps", fmt) is None
    assert extract_answer(r"\boxed{ } after 5 steps", fmt, fallback_last_number=True) == "5"


@pytest.mark.parametrize("s, want", [
    ("3, 5", "3, 5"), ("1,2345", "1,2345"), ("12,34", "12,34"), ("1,000 000", "1,000 000"), ("0,5", "0,5"),
    ("1,234,567", "1234567"), ("1 000 000", "1000000"), ("-1,234.50", "-1234.5"), ("$ 1,000", "1000"),
    ("\u22121,000", "-1000"), ("- 5", "-5"),
])
def test_normalize_number_drops_only_thousands_separators(s, want):
    """Commas and spaces go only between groups of three digits: a list (``#### 3, 5`` gave 35) or a European
    decimal comma stays as written, so it is never graded as the number its digits run together into."""
    assert normalize_number(s) == want
    assert extract_answer(f"#### {s}", "gsm8k") == want
