"""Stores that have each part, made and filled the same way by ``tests/features/test_parts.py`` and
its SIGKILL child (``part_child.py``)."""
from __future__ import annotations

import numpy as np
from crash_common import FRAME, add_step

from diskreplay import DiskReplay

MAX_SIZE, NUM_ENVS = 40, 2
_FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
           "dones": ((), "bool"), "tags": ((), "int32")}
KINDS = {
    "jumps": {"fields": _FIELDS},  # crash_common.step_args jumps every third transition
    "stacks": {"fields": {**_FIELDS, "states": ((4,) + FRAME, "float32")}, "frame_stack": 4},
    "priorities": {"fields": _FIELDS, "prioritized": True},
}


def create(kind: str, path, backend: str) -> DiskReplay:
    return DiskReplay.create(path, MAX_SIZE, num_envs=NUM_ENVS, backend=backend, **KINDS[kind])


def fill(buf: DiskReplay, steps: int, start: int = 1) -> int:
    """Add ``steps`` steps from transition ``start`` (a prioritized store also updates the
    priorities of a few slots after each); returns the next transition number."""
    for _ in range(steps):
        add_step(buf, start)
        start += buf.num_envs
        if buf.prioritized and buf.size:
            slots = np.arange(min(buf.size, 4))
            buf.update_priorities(slots, (start % 17 + slots).astype(np.float64))
    return start
