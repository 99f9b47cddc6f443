"""The device the device-aware tests run on (the TRL adapter's tests, the trainer's and `capo eval`'s CUDA tests).

``CAPO_TEST_DEVICE`` (``cpu`` or ``cuda``) when set; otherwise ``cuda`` when torch sees a GPU, else ``cpu``. So the
same files run unchanged here (no GPU: cpu) and on a GPU machine (cuda, automatically); ``CAPO_TEST_DEVICE=cpu``
keeps a GPU machine's run on the CPU, and ``CAPO_TEST_DEVICE=cuda`` without a GPU is an error, not a skip.

Tests compare what the code under test computed with an independent recomputation on this same device (reference
models are moved to it), and compare on the CPU.
"""

from __future__ import annotations

import os

import torch

DEVICES = ("cpu", "cuda")


def device_under_test() -> str:
    """``cpu`` or ``cuda``, as the module docstring says."""
    want = os.environ.get("CAPO_TEST_DEVICE", "").strip().lower()
    if not want:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want not in DEVICES:
        raise RuntimeError(f"CAPO_TEST_DEVICE={want!r}: allowed values: {', '.join(DEVICES)}")
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CAPO_TEST_DEVICE=cuda, but torch sees no CUDA GPU (torch "
                           f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'})")
    return want


DEVICE = device_under_test()
ON_CUDA = DEVICE == "cuda"


def assert_same_on_the_meta_default_device(cases) -> None:
    """``cases()`` -> a dict of results computed from CPU inputs made beforehand; with torch's default device set
    to ``meta`` it must return the same (compared as text: NaN equals NaN). A tensor the code makes without its
    inputs' device then lands on the meta device, holds no values, and the computation fails where it meets the
    inputs or is read back: on a machine with one device, this is how a test sees a missing ``device=``."""
    want = cases()
    torch.set_default_device("meta")
    try:
        got = cases()
    finally:
        torch.set_default_device(None)
    assert torch.empty(1).device.type == "cpu"
    for key in want:
        assert str(got[key]) == str(want[key]), key
