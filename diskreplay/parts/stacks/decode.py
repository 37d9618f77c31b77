"""Whole batches of a frame-stack store (``sample``, ``get``, n-step rows): every field of
the rows at some slots, states and next states rebuilt from frames (``framestack.py``).

A row's state is the frames of transitions ``t - (k-1)n, ..., t`` and its next state those
of ``t - (k-2)n, ..., t + n``: one chain of ``k + 1`` transitions holds both, so the stack
ring is searched once per chain entry, and the chain's slots are the row's slot plus fixed
offsets. While the frames are in RAM, the states and the next states are each one ``take``
of the gather mapping straight into the batch's arrays. The rows that need more (a base in
the chain, a frame the ring overwrote, a next state in the ``ns_buffer`` or in the jump
ring) are few; only they go through ``FrameStacks.patch``, the one rule, and the patches.
The jump ring is searched only for rows whose ``t + n`` is a base: the writer makes every
jump's next transition a base (``Writer._write_step``; FORMAT.md). Reads with a reader's
undo overlay, or of named fields only, take ``StackedRows.gather``.

``StackedRows`` is the frame-stack store's ``Rows`` (``parts/rows.py``): what the sessions
read through.
"""
from __future__ import annotations

import numpy as np

from .ring import FrameStacks
from ...backends.gather import BATCH_ORDER, FRAME_ROW_BYTES, PROBE_ROWS, Gatherer, slot_runs
from ..jumps import JumpRing
from ..rows import Rows

_largest, _smallest = np.maximum.reduce, np.minimum.reduce  # the ufuncs' own methods: no wrapper per call


class StackBatches:
    """Reads whole batches of one opened frame-stack store (see the module docstring)."""

    def __init__(self, stacks: FrameStacks, gatherer: Gatherer, jumps: JumpRing | None, num_envs: int,
                 max_size: int):
        self.stacks, self.gatherer, self.jumps = stacks, gatherer, jumps
        self.k, self.n, self.m = stacks.k, num_envs, max_size
        fields = gatherer.fields
        self.keys = list(BATCH_ORDER) + [f for f in fields if f not in BATCH_ORDER]
        self.others = [f for f in self.keys if f in fields and f != "states"]
        self.offsets = np.arange(-(self.k - 1), 2, dtype=np.int64) * num_envs  # the chain: t - (k-1)n ... t + n
        self.small_frames = fields["states"].row_bytes < FRAME_ROW_BYTES  # never probed (Gatherer.stack_rows)

    def batch(self, slots: np.ndarray, head: int, seen: int, base: int, scount: int, jcount: int,
              ns_rows: np.ndarray) -> dict:
        """Every field of the rows at ``slots`` (int64), whole states and next states
        included, on the snapshot ``(seen, base)`` with ``scount`` stack records and
        ``jcount`` jump records committed; ``ns_rows`` is its ``ns_buffer``."""
        k, n, m = self.k, self.n, self.m
        ts = seen - (head - slots) % m  # the transitions held
        chain = ts[:, None] + self.offsets
        chain_slots = chain - (base + 1)
        chain_slots %= m  # ring.slot_of
        found, ks = self.stacks.records.find(chain.reshape(-1), scount)
        hits = found.nonzero()[0]  # positions in the flattened chains that are bases: few
        gatherer = self.gatherer
        if slot_runs(slots) is None and (self.small_frames or gatherer.rows_cached(slots[:PROBE_ROWS])):
            arrays = gatherer.storage.gather_arrays
            frames, chain_rows = arrays["states"], gatherer.storage.rows("states", chain_slots)
            states = frames.take(chain_rows[:, :k], axis=0)
            next_states = frames.take(chain_rows[:, 1:], axis=0)
            batch = {name: arrays[name].take(slots, axis=0) for name in self.others}
        else:  # cold frames or a scan's runs: each distinct frame read once, as Gatherer.stack_rows does
            if len(hits):  # the whole states (and jump-ring next states) read later: announced now
                self.stacks.records.will_need(ks[hits])
                rows = hits[hits % (k + 1) == k] // (k + 1)  # t + n a base: t may have a jump
                if jcount and len(rows):
                    jumped, jks = self.jumps.find(ts[rows], jcount)
                    self.jumps.will_need(jks[jumped])
            batch, frames = gatherer.stack_rows(slots, self.others, chain_slots.reshape(-1), head, ns_rows)
            frames = frames.reshape(chain.shape + frames.shape[1:])
            states, next_states = np.ascontiguousarray(frames[:, :k]), np.ascontiguousarray(frames[:, 1:])
        newest = seen - n  # transitions after it have their next state in the ns_buffer
        in_buffer = ts > newest if len(ts) and _largest(ts) > newest else None
        if len(hits) or len(ts) and _smallest(ts) - (k - 1) * n <= max(seen - m, base):
            self._finish(ts, hits, ks, states, next_states, in_buffer, seen, base, jcount)
        if in_buffer is not None:
            next_states[in_buffer] = ns_rows.take(ts[in_buffer] - (newest + 1), axis=0)
        batch["states"], batch["next_states"] = states, next_states
        return {key: batch[key] for key in self.keys}

    def _finish(self, ts, hits, ks, states, next_states, in_buffer, seen: int, base: int, jcount: int) -> None:
        """``FrameStacks.patch`` on the states whose chains hold a base or a frame the ring
        overwrote. A next state outside the ns_buffer is, where ``t + n`` is a base, the
        jump ring's record of ``t`` if it has one, else that base's whole state (a jump at
        ``t`` makes ``t + n`` a base, so no other row can have a jump: ``Writer._write_step``);
        else its first ``k - 1`` frames are its state's last ones (the same transitions, the
        same newest base before ``t + n``) and its newest the ring's."""
        k, n = self.k, self.n
        oldest_live = max(seen - self.m, base)
        rows, ns_bases = {}, {}  # row: (newest base among positions 0..k-1, its record); row: record at k
        for q, rec in zip(hits.tolist(), ks[hits].tolist()):  # flat positions in the (rows, k + 1) chains
            i, j = divmod(q, k + 1)
            if j == k:
                ns_bases[i] = rec
            else:
                rows[i] = (j, rec)  # ascending: the last is the newest
        if _smallest(ts) - (k - 1) * n <= oldest_live:
            for i in np.flatnonzero(ts - (k - 1) * n <= oldest_live).tolist():
                rows.setdefault(i, (-1, 0))
        for i, (p, rec) in rows.items():
            self.stacks.patch(states[i], int(ts[i]) - (k - 1) * n, p, rec, seen, base)
            if i not in ns_bases and (in_buffer is None or not in_buffer[i]):
                next_states[i, :k - 1] = states[i, 1:]
        if not ns_bases:
            return
        rows, jumps = list(ns_bases), {}
        if jcount:
            jumped, jks = self.jumps.find(ts[rows], jcount)
            jumps = {i: jk for i, jump, jk in zip(rows, jumped.tolist(), jks.tolist()) if jump}
        for i in rows:
            if i in jumps:
                self.jumps.read_into(jumps[i], next_states[i])
            else:
                self.stacks.records.read_into(ns_bases[i], next_states[i])


