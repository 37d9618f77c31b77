"""The reader session (mode ``r``): reads a store beside a live writer, or one whose writer
died, and never writes to it.

* Counters are re-read as one snapshot before every read (``refresh``), retrying while a
  commit is in flight.
* A dead writer's store is read as recovery would leave it (``recovery.virtual_view``):
  rows of an interrupted add come from the undo reserve, applied to each batch.
* A batch is returned only if the writer did not touch its slots while it was copied;
  otherwise it is read again, for up to ``READ_PATIENCE`` seconds.

The counter words and rows are plain numpy loads, in program order: the check word, the
rows, then ``intent`` again. That relies on x86-64 TSO (loads are not reordered with
loads); a weakly ordered CPU would need an acquire fence before the re-read of ``intent``
in ``_read`` (FORMAT.md, "Memory ordering").
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..core import ring
from ..format.counters import COMMIT_RETRIES, W_CLEAN, W_INTENT, W_KEY, W_RESETS, Counters
from ..errors import CorruptStoreError, ReadOnlyError, StoreClosedError, TornReadError
from ..format.lock import writer_alive
from ..format.recovery import VirtualView, reserve_indices, virtual_view
from ..parts import PARTS
from .base import Session

ALIVE_TTL = 0.2  # seconds a "is the writer alive" answer is reused (/proc/locks is not free)
READ_PATIENCE = 3.0  # seconds a reader retries rows a live writer keeps overwriting


class Reader(Session):
    mode = "r"
    writable = False

    def _open_state(self) -> None:
        self.counters = Counters(self.directory, False)
        self.key = 0
        self.view: VirtualView | None = None  # of a dead writer's record
        self._dead_view: VirtualView | None = None
        self._view_record = None  # the record ``_dead_view`` was computed from
        self._alive, self._alive_at = False, -1.0
        if self.fields is not None:
            self._map_data()
        self.refresh()
        self._check_clean_record()
        self._new_sampler(self.draws)

    def _in_child(self) -> None:
        """A reader inherited by a forked child (a DataLoader worker, a pool process) maps
        the store afresh there, on its first use: nothing of the parent's mappings, file
        descriptors or threads is relied on. Its sampler goes on from where it was."""
        self.pid = os.getpid()
        self._release()  # the child's copies only (a reader writes nothing and holds no lock)
        self.counters = Counters(self.directory, False)
        self._view_record = self._dead_view = None
        self._alive, self._alive_at = False, -1.0
        if self.fields is not None:
            self._map_data()
        self.refresh()

    # ------------------------------------------------------------------ snapshots
    def refresh(self) -> None:
        """Read the last committed counters, retrying a concurrent commit."""
        for _ in range(COMMIT_RETRIES):
            problem = self.counters.problem(self.num_envs)
            if problem is None:
                break
            time.sleep(0.0005)
        else:
            raise CorruptStoreError(f"{self.counters.path}: {problem}; open the store with mode='r+' "
                                    "to recover it from the last flush")
        words = self.counters.words
        self.key = int(words[W_KEY])
        seen, intent, base, draws, resets = self.counters.snapshot()
        self.view = None
        if self.fields is not None and int(words[W_CLEAN]) != 1 and not self._writer_alive():
            # A checkpoint rewritten since (a flush by a writer that died after it) changes
            # its header, which is written last: part of the record too.
            record = (self.key, seen, intent, base, draws, resets, self.data.ckfile.header_bytes())
            if self._view_record != record:
                self._dead_view = virtual_view(self.counters, self.data, self.num_envs, self.reserve_rows)
                self._view_record = record
            self.view = self._dead_view
            seen, base, draws, resets = (self.view.state.seen, self.view.state.base, self.view.state.draws,
                                         self.view.state.resets)
        self.seen, self.base, self.draws, self.resets = seen, base, draws, resets
        if self.fields is None and seen:
            raise CorruptStoreError(f"{self.counters.path}: seen_size is {seen} but the store has no fields")
        self._check_files()
        self._check_parts_unchanged(words)
        for part in self.counted:  # each part's committed count in this snapshot
            part.count = part.snapshot(words, self.seen, self.num_envs, self.view)

    def _check_parts_unchanged(self, words) -> None:
        """A part this reader did not open (a format 1 store has no jump ring) that a writer
        has made since and counts records in: the reader cannot read it; reopening does."""
        if self.data is None:
            return
        for part in PARTS:
            if part.word is not None and part.name not in self.data.parts and int(words[part.word]):
                raise CorruptStoreError(
                    f"{self.path} was upgraded to format {part.since} by a writer since this reader opened "
                    f"it (it has {part.name} now{part.gives}); reopen it")

    def _check_files(self) -> None:
        """Refuse to read through a mapping whose file was truncated (SIGBUS) or replaced
        (stale rows) since it was mapped: checked at every refresh, before any read."""
        for mapped in self.mapped_files:
            problem = mapped.changed()
            if problem is not None:
                raise CorruptStoreError(
                    f"{mapped.path} {problem} while this reader had the store open; reopen the store "
                    "(open it with mode='r+' to recover it, or run diskreplay verify)")

    def _writer_alive(self) -> bool:
        now = time.monotonic()
        if now - self._alive_at > ALIVE_TTL:
            self._alive, self._alive_at = writer_alive(self.directory), now
        return self._alive

    def _check_clean_record(self) -> None:
        """A record marked clean must agree with the checkpoint close() wrote (checked once)."""
        if self.fields is None:
            return
        ckfile = self.data.ckfile
        for _ in range(3):
            if int(self.counters.words[W_CLEAN]) != 1:
                return
            checkpoint = ckfile.newest()
            if checkpoint is None or not ckfile.both_valid or \
                    (checkpoint.seen, checkpoint.base) == (self.seen, self.base):
                return
            self.refresh()  # a writer may have opened meanwhile
        raise CorruptStoreError(
            f"{self.counters.path}: marked clean at seen_size {self.seen}, but the last flush recorded "
            f"seen_size {checkpoint.seen}; open the store with mode='r+' to recover from the last flush")

    def current_ns(self) -> np.ndarray:
        if self.view is not None and self.view.ns_rows is not None:
            return self.view.ns_rows
        return super().current_ns()

    # ------------------------------------------------------------------ consistent reads
    def _gather(self, idxs: np.ndarray, head: int) -> dict:
        """A gather that no concurrent add tore: retried while the writer touched the rows."""
        return self._read(lambda gather, head: (gather(idxs), idxs))

    def _read(self, read) -> dict:
        """``read(gather, head)`` (see ``Session._read``) on one snapshot, retried while a
        concurrent add touched any slot it read (or their next-state slots), so that no
        result mixes two versions of a slot; for a dead writer's store, rows of its
        interrupted add are patched from the undo reserve in every gather."""
        deadline = time.monotonic() + READ_PATIENCE
        while time.monotonic() < deadline:
            key, view = self.key, self.view
            seen, n = self.seen, self.num_envs
            counts = [(part, part.count) for part in self.counted]
            head = ring.ring_head(seen, self.base, self.max_size)
            fix = None
            if view is not None and view.overlay is not None:
                fix = lambda batch, slots: self._apply_overlay(batch, slots, head, view)  # noqa: E731
            gather = self._row_gather(head, self.current_ns().copy(), fix)
            if fix is not None:
                return read(gather, head)[0]
            result, slots = read(gather, head)
            words = self.counters.words
            intent = int(words[W_INTENT])
            # Each part's records written since the snapshot must not have reached what this
            # read searched (OpenPart.kept: the jump ring's window, the stack ring and tail).
            if int(words[W_KEY]) == key and int(words[W_RESETS]) == self.resets and \
                    not self._touched(slots, head, intent, ns_touched=intent >= seen + 2 * n) and \
                    all(part.kept(words, seen, intent, n, count) for part, count in counts):
                return result
            time.sleep(0.0002)
            self.refresh()
        raise TornReadError(f"{self.path}: the writer kept overwriting the requested rows; try again")

    def _touched(self, idxs, head, intent, ns_touched) -> bool:
        """Whether the writer may have rewritten any of these slots (or their next-state
        slots) since the snapshot: a slot is rewritten by the transition ``max_size`` after
        the one it holds, and transitions up to ``intent`` may have been written."""
        if ns_touched:
            return True
        seen, m = self.seen, self.max_size
        if intent <= seen:
            return False
        slots = self.rows.read_slots(idxs)  # and their next states' (a stack's earlier frames too)
        held = ring.transition_of_slots(slots, seen, self.base, m)
        return bool((held + m <= intent).any())

    def patch_overlay(self, rows: dict, slots: np.ndarray, view: VirtualView) -> None:
        """Patch plain rows of ``slots`` (fields only) read straight from the files with the
        undo copies of the rows a dead writer's interrupted add left half-written (convert)."""
        self._apply_overlay(rows, slots, ring.ring_head(self.seen, self.base, self.max_size), view)

    def _apply_overlay(self, batch, idxs, head, view: VirtualView) -> None:
        """Patch rows whose slots were left half-written by a dead writer with their undo copies."""
        lo, hi = view.overlay
        ckfile = self.data.ckfile
        checkpoint = view.checkpoint or ckfile.newest()
        if checkpoint is None:
            raise CorruptStoreError(f"{self.path}: rows need restoring but no valid checkpoint exists")
        ts, ks = reserve_indices(lo, hi, checkpoint, self.base, self.max_size)
        if len(ts) == 0:
            return
        slot_to_k = dict(zip(ring.slot_of(ts, self.base, self.max_size).tolist(), ks.tolist()))
        for pos, slot in enumerate(idxs.tolist()):
            k = slot_to_k.get(slot)
            if k is not None:
                for name in self.fields.keys() & batch.keys():
                    batch[name][pos] = ckfile.read_reserve_rows(checkpoint.slot, name, [k])[0]
        if "next_states" not in batch:
            return
        ns_slots, in_buffer, _ = ring.next_state_sources(idxs, head, self.max_size, self.num_envs)
        for pos, slot in enumerate(ns_slots.tolist()):
            k = slot_to_k.get(slot)
            if k is not None and not in_buffer[pos]:
                batch["next_states"][pos] = ckfile.read_reserve_rows(checkpoint.slot, "states", [k])[0]

    def _still_damaged(self, bad: list[int]) -> list[int]:
        """Rows a live writer overwrote during a verify pass no longer match their old CRC."""
        if not bad:
            return bad
        intent = int(self.counters.words[W_INTENT])
        held = ring.transition_of_slots(np.asarray(bad), self.seen, self.base, self.max_size)
        return [slot for slot, t in zip(bad, held.tolist()) if t + self.max_size > intent]

    def needs_recovery(self) -> bool:
        """Whether the last writer died mid-add, so rows are read from the undo reserve."""
        self.refresh()
        return self.view is not None and self.view.overlay is not None

    # ------------------------------------------------------------------ refusals
    def refusal(self, what: str):
        if self.closed:
            return StoreClosedError(f"cannot {what}: {self.path} is closed")
        return ReadOnlyError(f"cannot {what}: {self.path} is open read-only (mode='r'); "
                             "open it with mode='r+' to write")

    def add(self, *args, **kwargs) -> None:
        raise self.refusal("add")

    def update_priorities(self, idxs, priorities) -> None:
        raise self.refusal("update priorities")

    def _current_priorities(self) -> None:
        """The writer's priorities as of this snapshot; for a dead writer's store rolled back
        to a checkpoint, the priorities of that flush."""
        view = self.view
        generation = view.checkpoint.generation if view is not None and view.ns_rows is not None else None
        self.prio.refresh_reader(self.seen, self.base, generation, self._writer_alive)

    def flush(self) -> None:
        raise self.refusal("flush")

    def reset(self) -> None:
        raise self.refusal("reset")
