"""Flushing: what makes a writer's adds survive a power cut (FORMAT.md, ``checkpoint.bin``).

``flush()`` computes the row sums of the rows added since the last checkpoint, syncs every
data file and the counters, then writes a new checkpoint (counters, ``ns_buffer`` and undo
copies of the rows the next adds will overwrite) into the slot that does not hold the
newest one. ``flush_before`` is the newest transition an add may write before a flush is
due. ``Flushing`` is a part of ``Writer`` (``writer.py``), kept apart so that each module
stays small; it uses the writer's attributes (``data``, ``words``, ``checkpoint``, ...).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from . import ring
from .counters import W_DRAWS, W_FLUSH_NS
from .errors import DiskReplayError, StoreIOError
from .fsutil import io_error
from .rowsums import update_sums


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
        summed = self.checkpoint.seen if self.checkpoint is not None else 0
        update_sums(self.data.sums, self.data.storage.arrays, summed, self.seen, self.base, self.max_size)
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
        for name, arr in self.data.storage.arrays.items():
            blocks = []
            if count:
                start = ring.slot_of(first_overwrite, base, m)
                end = min(start + count, m)
                blocks.append(arr[start:end])
                if end - start < count:
                    blocks.append(arr[: count - (end - start)])
            parts[name] = blocks
        ns_rows = self.current_ns() if seen > base else np.zeros_like(self.data.ns[0])
        ckfile = self.data.ckfile
        slot = generation % 2
        if self.prio is not None:  # its snapshot of this generation is durable before the header is
            self.prio.checkpoint(generation, seen, base)
        ckfile.write(slot, generation=generation, seen=seen, base=base, draws=self.sampler.draws,
                     resets=self.resets, ns_rows=ns_rows,
                     reserve_first=first_overwrite if count else seen + 1, reserve_parts=parts, jumps=self.jcount,
                     stacks=self.scount if self.data.stacks is not None else None)
        self.checkpoint = ckfile.read_header(slot)
        if self.checkpoint is None:
            raise StoreIOError(f"{ckfile.path}: the checkpoint just written does not read back")
        self._set_flush_limit()

    def _set_flush_limit(self) -> None:
        """The newest transition an add may write before a flush is due: past it, a slot
        would be overwritten that the newest checkpoint holds no undo copy of."""
        if self.fields is None:
            self.flush_before = self.jump_limit = self.stack_limit = 1 << 62
            return
        c = self.checkpoint
        # The jump ring keeps reserve_rows records of room beyond the checkpoint's window (jumps.py),
        # and so does a frame-stack store's stack ring (framestack.py).
        self.jump_limit = (c.jumps if c else self.jcount) + self.reserve_rows
        self.stack_limit = (c.stacks if c else self.scount) + self.reserve_rows
        limit = max(c.seen + self.reserve_rows, self.base + self.max_size) if c else self.base + self.max_size
        if c is not None and c.base != self.base:
            limit = self.base + self.max_size
        flush_every = self.desc["flush_every"]
        if flush_every is not None:
            limit = min(limit, self.seen + flush_every * self.num_envs)
        self.flush_before = limit


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
