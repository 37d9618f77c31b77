"""A writer whose store a forked child touches, run by tests/durability/test_fork.py:

    python fork_child.py STORE BACKEND PRIORITIZED EXIT

Creates a store and adds 20 steps (printing ``ack T`` after each add that returned), then
forks: the child calls add, flush, reset, sample and update_priorities on the inherited
writer (each must raise ``ForkedStoreError``), then ``close()``, and leaves by ``EXIT``
(``_exit``: ``os._exit``; ``exit``: ``sys.exit``, finalizers and atexit handlers run;
``drop``: the object dropped and collected first). The parent prints what the child saw,
waits for a line on stdin, adds 50 more steps, prints ``done`` and waits to be killed (the test sends SIGKILL).
"""
import gc
import os
import sys

import numpy as np

from diskreplay import DiskReplay, ForkedStoreError


def row(t: int) -> np.ndarray:
    return np.full(3, t, np.float32)


def add(buf, t: int) -> None:
    buf.add(row(t), t, float(t), row(t + 1), False)
    print("ack", t, flush=True)


def main() -> None:
    store, backend, prioritized, how = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
    buf = DiskReplay.create(store, 64, backend=backend, prioritized=prioritized, flush_every=7)
    for t in range(20):
        add(buf, t)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        seen = []
        calls = [("add", lambda: buf.add(row(99), 99, 99.0, row(100), False)), ("flush", buf.flush),
                 ("reset", buf.reset), ("sample", lambda: buf.sample(4)), ("get", lambda: buf.get([0]))]
        if prioritized:
            calls.append(("update_priorities", lambda: buf.update_priorities([0, 1], [5.0, 6.0])))
        for name, call in calls:
            try:
                call()
                seen.append(f"{name}:returned")
            except ForkedStoreError:
                seen.append(f"{name}:forked")
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                seen.append(f"{name}:{type(exc).__name__}")
        buf.close()
        seen.append(f"closed:{buf.closed}")
        os.write(w, " ".join(seen).encode())
        os.close(w)
        if how == "_exit":
            os._exit(0)
        if how == "drop":
            globals().pop("buf", None)
            del calls
            gc.collect()
        sys.exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    print("child", os.read(r, 4096).decode(), flush=True)
    sys.stdin.readline()  # the test reads the store as the child left it, then says go
    for t in range(20, 70):
        add(buf, t)
    print("done", flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
