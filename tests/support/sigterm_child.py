"""Real SIGTERMs into the README's preemption recipe (issue 13), run by tests/durability/test_interrupts.py:

    python sigterm_child.py DIR BACKEND SIGNALS SEED [EARLY_BYTES]

For each add path of ``interrupt_common.PATHS`` a store is created and filled past one lap;
then, ``SIGNALS`` times, a child is forked that reopens one of them, installs the recipe
(``def on_term(...): buf.close(); sys.exit(0)``) and adds steps as fast as it can, recording
in shared memory the ``seen_size`` after every ``add`` that returned; after a random delay it
gets SIGTERM. The parent then reopens the store and checks that it was closed cleanly, that
no acknowledged step was lost, and that every transition it holds is whole. Prints one JSON
line with the counts; exits 1 on any failure. ``EARLY_BYTES`` sets the writer's early work
(``flushing.EARLY_BYTES``; 1: after every step), so the signals also land while the early
work thread copies undo rows ahead.
"""
import json
import mmap
import os
import random
import signal
import sys
import warnings

import numpy as np

from diskreplay import DiskReplay, RecoveryWarning

from diskreplay.session import flushing
from interrupt_common import PATHS, add_step, check_whole, create


def child(store: str, name: str, shared: np.ndarray) -> None:
    buf = DiskReplay.open(store)

    def on_term(signum, frame):  # the README's recipe
        buf.close()  # flushes
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    shared[0] = buf.seen_size
    shared[1] = 1  # ready
    while True:
        add_step(buf, name)
        shared[0] = buf.seen_size


def main() -> int:
    directory, backend, signals, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if len(sys.argv) > 5:
        flushing.EARLY_BYTES = int(sys.argv[5])
    rng = random.Random(seed)
    names = list(PATHS)
    for name in names:
        with create(os.path.join(directory, name), name, backend) as buf:
            while buf.seen_size < 2 * buf.max_size:
                add_step(buf, name)
    shared_map = mmap.mmap(-1, 4096)
    shared = np.frombuffer(shared_map, np.int64, 2)
    counts = {"signals": 0, "torn": 0, "lost": 0, "unclean": 0, "bad_exit": 0, "completed_in_flight": 0}
    failures = []
    for i in range(signals):
        name = names[i % len(names)]
        store = os.path.join(directory, name)
        shared[:] = 0
        pid = os.fork()
        if pid == 0:
            try:
                child(store, name, shared)
            finally:
                os._exit(0)  # SystemExit from the recipe, or anything else: never back into the parent's code
        while shared[1] == 0:
            pass
        deadline = rng.uniform(0, 0.003)
        os.sched_yield()
        t0 = os.times().elapsed
        while os.times().elapsed - t0 < deadline:
            pass
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        counts["signals"] += 1
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            counts["bad_exit"] += 1
            failures.append(f"signal {i} ({name}): child status {status}")
        acked = int(shared[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RecoveryWarning)
            buf = DiskReplay.open(store)
        try:
            if caught:
                counts["unclean"] += 1
                failures.append(f"signal {i} ({name}): not closed cleanly: {caught[0].message}")
            seen, n = buf.seen_size, buf.num_envs
            if seen < acked:
                counts["lost"] += 1
                failures.append(f"signal {i} ({name}): seen_size {seen} < acknowledged {acked}")
            elif seen > acked + n:
                failures.append(f"signal {i} ({name}): seen_size {seen} > acknowledged {acked} + one step")
            elif seen == acked + n:
                counts["completed_in_flight"] += 1  # the add had returned, the count not yet written
            try:
                check_whole(buf, name)
                damaged = buf.verify_rows()[1]
                assert not damaged, damaged
            except AssertionError as exc:
                counts["torn"] += 1
                failures.append(f"signal {i} ({name}): torn: {exc}")
        finally:
            buf.close()
    print(json.dumps({"backend": backend, **counts, "failures": failures[:10]}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
