"""Answer extraction from model text: ``\\boxed{}``, GSM8K ``#### N``, RLCR tags, and a last-number fallback.

Every function here is a pure string function that runs in linear time in the length of the text (one regex
scan plus one pass over the braces; no recursion, no backtracking-prone patterns), so it is safe to call in the
parent process on arbitrary model output. Nothing is evaluated: the extracted strings are only compared later by
:class:`capo.verify.Verifier` inside a sandboxed worker process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from capo.verify.short import SHORT_FORMATS, extract_short

__all__ = [
    "ANSWER_FORMATS",
    "RlcrParse",
    "extract_answer",
    "extract_boxed",
    "extract_gsm8k",
    "extract_last_number",
    "extract_outcome",
    "extract_percent",
    "extract_rlcr",
    "normalize_number",
    "tidy_math_answer",
]

# "\boxed{", "\boxed {", "\fbox{" -- the brace is matched by the linear scan below.
_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# "\boxed 5" (MATH sometimes writes a single token without braces).
_BOXED_BARE = re.compile(r"\\boxed[ \t]+([^\s${}]+)")


_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)


def _match_braces(text: str, start: int = 0) -> dict[int, int]:
    """Map the index of every unescaped ``{`` (from ``start`` on) to the index of its matching ``}``.

    One regex scan plus an explicit stack: linear time, no recursion. ``\\{`` and ``\\}`` (LaTeX literal braces)
    are not grouping braces and are skipped. Unmatched openers are simply absent from the result.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKENS.finditer(text, start):
        c = m.group(0)
        if c == "{":
            stack.append(m.start())
        elif c == "}":
            if stack:
                pairs[stack.pop()] = m.start()
    return pairs


