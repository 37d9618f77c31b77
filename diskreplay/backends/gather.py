"""Gathering a batch: the rows at sampled slots plus their next states, read from the files.

Two ways to copy rows, chosen per batch by a predicate (``rows_cached``):

* through the gather mapping (``take`` on a ``MADV_RANDOM`` view), the cheapest way while
  the rows are in the page cache;
* for large rows (frames) not in RAM, by positioned reads of whole rows behind read-ahead
  hints for the whole batch (``RowReader.gather_many``), so the disk serves many at a time.
  The small fields (actions, rewards, dones: bytes a row, but a page read each when cold)
  are kept in RAM from the first cold batch on (``PinnedRange``, up to ``RESIDENT_BYTES``),
  so a cold batch costs the disk only its frames.

Slots that come in long runs of neighbours (the blocks of a chronological scan: stats,
plot, export, watch) are read a run at a time, one ``preadv`` per run and field, with the
scan's next span announced to the kernel (``POSIX_FADV_WILLNEED``) so the disk reads it
while the caller works on this one. Page-faulting the ``MADV_RANDOM`` mapping instead
reads a page at a time, about 35 MB/s on the benchmark disk.
"""
from __future__ import annotations

import numpy as np

from ..core import ring
from . import RowStorage
from ..disk.mapped import PinnedRange, lock_refused
from ..disk.rowreader import RowReader, page_cached, read_span, will_need
from ..core.schema import CORE_FIELDS, FieldSpec

LARGE_ROW_BYTES = 16 << 10  # states rows from this size on may be read by hinted positioned reads
FRAME_ROW_BYTES = 4 << 10  # likewise the frames of a frame-stack store (a stack reads several)
PROBE_ROWS = 2  # rows of a large-row batch checked for residency before choosing how to gather
WARM_STREAK = 256  # probes in a row that found their row in RAM before the mapping is trusted again
BATCH_ORDER = ("states", "actions", "rewards", "next_states", "dones")
RUN_ROWS = 64  # slots per run, on average, from which a gather reads run by run
RESIDENT_BYTES = 64 << 20  # small fields kept in RAM for cold batches while they total at most this
SMALL_ROW_BYTES = 4 << 10  # a field of rows under a page is small: a cold row would cost a page read


def resident_fields(row_bytes: dict, max_size: int) -> tuple[list, int]:
    """The fields a cold gather keeps in RAM (all but ``states`` with rows under a page) and
    their bytes; no fields when those bytes exceed ``RESIDENT_BYTES``."""
    names = [name for name, nbytes in row_bytes.items() if name != "states" and nbytes < SMALL_ROW_BYTES]
    total = sum(row_bytes[name] * max_size for name in names)
    return (names if total <= RESIDENT_BYTES else []), total


def cold_reads(row_bytes: dict, max_size: int, frame_stack: bool = False) -> str:
    """How batches not in RAM are read, for ``info``: ``row_bytes`` per field (a frame's
    for ``states`` of a frame-stack store)."""
    if row_bytes.get("states", 0) < (FRAME_ROW_BYTES if frame_stack else LARGE_ROW_BYTES):
        return "through the mapping (small rows)"
    names, total = resident_fields(row_bytes, max_size)
    if not names:
        return (f"hinted reads of every field (small fields {total / 2 ** 20:.1f} MiB, "
                f"over the {RESIDENT_BYTES >> 20} MiB kept in RAM)")
    why = lock_refused(total)
    return (f"frames by hinted reads; {', '.join(names)} in RAM "
            f"({total / 2 ** 20:.1f} MiB, {'not locked: ' + why if why else 'locked'})")


def slot_runs(slots: np.ndarray) -> list[tuple[int, int, int]] | None:
    """``(index in slots, first slot, length)`` of each run of consecutive slots, or None
    when runs average fewer than ``RUN_ROWS`` slots (a sampled batch, a short block)."""
    n = len(slots)
    if n < RUN_ROWS:
        return None
    breaks = np.flatnonzero(np.diff(slots) != 1) + 1
    if (len(breaks) + 1) * RUN_ROWS > n:
        return None
    starts = [0] + breaks.tolist()
    ends = breaks.tolist() + [n]
    first = slots[starts].tolist()
    return [(a, f, b - a) for a, b, f in zip(starts, ends, first)]


