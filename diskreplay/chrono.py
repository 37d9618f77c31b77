"""Chronological reading of a store, also beside a live writer: counter snapshots and row blocks.

Below the facade: it reads through any object with the store's public reading API
(``get``, ``seen_size``, ``size``, ``head``, ``max_size``, ``num_envs``, ``fields``,
``path``), so that :class:`~diskreplay.DiskReplay` itself can stream (``episodes()``).
:mod:`diskreplay.views` re-exports everything here; the rules it keeps:

* counters are read as one snapshot (:func:`snapshot`), so ``size``, ``seen_size`` and
  ``head`` always agree with each other;
* after reading rows by slot we look at ``seen_size`` again: a slot holding transition
  ``t`` at the snapshot is overwritten by transition ``t + max_size``, so rows whose
  transition is that old may now hold something newer (:class:`ChronoReader`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import numpy as np

from .core import ring
from .errors import EmptyStoreError, IndexOutOfRangeError, InvalidArgumentError, OvertakenError, StoreResetError
from .core.prefetch import Prefetcher
from .core.schema import FieldSpec

BLOCK_BYTES = 16 << 20
_SNAPSHOT_TRIES = 1000
TOO_FAST = "the writer is faster than this read, try again or read fewer rows"

@dataclass(frozen=True)
class Snapshot:
    """Counters of one committed state: the store held transitions ``first .. seen``
    (``size`` of them; chronological position 0 is the oldest), the newest in slot ``head``."""

    seen: int
    size: int
    head: int
    max_size: int
    num_envs: int
    generation: int | None = None  # the store's ``generation`` (None: a reader without one)

    @property
    def first(self) -> int:
        """Number (1-based) of the oldest transition held."""
        return self.seen - self.size + 1

    @property
    def base(self) -> int:
        """A reset point that gives these counters in :mod:`diskreplay.core.ring`'s terms: the
        store's own while the ring is not full, else the latest one consistent with ``head``."""
        return self.seen - self.size - (self.head + 1 - self.size) % self.max_size

    def bounds(self, start: int | None = None, stop: int | None = None) -> tuple[int, int]:
        """Chronological ``[start, stop)`` as non-negative positions, exactly as a Python slice
        of the ``size`` transitions takes them: negative values count from the newest, values
        beyond either end are clamped to it, and ``stop < start`` selects nothing."""
        for name, value in (("start", start), ("stop", stop)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise InvalidArgumentError(f"{name} must be an integer position or None, got {value!r}")
        lo, hi, _ = slice(start, stop).indices(self.size)
        return lo, max(lo, hi)

    def slots(self, start: int, stop: int) -> np.ndarray:
        """Slots of the positions ``[start, stop)``."""
        return ring.chronological_slots(start, stop, self.seen, self.base, self.max_size)

    def transition(self, pos):
        """Transition number at position ``pos`` (works on arrays)."""
        return self.first + pos

    def env(self, pos):
        """Environment that added the transition at position ``pos`` (env-major order)."""
        return (self.first - 1 + pos) % self.num_envs


def snapshot(buf) -> Snapshot:
    """``seen_size``, ``size`` and ``head`` of one committed state, beside a live writer too."""
    for _ in range(_SNAPSHOT_TRIES):
        generation, seen = _generation(buf), buf.seen_size
        size, head = buf.size, buf.head
        if buf.seen_size == seen and _generation(buf) == generation:
            break
    return Snapshot(seen, size, head, buf.max_size, buf.num_envs, generation)


def _generation(buf):
    return getattr(buf, "generation", None)


def check_generation(buf, snap: Snapshot, shrank: bool = False) -> None:
    """``StoreResetError`` if ``buf`` was reset (or created anew) since ``snap``, or if it
    ``shrank`` under it: only a reset makes a store hold fewer transitions, and a reader can
    see its new base a moment before its new reset count."""
    if shrank or snap.generation is not None and _generation(buf) != snap.generation:
        raise StoreResetError(f"{buf.path} was reset while it was being read (its rows now belong to a newer "
                              "generation than the read's first snapshot); run the read again")


class Block(NamedTuple):
    """Rows read together: their positions in the reader's snapshot, slots, transition numbers and data."""

    positions: np.ndarray
    slots: np.ndarray
    transitions: np.ndarray
    batch: dict


class ChronoReader:
    """Reads the chronological positions ``[start, stop)`` of a snapshot in row blocks,
    oldest first, as :class:`Block` s. ``start`` and ``stop`` work as in Python slices.

    ``snap`` defaults to a fresh :func:`snapshot`, ``rows`` (per block) to :func:`block_rows`.
    When the live writer overwrote rows before we read them and nothing has been yielded
    yet, the read starts over from a fresh snapshot (``self.snap``; the same positions,
    counted from the oldest transition then), up to ``restarts`` times; after that, and
    whenever rows were already yielded, the overwritten rows are dropped (``skipped``
    counts them; they are always the oldest of a block, so the blocks' ``transitions``
    then jump over them). With ``strict=True`` an overwritten row after the first block
    raises :class:`OvertakenError` instead. ``progress(done, total)`` is called after
    each block with positions read (or skipped) so far. ``fields`` (names, ``"next_states"``
    among them if wanted) reads only those keys: a scan reads no next states it does not use.
    With ``ahead=True`` the next block is read on a background thread while the caller
    works on this one (reads release the GIL, and so do the C kernels of a scan's
    statistics): the same blocks, ``progress`` calls and errors, in the caller's thread.
    """

    def __init__(self, buf, start: int | None = None, stop: int | None = None, *,
                 snap: Snapshot | None = None, rows: int | None = None, restarts: int = 20,
                 progress: Callable[[int, int], None] | None = None, strict: bool = False, fields=None,
                 ahead: bool = False):
        self.buf = buf
        self.snap = snapshot(buf) if snap is None else snap
        self.start, self.stop = self.snap.bounds(start, stop)
        self.fields = None if fields is None else tuple(fields)
        self.rows = max(1, block_rows(buf, keys=self.fields) if rows is None else rows)
        self.restarts = restarts
        self.progress = progress
        self.strict = strict
        self.ahead = ahead
        self.skipped = 0

    def __iter__(self) -> Iterator[Block]:
        steps = self._steps()
        if self.ahead:
            steps = Prefetcher(functools.partial(next, steps), prefetch=1)  # its StopIteration ends ours
        try:
            for block, done in steps:
                if block is not None:
                    yield block
                if self.progress is not None:
                    self.progress(done, self.stop - self.start)
        finally:
            if self.ahead:
                steps.close()

    def _steps(self) -> Iterator[tuple[Block | None, int]]:
        """``(block, positions done)`` for each block read, ``(None, positions done)`` after
        dropping rows the writer overwrote."""
        buf = self.buf
        pos = self.start
        emitted = False
        while pos < self.stop:
            snap = self.snap
            end = min(pos + self.rows, self.stop)
            slots = snap.slots(pos, end)
            try:
                batch = buf.get(slots) if self.fields is None else buf.get(slots, fields=self.fields)
            except IndexOutOfRangeError:  # slots the snapshot held are gone: a reset
                check_generation(buf, snap, shrank=True)
                raise  # (not reached)
            check_generation(buf, snap)  # rows of another generation are never labelled as this one's
            positions = np.arange(pos, end, dtype=np.int64)
            transitions = snap.transition(positions)
            # A slot keeps transition t until transition t + max_size is written.
            now = ring.transition_of_slots(slots, buf.seen_size, snap.base, snap.max_size)
            fresh = now == transitions
            if not fresh.all():
                if emitted and self.strict:
                    raise OvertakenError(f"the live writer overwrote transition {int(transitions[~fresh][0])} "
                                         f"before it was read; {TOO_FAST}")
                if not emitted and self.restarts > 0:
                    self.restarts -= 1
                    self.snap = snapshot(buf)
                    continue
                # fresh is monotone in the position: drop the stale prefix and read on.
                n_stale = int((~fresh).sum())
                self.skipped += n_stale
                pos += n_stale
                yield None, pos - self.start
                continue
            emitted = True
            pos = end
            yield Block(positions, slots, transitions, batch), pos - self.start


def block_rows(buf, factor: int = 1, keys=None) -> int:
    """Rows per block so that a block of batches (times ``factor``) stays near ``BLOCK_BYTES``;
    ``keys`` names what a row holds (default: every field and ``next_states``)."""
    specs = {name: FieldSpec(name, tuple(shape), np.dtype(dtype))
             for name, (shape, dtype) in require_fields(buf).items()}
    specs["next_states"] = specs["states"]
    row = sum(spec.row_bytes for name, spec in specs.items() if keys is None or name in keys)
    return max(1, BLOCK_BYTES // max(1, row * factor))


def require_fields(buf) -> dict:
    """The store's fields; EmptyStoreError while the first add has not declared them."""
    fields = buf.fields
    if fields is None:
        raise EmptyStoreError(f"{buf.path} holds no transitions yet (its fields are declared by the first add)")
    return fields


__all__ = ["BLOCK_BYTES", "Block", "ChronoReader", "Snapshot", "TOO_FAST", "block_rows", "check_generation",
           "require_fields", "snapshot"]
