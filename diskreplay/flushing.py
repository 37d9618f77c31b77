"""Flushing: what makes a writer's adds survive a power cut (FORMAT.md, ``checkpoint.bin``).

``flush()`` computes the row sums of the rows added since the last checkpoint, syncs every
data file and the counters, then writes a new checkpoint (counters, ``ns_buffer`` and undo
copies of the rows the next adds will overwrite) into the slot that does not hold the
newest one. ``flush_before`` is the newest transition an add may write before a flush is
due. ``Flushing`` is a part of ``Writer`` (``writer.py``), kept apart so that each module
stays small; it uses the writer's attributes (``data``, ``words``, ``checkpoint``, ...).
"""
from __future__ import annotations

import mmap
import sys
import time

import numpy as np

from . import ring
from .counters import W_DRAWS, W_FLUSH_NS
from .errors import DiskReplayError, StoreIOError
from .fsutil import io_error, start_writeback
from .rowsums import update_sums

EARLY_BYTES = 1 << 20  # rows handed to writeback ahead of the flush, per block


class Flushing:
    """The flush and checkpoint half of ``Writer``."""

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

    def _flush(self) -> None:
        self.words[W_DRAWS] = self.sampler.draws
        if self.fields is None:
            self.counters.sync()
            return
        self._work_early()  # the last rows' writeback runs while the sums are computed
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
        parts = {}
        storage = self.data.storage
        for name, arr in storage.arrays.items():
            blocks = []
            if count:  # in slot order: views of the ring, or copies where the rows lie env-major
                order, start = storage.order(name), ring.slot_of(first_overwrite, base, m)
                end = min(start + count, m)
                blocks.append((start, end - start))
                if end - start < count:
                    blocks.append((0, count - (end - start)))
                if not order.identity:  # copied a MiB at a time as the checkpoint writes them (in cache)
                    step = max(self.num_envs, (1 << 20) // arr[0].nbytes // self.num_envs * self.num_envs)
                    blocks = [(a + i, min(step, n - i)) for a, n in blocks for i in range(0, n, step)]
            parts[name] = _rows_of(arr, order, blocks) if count else blocks
        ns_rows = self.current_ns() if seen > base else np.zeros_like(self.data.ns[0])
        ckfile = self.data.ckfile
        slot = generation % 2
        if self.prio is not None:  # its snapshot of this generation is durable before the header is
            self.prio.checkpoint(generation, seen, base)
        body_crc = ckfile.write(slot, generation=generation, seen=seen, base=base, draws=self.sampler.draws,
                                resets=self.resets, ns_rows=ns_rows,
                                reserve_first=first_overwrite if count else seen + 1, reserve_parts=parts,
                                jumps=self.jcount, stacks=self.scount if self.data.stacks is not None else None)
        self.checkpoint = ckfile.read_header(slot, body_crc)  # the header read back; the body's CRC as written
        if self.checkpoint is None:
            raise StoreIOError(f"{ckfile.path}: the checkpoint just written does not read back")
        self._set_flush_limit()

    def _work_early(self) -> None:
        """Start the writeback of the committed rows written since the last call
        (``written_back``), whole pages of each field's byte range (``fsutil.start_writeback``),
        so that the next flush's fsync finds them mostly on disk. Runs before a step begins
        (nothing in flight), every ``EARLY_BYTES`` of rows. Only a hint to the kernel: what
        is durable is still decided by the flush alone. (The row sums stay in the flush:
        summing a block here made one add in four cost about 1 ms on W3's frames.)"""
        lo, hi = self.written_back, self.seen
        if hi > lo:
            first = max(lo, self.base, hi - self.max_size)  # transitions (first, hi] are in the ring
            start, count = ring.slot_of(first + 1, self.base, self.max_size), hi - first
            storage = self.data.storage
            for name, (fd, offset, row_bytes) in storage.locations.items():
                for first_row, rows in storage.order(name).runs(start, count):
                    end = first_row + min(rows, self.max_size - first_row)  # slot-order runs wrap at the end
                    for a, b in ((first_row, end), (0, rows - (end - first_row))):
                        # Whole pages only: the page the next rows go on stays out of writeback (a
                        # write to a page under writeback may have to wait for it); consecutive
                        # blocks tile, each taking the page the one before left.
                        lo_byte, hi_byte = _page_floor(offset + a * row_bytes), _page_floor(offset + b * row_bytes)
                        start_writeback(fd, lo_byte, hi_byte - lo_byte)
        self._plan_early_work(hi)

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
        self._plan_early_work(self.seen)


def _rows_of(arr, order, blocks):
    """The rows of slot ranges ``(first, count)`` of ``arr``, a block at a time (``order``: roworder.py)."""
    for first, count in blocks:
        yield arr[order.span(first, count)]


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
