"""An uncompressed ``.npz`` (what ``np.savez`` writes) filled by all of its members at once.

``zipfile`` writes members one after the other, so an export that produces every key of
a block together had to stage each key in a file of its own and copy it into the archive
afterwards: the output written twice. In a stored (uncompressed) zip the size of every
member is known before its data arrive, so each member gets its place up front and rows
are written straight there (``os.pwrite``); the CRC-32 of each member is carried along
(summed on a second thread while large rows are written),
and the zip headers are written last. ZIP64 records throughout, so members may exceed
4 GiB. When fewer rows came than announced (a live writer overtook some), the members
are moved down over the gaps and given their true shapes before the headers are written.

    with NpzWriter(path, {"states": ((4,), np.float32), ...}, rows=1000) as npz:
        npz.append("states", block_of_states)   # rows in order, each key at its own pace
        ...
        npz.finish()                            # the rows appended so far
"""
from __future__ import annotations

import concurrent.futures
import io
import os
import struct
import time
import zlib

import numpy as np

from ..disk.fsutil import pwrite_all
from .placed import WriteBehind

COPY_BYTES = 16 << 20
PARALLEL_CRC_BYTES = 1 << 20
_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header, without name and extra field
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory header
_ZIP64_END = struct.Struct("<IQHHIIQQQQ")
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_END = struct.Struct("<IHHHHIIH")
_VERSION = 45  # ZIP64
_FULL32 = 0xFFFFFFFF


def npy_header(shape: tuple, dtype: np.dtype) -> bytes:
    """The ``.npy`` header ``np.save`` writes for an array of ``shape`` and ``dtype``."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    out = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(out, header)
    except ValueError:  # a header too long for version 1.0 (huge structured dtypes)
        np.lib.format.write_array_header_2_0(out, header)
    return out.getvalue()


class _Member:
    def __init__(self, key: str, shape: tuple, dtype: np.dtype):
        self.name = f"{key}.npy".encode()
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))
        self.rows = 0  # appended so far
        self.offset = self.data = 0  # of its local header and of its first row
        self.header = b""
        self.crc = 0  # of its header and the rows appended so far

    def place(self, offset: int, rows: int) -> int:
        """Put the member at ``offset`` holding ``rows`` rows; returns the offset after it."""
        self.offset = offset
        self.header = npy_header((rows,) + self.shape, self.dtype)
        self.data = offset + _LOCAL.size + len(self.name) + 20 + len(self.header)
        self.crc = zlib.crc32(self.header)  # the member's data: its header, then its rows
        return self.data + rows * self.row_bytes

    @property
    def size(self) -> int:
        return len(self.header) + self.rows * self.row_bytes


class NpzWriter:
    """Writes ``path`` (created or truncated): one member ``KEY.npy`` per key of ``specs``
    (``{key: (row shape, dtype)}``), room for ``rows`` rows each."""

    def __init__(self, path: str, specs: dict, rows: int):
        self.members = {key: _Member(key, shape, dtype) for key, (shape, dtype) in specs.items()}
        self.capacity = rows
        offset = 0
        for member in self.members.values():
            offset = member.place(offset, rows)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.out = WriteBehind(self.fd)
        self.summer = None  # a thread summing large rows while they are written (both release the GIL)

    def append(self, key: str, values) -> None:
        """Write the next rows of ``key`` (an array of whole rows of its shape and dtype)."""
        member = self.members[key]
        arr = np.ascontiguousarray(values, dtype=member.dtype)
        n = arr.shape[0] if arr.ndim else 0
        if not arr.ndim or arr.shape[1:] != member.shape or member.rows + n > self.capacity:
            raise ValueError(f"{key}: {n} rows of {arr.shape[1:]} do not fit the member's "
                             f"{self.capacity - member.rows} rows of {member.shape}")
        view = memoryview(arr.reshape(-1).view(np.uint8))
        if len(view) < PARALLEL_CRC_BYTES:
            member.crc = zlib.crc32(view, member.crc)
            self.out.write(view, member.data + member.rows * member.row_bytes)
        else:
            if self.summer is None:
                self.summer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="npz-crc")
            crc = self.summer.submit(zlib.crc32, view, member.crc)
            self.out.write(view, member.data + member.rows * member.row_bytes)
            member.crc = crc.result()
        member.rows += n

    def finish(self) -> None:
        """Write the zip records for the rows appended (the same count for every key)."""
        counts = {m.rows for m in self.members.values()}
        if len(counts) > 1:
            raise ValueError(f"members hold different row counts {sorted(counts)}")
        rows = counts.pop() if counts else 0
        if rows < self.capacity:
            self._compact(rows)  # each header's shape changes, and with it the CRC
        when = time.localtime()
        dos_time = (when.tm_hour << 11) | (when.tm_min << 5) | (when.tm_sec // 2)
        dos_date = ((max(when.tm_year, 1980) - 1980) << 9) | (when.tm_mon << 5) | when.tm_mday
        central = []
        end = 0
        for m in self.members.values():
            extra = struct.pack("<HHQQ", 1, 16, m.size, m.size)
            local = _LOCAL.pack(0x04034B50, _VERSION, 0, 0, dos_time, dos_date, m.crc, _FULL32, _FULL32,
                                len(m.name), len(extra))
            pwrite_all(self.fd, memoryview(local + m.name + extra + m.header), m.offset)
            extra = struct.pack("<HHQQQ", 1, 24, m.size, m.size, m.offset)
            central.append(_CENTRAL.pack(0x02014B50, _VERSION, _VERSION, 0, 0, dos_time, dos_date, m.crc,
                                         _FULL32, _FULL32, len(m.name), len(extra), 0, 0, 0, 0o644 << 16,
                                         _FULL32) + m.name + extra)
            end = m.data + m.rows * m.row_bytes
        directory = b"".join(central)
        n = len(central)
        zip64_end = end + len(directory)
        tail = (directory
                + _ZIP64_END.pack(0x06064B50, 44, _VERSION, _VERSION, 0, 0, n, n, len(directory), end)
                + _ZIP64_LOCATOR.pack(0x07064B50, 0, zip64_end, 1)
                + _END.pack(0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(len(directory), _FULL32),
                            _FULL32, 0))
        pwrite_all(self.fd, memoryview(tail), end)
        os.ftruncate(self.fd, end + len(tail))

    def _compact(self, rows: int) -> None:
        """Move every member down to its place for ``rows`` rows (front to back, so a copy
        never overwrites rows not yet moved) and recompute its CRC."""
        offset = 0
        for member in self.members.values():
            old = member.data
            offset = member.place(offset, rows)
            crc = member.crc
            done, length = 0, rows * member.row_bytes
            while done < length:
                chunk = os.pread(self.fd, min(COPY_BYTES, length - done), old + done)
                if not chunk:
                    raise OSError(f"short read moving {member.name.decode()} in the npz being written")
                crc = zlib.crc32(chunk, crc)
                if member.data != old:
                    pwrite_all(self.fd, memoryview(chunk), member.data + done)
                done += len(chunk)
            member.crc = crc

    def close(self) -> None:
        if self.summer is not None:
            self.summer.shutdown()
            self.summer = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "NpzWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
