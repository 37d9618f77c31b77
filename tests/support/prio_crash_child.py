"""Child of ``tests/durability/test_prioritized_crash.py``: opens a prioritized store and runs the
deterministic operation stream ``prio_ops(i)`` (updates, adds, flushes), printing ``i``
after operation ``i`` returned, until it is killed."""
from __future__ import annotations

import sys

import numpy as np

from diskreplay import DiskReplay
from fields import step_values


def prio_op(i: int, size: int, seen: int):
    """Operation ``i`` for a store of ``size`` occupied slots: ``("add", t)``,
    ``("flush",)`` or ``("update", idxs, raw)``; the same in the child and the parent."""
    rng = np.random.default_rng(1000 + i)
    r = rng.random()
    if r < 0.15:
        return ("add", seen + 1)
    if r < 0.2:
        return ("flush",)
    k = int(rng.integers(1, 33))
    return ("update", rng.integers(0, size, k), rng.random(k) * 10)


def main(path: str) -> None:
    buf = DiskReplay.open(path)
    i = 0
    while True:
        i += 1
        op = prio_op(i, buf.size, buf.seen_size)
        if op[0] == "add":
            buf.add(*step_values(op[1]))
        elif op[0] == "flush":
            buf.flush()
        else:
            buf.update_priorities(op[1], op[2])
        sys.stdout.write(f"{i}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
