"""Real SIGTERMs into the README's preemption recipe in a prioritized learner loop (issue 35
item 2), run by tests/durability/test_interrupts_ops.py:

    python sigterm_learner.py DIR BACKEND SIGNALS SEED

A prioritized store is created and filled past one lap; then, ``SIGNALS`` times, a child
is forked that reopens it, installs the recipe (``def on_term(...): buf.close();
sys.exit(0)``) and runs the README's learner loop: ``batches()`` with its prefetch thread,
``update_priorities`` on every batch, an ``add`` after each (recording in shared memory the
``seen_size`` after every add that returned). After a random delay (counted from the child's
first batch, so a slow machine only makes runs longer) it gets SIGTERM. The parent waits at
most ``HANG_S`` for it (then kills it: a hang), reopens the store and checks that it was
closed cleanly, that no acknowledged step was lost, that every transition is whole and every
priority finite. Prints one JSON line with the counts; exits 1 on any failure. A handler
that runs inside a weakref callback has its ``sys.exit`` dropped by Python ("Exception
ignored"); the loop's next store call then raises ``StoreClosedError`` and the child exits
through it: counted apart (``closed_error``), not a failure.
"""
import json
import mmap
import os
import random
import signal
import sys
import time
import traceback
import warnings

import numpy as np

from diskreplay import DiskReplay, RecoveryWarning, StoreClosedError
from interrupt_common import add_step, check_whole, fields_for

CHAIN = "fast-vector"  # 3 envs, 12 slots (interrupt_common)
HANG_S = 20.0


def child(store: str, shared: np.ndarray) -> None:
    buf = DiskReplay.open(store)

    def on_term(signum, frame):  # the README's recipe
        buf.close()  # flushes
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    shared[0] = buf.seen_size
    with buf.batches(8) as batches:
        for batch in batches:
            buf.update_priorities(batch["idxs"], np.abs(batch["rewards"]) + 0.25)
            shared[1] = 1  # a whole loop ran: the signal may come
            add_step(buf, CHAIN)
            shared[0] = buf.seen_size


def check(store: str, acked: int, i: int, counts: dict, failures: list) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecoveryWarning)
        buf = DiskReplay.open(store)
    try:
        if caught:
            counts["unclean"] += 1
            failures.append(f"signal {i}: not closed cleanly: {caught[0].message}")
        seen, n = buf.seen_size, buf.num_envs
        if seen < acked:
            counts["lost"] += 1
            failures.append(f"signal {i}: seen_size {seen} < acknowledged {acked}")
        elif seen > acked + n:
            failures.append(f"signal {i}: seen_size {seen} > acknowledged {acked} + one step")
        try:
            check_whole(buf, CHAIN)
            assert not buf.verify_rows()[1]
            p = buf.get(np.arange(buf.size))["priorities"]
            assert np.isfinite(p).all() and (p >= 0).all(), p
        except AssertionError as exc:
            counts["torn"] += 1
            failures.append(f"signal {i}: torn: {exc}")
    finally:
        buf.close()


def main() -> int:
    directory, backend, signals, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    store = os.path.join(directory, "learner")
    with DiskReplay.create(store, 12, num_envs=3, backend=backend, seed=1, prioritized=True,
                           fields=fields_for(False)) as buf:
        while buf.seen_size < 2 * buf.max_size:
            add_step(buf, CHAIN)
    shared = np.frombuffer(mmap.mmap(-1, 4096), np.int64, 2)
    counts = {"signals": 0, "torn": 0, "lost": 0, "unclean": 0, "bad_exit": 0, "hangs": 0, "crashes": 0,
              "closed_error": 0}
    failures = []
    for i in range(signals):
        shared[:] = 0
        pid = os.fork()
        if pid == 0:
            code = 3  # the loop ended by itself: it never should
            try:
                child(store, shared)
            except SystemExit as exc:  # the recipe's exit
                code = 0 if exc.code in (0, None) else 2
            except StoreClosedError:  # the handler ran where Python drops its exit (a weakref callback)
                code = 4
            except BaseException:  # noqa: BLE001 - reported as a bad exit
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)  # never back into the parent's code
        status = None
        while shared[1] == 0 and status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            status = code if done else None  # died before its first batch: reported below
            time.sleep(0.0001)
        if status is None:
            time.sleep(rng.uniform(0, 0.02))  # into any line of the loop: next(), update, add, the thread's sample
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + HANG_S
            while status is None and time.monotonic() < deadline:
                done, code = os.waitpid(pid, os.WNOHANG)
                status = code if done else None
                time.sleep(0.001)
        counts["signals"] += 1
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            counts["hangs"] += 1
            failures.append(f"signal {i}: no exit within {HANG_S} s")
            continue  # killed: the next child's open recovers it
        if os.WIFSIGNALED(status):
            counts["crashes"] += 1
            failures.append(f"signal {i}: child killed by signal {os.WTERMSIG(status)}")
            continue
        if os.WEXITSTATUS(status) == 4:
            counts["closed_error"] += 1  # exited promptly all the same, through the next call's error
        elif os.WEXITSTATUS(status) != 0:
            counts["bad_exit"] += 1
            failures.append(f"signal {i}: child exit {os.WEXITSTATUS(status)}")
        check(store, int(shared[0]), i, counts, failures)
    print(json.dumps({"backend": backend, **counts, "failures": failures[:10]}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
