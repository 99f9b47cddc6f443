import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "arith.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is {i}+{i}?", "solution": f"so \\boxed{{{2 * i}}}"} for i in range(5)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p
