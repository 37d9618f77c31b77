"""Flushing: what makes a writer's adds survive a power cut (FORMAT.md, ``checkpoint.bin``).

``flush()`` computes the row sums of the rows added since the last checkpoint, syncs every
data file and the counters, then writes a new checkpoint (counters, ``ns_buffer`` and undo
copies of the rows the next adds will overwrite) into the slot that does not hold the
newest one. ``flush_before`` is the newest transition an add may write before a flush is
due. Between flushes, every ``EARLY_BYTES`` of rows, adds hand early work to a thread
(``earlywork.py``): start the writeback of their rows, copy the next checkpoint's undo rows
ahead (``undocopy.py``), so that a flush at the limit has mostly sums, fsyncs of data
already on its way to disk, and a header left. ``Flushing`` is a part of ``Writer``
(``writer.py``), kept apart so that each module stays small; it uses the writer's
attributes (``data``, ``words``, ``checkpoint``, ...).
"""
from __future__ import annotations

import mmap
import sys
import time

import numpy as np

from ..core import ring
from ..format.counters import W_DRAWS, W_FLUSH_NS
from .earlywork import EarlyWorker
from ..errors import DiskReplayError, StoreIOError
from ..disk.fsutil import io_error, start_writeback
from ..format.rowsums import update_sums
from .undocopy import UndoCopy, plan

EARLY_BYTES = 1 << 20  # rows handed to writeback ahead of the flush, per block


