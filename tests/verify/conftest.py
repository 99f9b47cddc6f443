import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def verifier():
    """One warm 2-worker verifier for the whole verify test session (hard timeout 3 s)."""
    from capo.verify import Verifier

    v = Verifier(workers=2, timeout_s=3.0)
    v.verify_batch(["1/2", "2"], ["0.5", "3"])  # start and warm both workers
    yield v
    v.close()
