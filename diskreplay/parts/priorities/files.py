"""Prioritized replay: the per-slot priorities of a store, their sum tree, and their durability.

A prioritized store (``store.json`` keys ``prioritized``, ``alpha``, ``epsilon``) holds
one more per-slot dataset in its backend, ``priorities`` (float64, ``p_i = (priority +
epsilon) ** alpha``; ``priorities.npy`` or a dataset of ``data.h5``), and one file of its
own, ``priorities.bin``:

* a page of live words: which transitions hold their priority (``assigned``), the ``base``
  they were assigned for, the running maximum ``max_p`` new transitions get, and a
  sequence number that is odd while ``update_priorities`` writes (readers retry);
* a dirty byte per block of 512 slots, one bit per snapshot slot;
* two snapshot slots, written alternately by generation like ``checkpoint.bin``: a header
  (generation, seen, base, assigned, max_p, CRC) and a copy of every slot's priority as of
  that flush. Only blocks dirtied since the slot was last written are copied.

New transitions are not written by ``add`` (which stays as fast as on a uniform store):
transitions after ``assigned`` hold ``max_p``, assigned lazily before every sample, get,
update and checkpoint. ``max_p`` only changes in ``update_priorities``, which assigns the
pending ones first, so each transition gets the largest ``p`` held when it was added.

Durability. ``kill -9``: the live dataset and words are in the page cache, and the tree
is rebuilt from them at open, so every returned update is there and the tree agrees.
Power cut: recovery rolls the rows back to the newest checkpoint of generation ``G``;
the snapshot of generation ``G`` is written and synced before that checkpoint's header
(the writer's ``_write_checkpoint`` calls :meth:`Priorities.checkpoint` first), and
it is not touched again before checkpoint ``G + 1`` is durable, so the priorities come
back exactly as they were at that flush.
"""
from __future__ import annotations

import math
import os
import struct
import time
import zlib

import numpy as np

from ...core import ring
from ...backends import get_backend
from ...errors import CorruptStoreError, DiskReplayError, EmptyStoreError, InvalidPriorityError
from ...disk.fsutil import preallocate_file
from ...disk.mapped import MappedFile
from ...format.lock import writer_alive
from .args import read_settings
from ...core.schema import FieldSpec
from . import tree as sumtree
from ..base import Checks, Geometry, OpenPart, Part

PRIORITY_FILE = "priorities.bin"
DATASET = "priorities"
SPEC = FieldSpec(DATASET, (), np.dtype(np.float64))
BLOCK = 512  # slots per dirty byte (4 KiB of priorities)
PAGE = 4096
MAGIC = int.from_bytes(b"DRPRIO01", "little", signed=True)
SNAP_MAGIC = b"DRPSNP01"
W_MAGIC, W_VERSION, W_ASSIGNED, W_BASE, W_MAXP, W_SEQ = range(6)
_HEADER = struct.Struct("<8sQQQQdI")  # magic, generation, seen, base, assigned, max_p, crc
SEQ_WAITS = 200  # waits (0.5 ms each) of a reader for an update in progress to finish
SEQ_COPIES = 20  # copies a reader takes while updates keep changing the priorities
# The stored priorities' range (``Priorities.stored``): a sum of max_size of them stays
# below the largest float64 by a factor of 4 (the tree adds them in any order); a
# subnormal would make ``p_i / min p`` overflow.
P_LIMIT = float(np.finfo(np.float64).max) / 4
P_TINY = float(np.finfo(np.float64).tiny)
_largest, _smallest = np.maximum.reduce, np.minimum.reduce


