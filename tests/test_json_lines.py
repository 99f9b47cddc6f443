"""capo.rundir's fast JSON lines: ``json_loads`` reads what ``json.loads`` reads, ``json_line`` writes what
``json.dumps`` writes (as values), with orjson and without it."""

from __future__ import annotations

import enum
import json
import math
import random
import struct

import pytest

from capo import rundir
from capo.rundir import json_line, json_loads


@pytest.fixture(params=["orjson", "stdlib"])
def fast(request, monkeypatch):
    """Both paths: with orjson, and as in an environment without it."""
    if request.param == "stdlib":
        monkeypatch.setattr(rundir, "orjson", None)
    return request.param


def _same(a, b) -> bool:
    """Equal values of equal types (NaN equals NaN; -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float):
        return struct.pack("d", a) == struct.pack("d", b) or (math.isnan(a) and math.isnan(b))
    return a == b


def _random_floats(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    bits = [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(n)]
    return ([x for x in bits if math.isfinite(x)] + [rng.random() * 10.0 ** rng.randint(-30, 30) for _ in range(n)]
            + [round(-rng.expovariate(3.0), 6) for _ in range(n)] + [5e-324, -0.0, 1e16, 1e-5, 2.0 ** 53 + 2])


TEXTS = [
    '{"a": 1, "b": [1.5, -0.0, 1e5, 1E-7, 0.1e1], "c": "\\u00e9\\n", "d": null, "e": true, "a": 2}',
    "[NaN, Infinity, -Infinity, 1e400, -1e400, 1e-400]",  # only the standard library reads these
    '"\\ud800 lone surrogate"',
    "[9223372036854775807, -9223372036854775808, 18446744073709551615, 123456789012345678901234567890, "
    "-12345678901234567890]",  # integers beyond 64 bits: the standard library keeps them exact
    '{"gold": 12345678901234567890123, "x": 0.1234567890123456789}',
    '[1.000000000000000111022302462515654042363166809082031250000001, 2.2250738585072011e-308]',
    '  {"é": "ü", "t": "\\t"}\r\n',
    "[" * 200 + "]" * 200,
]


@pytest.mark.parametrize("text", TEXTS)
def test_json_loads_reads_what_the_standard_library_reads(fast, text):
    want = json.loads(text)
    assert _same(json_loads(text), want)
    assert _same(json_loads(text.encode("utf-8", "surrogatepass")), want)


def test_json_loads_reads_floats_bit_for_bit(fast):
    text = json.dumps(_random_floats(20_000))
    assert _same(json_loads(text), json.loads(text))


@pytest.mark.parametrize("text", ["{not json", '{"a": 1} x', "[1,]", '\ufeff{"a": 1}', "", '"\x01"'])
def test_json_loads_raises_the_standard_librarys_error(fast, text):
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        json_loads(text)
    assert str(got.value) == str(want.value)


class Verdict(str, enum.Enum):
    CORRECT = "correct"


ROWS = [
    {"token_logprobs": _random_floats(3000, seed=1), "text": "é\u2028\x00 \"quoted\"", "n": 3, "none": None},
    {"token_logprobs": [-0.5, -math.inf], "mean": -math.inf},  # non-finite: the standard library writes them
    {"nested": [{"x": [1.0, math.nan]}], "ok": True},
    {"big": 2 ** 70, "neg": -(2 ** 63) - 1, "t": (1, 2.5), "verdict": Verdict.CORRECT},
    {1: "int key", "sum_overflows": [1e308, 1e308]},
]


@pytest.mark.parametrize("row", ROWS)
def test_json_line_writes_the_values_json_dumps_writes(fast, row):
    line = json_line(row)
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert _same(json.loads(line), json.loads(json.dumps(row, ensure_ascii=False)))


def test_json_line_is_compact_where_orjson_writes_it():
    assert json_line({"a": [1.0, 1e-05], "b": "é", "c": None}) == '{"a":[1.0,0.00001],"b":"é","c":null}\n'
    assert json_line({"a": [1.0, -math.inf]}) == '{"a": [1.0, -Infinity]}\n'  # as json.dumps writes it


def test_read_jsonl_splits_at_newlines_only_and_refuses_a_bad_line(tmp_path):
    """A JSON string may hold U+2028 (SmolLM2 wrote one in a facts answer, and a sweep record failed to build),
    U+2029, U+0085 and the separators str.splitlines() breaks at: read_jsonl keeps each row whole. A line that is not
    JSON raises, naming the file and line: a whole file is never read short."""
    from capo.errors import DataError
    from capo.rundir import read_jsonl

    rows = [{"text": "Al A\u2028x"}, {"text": "a\u2029b\x85c\x1cd\x0be"}, {"n": 1}]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert len(path.read_text(encoding="utf-8").splitlines()) > 3  # what the old readers split it into
    assert read_jsonl(path) == rows
    path.write_text(path.read_text(encoding="utf-8") + '{"text": "torn\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"g\.jsonl, line 4: not a JSON line"):
        read_jsonl(path)


def test_read_jsonl_rows_stops_at_a_torn_tail_and_repairs_it(tmp_path):
    """An append-only file a kill tore: the rows before the torn line, whole even where a string holds U+2028; with
    ``repair`` the file is cut back to its last complete row, so the next append starts a line of its own. A missing
    file has no rows."""
    from capo.rundir import read_jsonl_rows

    rows = [{"text": "a\u2028b"}, {"n": 2}]
    whole = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path = tmp_path / "m.jsonl"
    assert read_jsonl_rows(path) == [] and not path.exists()
    for torn in ('{"n": 3', '{"n": 3\n', '{"n": 3\n\n  \n'):  # no newline at the end; a last line not JSON
        path.write_text(whole + torn, encoding="utf-8")
        assert read_jsonl_rows(path) == rows
        assert path.read_text(encoding="utf-8") == whole + torn  # read without repair: untouched
        assert read_jsonl_rows(path, repair=True) == rows
        assert path.read_text(encoding="utf-8") == whole


@pytest.mark.parametrize("repair", [False, True])
def test_read_jsonl_rows_refuses_a_damaged_line_with_rows_after_it(tmp_path, repair):
    """A line that is not JSON with rows after it is no crash's torn tail: reading it short would drop the rows
    after it (a report of a run cut at the damage, a resume repairing them away), so it raises naming the file and
    line, and ``repair`` leaves the file untouched."""
    from capo.errors import DataError
    from capo.rundir import read_jsonl_rows

    text = '{"n": 1}\n\n{"n": 2\n{"n": 3}\n'
    path = tmp_path / "m.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=r"m\.jsonl, line 3: not a JSON line .*rows follow it"):
        read_jsonl_rows(path, repair=repair)
    assert path.read_text(encoding="utf-8") == text