def extract_boxed(text: str | None) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, else ``None``.

    Braces are matched with an explicit stack (escaped ``\\{``/``\\}`` do not count), so nested braces of any depth
    work and an unclosed ``\\boxed{`` (a truncated response) is ignored in favour of an earlier complete one.
    "Last" means the last top-level box: for ``\\boxed{\\boxed{1}}`` the outer box is taken and a box that merely
    wraps another box is unwrapped, giving ``1``. ``\\boxed 5`` (no braces) is accepted too. Returns the stripped
    content; an empty box gives ``""``. Linear time in ``len(text)``.
    """
    if not text or "\\" not in text:
        return None
    first = text.find("\\boxed")
    fb = text.find("\\fbox")
    if first == -1 or (fb != -1 and fb < first):
        first = fb
    if first == -1:
        return None
    pairs = _match_braces(text, first)
    best: tuple[int, int, int, int] | None = None  # (box start, box end, content start, content end)
    for m in _BOXED_OPEN.finditer(text, first):
        open_at = m.end() - 1
        close = pairs.get(open_at)
        if close is None:
            continue
        if best is not None and m.start() < best[1]:
            continue  # nested inside the box already chosen: the enclosing box wins
        best = (m.start(), close + 1, open_at + 1, close)
    for m in _BOXED_BARE.finditer(text, first):
        if best is None or m.start() >= best[1]:
            best = (m.start(), m.end(), m.start(1), m.end(1))
    if best is None:
        return None
    lo, hi = best[2], best[3]
    # unwrap \boxed{\boxed{x}}: while the content is exactly one box, take that box's content (absolute indices,
    # so this stays linear however deep the nesting is)
    while True:
        while lo < hi and text[lo].isspace():
            lo += 1
        while hi > lo and text[hi - 1].isspace():
            hi -= 1
        m = _BOXED_OPEN.match(text, lo, hi)
        if not m:
            break
        close = pairs.get(m.end() - 1)
        if close != hi - 1:
            break
        lo, hi = m.end(), close
    return text[lo:hi]


_GSM8K = re.compile(r"####\s*([^\n]*)")
# a minus sign only where it cannot be a hyphen or an operator between numbers ("pages 10-12" ends in 12, "20 - 2"
# in 2), ASCII or U+2212; a dollar sign may be followed by a space
_SIGN = r"(?:(?<![\w.)\]}])[-\u2212])?"
# commas only between digits: "42, which" ends at 42 (it read "42,", graded wrong; found by an audit)
_NUMBER = re.compile(_SIGN + r"(?:\$\s*)?\d+(?:,\d+)*(?:\.\d+)?|" + _SIGN + r"\.\d+")


# a number whose digit groups, if any, are thousands: "1,234", "1 234 567" (one separator throughout); not "3, 5"
_GROUPED = re.compile(r"-?\s*(?:\d{1,3}(?:([, ])\d{3})(?:\1\d{3})*|\d+)(?:\.\d+)?|-?\s*\.\d+")


def normalize_number(s: str) -> str:
    """Normalise a numeric answer string: drop ``$``, thousands separators (commas or spaces between groups of
    three digits), a trailing period, ``.0+``.

    Anything else (a list such as ``3, 5``, an expression) is returned stripped but otherwise unchanged.
    """
    t = s.strip().rstrip(".").strip().replace("$", "").replace("\u2212", "-").strip()
    if not _GROUPED.fullmatch(t):
        return s.strip()
    t = t.replace(",", "").replace(" ", "")  # now -?digits[.digits] or -?.digits
    if "." in t:
        t = t.rstrip("0").rstrip(".")
    if t in ("", "-", "-0"):  # ".0" and "-.0" lose every digit; "-0" and "-0.0" keep a sign
        t = "0"
    return t


# a number followed by a unit of one to three words of letters ("12 eggs", "$18 dollars.", "5 km/h", "24 sq. ft.",
# "100 m²"): no digit in a word
_WORD = r"[^\W\d_](?:[^\W\d_]|['/.])*"  # letters, and ' / . inside ("km/h", "sq.")
_UNIT_AFTER = re.compile(rf"(?P<number>.*?\d)\s+(?P<unit>{_WORD}(?:\s+{_WORD}){{0,2}})[.!]?")
# words after a number that change its value or make it an expression, not a unit: never dropped
NOT_UNITS = frozenset({
    "and", "or", "plus", "minus", "times", "over", "divided", "by", "squared", "cubed", "factorial", "to", "than",
    "more", "less", "fewer", "below", "above", "under", "negative", "percent", "point", "pi", "zero",
    "half", "halves", "quarter", "quarters", "third", "thirds", "fourth", "fourths", "fifth", "fifths", "sixth",
    "sixths", "eighth", "eighths", "tenth", "tenths", "hundredth", "hundredths", "thousandth", "thousandths",
    "dozen", "dozens", "score", "hundred", "hundreds", "thousand", "thousands", "million", "millions", "billion",
    "billions", "trillion", "trillions", "quadrillion", "quadrillions", "lakh", "lakhs", "crore", "crores", "grand",
    "bn", "mn", "mil", "k"})


def _unit(words: str) -> bool:
    """Whether ``words`` after a number are a unit (:data:`_UNIT_AFTER`): words of two characters or more, none in
    :data:`NOT_UNITS` (a one-letter word is a variable or a constant: "12 x", "12 e", "12 π")."""
    return all(len(w) > 1 and w.strip(".") not in NOT_UNITS for w in words.lower().split())


def extract_gsm8k(text: str | None) -> str | None:
    """The answer after the last ``#### `` marker (GSM8K reference format), normalised; ``None`` if absent.

    ``"... #### 1,234."`` gives ``"1234"``; ``"#### 12 eggs"`` gives ``"12"`` (a unit of one to three words after
    the number: math-verify read it as a product, 12*e*g*g*s, and graded it wrong); words that change the value
    (``"2 million"``, ``"7 and a half"``, ``"12 times"``: :data:`NOT_UNITS`) are kept, as is a one-letter word
    (``"12 x"``, ``"12 e"``). Only the rest of that line is taken.
    """
    if not text or "####" not in text:
        return None
    ans = None
    for m in _GSM8K.finditer(text):
        ans = m.group(1)
    if ans is None:
        return None
    ans = ans.strip()
    if not ans:
        return None
    unit = _UNIT_AFTER.fullmatch(ans)
    if unit and _unit(unit["unit"]) and _GROUPED.fullmatch(number := normalize_number(unit["number"])):
        return number
    return normalize_number(ans)


def extract_last_number(text: str | None) -> str | None:
    """The last number in ``text`` (``-1,234.5`` style), normalised; ``None`` if there is none."""
    if not text:
        return None
    last = None
    for m in _NUMBER.finditer(text):
        last = m.group(0)
    return None if last is None else normalize_number(last)


@dataclass(frozen=True)
class RlcrParse:
    """RLCR output parse: the ``<answer>`` content, the ``<confidence>`` value, and whether the format is valid.

    ``format_ok`` is True only when exactly the last ``<answer>..</answer>`` and ``<confidence>..</confidence>``
    exist, the answer is non-empty, and the confidence is a finite float in [0, 1]. ``confidence`` is None
    whenever it is not a valid number in [0, 1].
    """

    answer: str | None
    confidence: float | None
    format_ok: bool


# a tag's content never holds another opening tag, so "I'll put it in <answer> tags. <answer>42</answer>" gives 42,
# not everything from the first mention of the tag (the pair is the last opening tag before its closing one)
_ANSWER_TAG = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL | re.IGNORECASE)
_CONF_TAG = re.compile(r"<confidence>((?:(?!<confidence>).)*?)</confidence>", re.DOTALL | re.IGNORECASE)
_FLOAT = re.compile(r"[+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _last(pattern: re.Pattern, text: str) -> str | None:
    out = None
    for m in pattern.finditer(text):
        out = m.group(1)
    return out


def extract_rlcr(text: str | None) -> RlcrParse:
    """Parse ``<answer>..</answer>`` and ``<confidence>q</confidence>`` (RLCR, arXiv 2507.16806).

    The ``<think>`` and ``<analysis>`` tags are optional. The last occurrence of each tag is used: the last closing
    tag with the opening tag nearest before it (a mention of ``<answer>`` earlier in the reasoning, never closed,
    is not part of the answer). A confidence
    that is not a plain decimal number (``0.8``, ``.8``, ``1``, ``8e-1``; percentages are *not* accepted) or lies
    outside [0, 1] is a format failure. If the answer itself contains a ``\\boxed{}``, its content is taken.
    """
    if not text:
        return RlcrParse(None, None, False)
    raw_answer = _last(_ANSWER_TAG, text)
    answer = None
    if raw_answer is not None:
        answer = raw_answer.strip()
        boxed = extract_boxed(answer)
        if boxed is not None:
            answer = boxed
        if answer == "":
            answer = None
    conf = None
    raw_conf = _last(_CONF_TAG, text)
    if raw_conf is not None:
        s = raw_conf.strip()
        if _FLOAT.fullmatch(s):
            q = float(s)
            if 0.0 <= q <= 1.0:
                conf = q
    return RlcrParse(answer, conf, answer is not None and conf is not None)


_PERCENT = re.compile(r"0[1-9]|[1-9][0-9]")


def extract_percent(text: str | None) -> str | None:
    """A stated probability written as two digits, ``01`` ... ``99`` (percent), parsed strictly: the content of the
    last ``<answer>`` tag when the text has one, else the whole text, with surrounding whitespace removed, must be
    exactly two digits and not ``00``; anything else (``7``, ``100``, ``0.37``, ``37%``, extra words) is None.
    The answer format of the stochastic-outcome task (:mod:`capo.tasks.stochastic`)."""
    if text is None:
        return None
    tagged = _last(_ANSWER_TAG, text)
    s = (text if tagged is None else tagged).strip()
    return s if _PERCENT.fullmatch(s) else None


_OUTCOME = re.compile(r"([01]) (0[1-9]|[1-9][0-9])")


def extract_outcome(text: str | None) -> tuple[str, str] | None:
    """A predicted binary outcome and a stated confidence that it is right, written ``D NN``: the digit ``0`` or
    ``1``, one space, two digits ``01`` ... ``99`` (percent), e.g. ``1 73``. Parsed strictly, like
    :func:`extract_percent`: the content of the last ``<answer>`` tag when the text has one, else the whole text,
    with surrounding whitespace removed, must be exactly that; returns (outcome, percent) as strings, else None
    (``173``, ``1 7``, ``2 50``, ``1 00``, ``1  73``). The answer format of the stochastic-outcome task's binary
    variant (:mod:`capo.tasks.stochastic`, ``stochastic_binary``)."""
    if text is None:
        return None
    tagged = _last(_ANSWER_TAG, text)
    m = _OUTCOME.fullmatch((text if tagged is None else tagged).strip())
    return None if m is None else (m.group(1), m.group(2))


# answer formats whose response is itself a stated probability (percent) or carries one (outcome: "D NN"), graded
# against a fixed outcome: their gold answers are "1" or "0" (the stochastic tasks')
STATED_FORMATS = ("percent", "outcome")
ANSWER_FORMATS = ("auto", "boxed", "gsm8k", "rlcr", "last_number", *STATED_FORMATS, *SHORT_FORMATS)
# The default of every answer-format setting (trainer, capo eval, graders, TRL/verl reward functions).
DEFAULT_ANSWER_FORMAT = "auto"


def extract_answer(text: str | None, fmt: str = DEFAULT_ANSWER_FORMAT, *, fallback_last_number: bool = False) -> str | None:
    """Extract the final answer from a model response.

    ``fmt``: ``"boxed"`` (last ``\\boxed{}``), ``"gsm8k"`` (``#### N``), ``"rlcr"`` (``<answer>`` tag),
    ``"last_number"``, ``"percent"`` (a stated probability 01-99, :func:`extract_percent`), ``"outcome"`` (the
    predicted outcome of ``D NN``, :func:`extract_outcome`), ``"short"`` (a short free-text answer, facts:
    :func:`capo.verify.short.extract_short`), ``"rlcr_short"`` (the same inside RLCR's ``<answer>`` tag), or ``"auto"``: the RLCR ``<answer>`` tag if present, else the last box, else ``#### N``.
    With ``fallback_last_number`` the last number in the text is used when nothing else was found (the
    "flexible extract" of lm-eval's GSM8K task).
    """
    if fmt not in ANSWER_FORMATS:
        raise ValueError(f"answer format {fmt!r} is not allowed; allowed values: {', '.join(ANSWER_FORMATS)}")
    if text is None:
        return None
    ans: str | None
    if fmt == "boxed":
        ans = extract_boxed(text)
    elif fmt == "gsm8k":
        ans = extract_gsm8k(text)
    elif fmt == "rlcr":
        ans = extract_rlcr(text).answer
    elif fmt == "last_number":
        ans = extract_last_number(text)
    elif fmt == "percent":
        return extract_percent(text)  # strict: no fallback to a last number
    elif fmt == "outcome":
        parsed = extract_outcome(text)  # strict, as percent
        return None if parsed is None else parsed[0]
    elif fmt in SHORT_FORMATS:  # strict, no number fallback: a refusal or a long sentence is no answer
        return extract_short(text if fmt == "short" else extract_rlcr(text).answer)
    else:
        ans = extract_rlcr(text).answer
        if ans is None:
            ans = extract_boxed(text)
        if ans is None:
            ans = extract_gsm8k(text)
    if (ans is None or ans == "") and fallback_last_number and fmt != "last_number":
        ans = extract_last_number(_CONF_TAG.sub("", text))  # never the stated confidence
    if ans and fmt in ("boxed", "rlcr", "auto"):
        ans = tidy_math_answer(ans)
    return ans if ans != "" else None


_SENTENCE_STOP = re.compile(r"(?<=\d)\.\s*$")  # "18." -> "18": a full stop after the number, not a decimal point
_THIN_SPACE_THOUSANDS = re.compile(r"(?<=\d)\\,(?=\d{3}(?!\d))")  # "1\,000" -> "1000" (as "1{,}000" already is)


def tidy_math_answer(ans: str) -> str:
    """An extracted math answer without the typography math-verify reads as text: a full stop after a final number
    (``18.``, ``x = 5.``) and LaTeX thin spaces between digit groups (``1\\,000``). ``#### N`` answers get the same
    from :func:`normalize_number`."""
    return _THIN_SPACE_THOUSANDS.sub("", _SENTENCE_STOP.sub("", ans.strip()))
