"""Build a command's argparse flags from a typed settings dataclass (:mod:`capo.settings`): type, default, help,
choices and spelling all come from the field, so a setting is written once."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from capo.errors import is_real
from capo.settings import cli_fields


def add_settings(p: argparse.ArgumentParser, cls, default_group: str | None = None) -> None:
    """One argument per command-line field of ``cls``; fields with a ``group`` go to that ``--help`` section, the
    others to ``default_group`` (None: the parser's own options)."""
    groups: dict[str, Any] = {}
    for f in cli_fields(cls):
        name = f.metadata["group"] or default_group
        target = p if name is None else (groups.get(name) or groups.setdefault(name, p.add_argument_group(name)))
        _add(target, f)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _add(target, f: dataclasses.Field) -> None:
    m = f.metadata
    dflt = _default(f)
    default = dflt if m["cli_default"] == "same" else m["cli_default"]
    flag = m["flag"] or "--" + f.name.replace("_", "-")
    extra = {k: m[k] for k in ("metavar", "nargs") if m.get(k) is not None}
    if m.get("required"):
        extra["required"] = True
    if not flag.startswith("-"):  # positional
        target.add_argument(f.name, help=m["help"], **extra)
        return
    if isinstance(dflt, bool):
        if default is None:  # filled in later (e.g. from a recorded run): the flag sets it either way
            target.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                                help=m["help"])
        elif dflt:  # on by default: the flag turns it off
            target.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false", help=m["help"])
        else:
            target.add_argument(flag, dest=f.name, action="store_true", default=default, help=m["help"])
        return
    if m.get("action") == "append":
        target.add_argument(flag, dest=f.name, action="append", default=default, help=m["help"], **extra)
        return
    shown = f" (default: {dflt})" if dflt is not None and dflt != [] else ""
    target.add_argument(flag, dest=f.name, type=_kind(f, dflt), default=default, choices=m["choices"],
                        help=m["help"] + shown, **extra)


def _kind(f: dataclasses.Field, dflt):
    """int / float from the default, else from the annotation (``int | None``), else str; a float is a finite one."""
    ann = str(f.type)
    kind = type(dflt) if is_real(dflt) else int if ann.startswith("int") else float if ann.startswith("float") else str
    return finite_float if kind is float else kind


def finite_float(text: str) -> float:
    """A number on the command line: ``nan``, ``inf`` and ``1e999`` are refused (no setting means "unbounded" by
    inf: a learning rate of inf built a NaN model, a verifier timeout of inf was recorded as a JSON ``Infinity``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options ``argv`` gives explicitly (a flag at its default value counts as given), read
    by parsing ``argv`` again with every default suppressed; for checks such as "this flag has no effect here"."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a, _ in saved:
            a.default = argparse.SUPPRESS
        ns, _ = parser.parse_known_args(argv, argparse.Namespace())
    finally:
        for a, d in saved:
            a.default = d
    own = {a.dest for a, _ in saved}
    return {k for k in vars(ns) if k in own}
