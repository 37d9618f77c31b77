"""What the two sessions on a store share: its description, its opened files, the ring
state and sampling. ``Writer`` (``writer.py``, mode ``r+``) and ``Reader`` (``reader.py``,
mode ``r``) add what differs: recovery, adding and flushing for the one; snapshots of a
live writer's counters and consistent gathers for the other.

The ring state is ``(seen, base, draws, resets)`` (see ``ring.py``): transition ``t``
lives in slot ``ring.slot_of(t, base, max_size)``.
"""
from __future__ import annotations

import os
import threading
from typing import Callable

import numpy as np

from ..core import ring
from ..backends import BACKENDS
from ..format.counters import W_FLUSH_NS, Counters
from ..format.description import read_description
from ..errors import (CorruptStoreError, EmptyStoreError, IndexOutOfRangeError, InvalidArgumentError,
                     StoreClosedError)
from ..backends.gather import Gatherer
from ..format.directory import check_is_store
from ..parts.stacks.ring import state_spec
from . import forks
from .files import DataFiles
from ..format.lock import WriterLock
from ..core.nstep import nstep_batch
from ..parts.priorities.files import Priorities
from ..parts import Geometry, Rows, rows_for
from ..parts.sampling import Sampler, sampler_for
from ..parts.priorities.args import check_priorities, is_prioritized
from ..format.rowsums import torn_slots
from ..core.schema import FieldSpec

_INT64 = np.dtype(np.int64)
_smallest, _largest = np.minimum.reduce, np.maximum.reduce  # the ufuncs' own methods: no wrapper per call


