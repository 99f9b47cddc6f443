"""Typed command settings (capo.settings + capo.cli.flags): one field gives a flag its type, default, help, choices
and spelling; the namespace round-trips into the dataclass; every non-train command is built this way."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from capo.cli import build_parser
from capo.cli.flags import add_settings
from capo.settings import cli_fields, from_namespace, opt


@dataclass
class _S:
    paths: list = opt([], "inputs", flag="paths", nargs="+", metavar="P")
    n: int = opt(3, "how many")
    ratio: float | None = opt(None, "a fraction", group="tuning")
    mode: str = opt("a", "which mode", choices=("a", "b"))
    fast: bool = opt(False, "go fast")
    checked: bool = opt(True, "check things")
    tags: list = opt([], "a tag (repeatable)", flag="--tag", action="append")
    out: str | None = opt(None, "where", required=True)
    hidden: int = opt(7, "not a flag", flag="")


def _parser():
    p = argparse.ArgumentParser(prog="t")
    add_settings(p, _S, default_group="main")
    return p


def test_flags_come_from_the_fields():
    ns = _parser().parse_args(["x", "y", "--n", "5", "--ratio", "0.5", "--mode", "b", "--fast", "--no-checked",
                               "--tag", "u", "--tag", "v", "--out", "o"])
    s = from_namespace(_S, ns)
    assert s == _S(paths=["x", "y"], n=5, ratio=0.5, mode="b", fast=True, checked=False, tags=["u", "v"], out="o")
    assert isinstance(s.n, int) and isinstance(s.ratio, float)
    d = from_namespace(_S, _parser().parse_args(["x", "--out", "o"]))
    assert (d.n, d.ratio, d.mode, d.fast, d.checked, d.tags, d.hidden) == (3, None, "a", False, True, [], 7)
    assert [f.name for f in cli_fields(_S)] == [f.name for f in dataclasses.fields(_S)][:-1]


@pytest.mark.parametrize("argv", [["x", "--mode", "c", "--out", "o"], ["x"], ["--out", "o"], ["x", "--out", "o", "--n", "z"]])
def test_bad_values_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_help_shows_each_fields_help_default_and_group():
    text = " ".join(_parser().format_help().split())
    assert "how many (default: 3)" in text and "tuning:" in text and "main:" in text
    assert "--no-checked" in text and "{a,b}" in text and "not a flag" not in text


@pytest.mark.parametrize("cmd,cls", [("eval", "capo.evaluation.run.EvalSettings"),
                                     ("demo", "capo.cli.demo_cmd.DemoSettings"),
                                     ("report", "capo.cli.report_cmd.ReportSettings"),
                                     ("build-default", "capo.cli.build_default_cmd.BuildSettings")])
def test_every_command_but_train_is_built_from_its_settings(cmd, cls):
    import importlib

    mod, name = cls.rsplit(".", 1)
    settings = getattr(importlib.import_module(mod), name)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd]
    dests = {a.dest for a in sub._actions} - {"help", "out" if cmd == "eval" else "", "progress"}
    assert dests == {f.name for f in cli_fields(settings)}
    for f in cli_fields(settings):
        action = next(a for a in sub._actions if a.dest == f.name)
        assert f.metadata["help"].replace("%%", "%") in (action.help or "")