class Gatherer:
    """Reads batches from one opened ``RowStorage``; owns the row reader it may start."""

    def __init__(self, fields: dict[str, FieldSpec], storage: RowStorage, num_envs: int, max_size: int):
        self.fields = fields
        self.storage = storage
        self.num_envs = num_envs
        self.max_size = max_size
        self.extra_names = tuple(name for name in fields if name not in CORE_FIELDS)
        self.large_rows = fields["states"].row_bytes >= LARGE_ROW_BYTES
        self.row_reader: RowReader | None = None
        self.resident: dict | None = None  # small fields' rows in RAM, from the first cold batch on
        self.pins: list[PinnedRange] = []
        self.probe_streak = WARM_STREAK  # a fresh store is taken as in RAM until a probe says otherwise

    def gather(self, idxs: np.ndarray, head: int, ns_rows: np.ndarray) -> dict:
        """Rows at ``idxs`` plus their next states (``ns_rows`` is the current ``ns_buffer``)."""
        ns_slots, in_buffer, buffer_idx = ring.next_state_sources(idxs, head, self.max_size, self.num_envs)
        runs = slot_runs(idxs)
        if runs is not None:
            batch = self._gather_runs(idxs, runs, list(self.fields), ns_slots)
            batch = {key: batch[key] for key in BATCH_ORDER + self.extra_names}
        elif self.large_rows and not self.rows_cached(idxs[:PROBE_ROWS]):
            batch = self._gather_large(idxs, ns_slots)
        else:
            batch = self._gather_mapped(idxs, ns_slots)
        if in_buffer.any():
            batch["next_states"][in_buffer] = ns_rows.take(buffer_idx[in_buffer], axis=0)
        return batch

    def gather_some(self, idxs: np.ndarray, head: int, ns_rows: np.ndarray, names) -> dict:
        """Only the fields ``names`` (``next_states`` among them if wanted) of the rows at
        ``idxs``: what n-step chains read from successors, without their states."""
        fields = [name for name in names if name != "next_states"]
        want_ns = len(fields) < len(names)
        if want_ns:
            ns_slots, in_buffer, buffer_idx = ring.next_state_sources(idxs, head, self.max_size, self.num_envs)
        runs = slot_runs(idxs)
        if runs is not None:
            batch = self._gather_runs(idxs, runs, fields, ns_slots if want_ns else None)
        elif want_ns and self.large_rows and not self.rows_cached(ns_slots[:PROBE_ROWS]):
            if self.row_reader is None:
                self.row_reader = RowReader()
            locations, requests, batch = self.storage.locations, [], self._take_resident(fields, idxs)
            for name, slots in [(name, idxs) for name in fields if name not in batch] + [("next_states", ns_slots)]:
                spec = self.fields["states" if name == "next_states" else name]
                batch[name] = np.empty((len(idxs),) + spec.shape, spec.dtype)
                requests.append(locations["states" if name == "next_states" else name] + (slots, batch[name]))
            self.row_reader.gather_many(requests)
        else:
            arrays = self.storage.gather_arrays
            batch = {name: arrays[name].take(idxs, axis=0) for name in fields}
            if want_ns:
                batch["next_states"] = arrays["states"].take(ns_slots, axis=0)
        if want_ns and in_buffer.any():
            batch["next_states"][in_buffer] = ns_rows.take(buffer_idx[in_buffer], axis=0)
        return batch

    def stack_rows(self, idxs: np.ndarray, names, frame_slots: np.ndarray, head: int, ns_rows: np.ndarray):
        """``(rows, frames)`` of a frame-stack store: the fields ``names`` (not states) at
        ``idxs`` and the ``states`` rows (one frame each) at ``frame_slots``. Through the
        gather mapping while the frames are in RAM (``rows_cached``), or for a scan's runs
        (``gather_some``); else each distinct frame once (a stack and its next state share
        ``k - 1`` frames) and the other fields' rows, by one set of hinted positioned reads
        all in flight together, as ``_gather_large`` reads whole states."""
        spec = self.fields["states"]
        cached = spec.row_bytes < FRAME_ROW_BYTES or not len(frame_slots) or \
            self.rows_cached(frame_slots[:PROBE_ROWS])
        frame_rows = self.storage.rows("states", frame_slots)  # env-major frames: a stack's are neighbours
        if cached or slot_runs(idxs) is not None:
            rows = self.gather_some(idxs, head, ns_rows, names) if names else {}
            if cached:
                return rows, self.storage.gather_arrays["states"].take(frame_rows, axis=0)
            names = ()
        else:
            rows = self._take_resident(names, idxs)
            names = [name for name in names if name not in rows]
            rows.update({name: np.empty((len(idxs),) + self.fields[name].shape, self.fields[name].dtype)
                         for name in names})
        if self.row_reader is None:
            self.row_reader = RowReader()
        distinct, where = np.unique(frame_rows, return_inverse=True)  # sorted: neighbours read as one span
        frames = np.empty((len(distinct),) + spec.shape, spec.dtype)
        locations = self.storage.locations
        self.row_reader.gather_many([locations["states"] + (distinct, frames)]
                                    + [locations[name] + (idxs, rows[name]) for name in names])
        return rows, frames.take(where.reshape(-1), axis=0)

    def announce(self, idxs: np.ndarray, head: int) -> bool:
        """Start the disk reads a cold gather of ``idxs`` will make (their states rows, their
        next states' rows, and rows of fields not kept in RAM, by ``POSIX_FADV_WILLNEED``, in
        ascending order) and return True; False, announcing nothing, unless the store has
        large rows and the last probe found them cold (``rows_cached``): a warm store's
        batch needs no reads. Only a hint: the gather reads (or copies) every row itself."""
        if not self.large_rows or self.probe_streak >= WARM_STREAK:
            return False
        ns_slots = ring.next_state_sources(idxs, head, self.max_size, self.num_envs)[0]
        wanted = [("states", np.concatenate([idxs, ns_slots]))] + [
            (name, idxs) for name in self.fields if name != "states" and name not in (self.resident or {})]
        for name, slots in wanted:
            fd, offset, row_bytes = self.storage.locations[name]
            for slot in np.unique(slots).tolist():
                will_need(fd, offset + slot * row_bytes, row_bytes)
        return True

    def rows_cached(self, idxs) -> bool:
        """Whether to copy a large-row batch from the gather mapping: the first page of each
        of the ``states`` rows at these slots is in the page cache (a one-byte ``RWF_NOWAIT`` read each, a
        microsecond, no waiting for the disk) and so were the last ``WARM_STREAK`` probed.

        Through the mapping a row not in RAM costs a page fault per page, one after the
        other (hundreds of microseconds a frame), while positioned reads copy cached rows
        for a few microseconds more and overlap the misses; so the mapping is used only
        while misses are rarer than about one row in a few hundred. Where the probe is
        unavailable, rows are taken as cached."""
        fd, offset, row_bytes = self.storage.locations["states"]
        for i in self.storage.rows("states", idxs).tolist():
            if page_cached(fd, offset + i * row_bytes) is False:
                self.probe_streak = 0
                return False
            self.probe_streak += 1
        return self.probe_streak >= WARM_STREAK

    def _gather_runs(self, idxs, runs, names, ns_slots=None) -> dict:
        """The fields ``names`` (plus next states when ``ns_slots`` is given) of ``idxs``,
        which come in ``runs`` (:func:`slot_runs`), read run by run: every run of every
        field announced first, then copied by one ``preadv`` each."""
        requests = []
        batch = {}
        for name in names:
            spec = self.fields[name]
            batch[name] = np.empty((len(idxs),) + spec.shape, spec.dtype)
            requests.append((name, runs, batch[name]))
        if ns_slots is not None:
            spec = self.fields["states"]
            batch["next_states"] = np.empty((len(idxs),) + spec.shape, spec.dtype)
            ns_runs = slot_runs(ns_slots) or [(k, int(s), 1) for k, s in enumerate(ns_slots.tolist())]
            requests.append(("states", ns_runs, batch["next_states"]))
        locations = self.storage.locations
        for name, field_runs, out in requests:
            fd, offset, row_bytes = locations[name]
            for _, slot, n in field_runs:
                will_need(fd, offset + slot * row_bytes, n * row_bytes)
            _, slot, n = field_runs[-1]  # the scan's next span, read while the caller works
            after = (slot + n) % self.max_size
            will_need(fd, offset + after * row_bytes, min(len(out), self.max_size - after) * row_bytes)
        for name, field_runs, out in requests:
            fd, offset, row_bytes = locations[name]
            view = memoryview(out.reshape(-1).view(np.uint8))
            for k, slot, n in field_runs:
                if n * row_bytes:
                    read_span(fd, offset + slot * row_bytes, view[k * row_bytes:(k + n) * row_bytes])
        return batch

    def _gather_mapped(self, idxs, ns_slots) -> dict:
        """Gather through the gather mapping (``take`` copies only the rows asked for)."""
        arrays = self.storage.gather_arrays
        states = arrays["states"]
        batch = {"states": states.take(idxs, axis=0), "actions": arrays["actions"].take(idxs, axis=0),
                 "rewards": arrays["rewards"].take(idxs, axis=0), "next_states": states.take(ns_slots, axis=0),
                 "dones": arrays["dones"].take(idxs, axis=0)}
        for name in self.extra_names:
            batch[name] = arrays[name].take(idxs, axis=0)
        return batch

    def _gather_large(self, idxs, ns_slots) -> dict:
        """Every field's rows (states, next states, small fields) by one ``gather_many``,
        which announces all of the batch's reads to the kernel before copying any."""
        if self.row_reader is None:
            self.row_reader = RowReader()
        locations = self.storage.locations
        spec = self.fields["states"]
        rows = np.empty((2 * len(idxs),) + spec.shape, spec.dtype)
        requests = [locations["states"] + (np.concatenate([idxs, ns_slots]), rows)]
        small = self._take_resident(self.fields, idxs)
        for name, field in self.fields.items():
            if name != "states" and name not in small:  # by positioned reads too, all in flight together
                small[name] = np.empty((len(idxs),) + field.shape, field.dtype)
                requests.append(locations[name] + (idxs, small[name]))
        self.row_reader.gather_many(requests)
        batch = {"states": rows[: len(idxs)], "actions": small["actions"], "rewards": small["rewards"],
                 "next_states": rows[len(idxs):], "dones": small["dones"]}
        for name in self.extra_names:
            batch[name] = small[name]
        return batch

    def _take_resident(self, names, idxs) -> dict:
        """The rows at ``idxs`` of those ``names`` kept in RAM (a cold path's first call
        reads them in); the other names are left for positioned reads."""
        if self.resident is None:
            self.resident = {}
            row_bytes = {name: spec.row_bytes for name, spec in self.fields.items()}
            try:
                for name in resident_fields(row_bytes, self.max_size)[0]:
                    fd, offset, nbytes = self.storage.locations[name]
                    self.pins.append(PinnedRange(fd, offset, self.max_size * nbytes))
                    spec = self.fields[name]
                    self.resident[name] = self.pins[-1].array(0, (self.max_size,) + spec.shape, spec.dtype)
            except OSError:  # no room to map or read them in: every field by positioned reads
                self._unpin()
        return {name: self.resident[name].take(idxs, axis=0) for name in names if name in self.resident}

    @property
    def pinned(self) -> str:
        """What the cold path keeps in RAM, as found at its first batch (tests, bench)."""
        if self.resident is None:
            return "nothing yet (no cold batch)"
        if not self.pins:
            return "nothing"
        why = next((pin.locked for pin in self.pins if pin.locked), None)
        return f"{', '.join(self.resident)}: {sum(p.nbytes for p in self.pins)} bytes, " + (
            f"not locked ({why})" if why else "locked")

    def _unpin(self) -> None:
        self.resident = {}
        for pin in self.pins:
            pin.close()
        self.pins = []

    def close(self) -> None:
        if self.row_reader is not None:
            self.row_reader.close()
            self.row_reader = None
        self._unpin()