class Session:
    """An open store. Subclasses set ``mode`` and implement ``_open_state``."""

    mode = ""
    writable = False
    live = False  # whether adds may write (the writer, until closed or failed)
    busy = None  # the frame of a running add, flush or reset (only the writer sets it)

    def __init__(self, path: str, *, lock: WriterLock | None = None):
        # Every public operation holds the mutex, so threads sharing one store (an actor
        # adding, a learner sampling, a ``batches()`` thread) never see each other's
        # half-done steps. Reentrant: a signal handler may close() inside an add.
        self.mutex = threading.RLock()
        self.pid = os.getpid()  # the process that opened it (a forked child is another: _in_child)
        self.path = path
        self.directory = os.path.abspath(path)
        self.closed = True
        self.lock = lock
        self.counters: Counters | None = None
        self.data: DataFiles | None = None
        self.gatherer: Gatherer | None = None
        self.rows: Rows | None = None  # what reads go through (parts/rows.py: plain or frame stacks)
        self.sampler: Sampler | None = None  # draws slots, uniform or by priority (parts/sampling.py)
        self.recovery_note: str | None = None
        self.seen = self.base = self.draws = self.resets = 0
        try:
            check_is_store(self.directory)
            self._read_description()
            self._open_state()
        except BaseException:
            self._release()
            raise
        self.closed = False

    def _read_description(self) -> None:
        desc = read_description(self.directory, BACKENDS)
        self.desc = desc
        self.max_size: int = desc["max_size"]
        self.num_envs: int = desc["num_envs"]
        self.fields: dict[str, FieldSpec] | None = desc["fields"]  # as stored (one frame with frame_stack)
        self.reserve_rows: int | None = desc["reserve_rows"]
        self.frame_stack: int | None = desc.get("frame_stack")
        # One whole state as add takes it and reads return it (frame_stack frames, or the states rows).
        self.state_spec: FieldSpec | None = None if self.fields is None else state_spec(self.fields, self.frame_stack)

    def _open_state(self) -> None:
        raise NotImplementedError

    def _map_data(self) -> None:
        self.data = DataFiles(self.directory, Geometry.of(self.desc, is_prioritized(self.desc)), self.writable,
                              frames_layout=self.desc.get("frames_layout"))
        self.gatherer = Gatherer(self.fields, self.data.storage, self.num_envs, self.max_size)
        self.rows = rows_for(self.data, self.gatherer, self.num_envs, self.max_size)
        if self.sampler is not None:  # fields known at the first add: the same stream, now with priorities
            self.sampler = sampler_for(self.sampler.stream, self.prio, self._current_priorities)

    def _new_sampler(self, draws: int) -> None:
        """The store's sampler, its random stream ``draws`` draws in."""
        self.sampler = sampler_for(ring.Sampler(self.desc["seed_entropy"], draws), self.prio,
                                   self._current_priorities)

    @property
    def prio(self) -> Priorities | None:
        """A prioritized store's priorities and their tree (``parts/priorities/``), else None."""
        return self.data.priorities if self.data is not None else None

    @property
    def parts(self) -> list:
        """The open objects of the store's parts (none before its fields are known)."""
        return list(self.data.parts.values()) if self.data is not None else []

    @property
    def counted(self) -> list:
        """The open parts that count committed records (``OpenPart.count``)."""
        return self.data.counted if self.data is not None else []

    def part_counts(self) -> dict:
        """The committed records of the parts that count them, by part name."""
        return {part.part.name: part.count for part in self.counted}

    def current_parts(self) -> None:
        """Bring every part up to the session's snapshot before its data is read whole."""
        if self.prio is not None:
            self._current_priorities()

    # ------------------------------------------------------------------ state
    def refresh(self) -> None:
        """Bring ``seen``, ``base``, ``draws`` and ``resets`` up to date (readers re-read them)."""

    def state(self) -> ring.RingState:
        with self.mutex:
            self._check_open()
            self.refresh()
            return ring.RingState(self.seen, self.base, self.draws, self.resets)

    def _check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(f"{self.path} is closed")
        if self.pid != forks.PID:
            self._in_child()

    def _in_child(self) -> None:
        """Used in a forked child of the process that opened it (the writer refuses, a
        reader reopens its files)."""

    def _enter_read(self) -> None:
        """Start a read (under the mutex): the store must be open (and, for the writer, not
        in the middle of an add of this thread; see ``Writer._enter``)."""
        self._check_open()

    def current_ns(self) -> np.ndarray:
        """The ``ns_buffer`` rows of the newest step (the area of its parity)."""
        return self.data.ns[(self.seen // self.num_envs) % 2]

    def ns_buffer(self) -> np.ndarray:
        """A copy of the next states of the newest ``num_envs`` transitions (empty when none)."""
        with self.mutex:
            self._enter_read()
            self.refresh()
            return self._ns_buffer()

    def _ns_buffer(self) -> np.ndarray:
        if self.fields is None or self.seen == self.base:
            return np.empty((0,), np.float32)
        return self.current_ns().copy()

    @property
    def last_flush_ns(self) -> int:
        return int(self.counters.words[W_FLUSH_NS])

    @property
    def mapped_files(self) -> list:
        """Every memory-mapped file of the store (for tools that drop a process's mapped pages)."""
        return (self.data.mapped_files if self.data is not None else []) + [self.counters.file]

    @property
    def storage(self):
        """The backend's opened rows (None before the fields are known)."""
        return self.data.storage if self.data is not None else None

    # ------------------------------------------------------------------ reading
    def sample(self, batch_size: int, use_cer: bool, n_step: int = 1, gamma: float = 0.99,
               beta: float = 0.4, ahead: bool = False) -> tuple[np.ndarray, dict]:
        """``(idxs, batch)``: ``batch_size`` slots drawn uniformly from the occupied ones, or
        by priority with ``weights`` on a prioritized store (n-step rows when ``n_step > 1``;
        the facade checked every argument). ``ahead`` (a prefetcher's batches): on the cold
        path, also start the reads of the batch the next such call will draw (``_read_ahead``)."""
        with self.mutex:
            self._enter_read()
            return self._sample(batch_size, use_cer, n_step, gamma, beta, ahead)

    def _read_ahead(self, idxs: np.ndarray, size: int, batch_size: int, use_cer: bool, head: int) -> None:
        """On the cold path (``Gatherer.announce``), this batch's reads announced, then those of
        the next batch: the sampler's next draw, peeked (it does not move, so the stream of
        indices is the one without this; an add meanwhile changes the next draw and wastes
        only the reads). The disk then has both batches in its queue while this one is
        copied, handed over and waited for, instead of idling between batches."""
        if self.gatherer.announce(idxs, head):
            upcoming = self.sampler.peek(size, batch_size, use_cer, head)
            if upcoming is not None:
                self.gatherer.announce(upcoming, head)

    def _sample(self, batch_size: int, use_cer: bool, n_step: int = 1, gamma: float = 0.99, beta: float = 0.4,
                ahead: bool = False):
        self.refresh()
        size = ring.ring_size(self.seen, self.base, self.max_size)
        if size == 0:
            raise EmptyStoreError(f"cannot sample from {self.path}: the store is empty; add transitions first")
        head = ring.ring_head(self.seen, self.base, self.max_size)
        idxs, weights = self.sampler.draw(size, batch_size, use_cer, head, beta)
        if ahead and n_step == 1 and self.rows.reads_ahead:
            self._read_ahead(idxs, size, batch_size, use_cer, head)
        self._drew()
        batch = self._gather(idxs, head) if n_step == 1 else self._gather_nstep(idxs, n_step, gamma)
        if weights is not None:
            batch["weights"] = weights
        return idxs, batch

    def _current_priorities(self) -> None:
        """Bring the tree up to the ring state (the writer assigns pending transitions;
        ``Reader`` re-reads the writer's priorities)."""
        self.data.priorities.catch_up(self.seen, self.base)

    def update_priorities(self, idxs, priorities) -> None:
        """Store ``(priority + epsilon) ** alpha`` for slots ``idxs`` (``prioritized.py``),
        every argument checked before anything is written (the writer's ``_enter``)."""
        with self.mutex:
            self._enter("update priorities")
            idxs = self._checked_idxs(idxs)
            raw = check_priorities(priorities, len(idxs))
            self.sampler.update(idxs, raw, self.seen, self.base)

    def bind_add(self):
        """A specialised ``add`` for the facade to install, or None (see ``Writer.bind_add``)."""
        return None

    def _drew(self) -> None:
        """Hook after the sampler advanced (the writer records its position)."""

    def get(self, idxs, n_step: int = 1, gamma: float = 0.99) -> dict:
        with self.mutex:
            self._enter_read()
            return self._get(idxs, n_step, gamma)

    def _get(self, idxs, n_step: int = 1, gamma: float = 0.99) -> dict:
        self.refresh()
        idxs = self._checked_idxs(idxs)
        if self.fields is None:
            return {}  # no fields yet, and _checked_idxs allowed only an empty selection
        if n_step == 1:
            batch = self._gather(idxs, ring.ring_head(self.seen, self.base, self.max_size))
        else:
            batch = self._gather_nstep(idxs, n_step, gamma)
        batch.update(self.sampler.keys(idxs))
        return batch

    def _gather(self, idxs: np.ndarray, head: int) -> dict:
        return self.rows.batch(idxs, head, self.seen, self.base, self.current_ns())

    def get_fields(self, idxs, names: tuple) -> dict:
        """Only the keys ``names`` (fields, ``next_states``, ``jumps`` and ``priorities`` if
        wanted), in that order, of the rows at ``idxs``, from one snapshot: chronological scans
        read no next states they do not use, and learn where unmarked autoresets cut episodes
        from the jump ring."""
        with self.mutex:
            self._enter_read()
            self.refresh()
            idxs = self._checked_idxs(idxs)
            if self.fields is None:
                return {}
            rows = tuple(name for name in names if name not in ("jumps", "priorities"))

            def read(gather, head):
                out = gather(idxs, rows) if rows else {}
                if "jumps" in names:
                    out["jumps"] = self._jumps(idxs, head)
                return out, idxs
            out = self._read(read)
            if "priorities" in names:
                out.update(self.sampler.keys(idxs))
            return {name: out[name] for name in names}

    def _gather_nstep(self, idxs: np.ndarray, n_step: int, gamma: float) -> dict:
        """n-step rows for ``idxs`` (``nstep.py``), every row and successor read from one snapshot."""
        def read(gather, head):
            return nstep_batch(idxs, gather, lambda slots: self._jumps(slots, head), seen=self.seen,
                               base=self.base, max_size=self.max_size, num_envs=self.num_envs, n_step=n_step,
                               gamma=gamma, fields=self.fields)
        return self._read(read)

    def _read(self, read: Callable) -> dict:
        """``read(gather, head)`` on the current snapshot: ``gather(slots, names=None)``
        returns rows (``Gatherer.gather``, or ``gather_some`` of ``names``); ``read``
        returns ``(result, every slot it read)``. Readers retry it while a writer touched
        those slots (``Reader._read``); in the writer's process nothing can."""
        head = ring.ring_head(self.seen, self.base, self.max_size)
        ns_rows = self.current_ns()
        return read(self._row_gather(head, ns_rows), head)[0]

    def _row_gather(self, head: int, ns_rows: np.ndarray, fix: Callable | None = None) -> Callable:
        """The ``gather`` that ``_read`` hands to its ``read``: rows, ``fix(batch, slots)``
        (a reader's undo overlay) on them, and exact next states (``Rows.gather``)."""
        rows, seen, base = self.rows, self.seen, self.base

        def gather(slots, names=None):
            return rows.gather(slots, names, head, seen, base, ns_rows, fix)
        return gather

    def _jumps(self, idxs: np.ndarray, head: int) -> np.ndarray:
        """bool per slot in ``idxs``: whether its transition has a recorded jump (``Rows.jump_flags``)."""
        return self.rows.jump_flags(idxs, head, self.seen, self.base)

    def _checked_idxs(self, idxs) -> np.ndarray:
        size = ring.ring_size(self.seen, self.base, self.max_size)
        if idxs.__class__ is np.ndarray and idxs.dtype == _INT64 and idxs.ndim == 1 and idxs.size:
            if _smallest(idxs) >= 0 and _largest(idxs) < size:  # batch_idxs: no conversion, two reductions
                return idxs
        arr = np.asarray(idxs)
        if arr.dtype == object or arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
            raise InvalidArgumentError(f"idxs must be integers, got {arr.dtype} data")
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= size:  # before a cast could wrap it negative
            raise IndexOutOfRangeError(
                f"index {int(arr.max())} is outside [0, {size}) (the store holds {size} transitions)")
        arr = arr.astype(np.int64, copy=False).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= size):
            bad = arr[(arr < 0) | (arr >= size)][0]
            raise IndexOutOfRangeError(f"index {bad} is outside [0, {size}) (the store holds {size} transitions)")
        return arr

    def verify_rows(self, progress: Callable[[int], None] | None = None) -> tuple[int, list[int]]:
        """``(rows checked, damaged slots)`` for the rows durable at the last flush."""
        with self.mutex:
            self._enter_read()
            return self._verify_rows(progress)

    def _verify_rows(self, progress: Callable[[int], None] | None) -> tuple[int, list[int]]:
        if self.fields is None:
            return 0, []
        self.refresh()
        checkpoint = self.data.ckfile.newest()
        if checkpoint is None:
            raise CorruptStoreError(f"{self.data.ckfile.path}: neither checkpoint slot is valid")
        upto = min(checkpoint.seen, self.seen)
        first = max(self.base, self.seen - self.max_size, 0)
        bad = torn_slots(self.data.sums, self.data.storage, first, upto, self.base, self.max_size,
                         progress)
        return max(0, upto - first), self._still_damaged(bad)

    def _still_damaged(self, bad: list[int]) -> list[int]:
        return bad

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        with self.mutex:
            if self.closed:
                return
            try:
                self._before_close()
            finally:
                try:
                    self.closed = True
                    self._release()
                except BaseException:  # Ctrl-C part-way: finish releasing (idempotent), then raise
                    self.closed = True
                    self._release()
                    raise

    def _before_close(self) -> None:
        """Hook: what a session does while everything is still open (the writer flushes)."""

    def _release(self) -> None:
        self.rows = None
        if self.gatherer is not None:
            self.gatherer.close()
            self.gatherer = None
        for res in (self.data, self.counters):
            if res is not None:
                res.close()
        self.data = self.counters = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None
