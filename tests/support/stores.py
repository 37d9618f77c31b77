"""The store kinds the tests share: one ``make_store(kind, backend, num_envs)`` and one
``fill``, used by the part contract (``part_contract.py``, ``tests/features/test_parts.py``,
``tests/durability/test_parts_durability.py``) and its SIGKILL child (``part_child.py``).

Kinds: ``jumps`` (next states that jump every third transition, ``crash_common.step_args``:
the jump ring), ``stacks`` (``frame_stack=4``: the stack ring), ``priorities``
(``prioritized=True``, a few priorities updated after every step)."""
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


def make_store(kind: str, backend: str, num_envs: int = NUM_ENVS, *, path, max_size: int = MAX_SIZE,
               **options) -> DiskReplay:
    """A new, empty store of ``kind`` at ``path`` (``options`` go to ``DiskReplay.create``)."""
    return DiskReplay.create(path, max_size, num_envs=num_envs, backend=backend, **{**KINDS[kind], **options})


def step_ops(buf: DiskReplay, start: int) -> list:
    """The operations of the step whose first transition is ``start``, each a callable the
    user would see return (an add; on a prioritized store, then a priority update)."""
    ops = [lambda: add_step(buf, start)]
    if buf.prioritized:
        def update():
            slots = np.arange(min(buf.size, 4))
            buf.update_priorities(slots, ((start + buf.num_envs) % 17 + slots).astype(np.float64))
        ops.append(update)
    return ops


def fill(buf: DiskReplay, steps: int, start: int = 1) -> int:
    """Add ``steps`` steps from transition ``start`` (a prioritized store also updates the
    priorities of a few slots after each); returns the next transition number."""
    for _ in range(steps):
        for op in step_ops(buf, start):
            op()
        start += buf.num_envs
    return start
