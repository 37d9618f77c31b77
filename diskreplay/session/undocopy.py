"""The next checkpoint's undo rows, copied ahead while adds fill the current reserve.

A flush writes into the checkpoint slot that does not hold the newest checkpoint: the
``ns_buffer``, copies of the ``reserve_rows`` rows the next adds will overwrite (the undo
reserve), then the header (``checkpoint.py``). Copied all at once, the undo rows were two
thirds of every flush (16 of 24 ms for W3's 16 MiB reserve), all of it on one add.

They are known long before: when the adds since checkpoint ``c`` reach the flush limit at
``seen == s``, the reserve is the rows of transitions ``s+1 .. s+R``, and no add before the
flush writes their slots when ``s + R - c.seen <= max_size`` (they lie ahead of every slot the
adds since ``c`` reach). So the writer's early work (``flushing.py``) copies a block of them
into the next slot after each block of adds, with their writeback started, keeping each
field's running CRC; the flush copies whatever is left, or all of it when the flush comes at
another ``seen`` than planned (a ``flush()`` call, a reset, the jump or stack ring's limit)
or the plan's rows could change first, and joins the CRCs (``crcjoin.py``).

Only the timing changes. The slot written ahead is the one the flush writes anyway (it holds
the checkpoint before the newest, which nothing reads once the newest is valid), and it
becomes valid only when the flush writes its header, so what a crash or a power cut leaves
is what it left before.
"""
from __future__ import annotations

from ..core import ring

__all__ = ["UndoCopy", "plan"]

BLOCK_BYTES = 1 << 20  # rows copied at a time from a ring whose rows lie env-major (roworder.py)


class UndoCopy:
    """The undo rows ``0 .. count-1`` (transitions ``first ..``) of checkpoint slot ``slot``,
    of which ``done`` are written; ``crcs[name]``: the CRC of field ``name``'s written rows;
    ``target``: the rows early work has asked for so far (the writer's thread sets it)."""

    def __init__(self, slot: int, first: int, count: int, base: int, names):
        self.key = (slot, first, count, base)
        # One attribute, replaced whole after each block: a signal handler's flush that runs
        # in the middle of a block sees the rows before it as done, never a half-counted block.
        self.progress = (0, {name: 0 for name in names})
        self.target = 0

    @property
    def done(self) -> int:
        return self.progress[0]

    @property
    def crcs(self) -> dict:
        return self.progress[1]

    def copy(self, ckfile, storage, upto: int, num_envs: int, wanted=None) -> None:
        """Write rows ``done .. upto-1`` of every field. ``wanted()``, asked before each write
        (``earlywork.py``), says whether this copy is still the writer's (a flush may have
        taken it over, a close ended it); if not, nothing more is written."""
        done, crcs = self.progress
        slot, first, count, base = self.key
        upto = min(upto, count)
        if upto <= done:
            return
        m = len(next(iter(storage.arrays.values())))
        crcs = dict(crcs)
        for name, arr in storage.arrays.items():
            order, k, crc = storage.order(name), done, crcs[name]
            for start, n in _blocks(ring.slot_of(first + done, base, m), upto - done, m, order, arr, num_envs):
                block = arr[order.span(start, n)]  # a view, or a copy where rows lie env-major
                if wanted is not None and not wanted():
                    return
                crc = ckfile.write_rows(slot, name, k, block, crc)
                k += n
            crcs[name] = crc
        self.progress = (upto, crcs)


def _blocks(start: int, count: int, m: int, order, arr, num_envs: int):
    """``(first slot, rows)`` pieces of ``count`` rows from slot ``start``, split at the ring's
    end, and where rows lie env-major into blocks of about ``BLOCK_BYTES``."""
    end = min(start + count, m)
    pieces = [(start, end - start)]
    if end - start < count:
        pieces.append((0, count - (end - start)))
    if order.identity:
        return pieces
    step = max(num_envs, BLOCK_BYTES // max(1, arr[0].nbytes) // num_envs * num_envs)
    return [(a + i, min(step, n - i)) for a, n in pieces for i in range(0, n, step)]


def plan(checkpoint, seen: int, flush_before: int, num_envs: int, base: int, max_size: int,
         reserve_rows: int, names) -> UndoCopy | None:
    """The undo copy of the flush the adds will reach at ``flush_before``, or None where it
    cannot be copied ahead: no checkpoint of this ring, a ring not yet full by then (nothing
    to undo, or a partial reserve), or reserve rows the adds before the flush could reach."""
    if checkpoint is None or checkpoint.base != base:
        return None
    s = seen + (flush_before - seen) // num_envs * num_envs  # adds come num_envs rows at a time
    if s < base + max_size or s + reserve_rows - checkpoint.seen > max_size:
        return None
    return UndoCopy((checkpoint.generation + 1) % 2, s + 1, reserve_rows, base, names)
