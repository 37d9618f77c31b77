"""Flushing: what makes a writer's adds survive a power cut (FORMAT.md, ``checkpoint.bin``).

``Flusher.flush`` computes the row sums of the rows added since the last checkpoint, syncs
every data file and the counters, then writes a new checkpoint (counters, ``ns_buffer`` and
undo copies of the rows the next adds will overwrite) into the slot that does not hold the
newest one. ``flush_before`` (in the writer's ``WriteState``) is the newest transition an
add may write before a flush is due. Between flushes, every ``EARLY_BYTES`` of rows, adds
hand early work to a thread (``earlywork.py``): start the writeback of their rows, copy the
next checkpoint's undo rows ahead (``undocopy.py``), so that a flush at the limit has mostly
sums, fsyncs of data already on its way to disk, and a header left.

``Flusher`` is the writer's collaborator, not a part of it: it owns the flush limit's
bookkeeping (the early work thread, the planned undo copy, how far writeback and the side
rings may go) and reads the writer's store (``data``, ``counters``, the ring counters in
``ws``); the writer owns the checkpoint it writes (``Writer.checkpoint``) and decides what
a failure means (``Writer._flush_now``).
"""
from __future__ import annotations

import mmap
import time

import numpy as np

from ..core import ring
from ..format.counters import W_DRAWS, W_FLUSH_NS
from .earlywork import EarlyWorker
from ..errors import StoreIOError
from ..disk.fsutil import start_writeback
from ..format.rowsums import update_sums
from .undocopy import UndoCopy, plan

EARLY_BYTES = 1 << 20  # rows handed to writeback ahead of the flush, per block


