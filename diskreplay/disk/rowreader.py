"""Gathering whole rows with positioned reads, for data that is not in RAM.

Page-faulting a memory map reads one page at a time (plus read-ahead, up to megabytes on
a virtual disk). A cold gather instead tells the kernel every range it will read first
(``POSIX_FADV_WILLNEED``: the kernel submits those reads at once and returns), so the
disk's queue holds the whole batch, then copies each row with ``os.preadv`` (the GIL is
released while a read waits)::

    reader = RowReader()
    out = np.empty((len(idxs),) + row_shape, dtype)
    reader.gather(fd, data_offset, row_bytes, idxs, out)       # one field
    reader.gather_many([(fd, off, rb, idxs, out), ...])          # several fields, one pass

``gather_many`` announces the reads of every field before copying any, so a batch's frames
and its small fields (actions, rewards, dones: one page each) are all in flight together.
Small rows that share a page, or lie on neighbouring pages, are announced as one range.
On this project's benchmark disk, one thread copying behind the hints beat 16 threads
each waiting on its own read (no thread hand-offs on 2 cores); ``threads > 1`` still
spreads the copies over a pool for disks that need more requests in flight.
"""
from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InvalidArgumentError, StoreIOError
from ..core.schema import check_count

__all__ = ["RowReader", "page_cached", "read_span", "will_need"]

PAGE = mmap.PAGESIZE
_NOWAIT = getattr(os, "RWF_NOWAIT", None)
_PROBE_BYTE = bytearray(1)  # probes only ask whether the read would block; the byte is discarded


