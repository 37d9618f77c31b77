"""A full, read-only integrity check of a store: what ``diskreplay verify`` runs.

It takes no lock and writes nothing, so it is safe beside a live writer. Checked:

* ``store.json`` parses and is a valid description;
* ``meta.bin`` (the live counters) has the right size and is self-consistent;
* every data file exists with the right header and size (``.npy`` headers for the
  memmap backend, the HDF5 structure and dataset offsets for the hdf5 backend),
  as do ``ns_buffer.npy`` and ``checkpoint.bin``;
* both checkpoint slots are read (header and body checksums); at least one must be valid;
* each of the store's parts checks itself (``Part.check``, in ``diskreplay/parts/``):
* the jump ring (format 2): ``jumps.npy`` and ``jump_states.npy`` have the right header and
  size, and the records lookups search are of transitions in increasing order that were
  added (an unsorted window would hide exact next states);
* a frame-stack store's stack files (``stack_records.npy``, ``stack_states.npy``,
  ``stack_tail.npy``) have the right header and size, ``ns_buffer.npy`` holds whole stacks,
  and the transition after every jump of the ring is a base (reads rely on it);
* a prioritized store's priorities: the tree built from them, ``max_p``, empty and occupied
  slots, the snapshots;
* every row of every field is read once, in row blocks (bounded memory), through
  positioned reads so that an I/O error is reported instead of killing the process;
  each row that was durable at the last flush is checked against its CRC-32 in
  ``rowsums.npy`` (rows added since have no CRC yet and are only read); ``bool`` fields
  must hold only 0 and 1 bytes; NaN and infinities in floats are counted, not flagged.

Beside a live writer, a CRC mismatch of a row the writer overwrote meanwhile is not
reported (the counters are read again after the pass to tell).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .core import ring
from .backends import BACKENDS, get_backend
from .format.checkpoint import CHECKPOINT_FILE, CheckpointFile, CheckpointLayout
from .format.counters import COMMIT_RETRIES, COUNTERS_FILE, Counters
from .format.description import DESCRIPTION_FILE, read_description
from .errors import DiskReplayError, StoreLockedError
from .disk.fsutil import pread_all as _pread_all
from .parts import Geometry, parts_of
from .parts.base import Checks
from .format.directory import CREATING_MARKER, NS_FILE, check_is_store
from .parts.stacks.ring import state_spec
from .disk.npyfile import read_npy_header
from .parts.priorities.args import is_prioritized
from .core.roworder import LAYOUT_KEY, SLOT_ORDER, states_order
from .format.rowsums import ROWSUMS_FILE, batch_sums

BLOCK_BYTES = 8 << 20


@dataclass
class VerifyReport:
    """The outcome of :func:`verify_store`."""

    path: str
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    checked: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    locked: str | None = None  # another program holds a file locked: not checked, not damaged

    def problem(self, text: str) -> None:
        self.ok = False
        self.problems.append(text)

    def count(self, key: str, n: int = 1) -> None:
        self.checked[key] = self.checked.get(key, 0) + n

    def summary(self) -> str:
        c = self.checked
        status = "OK" if self.ok else "LOCKED" if self.locked and not self.problems else "DAMAGED"
        lines = [f"{self.path}: {status}"]
        parts = [f"{c.get(k, 0)} {label}" for k, label in (
            ("files", "files"), ("fields", "fields"), ("rows", "rows"),
            ("rows_crc_checked", "row CRCs"), ("checkpoint_slots_valid", "valid checkpoint slots"))]
        lines.append("checked: " + ", ".join(parts))
        if self.locked:
            lines.append(f"locked: {self.locked}")
        lines += [f"problem: {p}" for p in self.problems]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def verify_store(path, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the store at ``path`` read-only; ``progress(done_rows, total_rows)`` after each block.

    Raises :class:`StoreNotFoundError` when ``path`` does not exist and :class:`NotAStoreError`
    when it holds no store, not even a half-created one; whatever is wrong with a store is
    reported, not raised."""
    directory = os.path.abspath(os.fspath(path))
    report = VerifyReport(os.fspath(path))
    report.checked.update(files=0, fields=0, rows=0, field_rows=0, rows_crc_checked=0,
                          checkpoint_slots_valid=0)
    check_is_store(directory, allow_incomplete=True)
    if os.path.exists(os.path.join(directory, CREATING_MARKER)):
        report.problem(f"{os.path.join(directory, CREATING_MARKER)}: the store was never completely created")

    # -- description
    try:
        desc = read_description(directory, BACKENDS)
    except DiskReplayError as exc:
        report.problem(f"{DESCRIPTION_FILE}: {exc}")
        return report
    report.count("files")
    fields, num_envs = desc["fields"], desc["num_envs"]

    # -- live counters
    seen = base = words = None
    try:
        counters = Counters(directory, writable=False)
    except DiskReplayError as exc:
        report.problem(f"{COUNTERS_FILE}: {exc}")
        counters = None
    if counters is not None:
        report.count("files")
        try:
            problem = None
            for _ in range(COMMIT_RETRIES):  # a live writer's commit may be in progress
                problem = counters.problem(num_envs)
                if problem is None:
                    break
                time.sleep(0.0005)
            if problem is not None:
                report.problem(f"{counters.path}: {problem}")
            else:
                seen, _, base, _, _ = counters.snapshot()
                words = np.array(counters.words, copy=True)  # the parts' counts, as of this snapshot
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
    states = state_spec(fields, desc.get("frame_stack"))  # a whole state (frame stacks: k frames)
    _check_npy(os.path.join(directory, NS_FILE), (2, num_envs) + states.shape, states.dtype, report)

    # -- checkpoints
    layout = CheckpointLayout(fields, num_envs, desc["reserve_rows"], states)
    try:
        ck = CheckpointFile(directory, layout, writable=False)
    except DiskReplayError as exc:
        report.problem(f"{CHECKPOINT_FILE}: {exc}")
        ck = None
    checkpoint_seen = None
    if ck is not None:
        report.count("files")
        try:
            valid = []
            for slot in (0, 1):
                header = ck.read_header(slot)
                if header is not None:
                    valid.append(header)
            report.checked["checkpoint_slots_valid"] = len(valid)
            if len(valid) == 1:
                report.notes.append(f"{CHECKPOINT_FILE}: only slot {valid[0].slot} is valid (normal before "
                                    "the second flush, or while a flush is writing the other slot)")
            if valid:
                checkpoint_seen = max(valid, key=lambda v: v.generation).seen
            if not valid:
                report.problem(f"{ck.path}: neither checkpoint slot is valid (bad header or body checksum)")
            elif seen is not None and max(v.seen for v in valid) > seen:
                report.notes.append(
                    f"{CHECKPOINT_FILE}: the newest checkpoint is ahead of meta.bin's seen_size "
                    f"{seen}; the next open for writing recovers from it")
        finally:
            ck.close()

    # -- the parts (the jump ring, frame stacks, priorities), each by its own checks
    g = Geometry.of(desc, is_prioritized(desc))
    checks = Checks(directory, desc, g, seen, base, words, report,
                    lambda path, shape, dtype: _check_npy(path, shape, dtype, report),
                    lambda index: _word(directory, index))
    for part in parts_of(g):
        part.check(checks)

    # -- every row, once
    if seen is None:
        report.notes.append("rows were not read: the live counters cannot be trusted")
    elif starts:
        _read_rows(directory, desc, starts, (seen, base), checkpoint_seen, report, progress)
    return report


