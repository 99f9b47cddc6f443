"""`capo eval --device`: the hf engine runs the model on the GPU when one is visible (before 2026-11-25 it stayed on
the CPU on a GPU machine, found on the lent H100), and `cuda` without a GPU is refused before anything is written."""

import json

import pytest
import torch

from capo.cli import main
from capo.evaluation.run import EvalSettings, make_engine
from _device import DEVICE  # tests/ is on sys.path (its conftest.py)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_cuda_without_a_gpu_is_refused_before_anything_is_written(tiny_model, tmp_path, capsys):
    rc = main(["eval", "--model", str(tiny_model), "--device", "cuda", "--limit", "2", "--out", str(tmp_path / "e")])
    assert rc == 2 and "--device: cuda was asked for but torch sees no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


def test_auto_and_cpu_place_the_model_where_they_say(tiny_model):
    auto = make_engine(EvalSettings(model=str(tiny_model)))
    cpu = make_engine(EvalSettings(model=str(tiny_model), device="cpu"))
    assert next(auto.model.parameters()).device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert next(cpu.model.parameters()).device.type == "cpu"


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (and CAPO_TEST_DEVICE unset or cuda)")
def test_eval_runs_on_the_gpu_end_to_end(tiny_model, tmp_path):
    sums = tmp_path / "sums.jsonl"
    sums.write_text("".join(json.dumps({"prompt": f"{a}+{b}", "answer": str(a + b)}) + "\n"
                            for a in range(1, 5) for b in range(1, 4)))
    out = tmp_path / "e"
    assert main(["eval", "--model", str(tiny_model), "--dataset", str(sums), "-k", "2", "--max-new-tokens", "8",
                 "--n-boot", "0", "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["device"] == "auto"
    assert (out / "metrics.json").is_file()
