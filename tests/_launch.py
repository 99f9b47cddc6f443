"""``accelerate launch`` for a multi-process test, on a free TCP port for its rendezvous.

A fixed port is shared by every test that names it: two such tests on the two workers of ``pytest -n 2`` then
collide (the second's ranks join the first's rendezvous, or fail with "address already in use").
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    """A port the system just gave out and nobody holds now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(procs: int) -> list[str]:
    """The command line up to the script: this environment's ``accelerate launch`` on ``procs`` CPU processes
    (``--multi_gpu`` with more than one: without it accelerate starts one process on a CPU machine), no mixed
    precision, no dynamo, a free port."""
    return [str(Path(sys.executable).parent / "accelerate"), "launch", *(["--multi_gpu"] if procs > 1 else []),
            "--num_processes", str(procs), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port())]
