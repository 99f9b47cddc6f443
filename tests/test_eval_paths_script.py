"""scripts/eval_paths.py: both evaluation paths drawn on the embedded default, and its bad input."""

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("eval_paths", ROOT / "scripts" / "eval_paths.py")
eval_paths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_paths)


@pytest.mark.slow
def test_two_draws_per_path_on_the_embedded_default(tmp_path, capsys):
    assert eval_paths.main(["--preset", "default", "--draws", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    draws = json.loads((tmp_path / "eval_paths.json").read_text())
    assert [len(draws[p]) for p in ("trainer", "capo eval")] == [2, 2]
    t0 = draws["trainer"][0]
    assert f"seed 0: trainer accuracy {t0['accuracy']:.3f} AUC-mean {t0['auc_mean']:.3f}" in out
    assert "auc_mean: trainer" in out and "(Welch, 2 draws each)" in out
    # capo eval's draws are complete runs: 128 problems x 8 samples each, at the draw's sampling seed
    for seed in (0, 1):
        cfg = json.loads((tmp_path / f"eval-{seed}" / "metrics.json").read_text())["config"]
        assert (cfg["seed"], cfg["limit"], cfg["k"]) == (seed, 128, 8)


def test_one_draw_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        eval_paths.main(["--draws", "1"])
    assert e.value.code == 2 and "--draws must be >= 2" in capsys.readouterr().err
