"""Rows written straight into an export's output file, and the disk's writeback started behind them.

npz members (:mod:`diskreplay.export.npz`) and HDF5 datasets whose chunks (of whole rows)
are allocated at creation (:func:`create_placed`) give every row its place in the file
before any is written, so a block of rows is one positioned write (``os.pwrite``, the GIL
released) per chunk run, without HDF5 copying each block through its chunk cache first.
:class:`PlacedRows` knows where a dataset's rows lie; datasets whose bytes in the file may
differ from numpy's in memory (see :func:`writes_raw`) are written through h5py instead.

The kernel keeps written pages dirty until a tenth of RAM is dirty, which on a large
machine is more than a whole export: the final ``fsync`` then wrote everything while the
export waited, after every read. :class:`WriteBehind` starts the writeback of each stretch
as soon as it is written (``POSIX_FADV_DONTNEED`` starts it without waiting for it), so the
disk writes while the next rows are read, and drops those pages a few stretches later, once
written, so that an export does not fill the page cache with a file nobody reads yet.
"""
from __future__ import annotations

import collections
import os

import numpy as np

from ..disk.fsutil import pwrite_all

KICK_BYTES = 16 << 20  # written between two writeback requests
DROP_LAG = 8  # requests later, the pages of a stretch are dropped (written by then, or left)
GATHER_BELOW = 64 << 10  # writes smaller than this are gathered in memory ...
GATHER_BYTES = 1 << 20  # ... up to this much a dataset
GATHER_ROW_BYTES = 4096  # rows at least this large, apart in memory, are written by pwritev
IOV_MAX = 1024
GAP_BYTES = 1 << 20  # writes closer than this are advised as one range
MIN_BYTES = 256 << 10  # a smaller range is left to the final fsync (each piece of advice costs ~0.1 ms)


class WriteBehind:
    """Positioned writes to ``fd``, with the writeback of every ``KICK_BYTES`` written
    requested right away and the pages dropped ``DROP_LAG`` requests later."""

    def __init__(self, fd: int, owned: bool = False):
        self.fd, self.owned = fd, owned
        self.pending: list[tuple[int, int]] = []
        self.pending_bytes = 0
        self.kicked: collections.deque = collections.deque()
        self.placed: list = []  # PlacedRows writing through this

    @classmethod
    def opening(cls, path: str) -> "WriteBehind":
        """On a file of its own opened for writing ``path`` (closed by :meth:`close`)."""
        return cls(os.open(path, os.O_WRONLY), owned=True)

    def close(self) -> None:
        if self.owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "WriteBehind":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None:
                for place in self.placed:  # small writes still gathered (exports flush them before resizing)
                    place.flush()
        finally:
            self.close()

    def write(self, view: memoryview, offset: int) -> None:
        pwrite_all(self.fd, view, offset)
        self.wrote(offset, len(view))

    def write_rows(self, rows: list, offset: int) -> None:
        """Write the arrays ``rows`` (each contiguous) one after the other from ``offset``,
        gathered by ``pwritev`` rather than copied together first."""
        views = [memoryview(r.reshape(-1).view(np.uint8)) for r in rows]
        at = offset
        for i in range(0, len(views), IOV_MAX):
            part = views[i:i + IOV_MAX]
            want = sum(len(v) for v in part)
            done = os.pwritev(self.fd, part, at)
            if done < want:  # a short write: the rest the plain way
                pwrite_all(self.fd, memoryview(b"".join(part))[done:], at + done)
            at += want
        self.wrote(offset, at - offset)

    def wrote(self, offset: int, length: int) -> None:
        if length:
            self.pending.append((offset, length))
            self.pending_bytes += length
            if self.pending_bytes >= KICK_BYTES:
                self.kick()

    def kick(self) -> None:
        ranges = [(o, n) for o, n in _merged(self.pending) if n >= MIN_BYTES]
        self.pending, self.pending_bytes = [], 0
        _advise(self.fd, ranges)  # dirty pages: writeback starts
        self.kicked.append(ranges)
        if len(self.kicked) > DROP_LAG:
            _advise(self.fd, self.kicked.popleft())  # clean pages now: dropped


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for offset, length in sorted(ranges):
        if out and offset <= out[-1][0] + out[-1][1] + GAP_BYTES:
            out[-1][1] = max(out[-1][1], offset + length - out[-1][0])
        else:
            out.append([offset, length])
    return [(o, n) for o, n in out]


def _advise(fd: int, ranges) -> None:
    if not hasattr(os, "posix_fadvise"):
        return
    for offset, length in ranges:
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:  # advice only
            return


def writes_raw(dtype: np.dtype) -> bool:
    """Whether HDF5 stores ``dtype`` as numpy holds it in memory (native integers, bools,
    IEEE floats), so rows may be written as bytes; others go through h5py."""
    dtype = np.dtype(dtype)
    return dtype.isnative and (dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize in (2, 4, 8)))


