"""``checkpoint.bin``: the state as of the last flush, plus the undo reserve.

Two slots, written alternately; each holds a header (counters and sampler draws at
the flush), the ``ns_buffer`` then, and the *undo reserve*: copies of the rows that
the next ``reserve_rows`` transitions will overwrite. The writer never overwrites a
row that was durable at the last flush unless its copy is in the newest checkpoint
(an add past the reserve flushes first), so after a power cut recovery restores
those rows and returns exactly to the flushed state.
"""
from __future__ import annotations

import os
import struct
import time
import zlib
from dataclasses import dataclass

import numpy as np

from . import crcjoin
from ..errors import CorruptStoreError
from ..disk.fsutil import close_fd, io_error, preallocate_file, pwrite_all, start_writeback

CHECKPOINT_FILE = "checkpoint.bin"
HEADER_BYTES = 4096
MAGIC = b"DRCKPT01"
# magic, version, slot, generation, seen, base, draws, resets, reserve_first,
# reserve_count, flush_time_ns, [jumps: version 2 and 3], [stacks: version 3 only], body_len,
# body_crc, header_crc
_HEADERS = {1: struct.Struct("<8sII9QII"), 2: struct.Struct("<8sII10QII"), 3: struct.Struct("<8sII11QII")}
_HEADER = _HEADERS[2]  # written; version 1 (format 1 stores, no jump count) is still read
# Version 3 (the stack ring's count too) is written by frame-stack stores only, so the
# checkpoints of every other store stay as they were.
_VERSION = struct.Struct("<I")


def _align(n: int, to: int = 4096) -> int:
    return (n + to - 1) // to * to


@dataclass
class Checkpoint:
    slot: int
    generation: int
    seen: int
    base: int
    draws: int
    resets: int
    reserve_first: int
    reserve_count: int
    flush_time_ns: int
    jumps: int = 0  # records of the jump ring (jumps.py) at the flush; 0 in a version 1 header
    stacks: int = 0  # records of the stack ring (framestack.py) at the flush; 0 below version 3


class CheckpointLayout:
    """Byte layout of the checkpoint file for a store's fields and reserve size."""

    def __init__(self, fields: dict, num_envs: int, reserve_rows: int, state=None):
        """``state``: the spec of one state where it is not the ``states`` field's rows (a
        frame-stack store keeps frames as rows, whole stacks in the ``ns_buffer``)."""
        self.fields = fields
        self.reserve_rows = reserve_rows
        self.state = fields["states"] if state is None else state
        self.ns_bytes = num_envs * self.state.row_bytes
        self.field_offsets = {}
        pos = self.ns_bytes
        for name, spec in fields.items():
            self.field_offsets[name] = pos
            pos += reserve_rows * spec.row_bytes
        self.body_bytes = pos
        self.slot_bytes = _align(HEADER_BYTES + pos)

    @property
    def file_bytes(self) -> int:
        return 2 * self.slot_bytes

    def slot_offset(self, slot: int) -> int:
        return slot * self.slot_bytes

    def reserve_row_offset(self, slot: int, name: str, k: int) -> int:
        return (self.slot_offset(slot) + HEADER_BYTES + self.field_offsets[name]
                + k * self.fields[name].row_bytes)


def create_checkpoint_file(directory: str, layout: CheckpointLayout) -> None:
    preallocate_file(os.path.join(directory, CHECKPOINT_FILE), layout.file_bytes, create=True)


