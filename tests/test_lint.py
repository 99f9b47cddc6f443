"""What no test run reaches: pyflakes' rules (an undefined name, an unused import, a redefinition) over every Python
file the repository tracks, checked by ruff. A name used only on a path no test takes (a runner's branch, a
script) fails here, not for the first user who takes that path."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_python_file_passes_pyflakes_rules():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    paths = files.stdout.split()
    assert len(paths) > 200, "git ls-files found too few files: this test would read nothing"
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--no-cache", "--output-format",
                        "concise", *paths], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
