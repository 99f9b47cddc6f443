"""A free TCP port for a multi-process test's rendezvous (``accelerate launch --main_process_port``).

A fixed port is shared by every test that names it: two such tests on the two workers of ``pytest -n 2`` then
collide (the second's ranks join the first's rendezvous, or fail with "address already in use").
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the system just gave out and nobody holds now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
