"""A writer's early work, on a thread of its own while adds go on.

Between flushes, every ``EARLY_BYTES`` of rows, an add hands over early work (``flushing.py``):
start the writeback of the rows added, and copy the next block of the next checkpoint's
undo rows ahead (``undocopy.py``). On the add's own thread that cost about 0.6-0.9 ms per
MiB of rows (the copy, its CRC and the writeback's submission): on W3's frames one add in
four or two took that long. Here the add only posts the job; the thread does it with the
GIL released for the writes, CRCs and hints.

None of it is needed for durability: whatever a job has not done, the flush does itself
(the writeback by its fsync, the undo rows by copying the rest). So the protocol is small
and lock-free on the writer's side, because a signal handler may run ``close()`` anywhere
on the writer's thread and must never wait for a lock that thread holds:

* ``post(job)`` puts ``(epoch, job)`` on a ``SimpleQueue`` (its ``put`` never blocks and is
  reentrant). The thread runs a job only while its epoch is current, and the job asks
  ``wanted()`` before each write.
* ``quiesce()`` (a flush before it finishes the undo copy, ``close()``) makes every posted
  job stale, then waits until the thread is inside none: after it returns no job writes
  again. The thread sets ``busy`` before it checks the epoch and the writer bumps the epoch
  before it reads ``busy`` (both under the GIL, so in one order), so a job either sees the
  new epoch or is waited for.

Errors inside a job are dropped: the flush redoes that work and meets the error itself.
After a ``fork`` the child has no thread; the writer starts another there (``alive``).
"""
from __future__ import annotations

import os
import queue
import threading
import time

__all__ = ["EarlyWorker"]

_POLL_S = 50e-6  # quiesce's wait: a block of work takes about a millisecond


class EarlyWorker:
    def __init__(self, name: str):
        self.epoch = 0
        self.busy = False
        self.pid = os.getpid()
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"diskreplay early work ({name})", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether jobs posted here will run (false in a forked child, or once stopped)."""
        return self.pid == os.getpid() and self._thread.is_alive()

    def post(self, job) -> None:
        """Run ``job(wanted)`` on the thread, unless a ``quiesce`` comes first."""
        self._jobs.put((self.epoch, job))

    def quiesce(self) -> None:
        """Drop every job posted so far and wait until none is running."""
        self.epoch += 1
        while self.busy and self.alive:
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """Quiesce, then let the thread end (it holds nothing; no join, so a signal
        handler's ``close()`` never waits on it)."""
        self.quiesce()
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            epoch, job = item
            self.busy = True
            try:
                if epoch == self.epoch:
                    job(lambda: epoch == self.epoch)
            except BaseException:  # noqa: BLE001 - the flush redoes what a job could not do
                pass
            finally:
                self.busy = False
