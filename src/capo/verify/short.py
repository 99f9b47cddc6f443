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
   read as "Ouagadougou", "Paris, France" as "Paris"), equals the normal form of any alternative of the gold. An
   inverted name is read in its natural order instead of by its head: a part after the comma that starts with a
   capital and ends in "of" / "of the" or holds a word that changes which place is meant (:data:`QUALIFIERS`:
   compass points, "Democratic", "Republic", "Dem.", "Rep.", "DR", ...). So "Congo, Democratic Republic of the"
   reads "Democratic Republic of the Congo", "Korea, North" "North Korea" and "Congo, Dem. Rep." "Dem Rep Congo":
   none of them is Brazzaville's "Congo" or South Korea's "Korea", and "Tanzania, United Republic of" matches
   "United Republic of Tanzania" but not a gold of "Tanzania" alone. "Paris, the capital of" (lower case) is
   "Paris". A qualified form no list names can still be read by its head.

Every function is a pure string function, linear in the length of its input (no backtracking-prone pattern), safe to
call in the parent process on arbitrary model output.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["MAX_WORDS", "SHORT_FORMATS", "gold_alternatives", "extract_short", "judge_short", "normalize_short"]

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
_INVERTED_TAIL = re.compile(r"(?:^| )of(?: the)?$")  # the normal form of "Democratic Republic of the" (step 3)
# words that, after a comma, change which place a name means (step 3), in normal form
QUALIFIERS = frozenset({"north", "south", "east", "west", "northern", "southern", "eastern", "western", "central",
                        "upper", "lower", "new", "democratic", "dem", "republic", "rep", "dr", "peoples", "people",
                        "islamic", "federal", "federated", "united", "equatorial", "plurinational", "bolivarian",
                        "kinshasa", "brazzaville", "american", "british", "french", "province"})  # not "UK": "London, UK"


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


def _clean(line: str) -> str:
    return _EMPHASIS.sub("", line).strip().rstrip(".!;,").strip()


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
    forms = {normalize_short(answer)}
    head, comma, tail = answer.partition(",")
    if comma:  # "Ouagadougou, which" -> "Ouagadougou"; "Congo, Democratic Republic of the" -> its natural order
        forms.add(normalize_short(f"{tail} {head}" if _inverted(tail) else head))
    return any(normalize_short(a) in forms for a in gold_alternatives(gold))


def _inverted(tail: str) -> bool:
    """Whether the part after a name's comma belongs to the name (module docstring, step 3)."""
    t = tail.strip()
    words = normalize_short(t).split()
    return bool(t[:1].isupper() and words and (_INVERTED_TAIL.search(" ".join(words)) or QUALIFIERS & set(words)))
