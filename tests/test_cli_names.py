"""Unknown names get the closest known one suggested; `capo train --help` shows each field's type and default."""

import pytest

from capo.cli import main
from capo.core.checks import did_you_mean
from capo.core.registry import ADVANTAGES, UnknownNameError


def test_did_you_mean_picks_the_closest_name_or_nothing():
    assert did_you_mean("grop", ["grpo", "capo", "rlcr"]) == " (did you mean 'grpo'?)"
    assert did_you_mean("rlrc", ["grpo", "capo", "rlcr"]) == " (did you mean 'rlcr'?)"
    assert did_you_mean("zzzzzz", ["grpo", "capo", "rlcr"]) == ""  # nothing close: no guess


@pytest.mark.parametrize("argv, hint", [
    (["train", "--algo.name", "grop"], "did you mean 'grpo'?"),
    (["train", "--algo.advantage", "rlo"], "did you mean 'rloo'?"),
    (["train", "--data.dataset", "gms8k"], "did you mean 'gsm8k'?"),
    (["train", "--run.on_bad_sample", "skp"], "did you mean 'skip'?"),
    (["demo", "--algos", "grpo,capoo"], "did you mean 'capo'?"),
    (["eval", "--model", "default", "--dataset", "gms8k", "--out", "OUT"], "did you mean 'gsm8k'?"),
])
def test_unknown_value_suggests_the_closest_name(argv, hint, tmp_path, capsys):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert hint in err and "error:" in err
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.parametrize("flag, hint", [("--algo.nmae", "'--algo.name'"), ("--rolout.group_size", "'--rollout.group_size'"),
                                        ("--run.stpes", "'--run.steps'"),
                                        ("--run.step", "'--run.steps'")])  # a prefix is not an abbreviation
def test_unknown_config_flag_suggests_the_closest_flag(flag, hint, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", flag, "4"])
    assert e.value.code == 2
    assert f"unrecognized arguments: {flag} 4 (did you mean {hint}?)" in capsys.readouterr().err


def test_registry_suggests():
    with pytest.raises(UnknownNameError, match=r"unknown advantage estimator 'grop' \(did you mean 'grpo'\?\)"):
        ADVANTAGES.get("grop")


def test_train_help_shows_type_and_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--run.steps INT [int, default 100] training steps" in out
    assert "--optim.lr FLOAT [float, default 0.0001] AdamW learning rate" in out
    assert "--model.ref_path STR|NONE [str|none, default null]" in out
    assert "--rollout.share_prefix BOOL [bool, default true]" in out
    assert '--model.path STR [str, default "default"]' in out
