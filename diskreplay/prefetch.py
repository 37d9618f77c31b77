"""Preparing batches in a background thread while the learner computes."""
from __future__ import annotations

import queue
import threading

_DONE = object()


class Prefetcher:
    """Iterator over ``sample_fn()`` results, produced ``prefetch`` ahead by one thread.

    One thread calls ``sample_fn`` in order, so for a seeded store the batches are the
    same, in the same order, as direct calls would give. ``close()`` (or leaving a
    ``with`` block) stops the thread; batches prepared but not taken are dropped.
    """

    def __init__(self, sample_fn, prefetch: int = 2, count: int | None = None):
        self._sample = sample_fn
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._count = count
        self._thread = threading.Thread(target=self._run, name="diskreplay-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        made = 0
        try:
            while not self._stop.is_set() and (self._count is None or made < self._count):
                item = self._sample()
                made += 1
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the consumer, raised there
            self._put_final(exc)
            return
        self._put_final(_DONE)

    def _put_final(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        item = self._queue.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