class Flusher:
    """The flushes, the flush limit and the early work of one writer ``w``."""

    def __init__(self, w):
        self.w = w
        self.ws = w.ws
        self.early = None  # the early work thread (earlywork.py), started by the first early work
        self.undo_copy = None  # the next checkpoint's undo rows copied ahead (None: not planned; False: nothing)
        self.written_back = 0  # transitions whose writeback early work started
        self.early_at = 1 << 62  # the transition past which an add hands over early work

    def flush(self) -> None:
        w, ws = self.w, self.ws
        w.words[W_DRAWS] = w.sampler.draws
        if w.fields is None:
            w.counters.sync()
            return
        # the last rows' writeback runs while the sums are computed
        self.start_writeback(w.data.storage, self.written_back, ws.seen, ws.base)
        summed = w.checkpoint.seen if w.checkpoint is not None else 0
        update_sums(w.data.sums, w.data.storage, summed, ws.seen, ws.base, w.max_size)
        w.data.sync_rows()
        w.words[W_FLUSH_NS] = time.time_ns()
        w.counters.sync()
        self.write_checkpoint()

    def write_checkpoint(self) -> None:
        w = self.w
        seen, base, m = self.ws.seen, self.ws.base, w.max_size
        generation = (w.checkpoint.generation + 1) if w.checkpoint else 1
        first_overwrite = max(seen + 1, base + m + 1)
        count = max(0, seen + w.reserve_rows - first_overwrite + 1)
        slot = generation % 2
        storage = w.data.storage
        self.stop_early_work()  # the undo copy is the flush's from here
        copy = self.undo_copy
        if not copy or copy.key != (slot, first_overwrite, count, base):  # not the flush planned for
            copy = UndoCopy(slot, first_overwrite, count, base, storage.arrays)
        ckfile = w.data.ckfile
        copy.copy(ckfile, storage, count, w.num_envs)  # what early work has not copied yet
        ns_rows = w.current_ns() if seen > base else np.zeros_like(w.data.ns[0])
        for part in w.parts:  # each part's state of this generation is durable before the header is
            part.checkpoint(generation, seen, base)
        body_crc = ckfile.commit(slot, generation, seen, base, w.sampler.draws, w.resets, ns_rows,
                                 first_overwrite if count else seen + 1, count, copy.crcs,
                                 **{part.part.header: part.count for part in w.counted})
        w.checkpoint = ckfile.read_header(slot, body_crc)  # the header read back; the body's CRC as written
        if w.checkpoint is None:
            raise StoreIOError(f"{ckfile.path}: the checkpoint just written does not read back")
        self.set_flush_limit()

    def work_early(self) -> None:
        """An add's early work, every ``EARLY_BYTES`` of rows, handed to the writer's early
        work thread (``earlywork.py``): the writeback of the rows added, and the next block
        of the next checkpoint's undo rows (``undocopy.py``)."""
        w, ws = self.w, self.ws
        worker = self.early
        if worker is None or not worker.alive:  # the first early work, or a forked child's
            worker = self.early = EarlyWorker(w.path)
        lo, hi, base = self.written_back, ws.seen, ws.base
        storage = w.data.storage
        worker.post(lambda wanted: self.start_writeback(storage, lo, hi, base))
        copy = self.undo_copy
        if copy is None:  # planned once per checkpoint; False: nothing to copy ahead
            copy = self.undo_copy = plan(w.checkpoint, ws.seen, ws.flush_before, w.num_envs, ws.base,
                                         w.max_size, w.reserve_rows, storage.arrays) or False
        if copy:
            # A third more rows than the adds wrote since the last block: done before the flush.
            upto = copy.target = copy.target + (self.early_at - self.written_back) * 4 // 3 + 1
            ckfile, n = w.data.ckfile, w.num_envs
            worker.post(lambda wanted: copy.copy(ckfile, storage, upto, n, wanted))
        self.plan_early_work(ws.seen)

    def stop_early_work(self) -> None:
        """No early work job runs after this (a flush's undo copy, ``close()``)."""
        if self.early is not None:
            self.early.quiesce()

    def stop(self) -> None:
        """At close: the early work thread ends; no job touches the files after this."""
        if self.early is not None:
            self.early.stop()
            self.early = None

    def start_writeback(self, storage, lo: int, hi: int, base: int) -> None:
        """Start the writeback of the rows of transitions ``(lo, hi]``, whole pages of each
        field's byte range (``fsutil.start_writeback``), so that the next flush's fsync finds
        them mostly on disk. Only a hint to the kernel: what is durable is still decided by
        the flush alone. (The row sums stay in the flush.)"""
        m = self.w.max_size
        if hi > lo:
            first = max(lo, base, hi - m)  # transitions (first, hi] are in the ring
            start, count = ring.slot_of(first + 1, base, m), hi - first
            for name, (fd, offset, row_bytes) in storage.locations.items():
                for first_row, rows in storage.order(name).runs(start, count):
                    end = first_row + min(rows, m - first_row)  # slot-order runs wrap at the end
                    for a, b in ((first_row, end), (0, rows - (end - first_row))):
                        # Whole pages only: the page the next rows go on stays out of writeback (a
                        # write to a page under writeback may have to wait for it); consecutive
                        # blocks tile, each taking the page the one before left.
                        lo_byte, hi_byte = _page_floor(offset + a * row_bytes), _page_floor(offset + b * row_bytes)
                        start_writeback(fd, lo_byte, hi_byte - lo_byte)

    def plan_early_work(self, done: int) -> None:
        """``due``: the transition past which an add takes the general path, which flushes
        (``flush_before``) or starts writeback (``work_early``): the fast adds test this one number."""
        w, ws = self.w, self.ws
        self.written_back = done
        row_bytes = sum(spec.row_bytes for spec in w.fields.values())
        self.early_at = done + max(w.num_envs, EARLY_BYTES // max(1, row_bytes))
        ws.due = min(ws.flush_before, self.early_at)

    def set_flush_limit(self) -> None:
        """The newest transition an add may write before a flush is due: ``reserve_rows``
        past the newest checkpoint. Past it, a slot would be overwritten that the checkpoint
        holds no undo copy of; before the ring's first wrap nothing is overwritten, but the
        same limit holds there too, so that no flush has more than ``reserve_rows`` rows to
        sum and sync (the first flush would otherwise take the whole ring: seconds on a
        large store, all on one add)."""
        w, ws = self.w, self.ws
        if w.fields is None:
            ws.flush_before = ws.due = self.early_at = 1 << 62
            self.written_back = 0
            self.undo_copy = False
            return
        c = w.checkpoint
        # The jump ring keeps reserve_rows records of room beyond the checkpoint's window (jumps.py),
        # and so does a frame-stack store's stack ring (parts/stacks/): each counting part's
        # limit. Records since the checkpoint are of transitions after c.seen - num_envs, so
        # the row limit below implies the jump ring's; it stays as the rule the jump ring relies on.
        for part in w.counted:
            part.limit = (getattr(c, part.part.header) if c else part.count) + w.reserve_rows
        if c is not None and c.base == ws.base:
            limit = c.seen + w.reserve_rows
        else:  # no checkpoint of this ring yet (a reset not yet flushed): only the wrap needs one
            limit = ws.base + w.max_size
        flush_every = w.desc["flush_every"]
        if flush_every is not None:
            limit = min(limit, ws.seen + flush_every * w.num_envs)
        ws.flush_before = limit
        self.undo_copy = None  # planned at the first early work against this checkpoint
        self.plan_early_work(ws.seen)


def _page_floor(n: int) -> int:
    return n - n % mmap.PAGESIZE


def initial_checkpoint(specs: dict, num_envs: int, states=None):
    """An initial checkpoint at seen_size 0: recovery always has one to fall back on.
    ``states``: the spec of a whole state when it is not ``specs["states"]`` (frame stacks)."""
    states = specs["states"] if states is None else states
    stacks = 0 if states is not specs["states"] else None

    def write(ckfile) -> None:
        ckfile.write(1, generation=1, seen=0, base=0, draws=0, resets=0,
                     ns_rows=np.zeros((num_envs,) + states.shape, states.dtype),
                     reserve_first=1, reserve_parts={name: [] for name in specs}, stacks=stacks)

    return write