class CheckpointFile:
    """Reads and writes the two checkpoint slots."""

    def __init__(self, directory: str, layout: CheckpointLayout, writable: bool):
        self.path = os.path.join(directory, CHECKPOINT_FILE)
        self.layout = layout
        self.both_valid = True
        try:
            self.fd = os.open(self.path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptStoreError(f"{self.path} is missing") from None
        except OSError as exc:
            raise io_error(f"opening {self.path}", exc) from exc
        size = os.fstat(self.fd).st_size
        if size != layout.file_bytes:
            os.close(self.fd)
            raise CorruptStoreError(f"{self.path} is {size} bytes, expected {layout.file_bytes} bytes")

    def read_header(self, slot: int, body_crc_known: int | None = None) -> Checkpoint | None:
        """The slot's header if header and body checksums hold, else None. ``body_crc_known``:
        the body's CRC as ``write`` computed it from the bytes it wrote, compared instead of
        reading the body back (16 MiB on a default reserve: tens of ms in every flush)."""
        raw = os.pread(self.fd, _HEADERS[3].size, self.layout.slot_offset(slot))
        if len(raw) < 12:
            return None
        header = _HEADERS.get(_VERSION.unpack_from(raw, 8)[0])
        if header is None or len(raw) < header.size:
            return None
        raw = raw[:header.size]
        fields = list(header.unpack(raw))
        if header is _HEADERS[1]:
            fields.insert(11, 0)
        if header is not _HEADERS[3]:
            fields.insert(12, 0)
        (magic, version, slot_no, generation, seen, base, draws, resets, first, count,
         flush_ns, jumps, stacks, body_len, body_crc, header_crc) = fields
        if magic != MAGIC or slot_no != slot:
            return None
        if zlib.crc32(raw[:-4]) != header_crc or body_len != self.layout.body_bytes:
            return None
        limit = 1 << 62
        if not (0 <= base <= seen < limit and draws < limit and resets < limit and first < limit
                and count <= self.layout.reserve_rows and jumps < limit and 0 <= stacks < limit):
            return None
        if (self._body_crc(slot) if body_crc_known is None else body_crc_known) != body_crc:
            return None
        return Checkpoint(slot, generation, seen, base, draws, resets, first, count, flush_ns, jumps, stacks)

    def _body_crc(self, slot: int) -> int:
        return self._crc_range(self.layout.slot_offset(slot) + HEADER_BYTES, self.layout.body_bytes)

    def _crc_range(self, pos: int, remaining: int, crc: int = 0) -> int:
        """CRC-32 (continuing ``crc``) of ``remaining`` bytes of the file from ``pos``; -1 if short."""
        while remaining > 0:
            chunk = os.pread(self.fd, min(remaining, 8 << 20), pos)
            if not chunk:
                return -1
            crc = zlib.crc32(chunk, crc)
            pos += len(chunk)
            remaining -= len(chunk)
        return crc

    def header_bytes(self) -> bytes:
        """Both slots' headers as stored (two small reads): they change with every
        completed checkpoint write, since the header is written last."""
        size = _HEADERS[3].size
        return b"".join(os.pread(self.fd, size, self.layout.slot_offset(slot)) for slot in (0, 1))

    def newest(self) -> Checkpoint | None:
        """The valid checkpoint with the highest generation (None if neither slot is valid)."""
        found = [c for c in (self.read_header(0), self.read_header(1)) if c is not None]
        self.both_valid = len(found) == 2
        return max(found, key=lambda c: c.generation) if found else None

    def write(self, slot: int, generation: int, seen: int, base: int, draws: int, resets: int,
              ns_rows: np.ndarray, reserve_first: int, reserve_parts: dict, jumps: int = 0,
              stacks: int | None = None) -> int:
        """Write a whole slot and fsync it; return the body's CRC. ``reserve_parts[name]`` is
        an iterable of row blocks (views into the ring, or copies made as they are taken)
        holding the rows from ``reserve_first`` on,
        in order, for every field in the layout's order. ``stacks`` (a frame-stack store's
        stack ring count) makes a version 3 header."""
        crcs, count = {}, 0
        for name in self.layout.fields:
            crc, rows = 0, 0
            for block in reserve_parts[name]:
                crc = self.write_rows(slot, name, rows, block, crc)
                rows += len(block)
            crcs[name], count = crc, rows
        return self.commit(slot, generation, seen, base, draws, resets, ns_rows, reserve_first, count, crcs,
                           jumps, stacks)

    def write_rows(self, slot: int, name: str, k: int, block: np.ndarray, crc: int = 0) -> int:
        """Write ``block`` as undo rows ``k, k + 1, ...`` of field ``name`` in ``slot`` and
        start their writeback; return ``crc`` (that of the field's rows ``0..k-1``) continued
        over them. The slot stays invalid until ``commit`` writes its header."""
        pos = self.layout.reserve_row_offset(slot, name, k)
        written = self._pwrite(block, pos)
        start_writeback(self.fd, pos, len(written))  # on disk while the CRC and the next block run
        return zlib.crc32(written, crc)

    def commit(self, slot: int, generation: int, seen: int, base: int, draws: int, resets: int,
               ns_rows: np.ndarray, reserve_first: int, count: int, crcs: dict, jumps: int = 0,
               stacks: int | None = None) -> int:
        """Finish a slot whose undo rows ``0..count-1`` of every field ``write_rows`` wrote
        (``crcs[name]``: their CRC): write the ``ns_buffer``, fsync, write the header, fsync;
        return the body's CRC."""
        base_off = self.layout.slot_offset(slot) + HEADER_BYTES
        # The body checksum covers the whole region as it is in the file, unused rows too,
        # because that is what recovery reads back. It is joined from the CRCs of the bytes
        # as they were written (the body is laid out in field order, each field's reserve
        # contiguous); only the unused rows of each field are read back from the file.
        body_crc = zlib.crc32(self._pwrite(ns_rows, base_off))
        for name, spec in self.layout.fields.items():
            crc = crcs[name]
            if count < self.layout.reserve_rows:
                crc = self._crc_range(self.layout.reserve_row_offset(slot, name, count),
                                      (self.layout.reserve_rows - count) * spec.row_bytes, crc)
                if crc < 0:
                    raise CorruptStoreError(f"{self.path} is shorter than its layout")
            body_crc = crcjoin.join(body_crc, crc, self.layout.reserve_rows * spec.row_bytes)
        flush_ns = time.time_ns()
        if stacks is None:
            header = _HEADER.pack(MAGIC, 2, slot, generation, seen, base, draws, resets,
                                  reserve_first, count, flush_ns, jumps, self.layout.body_bytes, 0, 0)
        else:
            header = _HEADERS[3].pack(MAGIC, 3, slot, generation, seen, base, draws, resets,
                                      reserve_first, count, flush_ns, jumps, stacks, self.layout.body_bytes, 0, 0)
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise io_error(f"syncing {self.path}", exc) from exc
        header = header[:-8] + struct.pack("<I", body_crc)
        header += struct.pack("<I", zlib.crc32(header))
        self._pwrite(header, self.layout.slot_offset(slot))
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise io_error(f"syncing {self.path}", exc) from exc
        return body_crc

    def _pwrite(self, data, offset: int) -> memoryview:
        """Write all of ``data`` at ``offset``; return the bytes written (for their CRC)."""
        whole = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else memoryview(data)
        try:
            pwrite_all(self.fd, whole, offset)
        except OSError as exc:
            raise io_error(f"writing {self.path}", exc) from exc
        return whole

    def read_reserve_rows(self, slot: int, name: str, ks: np.ndarray) -> np.ndarray:
        spec = self.layout.fields[name]
        out = np.empty((len(ks),) + spec.shape, spec.dtype)
        flat = out.reshape(len(ks), -1).view(np.uint8) if spec.row_bytes else out
        for i, k in enumerate(ks):
            raw = os.pread(self.fd, spec.row_bytes, self.layout.reserve_row_offset(slot, name, int(k)))
            flat[i] = np.frombuffer(raw, np.uint8)
        return out

    def read_ns(self, slot: int, num_envs: int) -> np.ndarray:
        spec = self.layout.state
        raw = os.pread(self.fd, self.layout.ns_bytes, self.layout.slot_offset(slot) + HEADER_BYTES)
        return np.frombuffer(raw, spec.dtype).reshape((num_envs,) + spec.shape).copy()

    def close(self) -> None:
        self.fd = close_fd(self.fd)
