"""A full, read-only integrity check of a store: what ``diskreplay verify`` runs.

It takes no lock and writes nothing, so it is safe beside a live writer. Checked:

* ``store.json`` parses and is a valid description;
* ``meta.bin`` (the live counters) has the right size and is self-consistent;
* every data file exists with the right header and size (``.npy`` headers for the
  memmap backend, the HDF5 structure and dataset offsets for the hdf5 backend),
  as do ``ns_buffer.npy`` and ``checkpoint.bin``;
* both checkpoint slots are read (header and body checksums); at least one must be valid;
* every row of every field is read once, in row blocks (bounded memory), through
  positioned reads so that an I/O error is reported instead of killing the process;
  ``bool`` fields must hold only 0 and 1 bytes; float fields are only checked to be
  readable (NaN and infinities may be legitimate data, and are just counted).

Rows carry no per-row sequence numbers or checksums yet, so a row whose bytes were
changed in place cannot be told from a good one; the summary says so.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import ring
from .backends import get_backend
from .checkpoint import CHECKPOINT_FILE, CheckpointFile, CheckpointLayout
from .counters import COUNTERS_FILE, Counters
from .description import DESCRIPTION_FILE, read_description
from .errors import DiskReplayError
from .npyfile import read_npy_header

NS_FILE = "ns_buffer.npy"
CREATING_MARKER = "CREATING"
BLOCK_BYTES = 8 << 20
NO_ROW_CHECKSUMS = ("rows carry no per-row checksums or sequence numbers yet: rows were checked "
                    "for readability (and bools for valid values), not for silent corruption")


@dataclass
class VerifyReport:
    """The outcome of :func:`verify_store`."""

    path: str
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    checked: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        self.ok = False
        self.problems.append(text)

    def count(self, key: str, n: int = 1) -> None:
        self.checked[key] = self.checked.get(key, 0) + n

    def summary(self) -> str:
        c = self.checked
        lines = [f"{self.path}: {'OK' if self.ok else 'DAMAGED'}"]
        parts = [f"{c.get(k, 0)} {label}" for k, label in (
            ("files", "files"), ("fields", "fields"), ("rows", "rows per field"),
            ("checkpoint_slots_valid", "valid checkpoint slots"))]
        lines.append("checked: " + ", ".join(parts))
        lines += [f"problem: {p}" for p in self.problems]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def verify_store(path, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the store at ``path`` read-only; ``progress(done_rows, total_rows)`` after each block."""
    directory = os.path.abspath(os.fspath(path))
    report = VerifyReport(os.fspath(path))
    report.checked.update(files=0, fields=0, rows=0, field_rows=0, checkpoint_slots_valid=0)
    if not os.path.isdir(directory):
        report.problem(f"{directory}: no store here (not a directory)" if os.path.exists(directory)
                       else f"{directory}: the path does not exist")
        return report
    if os.path.exists(os.path.join(directory, CREATING_MARKER)):
        report.problem(f"{os.path.join(directory, CREATING_MARKER)}: the store was never completely created")

    # -- description
    try:
        desc = read_description(directory)
    except DiskReplayError as exc:
        report.problem(f"{DESCRIPTION_FILE}: {exc}")
        return report
    report.count("files")
    fields, max_size, num_envs = desc["fields"], desc["max_size"], desc["num_envs"]

    # -- live counters
    seen = base = None
    try:
        counters = Counters(directory, writable=False)
    except DiskReplayError as exc:
        report.problem(f"{COUNTERS_FILE}: {exc}")
        counters = None
    if counters is not None:
        report.count("files")
        try:
            problem = None
            for _ in range(200):  # a live writer's commit may be in progress
                problem = counters.problem(num_envs)
                if problem is None:
                    break
                time.sleep(0.0005)
            if problem is not None:
                report.problem(f"{counters.path}: {problem}")
            else:
                seen, _, base, _, _ = counters.snapshot()
                report.checked["seen_size"] = seen
        finally:
            counters.close()
    if fields is None:
        if seen:
            report.problem(f"{COUNTERS_FILE}: seen_size is {seen} but the store has no fields yet")
        report.notes.append("the store has no fields yet (declared by the first add): no data files")
        return report
    report.checked["fields"] = len(fields)

    # -- data files: where each field's rows start
    starts = _data_starts(directory, desc, report)
    _check_npy(os.path.join(directory, NS_FILE), (2, num_envs) + fields["states"].shape,
               fields["states"].dtype, report)

    # -- checkpoints
    layout = CheckpointLayout(fields, num_envs, desc["reserve_rows"])
    try:
        ck = CheckpointFile(directory, layout, writable=False)
    except DiskReplayError as exc:
        report.problem(f"{CHECKPOINT_FILE}: {exc}")
        ck = None
    if ck is not None:
        report.count("files")
        try:
            valid = []
            for slot in (0, 1):
                header = ck.read_header(slot)
                if header is not None:
                    valid.append(header)
            report.checked["checkpoint_slots_valid"] = len(valid)
            if not valid:
                report.problem(f"{ck.path}: neither checkpoint slot is valid (bad header or body checksum)")
            elif seen is not None and max(v.seen for v in valid) > seen:
                report.notes.append(
                    f"{CHECKPOINT_FILE}: the newest checkpoint is ahead of meta.bin's seen_size "
                    f"{seen}; the next open for writing recovers from it")
        finally:
            ck.close()

    # -- every row, once
    size = ring.ring_size(seen, base, max_size) if seen is not None else max_size
    report.checked["size"] = size
    if starts:
        _read_rows(directory, desc, starts, size, report, progress)
    report.notes.append(NO_ROW_CHECKSUMS)
    return report