# ---------------------------------------------------------------------- files
class FileLayout:
    def __init__(self, max_size: int):
        self.max_size = max_size
        self.blocks = -(-max_size // BLOCK)
        self.dirty_offset = PAGE
        self.body_bytes = -(-max_size * 8 // PAGE) * PAGE
        first = PAGE + -(-self.blocks // PAGE) * PAGE
        self.slot_offsets = (first, first + PAGE + self.body_bytes)
        self.file_bytes = first + 2 * (PAGE + self.body_bytes)


def prioritized_bytes(max_size: int) -> int:
    """Disk space ``priorities.bin`` needs (the dataset is counted with the backend's)."""
    return FileLayout(max_size).file_bytes


def data_files(backend) -> list[str]:
    """The files a prioritized store has beyond a uniform one."""
    return backend.data_files({DATASET: SPEC}) + [PRIORITY_FILE]


def create_priority_file(directory: str, max_size: int) -> None:
    """Create ``priorities.bin``: live words of an empty store, and the snapshot of
    generation 1 (all zeros) that the store's initial checkpoint stands for."""
    layout = FileLayout(max_size)
    path = os.path.join(directory, PRIORITY_FILE)
    preallocate_file(path, layout.file_bytes, create=True)
    f = MappedFile(path, True)
    try:
        words = f.array(0, (PAGE // 8,), np.int64)
        words[W_MAGIC], words[W_VERSION] = MAGIC, 1
        words[W_MAXP:W_MAXP + 1].view(np.float64)[0] = 1.0
        _write_header(f, layout, 1, generation=1, seen=0, base=0, assigned=0, max_p=1.0)
        f.sync()
    finally:
        f.close()


def _write_header(f: MappedFile, layout: FileLayout, slot: int, **h) -> None:
    raw = _HEADER.pack(SNAP_MAGIC, h["generation"], h["seen"], h["base"], h["assigned"], h["max_p"], 0)
    raw = raw[:-4] + struct.pack("<I", zlib.crc32(raw[:-4]))
    f.array(layout.slot_offsets[slot], (len(raw),), np.uint8)[:] = np.frombuffer(raw, np.uint8)


def _read_header(f: MappedFile, layout: FileLayout, slot: int) -> dict | None:
    raw = f.array(layout.slot_offsets[slot], (_HEADER.size,), np.uint8).tobytes()
    magic, generation, seen, base, assigned, max_p, crc = _HEADER.unpack(raw)
    if magic != SNAP_MAGIC or zlib.crc32(raw[:-4]) != crc:
        return None
    return {"generation": generation, "seen": seen, "base": base, "assigned": assigned, "max_p": max_p}


# ---------------------------------------------------------------------- the open priorities
class Priorities(OpenPart):
    """The priorities of one open session (writer or reader) and their tree.

    ``tree.leaves[:max_size]`` is always the priority each slot has for sampling: the
    writer keeps it equal to the live dataset (after assigning pending transitions), a
    reader to its last consistent copy of it.
    """

    def __init__(self, directory: str, desc: dict, writable: bool):
        self.path = os.path.join(directory, PRIORITY_FILE)
        self.alpha, self.epsilon = read_settings(desc, os.path.join(directory, "store.json"))
        self.max_size = m = desc["max_size"]
        self.p_max = P_LIMIT / m  # the largest priority stored (``stored``)
        # (finite raw >= 0 + epsilon) ** alpha cannot overflow nor be invalid: no errstate (microseconds)
        self.quiet = self.alpha <= 1.0 and self.epsilon <= 1e300
        self.writable = writable
        self.layout = FileLayout(m)
        self.storage = self.file = self.live = self.words = self.dirty = None
        self.bodies = []
        try:
            self.storage = get_backend(desc["backend"]).open(directory, {DATASET: SPEC}, m, writable)
            self.live = self.storage.arrays[DATASET]
            self.file = MappedFile(self.path, writable)
            if self.file.size != self.layout.file_bytes:
                raise CorruptStoreError(f"{self.path} is {self.file.size} bytes, expected {self.layout.file_bytes}")
            self.words = self.file.array(0, (PAGE // 8,), np.int64)
            if int(self.words[W_MAGIC]) != MAGIC or int(self.words[W_VERSION]) != 1:
                raise CorruptStoreError(f"{self.path} is not a diskreplay priorities file")
            self.dirty = self.file.array(self.layout.dirty_offset, (self.layout.blocks,), np.uint8)
            self.bodies = [self.file.array(off + PAGE, (m,), np.float64) for off in self.layout.slot_offsets]
        except BaseException:
            self.close()
            raise
        self.tree = sumtree.new_tree(m)  # read at open: tests narrow FANOUT for a deep numpy tree
        self.loaded = None  # what a reader's copy was taken from

    # ------------------------------------------------------------------ live words
    @property
    def max_p(self) -> float:
        return float(self.words[W_MAXP:W_MAXP + 1].view(np.float64)[0])

    def _set_max_p(self, value: float) -> None:
        self.words[W_MAXP:W_MAXP + 1].view(np.float64)[0] = value

    @property
    def assigned(self) -> int:
        return int(self.words[W_ASSIGNED])

    # ------------------------------------------------------------------ writer: open
    def recover(self, seen: int, base: int, generation: int | None, from_checkpoint: bool) -> None:
        """Bring the priorities to the rows' state at open and build the tree. After a
        power cut (``from_checkpoint``) that is the snapshot of ``generation``; after a
        clean close or a process crash the live dataset, an update cut short included."""
        if from_checkpoint:
            self._restore(generation)
            self.storage.sync()
        if int(self.words[W_SEQ]) % 2:
            self.words[W_SEQ] += 1
        if self.assigned > seen:  # cannot happen by the protocol; assign them again rather than trust them
            self.words[W_ASSIGNED] = max(base, seen - self.max_size)
        self.file.sync()
        self._load(self.live)
        self.catch_up(seen, base)

    def undo_reset(self, generation: int) -> None:
        """A reset cut short after its flush began emptying the priorities: back to the
        snapshot of ``generation``, the flush the reset made first (nothing has changed the
        priorities since), so that they match the rows again."""
        self._restore(generation)
        self._load(self.live)

    def _restore(self, generation: int) -> None:
        """The live dataset, its words and the dirty map as of the snapshot of ``generation``."""
        snap = self.snapshot_header(generation)
        slot = generation % 2
        self.live[:] = self.bodies[slot]
        w = self.words
        w[W_ASSIGNED], w[W_BASE] = snap["assigned"], snap["base"]
        self._set_max_p(snap["max_p"])
        self.dirty[:] = 1 << (1 - slot)  # the other slot may hold anything now

    def snapshot_header(self, generation: int) -> dict:
        snap = _read_header(self.file, self.layout, generation % 2)
        if snap is None or snap["generation"] != generation:
            raise CorruptStoreError(
                f"{self.path}: the priorities of the last flush (generation {generation}) are missing or "
                "damaged; the store's priorities cannot be recovered")
        return snap

    def _load(self, source: np.ndarray) -> None:
        leaves = self.tree.leaves
        leaves[:self.max_size] = source
        if not (leaves.min() >= 0 and math.isfinite(float(leaves.sum()))):
            raise CorruptStoreError(f"{self.path}: the stored priorities hold negative or non-finite values; "
                                    "run diskreplay verify")
        self.tree.rebuild()

    # ------------------------------------------------------------------ writer: changes
    def catch_up(self, seen: int, base: int) -> None:
        """Give the transitions added since the last call ``max_p`` (and empty every slot
        after a reset). Each step is written before the word that records it."""
        w, m = self.words, self.max_size
        if int(w[W_BASE]) != base:
            self.dirty[:] = 3
            self.live[:] = 0
            self.tree.update_range(0, m, 0.0)
            self._set_max_p(1.0)
            w[W_ASSIGNED] = base
            w[W_BASE] = base
        lo = max(self.assigned, seen - m)
        if seen <= lo:
            return
        max_p = self.max_p
        for a, b in _slot_ranges(ring.slot_of(lo + 1, base, m), seen - lo, m):
            self.dirty[a // BLOCK:(b - 1) // BLOCK + 1] = 3
            self.live[a:b] = max_p
            self.tree.update_range(a, b, max_p)
        w[W_ASSIGNED] = seen

    def update(self, idxs: np.ndarray, raw: np.ndarray, seen: int, base: int) -> None:
        """``p = (raw + epsilon) ** alpha`` into the slots ``idxs`` (checked; the last of
        duplicates wins), the running ``max_p``, the live dataset and the tree."""
        if len(idxs) == 0:
            return
        p, top = self.stored(raw)  # refused before anything is written
        self.catch_up(seen, base)
        w = self.words
        w[W_SEQ] = int(w[W_SEQ]) | 1  # odd: readers wait for the update to finish
        try:
            if top > self.max_p:  # set before any slot holds it; a value a later duplicate replaces is never held
                top = float(sumtree.last_of_duplicates(idxs, p)[1].max())
                if top > self.max_p:
                    self._set_max_p(top)
            # One call (C where built): the dirty marks, the live dataset and the tree.
            self.tree.update_mirrored(idxs, p, self.live, self.dirty, BLOCK)
        except BaseException:  # interrupted (Ctrl-C): the tree follows whatever reached the dataset
            if self.words is w:  # (a signal handler may have closed the store: nothing to follow)
                self._load(self.live)
            raise
        finally:
            if self.words is w:  # still open: a close from a signal handler made the seq even itself
                w[W_SEQ] = (int(w[W_SEQ]) | 1) + 1  # even again, and never seen before

    def stored(self, raw: np.ndarray) -> tuple[np.ndarray, float]:
        """``(raw + epsilon) ** alpha`` and its largest value, each value checked to be one
        the store can keep: a normal float64 of at most ``P_LIMIT / max_size`` (so no sum
        of the tree overflows, and no ``p_i / min p`` of a weight divides by a subnormal),
        or 0 where ``raw + epsilon`` is 0 (never a positive priority that underflowed),
        else ``InvalidPriorityError``."""
        if self.quiet:
            p = (raw + self.epsilon) ** self.alpha
        else:
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                p = (raw + self.epsilon) ** self.alpha
        top = float(_largest(p))
        if top <= self.p_max and _smallest(p) >= P_TINY:  # the usual batch: two reductions
            return p, top
        with np.errstate(invalid="ignore"):
            bad = ~((p >= P_TINY) & (p <= self.p_max) | (p == 0) & (raw + self.epsilon == 0))
        if not bad.any():
            return p, top
        i = int(np.flatnonzero(bad)[0])
        fix = ("pass smaller priorities (e.g. clip the |TD error|) or create the store with a smaller alpha"
               if not p[i] < P_TINY else "pass 0 or larger priorities, or create the store with a smaller alpha "
               "or a larger epsilon")
        raise InvalidPriorityError(
            f"priority {float(raw[i])!r} would be stored as ({float(raw[i])!r} + epsilon {self.epsilon!r}) ** alpha "
            f"{self.alpha!r} = {float(p[i])!r}, outside what the store keeps ({P_TINY:.3g} to {self.p_max:.3g} "
            f"for {self.max_size} slots, or 0 from 0, so that the sum tree and the weights stay finite); {fix}; "
            "nothing was written")

    def checkpoint(self, generation: int, seen: int, base: int) -> None:
        """Snapshot of generation ``generation`` into slot ``generation % 2``: the dirty
        blocks, synced, then the header, synced (before the rows' checkpoint header)."""
        self.catch_up(seen, base)
        slot = generation % 2
        bit = 1 << slot
        blocks = np.flatnonzero(self.dirty & bit)
        body, m = self.bodies[slot], self.max_size
        if len(blocks) * 4 >= len(self.dirty):
            body[:] = self.live
        elif len(blocks):
            idx = (blocks[:, None] * BLOCK + np.arange(BLOCK)).reshape(-1)
            idx = idx[idx < m]
            body[idx] = self.live[idx]
        self.storage.sync()  # the live dataset too: a clean close is trusted without a snapshot
        self.file.sync()
        _write_header(self.file, self.layout, slot, generation=generation, seen=seen, base=base,
                      assigned=self.assigned, max_p=self.max_p)
        self.file.sync()
        np.bitwise_and(self.dirty, 3 - bit, out=self.dirty)

    # ------------------------------------------------------------------ reader
    def refresh_reader(self, seen: int, base: int, generation: int | None, writer_alive) -> None:
        """Make the tree the priorities a reader sees at ``(seen, base)``: a consistent copy
        of the live dataset (or, for a dead writer's store rolled back to a checkpoint, the
        snapshot of ``generation``), with pending transitions at ``max_p``. Rebuilt only
        when something changed (O(max_size) then)."""
        w = self.words
        waits = copies = 0
        while True:
            seq = int(w[W_SEQ])
            if generation is not None:
                snap = self.snapshot_header(generation)
                state = (seq, snap["assigned"], snap["base"], snap["max_p"], seen, base, generation)
            else:
                state = (seq, self.assigned, int(w[W_BASE]), self.max_p, seen, base, None)
            if state == self.loaded:
                return
            if seq % 2 and generation is None and waits < SEQ_WAITS and writer_alive():
                waits += 1
                time.sleep(0.0005)
                continue
            self.tree.leaves[:self.max_size] = self.live if generation is None else self.bodies[generation % 2]
            copies += 1
            # A writer that never pauses long enough for a whole copy of a large store: the
            # last copy is taken as it is (each slot holds a value the writer stored).
            if int(w[W_SEQ]) == seq or copies >= SEQ_COPIES:
                break
        _, assigned, p_base, max_p = state[:4]
        leaves, m = self.tree.leaves, self.max_size
        if p_base != base:
            leaves[:m], assigned, max_p = 0.0, base, 1.0
        size = ring.ring_size(seen, base, m)
        leaves[size:m] = 0.0
        lo = max(assigned, seen - m)
        if seen > lo:
            for a, b in _slot_ranges(ring.slot_of(lo + 1, base, m), seen - lo, m):
                leaves[a:b] = max_p
        self.tree.rebuild()
        self.loaded = state
        self.view_max_p = max_p

    def adopt(self, values: np.ndarray, max_p: float, seen: int, base: int) -> None:
        """Take over another store's priorities (``convert``: rows copied slot for slot);
        the flush that follows snapshots them."""
        self.dirty[:] = 3
        self.live[:] = values
        self._set_max_p(max_p)
        self.words[W_ASSIGNED], self.words[W_BASE] = seen, base
        self._load(self.live)

    def copy_into(self, other: "Priorities", count, seen: int, base: int, num_envs: int) -> None:
        """The priorities as this (reader's) session last brought them up to its snapshot."""
        other.adopt(self.tree.leaves[:self.max_size], self.view_max_p, seen, base)

    # ------------------------------------------------------------------ sampling
    def draw(self, sampler: ring.Sampler, size: int, batch_size: int, use_cer: bool, head: int,
             beta: float) -> tuple[np.ndarray, np.ndarray]:
        """``(idxs, weights)``: slots drawn with probability ``p_i / sum p`` (one draw of the
        store's sampler each), and ``(p_i / min p) ** -beta`` as float32."""
        total = self.tree.total
        if not total > 0:
            raise EmptyStoreError("every priority of the store is 0; update_priorities with larger values")
        return self.tree.draw(sampler.uniforms(batch_size), head if use_cer else -1, beta)

    def of(self, idxs: np.ndarray) -> np.ndarray:
        """The stored ``p_i`` of slots ``idxs`` (float64)."""
        return self.tree.leaves[idxs]

    # ------------------------------------------------------------------ checking
    def problems(self, seen: int, base: int) -> list[str]:
        """What is wrong with the priorities of a store at ``(seen, base)`` (after the
        session built its tree): values, words, tree and the newest snapshot."""
        out = [f"tree: {p}" for p in self.tree.problems()]
        m, leaves = self.max_size, self.tree.leaves[:self.max_size]
        size = ring.ring_size(seen, base, m)
        live = np.asarray(self.live)
        if not (np.isfinite(live).all() and live.min() >= 0):
            out.append(f"{DATASET}: negative or non-finite values")
        if size and self.epsilon > 0 and not leaves[:size].min() > 0:
            out.append(f"{DATASET}: an occupied slot has a priority <= 0 (it can never be sampled)")
        if size < m and np.any(leaves[size:] != 0):
            out.append(f"{DATASET}: an empty slot has a priority")
        if size and float(leaves[:size].max()) > self.max_p:
            out.append(f"{PRIORITY_FILE}: max_p {self.max_p} is below a held priority {float(leaves.max())}")
        if not (self.max_p >= 1.0 and math.isfinite(self.max_p)):
            out.append(f"{PRIORITY_FILE}: max_p is {self.max_p}, expected a finite value >= 1")
        if _read_header(self.file, self.layout, 0) is None and _read_header(self.file, self.layout, 1) is None:
            out.append(f"{PRIORITY_FILE}: neither snapshot slot is valid")
        return out

    # ------------------------------------------------------------------ closing
    def sync(self) -> None:
        self.storage.sync()
        self.file.sync()

    @property
    def mapped_files(self) -> list:
        return ([*self.storage.files] if self.storage else []) + ([self.file] if self.file else [])

    def close(self) -> None:
        if self.words is not None and self.words.flags.writeable and int(self.words[W_SEQ]) % 2:
            self.words[W_SEQ] += 1  # closed inside an update (a signal handler): no reader waits on it
        for arr in (self.live, self.words, self.dirty, *self.bodies):
            if arr is not None:  # an operation this close cut short must not write after it
                arr.flags.writeable = False
        self.live = self.words = self.dirty = None
        self.bodies = []
        for res in (self.storage, self.file):
            if res is not None:
                res.close()
        self.storage = self.file = None


def _slot_ranges(start: int, count: int, m: int) -> list[tuple[int, int]]:
    """The slot ranges ``[a, b)`` of ``count`` consecutive transitions from slot ``start`` (wrapping)."""
    end = min(start + count, m)
    out = [(start, end)]
    if end - start < count:
        out.append((0, count - (end - start)))
    return out


class PrioritiesPart(Part):
    """Priorities as a part: the ``priorities`` dataset (in the backend) and ``priorities.bin``;
    open, :class:`Priorities` (with the store's settings, ``alpha`` and ``epsilon``, from
    ``store.json``)."""
    name = "priorities"
    names = (PRIORITY_FILE,)  # the dataset's file ends in a data suffix (.npy) or lives in data.h5

    @classmethod
    def wanted(cls, g: Geometry) -> bool:
        return g.prioritized

    @classmethod
    def files(cls, g: Geometry) -> list[str]:
        return data_files(g.backend)

    @classmethod
    def datasets(cls, g: Geometry) -> dict:
        return {DATASET: SPEC}

    @classmethod
    def bytes_needed(cls, g: Geometry) -> int:
        return prioritized_bytes(g.max_size)  # the dataset is counted with the backend's

    @classmethod
    def create(cls, directory: str, g: Geometry) -> None:
        create_priority_file(directory, g.max_size)

    @classmethod
    def open(cls, directory: str, g: Geometry, writable: bool, storage=None) -> Priorities:
        return Priorities(directory, g.desc, writable)

    @classmethod
    def check(cls, c: Checks) -> None:
        """Its priorities as a reader sees them, the tree built from them checked node by
        node, ``max_p``, empty and occupied slots, the snapshots."""
        if c.seen is None:
            return
        try:
            prio = Priorities(c.directory, c.desc, writable=False)
        except DiskReplayError as exc:
            c.report.problem(f"{PRIORITY_FILE}: {exc}")
            return
        try:
            c.report.count("files")
            prio.refresh_reader(c.seen, c.base, None, lambda: writer_alive(c.directory))
            for problem in prio.problems(c.seen, c.base):
                c.report.problem(problem)
            c.report.checked["priorities"] = c.g.max_size
        except DiskReplayError as exc:
            c.report.problem(f"{PRIORITY_FILE}: {exc}")
        finally:
            prio.close()


__all__ = ["PrioritiesPart", "PRIORITY_FILE", "DATASET", "Priorities", "create_priority_file", "data_files"]
