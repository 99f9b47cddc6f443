"""Short free-text answers (facts: a city, a country, a chemical symbol): extraction, normalisation, matching.

A gold answer for these formats is one string holding every accepted alternative separated by ``|``
(``"Kyiv|Kiev"``): the first is the canonical answer, the rest are known aliases. A response is judged by
:func:`judge_short`:

1. :func:`extract_short` takes the answer from the response: the first non-empty line (or the ``<answer>`` tag's
   content in RLCR's format), without markdown emphasis, quotes or trailing punctuation. A line that states its
   answer ("The capital of France is Paris.", "Answer: Paris") gives what follows its last " is " / " are " /
   " was " / ":"; what is left is the answer when it has at most :data:`MAX_WORDS` words. Anything else -- an empty
   response, a refusal ("I don't know", "not sure", "unknown", ...), a long sentence, a sentence cut before its
   answer ("The capital of Peru is") -- is not an answer (``None``: the verdict is UNPARSABLE, never correct).
   "Paris is the capital of France" reads as "the capital of France" and is judged wrong: the reading is literal.
2. :func:`normalize_short` folds case, accents (NFKD, combining marks dropped), dotted abbreviations ("U.S." to
   "us"), apostrophes, other punctuation (to spaces), ``&`` (to "and"), "saint" (to "st") and a leading article
   ("the", "a", "an").
3. The answer is correct when its normal form, or that of its part before the first comma ("Ouagadougou, which"
   read as "Ouagadougou", "London, United Kingdom" as "London"), equals the normal form of any alternative of the
   gold. An inverted name is not read by its head: when every word after the comma (besides "of" and "the") is one
   that turns a place's name into another place's (:data:`QUALIFIERS`: compass points, "Democratic", "Republic",
   "Dem.", "Rep.", "DR", "United", ...), the answer is compared whole, in natural order, with abbreviations written
   out and "of" / "the" dropped on both sides (:func:`inverted_form`). So "Korea, North" is North Korea,
   "Congo, Dem. Rep." and "Congo, the Democratic Republic of the" are the Democratic Republic of the Congo, not
   Brazzaville's "Congo", "Congo, Rep." is the Republic of the Congo, and "Tanzania, United Republic of" matches
   "United Republic of Tanzania" but not a gold of "Tanzania" alone. A qualified form with any other word ("Paris,
   Texas") is still read by its head.

Every function is a pure string function, linear in the length of its input (no backtracking-prone pattern), safe to
call in the parent process on arbitrary model output.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["MAX_WORDS", "QUALIFIERS", "SHORT_FORMATS", "gold_alternatives", "extract_short", "inverted_form",
           "judge_short", "normalize_short"]

SHORT_FORMATS = ("short", "rlcr_short")  # the answer formats judged here (``rlcr_short``: RLCR's tags around one)
MAX_WORDS = 6  # the longest answer, in words, read as an answer (longer lines must state it after " is ")
ALIAS_SEP = "|"

# refusals, in normal form (apostrophes dropped): an answer equal to one, or starting with one, is no answer
_REFUSALS = ("i dont know", "i do not know", "dont know", "not sure", "im not sure", "i am not sure", "unknown",
             "unsure", "no idea", "none", "n a", "i cannot", "i cant", "cannot answer", "cant answer", "sorry",
             "no answer", "there is no")
_EMPHASIS = re.compile(r"[*_`\"“”‘’«»]+")
_STATES = re.compile(r"(?:\s(?:is|are|was)\s|:\s*)")
_ARTICLE = re.compile(r"^(?:the|a|an) ")
_PUNCT = re.compile(r"[^\w ]+")
_DOTTED = re.compile(r"(?<!\w)(?:[a-z]\.){2,}")  # an abbreviation of dotted single letters: "u.s.", "u.k.", "u.s.a."
_SPACES = re.compile(r"\s+")
# words that, after a comma, turn a place's name into another place's (step 3), in normal form; a tail made of these
# alone (and "of", "the") is part of the name ("Korea, North"), a tail with any other word is not ("Seoul, South Korea")
QUALIFIERS = frozenset({"north", "south", "east", "west", "northern", "southern", "eastern", "western", "central",
                        "upper", "lower", "new", "democratic", "dem", "republic", "rep", "dr", "peoples", "people",
                        "islamic", "federal", "federated", "united", "equatorial", "plurinational", "bolivarian",
                        "kinshasa", "brazzaville", "american", "british", "french"})
_SPELLED_OUT = {"dem": "democratic", "rep": "republic", "dr": "democratic republic"}
_LINKS = ("of", "the")


def normalize_short(text: str) -> str:
    """The comparison form of a short answer: lower case, no accents, no punctuation, no leading article,
    "saint" as "st", single spaces (``"The  Côte d'Ivoire!"`` -> ``"cote divoire"``)."""
    s = unicodedata.normalize("NFKD", text)
    s = "".join(c for c in s if not unicodedata.combining(c)).lower()
    s = _DOTTED.sub(lambda m: m.group(0).replace(".", ""), s)  # "U.S." -> "us", not "u s" (found by an audit)
    s = s.replace("&", " and ").replace("'", "").replace("’", "")
    s = _SPACES.sub(" ", _PUNCT.sub(" ", s).replace("_", " ")).strip()
    s = _ARTICLE.sub("", s)
    return " ".join("st" if w == "saint" else w for w in s.split(" "))


_DOTTED_END = re.compile(r"(?<!\w)(?:[A-Za-z]\.){2,}$")  # "U.S." keeps its last full stop (step 2 reads it "us")


def _clean(line: str) -> str:
    s = _EMPHASIS.sub("", line).strip()
    return s if _DOTTED_END.search(s) else s.rstrip(".!;,").strip()


def _is_refusal(answer: str) -> bool:
    n = normalize_short(answer)
    return not n or any(n == r or n.startswith(r + " ") for r in _REFUSALS)


def extract_short(text: str | None) -> str | None:
    """The short answer a response (or the content of RLCR's ``<answer>`` tag) gives (module docstring, step 1),
    or None when it gives none."""
    if not text:
        return None
    line = next((ln for ln in (_clean(x) for x in text.splitlines()) if ln), "")
    if _is_refusal(line):
        return None
    parts = _STATES.split(" " + line + " ")
    if len(parts) > 1:  # a statement: its answer follows the last " is " / ":"
        line = _clean(parts[-1])
    return None if len(line.split()) > MAX_WORDS or _is_refusal(line) else line


def gold_alternatives(gold: str) -> list[str]:
    """The accepted alternatives of a gold string (``"Kyiv|Kiev"`` -> ``["Kyiv", "Kiev"]``), empty ones dropped.
    ValueError when none is left."""
    alts = [a.strip() for a in str(gold).split(ALIAS_SEP) if a.strip()]
    if not alts:
        raise ValueError(f"gold answer {gold!r} holds no alternative (give 'ANSWER' or 'ANSWER|ALIAS|...')")
    return alts


def judge_short(answer: str | None, gold: str) -> bool | None:
    """True / False: the extracted ``answer`` matches / does not match an alternative of ``gold`` (module
    docstring); None when there is no answer."""
    if answer is None:
        return None
    alternatives = gold_alternatives(gold)
    if _inverted(answer):
        return inverted_form(answer) in {inverted_form(a) for a in alternatives}
    forms = {normalize_short(answer), normalize_short(answer.split(",", 1)[0])}
    return any(normalize_short(a) in forms for a in alternatives)


def _inverted(name: str) -> bool:
    """Whether the part after ``name``'s first comma (up to the next) belongs to the name (module docstring, step
    3)."""
    _, comma, rest = name.partition(",")
    words = [w for w in normalize_short(rest.split(",", 1)[0]).split() if w not in _LINKS]
    return bool(comma and words) and all(w in QUALIFIERS for w in words)


def inverted_form(name: str) -> str:
    """The comparison form of a place name written either way: an inverted name in natural order ("Congo, Dem.
    Rep." -> "democratic republic congo"), abbreviations written out, "of" and "the" dropped ("Democratic Republic of
    the Congo" -> the same)."""
    if _inverted(name):  # what follows a second comma is not part of the name ("Congo, Dem. Rep., which")
        head, _, rest = name.partition(",")
        name = f"{rest.split(',', 1)[0]} {head}"
    words = " ".join(_SPELLED_OUT.get(w, w) for w in normalize_short(name).split()).split()
    return " ".join(w for w in words if w not in _LINKS)