def _data_starts(directory: str, desc: dict, report: VerifyReport) -> dict:
    """``{field: (file path, byte offset of row 0)}`` for the fields whose file is sound."""
    fields, max_size = desc["fields"], desc["max_size"]
    starts = {}
    if desc["backend"] == "hdf5":
        backend = get_backend("hdf5")
        path = os.path.join(directory, backend.data_files(fields)[0])
        try:
            offsets = backend.dataset_offsets(directory, fields, max_size)
        except DiskReplayError as exc:
            report.problem(str(exc))
            return starts
        except Exception as exc:  # h5py may raise its own errors on a damaged file
            report.problem(f"{path}: HDF5 structure cannot be read ({exc})")
            return starts
        report.count("files")
        return {name: (path, offsets[name]) for name in fields}
    for name, spec in fields.items():
        path = os.path.join(directory, f"{name}.npy")
        offset = _check_npy(path, (max_size,) + spec.shape, spec.dtype, report)
        if offset is not None:
            starts[name] = (path, offset)
    return starts


def _check_npy(path: str, shape: tuple, dtype, report: VerifyReport) -> int | None:
    """Offset of the data of a sound ``.npy`` file, else None with the problem reported."""
    try:
        found_shape, found_dtype, offset = read_npy_header(path)
    except DiskReplayError as exc:
        report.problem(str(exc))
        return None
    if found_shape != tuple(shape) or found_dtype != np.dtype(dtype):
        report.problem(f"{path} holds {found_shape} {found_dtype}, expected {tuple(shape)} {np.dtype(dtype)}")
        return None
    expected = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    actual = os.stat(path).st_size
    if actual != expected:
        report.problem(f"{path} is {actual} bytes, expected {expected} bytes"
                       + (" (truncated)" if actual < expected else ""))
        return None
    report.count("files")
    return offset


def _read_rows(directory, desc, starts, size, report, progress) -> None:
    fields = desc["fields"]
    row_bytes = max(spec.row_bytes for spec in fields.values())
    step = max(1, BLOCK_BYTES // max(1, row_bytes))
    total = size * len(starts)
    done = 0
    bad_bools = {}
    nonfinite = 0
    fds = {}
    try:
        for name, (path, _) in starts.items():
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
        for name, (path, offset) in starts.items():
            spec = fields[name]
            for lo in range(0, size, step):
                hi = min(lo + step, size)
                want = (hi - lo) * spec.row_bytes
                try:
                    raw = _pread_all(fds[path], want, offset + lo * spec.row_bytes)
                except OSError as exc:
                    report.problem(f"{path}: I/O error reading rows {lo}..{hi - 1} of field {name!r} ({exc})")
                    break
                if len(raw) != want:
                    report.problem(f"{path}: rows {lo}..{hi - 1} of field {name!r} are past the end of the file")
                    break
                if spec.dtype.kind == "b":
                    b = np.frombuffer(raw, np.uint8)
                    bad = np.flatnonzero(b > 1)
                    if bad.size:
                        rows = lo + bad // max(1, spec.row_bytes)
                        first, count = bad_bools.get(name, (int(rows[0]), 0))
                        bad_bools[name] = (first, count + int(np.unique(rows).size))
                elif spec.dtype.kind in "fc":
                    values = np.frombuffer(raw, spec.dtype)
                    nonfinite += int(values.size - np.count_nonzero(np.isfinite(values)))
                report.count("field_rows", hi - lo)
                done += hi - lo
                if progress is not None:
                    progress(done, total)
    except OSError as exc:
        report.problem(f"opening a data file of {directory}: {exc}")
    finally:
        for fd in fds.values():
            os.close(fd)
    report.checked["rows"] = size
    for name, (first, count) in bad_bools.items():
        report.problem(f"field {name!r}: {count} rows hold bytes other than 0/1 in a bool field "
                       f"(first at slot {first})")
    report.checked["nonfinite_floats"] = nonfinite


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    parts = []
    while n > 0:
        chunk = os.pread(fd, min(n, 1 << 26), offset)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


__all__ = ["VerifyReport", "verify_store"]