class RowReader:
    """Reads rows of fixed size from files by ``os.preadv``, after read-ahead hints.

    ``fd`` must be open for reading; for no read-ahead beyond the rows asked, advise it
    ``POSIX_FADV_RANDOM`` (the store's read descriptors are). Thread-safe for concurrent
    ``gather`` calls. ``close()`` (or ``with``) stops the pool, if one was started.
    """

    def __init__(self, threads: int = 1, *, nowait: bool = True, hint: bool = True, miss_limit: int = 4):
        self.threads = check_count("threads", threads, 1)
        self.nowait = bool(nowait) and _NOWAIT is not None
        self.hint = bool(hint)
        self.miss_limit = max(1, int(miss_limit))
        self._pool = None

    # ------------------------------------------------------------------ reading
    def gather(self, fd: int, offset: int, row_bytes: int, idxs, out: np.ndarray) -> np.ndarray:
        """Read rows ``idxs`` (rows of ``row_bytes`` bytes starting at byte ``offset`` of
        ``fd``) into ``out``, a C-contiguous array of ``len(idxs)`` rows; returns ``out``.
        Indices may repeat and come in any order; ``out[k]`` is row ``idxs[k]``."""
        self.gather_many([(fd, offset, row_bytes, idxs, out)])
        return out

    def gather_many(self, requests) -> list:
        """``gather`` for several ``(fd, offset, row_bytes, idxs, out)`` at once, all reads
        in flight together; returns the ``out`` arrays in order.

        Rows the page cache holds are copied first (``RWF_NOWAIT``: no waiting); after
        ``miss_limit`` misses in a row the batch is taken as cold and the rest is read
        without further tries. With ``hint``, every range left is announced to the kernel
        (``POSIX_FADV_WILLNEED``) before the first copy, so the disk's queue fills at once.
        """
        jobs, hints, outs = [], [], []
        flag = _NOWAIT if self.nowait else None
        misses = 0
        for fd, offset, row_bytes, idxs, out in requests:
            outs.append(out)
            idxs = np.asarray(idxs, dtype=np.int64).reshape(-1)
            row_bytes, offset = int(row_bytes), int(offset)
            if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
                raise InvalidArgumentError("out must be a writeable C-contiguous ndarray")
            if out.nbytes != len(idxs) * row_bytes or (len(idxs) and out.shape[0] != len(idxs)):
                raise InvalidArgumentError(f"out holds {out.nbytes} bytes in {out.shape[:1]} rows; "
                                 f"expected {len(idxs)} rows of {row_bytes} bytes")
            if not len(idxs):
                continue
            if idxs.min() < 0:
                raise InvalidArgumentError(f"negative row index {int(idxs.min())}")
            view = memoryview(out.reshape(-1).view(np.uint8))
            positions = (idxs * row_bytes + offset).tolist()
            first = len(jobs)
            if flag is not None and misses < self.miss_limit:
                misses = self._read_cached(fd, positions, view, row_bytes, jobs, misses, flag)
            else:
                jobs.extend((fd, pos, view, k * row_bytes, row_bytes, 0) for k, pos in enumerate(positions))
            if len(jobs) > first:
                mine = jobs[first:]
                mine.sort(key=_job_position)  # ascending offsets: the order the hints go in
                if self.hint:
                    hints.extend((fd, start, length) for start, length in
                                 _page_ranges([job[1] for job in mine], row_bytes))
                jobs[first:] = _spans(mine)
        if not jobs:
            return outs
        if len(jobs) > 1:
            fadvise, willneed = os.posix_fadvise, os.POSIX_FADV_WILLNEED
            for fd, start, length in hints:
                fadvise(fd, start, length, willneed)
        if len(jobs) == 1 or self.threads == 1:
            _work(iter(jobs))
            return outs
        pool = self._started_pool()
        shared = iter(jobs)  # next() on a list iterator is atomic under the GIL
        futures = [pool.submit(_work, shared) for _ in range(min(self.threads, len(jobs)))]
        error = None
        for future in futures:
            exc = future.exception()
            error = error or exc
        if error is not None:
            raise error
        return outs

    def _read_cached(self, fd, positions, view, row_bytes, left, misses, flag) -> int:
        """Copy the rows the page cache holds; queue the others in ``left``; returns the
        count of misses in a row so far."""
        preadv = os.preadv
        limit = self.miss_limit
        for k, pos in enumerate(positions):
            start = k * row_bytes
            if misses >= limit:
                left.append((fd, pos, view, start, row_bytes, 0))
                continue
            try:
                got = preadv(fd, [view[start:start + row_bytes]], pos, flag)
            except BlockingIOError:
                got = 0
            except OSError:  # RWF_NOWAIT unsupported here (old kernel, odd filesystem)
                self.nowait = False
                got = 0
            if got < row_bytes:
                left.append((fd, pos, view, start, row_bytes, max(got, 0)))
                misses += 1
            else:
                misses = 0
        return misses

    # ------------------------------------------------------------------ pool access
    def _started_pool(self) -> ThreadPoolExecutor:
        """The reader's thread pool, started on first use (one thread needs none)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="diskreplay-read")
        return self._pool

    def submit(self, fn, *args):
        """Run ``fn(*args)`` on the reader's pool (a ``concurrent.futures.Future``)."""
        return self._started_pool().submit(fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "RowReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def page_cached(fd: int, position: int) -> bool | None:
    """Whether the page holding byte ``position`` of ``fd`` is in the page cache: a one-byte
    ``preadv`` with ``RWF_NOWAIT``, which fails at once rather than wait for the disk.
    None where the kernel or filesystem cannot tell (no ``RWF_NOWAIT`` for buffered reads)."""
    if _NOWAIT is None:
        return None
    try:
        return os.preadv(fd, [_PROBE_BYTE], int(position), _NOWAIT) == 1
    except BlockingIOError:
        return False
    except OSError:  # EOPNOTSUPP and the like: this file cannot be probed
        return None



def read_span(fd: int, position: int, view: memoryview) -> None:
    """Fill ``view`` with the bytes of ``fd`` from ``position`` on: one ``preadv`` for a
    whole run of neighbouring rows (a chronological scan), short reads finished."""
    _work([(fd, int(position), view, 0, len(view), 0)])


def will_need(fd: int, position: int, length: int) -> None:
    """Ask the kernel to start reading ``length`` bytes from ``position`` now and return
    (``POSIX_FADV_WILLNEED``): the read-ahead of a scan, on descriptors advised random."""
    if length > 0:
        os.posix_fadvise(fd, int(position), int(length), os.POSIX_FADV_WILLNEED)


def _job_position(job):
    return job[1]


def _page_ranges(positions, row_bytes: int) -> list:
    """``(start, length)`` byte ranges of whole pages covering rows at ``positions`` (in
    ascending order), overlapping and adjacent pages merged: exactly the pages the rows
    occupy, in as few requests as that allows."""
    pos = np.asarray(positions, dtype=np.int64)
    if not len(pos):
        return []
    first = pos // PAGE
    last = np.maximum.accumulate((pos + row_bytes - 1) // PAGE)
    new_run = np.empty(len(pos), dtype=bool)
    new_run[0] = True
    new_run[1:] = first[1:] > last[:-1] + 1
    starts = first[new_run]
    ends = last[np.append(np.flatnonzero(new_run)[1:] - 1, len(pos) - 1)]
    return [(int(a) * PAGE, int(b - a + 1) * PAGE) for a, b in zip(starts, ends)]


def _spans(jobs: list) -> list:
    """Jobs sorted by position with neighbouring rows, also neighbours in ``out`` (rows
    asked in ascending order), joined: one ``preadv`` a span (a frame stack's rows)."""
    if len(jobs) < 2:
        return jobs
    out = [jobs[0]]
    for job in jobs[1:]:
        fd, pos, view, start, length, got = out[-1]
        if job[5] == 0 and job[0] == fd and job[1] == pos + length and job[2] is view and job[3] == start + length:
            out[-1] = (fd, pos, view, start, length + job[4], got)
        else:
            out.append(job)
    return out


def _work(jobs) -> None:
    preadv = os.preadv
    for fd, pos, view, start, row_bytes, got in jobs:
        while got < row_bytes:  # short reads are legal; finish the row
            try:
                n = preadv(fd, [view[start + got:start + row_bytes]], pos + got)
            except OSError as exc:  # EIO and the like: the store's error, errno kept
                raise StoreIOError(exc.errno, f"reading the row at byte {pos} of fd {fd}: {exc.strerror}") from exc
            if n <= 0:
                raise StoreIOError(f"short read: row at byte {pos} of fd {fd} ends past the end of the file")
            got += n
