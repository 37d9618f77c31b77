"""Preparing batches in a background thread while the learner computes.

    with Prefetcher(buf.sample, prefetch=2) as batches:
        for batch in batches:
            learn(batch)

While the learner computes on one batch (numpy and torch release the GIL in their
kernels, the disk reads release it too), the next ``prefetch`` batches are gathered.
"""
from __future__ import annotations

import queue
import threading

from .schema import check_count

__all__ = ["Prefetcher"]

_DONE = object()
_POLL = 0.05  # seconds between checks of the stop flag while the queue is full


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher:
    """Iterator over ``sample_fn()`` results, produced up to ``prefetch`` ahead by one thread.

    One thread calls ``sample_fn`` in order, so for a seeded store the batches are the
    same, in the same order, as direct calls would give. ``count`` limits the number of
    batches (default: until closed). An exception raised by ``sample_fn`` is raised by
    ``next()`` once the batches before it are taken, and ends the iteration. ``close()``
    (or leaving a ``with`` block) stops the thread and joins it; batches prepared but
    not taken are dropped (``sample_fn`` was still called for them). ``close`` is looked
    up on the instance, so a wrapper may replace it (and should call the original).
    """

    def __init__(self, sample_fn, prefetch: int = 2, count: int | None = None):
        prefetch = check_count("prefetch", prefetch, 1)  # InvalidArgumentError, as every count argument
        count = None if count is None else check_count("count", count, 0)
        self._sample = sample_fn
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._finished = False
        self._count = count
        self._thread = threading.Thread(target=self._run, name="diskreplay-prefetch", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producer
    def _run(self) -> None:
        made = 0
        try:
            while not self._stop.is_set() and (self._count is None or made < self._count):
                item = self._sample()
                made += 1
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Failure(exc))
            return
        self._put(_DONE)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    # ------------------------------------------------------------------ consumer
    def __iter__(self):
        return self

    def __next__(self):
        if self._finished or self._stop.is_set():
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL)
                break
            except queue.Empty:
                if self._stop.is_set() or not self._thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise StopIteration from None
        if item is _DONE:
            self._finished = True
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            self.close()
            raise item.exc
        return item

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def close(self, wait: bool = True) -> None:
        """Stop the producer thread and wait for it (it finishes a ``sample_fn`` call in
        progress first; ``wait=False`` only tells it to stop, as does a call from a signal
        handler that interrupted ``next()``). Idempotent."""
        self._stop.set()
        if self._queue.mutex.locked():
            # The queue's own lock is held: by the producer for a moment, or by this thread,
            # cut short in next() by a signal handler that closes the store. Then neither a
            # join nor taking the lock would ever end; the stop flag is enough (the producer
            # stops at its next check, and what it prepared goes with the iterator).
            return
        if wait and self._thread is not threading.current_thread():
            self._thread.join()
        while True:  # drop prepared batches now, not when the iterator is collected
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
