"""Leaving a multi-process run's process group (``accelerate launch`` with several processes) without hanging.

A rank must leave the group before it exits: one that exits with the group's gloo / NCCL threads live is aborted by
the C++ runtime ("terminate called without an active exception"). And the group's threads must be let go in the one
order that cannot deadlock. The group's last owner joins its threads when it lets go of it. When that owner is DDP's
reducer, it joins them holding the GIL, while a gloo thread may still be freeing the last collectives' tensors,
which needs the GIL: both wait forever (torch's hazard pytorch#56297; seen by ``py-spy dump --native`` of a hung
two-process test, ``~ProcessGroupGloo`` -> ``std::thread::join`` against ``~AsyncAllgatherWork`` ->
``gil_scoped_acquire``; rare, commoner under load). So :func:`leave_process_group` frees DDP while a Python handle
keeps the group alive, then the handle: torch's ProcessGroup binding releases the GIL in its destructor, so the
thread finishes and the join returns.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any, Callable


def leave_process_group(accelerator: Any, ddp_model: Any, drop_model: Callable[[], None]) -> bool:
    """Wait for every process, leave the process group (accelerate's ``end_training``) and free DDP before the group.

    ``ddp_model``: the model ``accelerator.prepare`` wrapped; ``drop_model``: removes the caller's own references to
    it (e.g. puts the unwrapped module in its place); the accelerator's list of prepared models is emptied here
    (``free_memory``), so the accelerator cannot train on several processes afterwards. On one process: nothing.

    Returns whether DDP was freed before the group (False, with a RuntimeWarning, when something else still holds
    it: then its reducer may be the group's last owner after all)."""
    if accelerator.num_processes == 1:
        return True
    import torch.distributed as dist

    group, ddp = dist.group.WORLD, weakref.ref(ddp_model)
    del ddp_model
    accelerator.wait_for_everyone()
    accelerator.end_training()
    drop_model()
    accelerator.free_memory()
    gc.collect()
    freed = ddp() is None
    if not freed:
        warnings.warn("leave_process_group: the DDP model outlived its owner's references; leaving the process "
                      "group may hang (pytorch#56297)", RuntimeWarning, stacklevel=2)
    del group  # the last owner, with the GIL released while the group's threads join
    return freed
