import sys
import pathlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # for _tiny (tests/ is not a package)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Qwen2 model + tokenizer that writes well-formed RLCR answers (3, 4 or 7; gold is 7)."""
    pytest.importorskip("transformers")
    import _tiny

    d = tmp_path_factory.mktemp("tiny-qwen2")
    tok = _tiny.build_tokenizer(d)
    _tiny.build_model(d, tok)
    return str(d)