class StackedRows(Rows):
    """Rows of a frame-stack store: whole batches through ``StackBatches``, other reads
    (named fields, a reader's undo overlay) through ``FrameStacks.plan`` and ``finish``."""

    reads_ahead = False

    def __init__(self, gatherer: Gatherer, jumps: JumpRing | None, stacks: FrameStacks, num_envs: int,
                 max_size: int):
        super().__init__(gatherer, jumps, num_envs, max_size)
        self.stacks = stacks
        self.batches = StackBatches(stacks, gatherer, jumps, num_envs, max_size)

    def batch(self, slots: np.ndarray, head: int, seen: int, base: int, ns_rows: np.ndarray) -> dict:
        return self.batches.batch(slots, head, seen, base, self.stacks.count, self.jcount, ns_rows)

    def gather(self, slots, names, head: int, seen: int, base: int, ns_rows: np.ndarray, fix=None) -> dict:
        slots = np.asarray(slots, np.int64)
        if names is None and fix is None:  # jumps patched there too
            return self.batch(slots, head, seen, base, ns_rows)
        batch = self._rows(slots, names, head, seen, base, ns_rows, fix)
        self.patch(batch, slots, head, seen, base)
        return batch

    def read_slots(self, slots: np.ndarray) -> np.ndarray:
        """A stack is rebuilt from ``k - 1`` earlier slots too."""
        return self.stacks.chain_slots(slots)

    def _rows(self, slots: np.ndarray, names, head: int, seen: int, base: int, ns_rows: np.ndarray, fix) -> dict:
        """Its other fields as stored, whole states and next states rebuilt from frames
        (``FrameStacks.plan`` and ``finish``; ``fix`` patches frames too)."""
        m, n, stacks = self.m, self.n, self.stacks
        fields = self.gatherer.fields
        if names is None:
            keys = self.batches.keys
        else:  # as Gatherer.gather_some orders them: next states last
            keys = [f for f in names if f != "next_states"] + ["next_states"] * ("next_states" in names)
        others = [f for f in keys if f in fields and f != "states"]
        ts = seen - (head - slots) % m if len(slots) else np.empty(0, np.int64)  # transitions held
        want_states, want_ns = "states" in keys, "next_states" in keys
        if want_ns:
            in_buffer = ts > seen - n  # the newest step's next states are the ns_buffer's
            buffer_idx = ts - (seen - n + 1)
        wanted = ([ts] if want_states else []) + ([ts[~in_buffer] + n] if want_ns else [])
        plan = stacks.plan(np.concatenate(wanted) if wanted else ts[:0], base, stacks.count)
        frame_slots = plan[1].ravel()
        rows, frames = self.gatherer.stack_rows(slots, others, frame_slots, head, ns_rows)
        if fix is not None:
            if rows:
                fix(rows, slots)
            fix({"states": frames}, frame_slots)
        built = stacks.finish(plan, frames, seen, base)
        if want_states:
            rows["states"] = built[:len(ts)]
        if want_ns and not in_buffer.any():
            rows["next_states"] = built[len(ts) if want_states else 0:]
        elif want_ns:
            spec = stacks.records.spec  # a whole state: k frames
            ns = np.empty((len(slots),) + spec.shape, spec.dtype)
            ns[~in_buffer] = built[len(ts) if want_states else 0:]
            ns[in_buffer] = ns_rows.take(buffer_idx[in_buffer], axis=0)
            rows["next_states"] = ns
        return {key: rows[key] for key in keys if key in rows}


__all__ = ["StackBatches", "StackedRows"]