def _word(directory: str, index: int) -> int:
    """A word of ``meta.bin`` as it is now (has a live writer moved a count?)."""
    counters = Counters(directory, writable=False)
    try:
        return int(counters.words[index])
    finally:
        counters.close()


def _data_starts(directory: str, desc: dict, report: VerifyReport) -> dict:
    """``{field: (file path, byte offset of row 0)}`` for the fields whose file is sound."""
    fields, max_size = desc["fields"], desc["max_size"]
    starts = {}
    if desc["backend"] == "hdf5":
        backend = get_backend("hdf5")
        path = os.path.join(directory, backend.data_files(fields)[0])
        try:
            offsets = backend.dataset_offsets(directory, fields, max_size)
        except StoreLockedError as exc:
            report.ok = False
            report.locked = str(exc)
            return starts
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


def _read_rows(directory, desc, starts, counters_state, checkpoint_seen, report, progress) -> None:
    """Read every occupied row of every field once, block by block, checking CRCs where rows have one."""
    fields, max_size = desc["fields"], desc["max_size"]
    seen, base = counters_state
    size = ring.ring_size(seen, base, max_size)
    names = [name for name in fields if name in starts]
    whole = len(names) == len(fields)
    sums_path = os.path.join(directory, ROWSUMS_FILE)
    sums_offset = _check_npy(sums_path, (max_size,), np.dtype(np.uint32), report) if whole else None
    # Rows that were durable at the last flush carry a valid CRC: transitions (first, upto].
    upto = min(checkpoint_seen, seen) if checkpoint_seen is not None else 0
    first = max(base, seen - max_size, 0)
    crc_on = sums_offset is not None and upto > first
    row_bytes = sum(fields[n].row_bytes for n in names)
    order, n = states_order(desc.get(LAYOUT_KEY), max_size, desc["num_envs"]), desc["num_envs"]
    step = max(n, BLOCK_BYTES // max(1, row_bytes) // n * n)  # whole steps: env-major frames read per env
    done = 0
    bad_bools = {}
    mismatched = []
    nonfinite = 0
    fds = {}
    failed = set()
    try:
        for name in names + ([None] if crc_on else []):
            path = sums_path if name is None else starts[name][0]
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
        for lo in range(0, size, step):
            hi = min(lo + step, size)
            blocks = []
            for name in names:
                spec = fields[name]
                path, offset = starts[name]
                want = (hi - lo) * spec.row_bytes
                raw = b""
                if name not in failed:
                    try:
                        raw = (order if name == "states" else SLOT_ORDER).read_block(
                            lambda row, rows: _pread_all(fds[path], rows * spec.row_bytes, offset + row * spec.row_bytes),
                            lo, hi - lo, spec.row_bytes)
                    except OSError as exc:
                        report.problem(f"{path}: I/O error reading slots {lo}..{hi - 1} of field {name!r} ({exc})")
                        failed.add(name)
                    else:
                        if len(raw) != want:
                            report.problem(f"{path}: slots {lo}..{hi - 1} of field {name!r} lie past the end of the file")
                            failed.add(name)
                if name in failed:
                    blocks = None
                    continue
                b = np.frombuffer(raw, np.uint8).reshape(hi - lo, spec.row_bytes)
                if blocks is not None:
                    blocks.append(b)
                if spec.dtype.kind == "b":
                    bad = np.flatnonzero((b > 1).any(axis=1))
                    if bad.size:
                        first_bad, count = bad_bools.get(name, (lo + int(bad[0]), 0))
                        bad_bools[name] = (first_bad, count + int(bad.size))
                elif spec.dtype.kind in "fc":
                    values = np.frombuffer(raw, spec.dtype)
                    nonfinite += int(values.size - np.count_nonzero(np.isfinite(values)))
            if crc_on and blocks is not None:
                slots = np.arange(lo, hi, dtype=np.int64)
                ts = ring.transition_of_slots(slots, seen, base, max_size)
                check = np.flatnonzero((ts > first) & (ts <= upto))
                if check.size:
                    sums = np.frombuffer(_pread_all(fds[sums_path], (hi - lo) * 4, sums_offset + lo * 4), "<u4")
                    sel = slice(None) if check.size == hi - lo else check  # all rows: no copies
                    wrong = check[batch_sums([b[sel] for b in blocks], ts[sel]) != sums[sel]]
                    mismatched.extend((lo + int(i), int(ts[i])) for i in wrong)
                    report.count("rows_crc_checked", int(check.size))
            done += hi - lo
            report.count("field_rows", (hi - lo) * (len(names) - len(failed)))
            if progress is not None:
                progress(done, size)
    except OSError as exc:
        report.problem(f"opening a data file of {directory}: {exc}")
    finally:
        for fd in fds.values():
            os.close(fd)
    report.checked["rows"] = size
    for name, (first_bad, count) in bad_bools.items():
        report.problem(f"field {name!r}: {count} rows hold bytes other than 0/1 in a bool field "
                       f"(first at slot {first_bad})")
    if mismatched:
        mismatched = _not_overwritten(directory, desc, mismatched)
    if mismatched:
        slots = ", ".join(str(s) for s, _ in mismatched[:10]) + (", ..." if len(mismatched) > 10 else "")
        report.problem(f"{len(mismatched)} rows do not match their CRC in {ROWSUMS_FILE} "
                       f"(torn or damaged): slots {slots}")
    report.checked["nonfinite_floats"] = nonfinite
    if not crc_on:
        report.notes.append("no rows had a CRC to check (nothing flushed since they were added)")
    elif upto < seen:
        report.notes.append(f"the newest {seen - upto} transitions were added after the last flush "
                            "and have no CRC yet: they were only read")


def _not_overwritten(directory, desc, mismatched):
    """Drop mismatches of rows a live writer overwrote (or began to) while we read them."""
    try:
        counters = Counters(directory, writable=False)
    except DiskReplayError:
        return mismatched
    try:
        _, intent, _, _, _ = counters.snapshot()
    finally:
        counters.close()
    return [(s, t) for s, t in mismatched if t + desc["max_size"] > intent]


__all__ = ["VerifyReport", "verify_store"]
