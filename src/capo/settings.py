"""Typed command settings: each field of a settings dataclass (``capo eval``'s ``EvalSettings``, ``capo demo``'s
``DemoSettings``, ``capo report``'s ``ReportSettings``) carries its one definition -- default, ``--help`` text, how
the command line spells it, its allowed values -- and the parser is built from the fields
(:func:`capo.cli.flags.add_settings`). ``capo train`` has its own typed tree of knobs (``capo.trainer.config``)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def opt(default, help: str, *, flag: str | None = None, choices=None, group: str | None = None,
        cli_default: Any = "same", metavar: str | None = None, nargs: str | None = None,
        action: str | None = None, required: bool = False) -> Any:
    """A setting: its default, its ``--help`` text and how the command line spells it. ``flag``: the option string
    (default ``--field-name``; a word without dashes is a positional argument; a boolean whose default is True
    becomes ``--no-field-name``; ``""``: not on the command line); ``choices``: the allowed values' one source;
    ``group``: the ``--help`` section (None: the command's default section); ``cli_default``: what the parser leaves
    when the flag is absent, if not ``default`` (None: filled in later); ``metavar``/``nargs``/``action``: passed to
    argparse (``action="append"`` for a repeatable flag); ``required``: the flag must be given."""
    meta = {"help": help, "flag": flag, "choices": choices, "group": group, "cli_default": cli_default,
            "metavar": metavar, "nargs": nargs, "action": action, "required": required}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def cli_fields(cls) -> list:
    """The fields of the settings dataclass ``cls`` that are command-line arguments, in declaration order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("flag") != ""]


def from_namespace(cls, args):
    """An instance of ``cls`` from a parsed argparse namespace (one attribute per command-line field)."""
    return cls(**{f.name: getattr(args, f.name) for f in cli_fields(cls)})
