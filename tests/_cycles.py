"""What a call leaves to Python's cyclic garbage collector (the rollout and trainer memory tests).

A tensor in a reference cycle is freed only when the collector runs its oldest generation, which in a training
process is rare: a rollout cache kept that way made a testbed run hold 8.5 GB (docs/performance.md, "Memory of a
testbed run"). Tests assert that what they run leaves no tensor to it.
"""

from __future__ import annotations

import gc


def left_to_the_cyclic_collector(fn) -> list:
    """Run ``fn()`` with the cyclic collector off, then return every object it left in unreachable reference cycles
    (what ``gc.collect()`` would free); the collector's state is restored whatever happens."""
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        fn()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_on:
            gc.enable()
