"""Gathering whole rows with parallel positioned reads, for data that is not in RAM.

Page-faulting a memory map reads one page at a time per thread (plus read-ahead); a
pool of threads doing ``os.preadv`` into the rows of the output keeps many reads in
flight (the GIL is released during each read) and reads exactly the rows asked for.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class RowReader:
    """A small thread pool reading rows of fixed size from files."""

    def __init__(self, threads: int = 16):
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="diskreplay-read")
        self._advised: set[int] = set()

    def gather(self, fd: int, offset: int, row_bytes: int, idxs: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Read rows ``idxs`` of the file (rows of ``row_bytes`` from ``offset``) into ``out``."""
        if fd not in self._advised:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: rows are random
            self._advised.add(fd)
        flat = out.reshape(len(idxs), -1).view(np.uint8)
        positions = (np.asarray(idxs, np.int64) * row_bytes + offset).tolist()
        order = sorted(range(len(positions)), key=positions.__getitem__)  # sorted reads for locality
        chunks = [order[i::self.threads] for i in range(min(self.threads, len(order)))]
        futures = [self._pool.submit(_read_rows, fd, positions, chunk, flat, row_bytes) for chunk in chunks]
        for future in futures:
            future.result()
        return out

    def submit(self, fn, *args):
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _read_rows(fd, positions, chunk, flat, row_bytes) -> None:
    for i in chunk:
        view = memoryview(flat[i])
        got = os.preadv(fd, [view], positions[i])
        while got < row_bytes:  # short reads are legal; finish the row
            n = os.preadv(fd, [view[got:]], positions[i] + got)
            if n <= 0:
                raise OSError(f"short read at offset {positions[i] + got}")
            got += n
