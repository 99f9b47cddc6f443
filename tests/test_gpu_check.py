"""`sh scripts/gpu-check.sh --dry-run`: the GPU check's CPU parts, in `make test`. The wheel step
installs a wheel for real (a tiny one built here), the CUDA tests are collected, each command's flags are checked, and
the summary file says that nothing ran on a GPU."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402

PROBE = "capo_gpucheck_probe"


def _wheel(folder: pathlib.Path) -> pathlib.Path:
    """A minimal pure-Python wheel holding the module PROBE (what pip needs: the module, METADATA, WHEEL, RECORD)."""
    folder.mkdir()
    path = folder / f"{PROBE}-0.1-py3-none-any.whl"
    info = f"{PROBE}-0.1.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{PROBE}/__init__.py", "OK = True\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{PROBE}/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def test_dry_run_writes_the_summary(tmp_path):
    assert importlib.util.find_spec(PROBE) is None
    wheels, out = _wheel(tmp_path / "wheels").parent, tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    p = subprocess.run(["sh", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run", "--out", str(out), "--wheels",
                        str(wheels), "--also-need", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["dry_run"] and s["ok"] and "nothing ran on a GPU" in s["gpu_note"]
    if not torch.cuda.is_available():
        assert "no CUDA GPU visible" in s["gpu_note"] and s["machine"]["gpu"] is None
    w = s["wheels"]
    assert w["installed"] == [PROBE] and w["missing"] == [] and (out / "work" / "site" / PROBE).is_dir()
    assert [x["name"] for x in s["steps"]] == ["cuda_tests", "decode_loop", "update_attention", "trl_vs_capo", "demo"]
    assert all(x["rc"] == 0 and not x["timed_out"] for x in s["steps"]), s["steps"]
    tests = s["steps"][0]
    assert "--collect-only" in tests["cmd"] and tests["counts"]["collected"] >= 40, tests
    assert "tests/adapters/test_trl_cuda.py" in tests["cmd"]
    assert all((out / "logs" / f"{x['name']}.log").is_file() for x in s["steps"])


def test_the_test_list_and_the_download_command_agree_with_the_repository():
    for f in gpu_check.CUDA_TESTS:
        assert (ROOT / f).is_file(), f
    for dist in gpu_check.NEEDED.values():
        assert dist.replace("_", "-") in gpu_check.DOWNLOAD.replace("_", "-"), dist
    flat = " ".join(gpu_check.DOWNLOAD.split())
    for doc in (ROOT / "scripts" / "gpu-check.sh", ROOT / "docs" / "engines.md"):
        text = " ".join(doc.read_text().replace("\\\n", " ").replace("#", " ").split())
        assert flat in text, f"{doc.name} does not give the download command of scripts/gpu_check.py"


def test_without_a_gpu_a_real_run_refuses_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "machine", lambda: {"gpu": None, "cuda_available": False})
    monkeypatch.setattr(gpu_check, "install_wheels", lambda *a: {"missing": []})
    assert gpu_check.main(["--out", str(tmp_path / "o")]) == 2
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["steps"] == [] and not s["ok"] and s["gpu_note"].startswith("no CUDA GPU visible: nothing ran")


def test_counts_survive_a_run_cut_short():
    log = ("tests/a.py::test_x PASSED [ 10%]\ntests/a.py::test_y[p-1] FAILED [ 20%]\n"
           "tests/b.py::test_z SKIPPED (needs) [ 30%]\n")
    assert gpu_check.test_counts(log) == {"passed": 1, "failed": 1, "skipped": 1}
    assert gpu_check.test_counts("56/58 tests collected (2 deselected) in 3.1s") == {"collected": 56}