def create_placed(group, name: str, rows: int, shape: tuple, dtype, chunk_rows: int):
    """An HDF5 dataset of ``rows`` rows of ``shape`` (resizable along the rows), chunks
    of ``chunk_rows`` whole rows allocated at creation and never filled: every row has
    its place in the file before it is written."""
    from h5py import h5d, h5p

    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
    return group.create_dataset(name, shape=(rows,) + tuple(shape), maxshape=(None,) + tuple(shape),
                                dtype=dtype, chunks=(chunk_rows,) + tuple(shape), dcpl=dcpl)


class PlacedRows:
    """Where the rows of ``dset`` (made by :func:`create_placed`) lie in its file, and
    their writes: by ``out`` (a :class:`WriteBehind` on the file) when :func:`writes_raw`
    allows it, else through h5py."""

    def __init__(self, dset, out: WriteBehind):
        self.dset, self.out = dset, out
        self.row_bytes = dset.dtype.itemsize * int(np.prod(dset.shape[1:], dtype=np.int64))
        self.raw = writes_raw(dset.dtype) and self.row_bytes > 0 and dset.chunks is not None
        if self.raw:
            self.chunk_rows = dset.chunks[0]
            self.offsets = _chunk_offsets(dset)
        self.pending: dict = {}  # small writes gathered: {end row: [first row, arrays]}
        self.pending_bytes = 0
        out.placed.append(self)

    def write(self, lo: int, values: np.ndarray) -> None:
        """Rows ``lo, lo + 1, ...`` from ``values`` (whole rows of the dataset's dtype and shape).
        Writes under ``GATHER_BELOW`` are gathered in memory (up to ``GATHER_BYTES`` a
        dataset) and written by :meth:`flush` or when they add up: each ``pwrite`` may wait
        for the file system while the disk writes back, so the thousands of few-byte writes
        of a D4RL export's small datasets (a few rows per env and block) cost seconds."""
        n = len(values)
        if not n:
            return
        if not self.raw:
            self.dset[lo:lo + n] = values
            return
        for end, (first, _) in list(self.pending.items()):  # rows written again: what came before goes first
            if first < lo + n and lo < end:
                self._flush_run(end)
        if n * self.row_bytes >= GATHER_BELOW:
            self._write_now(lo, values)
            return
        first, arrays = self.pending.pop(lo, None) or (lo, [])
        arrays.append(np.array(values, self.dset.dtype))  # a copy: the block it came from is not kept
        self.pending[lo + n] = [first, arrays]
        self.pending_bytes += n * self.row_bytes
        if self.pending_bytes >= GATHER_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the small writes gathered so far."""
        for end in list(self.pending):
            self._flush_run(end)

    def _flush_run(self, end: int) -> None:
        first, arrays = self.pending.pop(end)
        self.pending_bytes -= (end - first) * self.row_bytes
        self._write_now(first, np.concatenate(arrays))

    def _write_now(self, lo: int, values: np.ndarray) -> None:
        n = len(values)
        cr, rb = self.chunk_rows, self.row_bytes
        runs = []  # (first row, end row, file offset) of chunks that lie back to back
        row = lo
        while row < lo + n:
            chunk = row // cr
            offset = int(self.offsets[chunk]) + (row - chunk * cr) * rb
            end = min(lo + n, (chunk + 1) * cr)
            if runs and offset == runs[-1][2] + (row - runs[-1][0]) * rb:
                runs[-1][1] = end
            else:
                runs.append([row, end, offset])
            row = end
        values = np.asarray(values)
        if _rows_apart(values, self.dset.dtype, rb):  # one env's rows of a block, say: written without a copy
            for first, end, offset in runs:
                self.out.write_rows([values[r] for r in range(first - lo, end - lo)], offset)
            return
        data = memoryview(np.ascontiguousarray(values, self.dset.dtype).reshape(-1).view(np.uint8))
        for first, end, offset in runs:
            self.out.write(data[(first - lo) * rb:(end - lo) * rb], offset)


def _rows_apart(values: np.ndarray, dtype: np.dtype, row_bytes: int) -> bool:
    """Whether ``values`` are large rows each contiguous in memory but not one after the other."""
    return (hasattr(os, "pwritev") and row_bytes >= GATHER_ROW_BYTES and values.dtype == dtype
            and not values.flags.c_contiguous and values[0].flags.c_contiguous)


def _chunk_offsets(dset) -> np.ndarray:
    """Byte offset in the file of each chunk, in row order."""
    cr = dset.chunks[0]
    offsets = np.full(-(-dset.shape[0] // cr), -1, np.int64)

    def place(info) -> None:
        offsets[info.chunk_offset[0] // cr] = info.byte_offset

    if hasattr(dset.id, "chunk_iter"):
        dset.id.chunk_iter(place)
    else:
        for i in range(dset.id.get_num_chunks()):
            place(dset.id.get_chunk_info(i))
    if (offsets < 0).any():
        raise RuntimeError(f"{dset.name}: chunks not allocated at creation")
    return offsets


__all__ = ["PlacedRows", "WriteBehind", "create_placed", "writes_raw"]