class Flushing:
    """The flush and checkpoint half of ``Writer``."""

    early = None  # the early work thread (earlywork.py), started by the first early work

    def flush(self) -> None:
        """Sync every data file, then write a new checkpoint; a failure leaves the writer failed."""
        with self.mutex:
            self._enter("flush")
            try:
                self.busy = sys._getframe()
                self._flush_now()
            finally:
                self.busy = None

    def _flush_now(self) -> None:
        try:
            self._flush()
        except DiskReplayError as exc:
            self._fail(exc)
            raise
        except OSError as exc:
            self._fail(exc)
            raise io_error(f"flushing {self.path}", exc) from exc

    def _fail(self, exc: BaseException) -> None:
        """After a failed sync nothing more is written: the disk may not hold what we think."""
        self.failed = exc
        self.live = False
        self._stop_early_work()

    def _flush(self) -> None:
        self.words[W_DRAWS] = self.sampler.draws
        if self.fields is None:
            self.counters.sync()
            return
        # the last rows' writeback runs while the sums are computed
        self._start_writeback(self.data.storage, self.written_back, self.seen, self.base)
        summed = self.checkpoint.seen if self.checkpoint is not None else 0
        update_sums(self.data.sums, self.data.storage, summed, self.seen, self.base, self.max_size)
        self.data.sync_rows()
        self.words[W_FLUSH_NS] = time.time_ns()
        self.counters.sync()
        self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        seen, base, m = self.seen, self.base, self.max_size
        generation = (self.checkpoint.generation + 1) if self.checkpoint else 1
        first_overwrite = max(seen + 1, base + m + 1)
        count = max(0, seen + self.reserve_rows - first_overwrite + 1)
        slot = generation % 2
        storage = self.data.storage
        self._stop_early_work()  # the undo copy is the flush's from here
        copy = self.undo_copy
        if not copy or copy.key != (slot, first_overwrite, count, base):  # not the flush planned for
            copy = UndoCopy(slot, first_overwrite, count, base, storage.arrays)
        ckfile = self.data.ckfile
        copy.copy(ckfile, storage, count, self.num_envs)  # what early work has not copied yet
        ns_rows = self.current_ns() if seen > base else np.zeros_like(self.data.ns[0])
        if self.prio is not None:  # its snapshot of this generation is durable before the header is
            self.prio.checkpoint(generation, seen, base)
        body_crc = ckfile.commit(slot, generation, seen, base, self.sampler.draws, self.resets, ns_rows,
                                 first_overwrite if count else seen + 1, count, copy.crcs, self.jcount,
                                 self.scount if self.data.stacks is not None else None)
        self.checkpoint = ckfile.read_header(slot, body_crc)  # the header read back; the body's CRC as written
        if self.checkpoint is None:
            raise StoreIOError(f"{ckfile.path}: the checkpoint just written does not read back")
        self._set_flush_limit()

    def _work_early(self) -> None:
        """An add's early work, every ``EARLY_BYTES`` of rows, handed to the writer's early
        work thread (``earlywork.py``): the writeback of the rows added, and the next block
        of the next checkpoint's undo rows (``undocopy.py``)."""
        worker = self.early
        if worker is None or not worker.alive:  # the first early work, or a forked child's
            worker = self.early = EarlyWorker(self.path)
        lo, hi, base = self.written_back, self.seen, self.base
        storage = self.data.storage
        worker.post(lambda wanted: self._start_writeback(storage, lo, hi, base))
        copy = self.undo_copy
        if copy is None:  # planned once per checkpoint; False: nothing to copy ahead
            copy = self.undo_copy = plan(self.checkpoint, self.seen, self.flush_before, self.num_envs, self.base,
                                         self.max_size, self.reserve_rows, storage.arrays) or False
        if copy:
            # A third more rows than the adds wrote since the last block: done before the flush.
            upto = copy.target = copy.target + (self.early_at - self.written_back) * 4 // 3 + 1
            ckfile, n = self.data.ckfile, self.num_envs
            worker.post(lambda wanted: copy.copy(ckfile, storage, upto, n, wanted))
        self._plan_early_work(self.seen)

    def _stop_early_work(self) -> None:
        """No early work job runs after this (a flush's undo copy, ``close()``)."""
        if self.early is not None:
            self.early.quiesce()

    def _start_writeback(self, storage, lo: int, hi: int, base: int) -> None:
        """Start the writeback of the rows of transitions ``(lo, hi]``, whole pages of each
        field's byte range (``fsutil.start_writeback``), so that the next flush's fsync finds
        them mostly on disk. Only a hint to the kernel: what is durable is still decided by
        the flush alone. (The row sums stay in the flush.)"""
        if hi > lo:
            first = max(lo, base, hi - self.max_size)  # transitions (first, hi] are in the ring
            start, count = ring.slot_of(first + 1, base, self.max_size), hi - first
            for name, (fd, offset, row_bytes) in storage.locations.items():
                for first_row, rows in storage.order(name).runs(start, count):
                    end = first_row + min(rows, self.max_size - first_row)  # slot-order runs wrap at the end
                    for a, b in ((first_row, end), (0, rows - (end - first_row))):
                        # Whole pages only: the page the next rows go on stays out of writeback (a
                        # write to a page under writeback may have to wait for it); consecutive
                        # blocks tile, each taking the page the one before left.
                        lo_byte, hi_byte = _page_floor(offset + a * row_bytes), _page_floor(offset + b * row_bytes)
                        start_writeback(fd, lo_byte, hi_byte - lo_byte)

    def _plan_early_work(self, done: int) -> None:
        """``due``: the transition past which an add takes the general path, which flushes
        (``flush_before``) or starts writeback (``_work_early``): the fast adds test this one number."""
        self.written_back = done
        row_bytes = sum(spec.row_bytes for spec in self.fields.values())
        self.early_at = done + max(self.num_envs, EARLY_BYTES // max(1, row_bytes))
        self.due = min(self.flush_before, self.early_at)

    def _set_flush_limit(self) -> None:
        """The newest transition an add may write before a flush is due: ``reserve_rows``
        past the newest checkpoint. Past it, a slot would be overwritten that the checkpoint
        holds no undo copy of; before the ring's first wrap nothing is overwritten, but the
        same limit holds there too, so that no flush has more than ``reserve_rows`` rows to
        sum and sync (the first flush would otherwise take the whole ring: seconds on a
        large store, all on one add)."""
        if self.fields is None:
            self.flush_before = self.jump_limit = self.stack_limit = self.due = self.early_at = 1 << 62
            self.written_back = 0
            self.undo_copy = False
            return
        c = self.checkpoint
        # The jump ring keeps reserve_rows records of room beyond the checkpoint's window (jumps.py),
        # and so does a frame-stack store's stack ring (framestack.py). Records since the
        # checkpoint are of transitions after c.seen - num_envs, so the row limit below implies
        # the jump ring's; it stays as the rule the jump ring relies on.
        self.jump_limit = (c.jumps if c else self.jcount) + self.reserve_rows
        self.stack_limit = (c.stacks if c else self.scount) + self.reserve_rows
        if c is not None and c.base == self.base:
            limit = c.seen + self.reserve_rows
        else:  # no checkpoint of this ring yet (a reset not yet flushed): only the wrap needs one
            limit = self.base + self.max_size
        flush_every = self.desc["flush_every"]
        if flush_every is not None:
            limit = min(limit, self.seen + flush_every * self.num_envs)
        self.flush_before = limit
        self.undo_copy = None  # planned at the first early work against this checkpoint
        self._plan_early_work(self.seen)


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
