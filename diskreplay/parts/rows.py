"""How a session reads rows: ``Rows``, the store's rows with the jump ring's exact next
states, and its subclass ``StackedRows`` (``stacks/decode.py``), a frame-stack store's
rows, whose states and next states are rebuilt from frames. ``rows_for`` (``parts``)
picks one; the sessions call it and never ask which kind of store they read, nor name
the parts a read goes through.

Every read is of one snapshot ``(seen, base)`` with ``head`` its newest slot; the parts'
``count`` are that snapshot's committed records (the session sets them at ``refresh``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..backends.gather import Gatherer
from ..core import ring
from .jumps import JumpRing


class Rows:
    """Rows of a store without frame stacks. ``jumps``: its jump ring (None in a format 1 store)."""

    reads_ahead = True  # sample's read-ahead of the next batch applies (Session._read_ahead)

    def __init__(self, gatherer: Gatherer, jumps: JumpRing | None, num_envs: int, max_size: int):
        self.gatherer, self.jumps, self.n, self.m = gatherer, jumps, num_envs, max_size

    def batch(self, slots: np.ndarray, head: int, seen: int, base: int, ns_rows: np.ndarray) -> dict:
        """Every field of the rows at ``slots``, next states included (``sample``, ``get``)."""
        batch = self.gatherer.gather(slots, head, ns_rows)
        self.patch(batch, slots, head, seen, base)
        return batch

    def gather(self, slots, names, head: int, seen: int, base: int, ns_rows: np.ndarray,
               fix: Callable | None = None) -> dict:
        """The rows at ``slots``, every field or only ``names``; ``fix(batch, slots)`` (a
        reader's undo overlay) patches them before the exact next states go in."""
        if names is None:
            batch = self.gatherer.gather(slots, head, ns_rows)
        else:
            batch = self.gatherer.gather_some(slots, head, ns_rows, names)
        if fix is not None:
            fix(batch, slots)
        self.patch(batch, slots, head, seen, base)
        return batch

    def read_slots(self, slots: np.ndarray) -> np.ndarray:
        """Every slot a read of ``slots`` and their next states may touch (a reader checks
        that a live writer did not rewrite them meanwhile)."""
        return np.concatenate([slots, (slots + self.n) % self.m])

    # ------------------------------------------------------------------ the jump ring
    @property
    def jcount(self) -> int:
        return self.jumps.count if self.jumps is not None else 0

    def recorded(self, slots: np.ndarray, head: int, seen: int, base: int) -> tuple[np.ndarray, np.ndarray]:
        """``(found, k)``: which slots' transitions have their next state in the jump ring,
        and the record numbers. The newest step's next states are in the ``ns_buffer`` and
        never looked up."""
        _, in_buffer, _ = ring.next_state_sources(slots, head, self.m, self.n)
        ts = ring.transition_of_slots(slots, seen, base, self.m)
        found, ks = self.jumps.find(ts, self.jcount)
        found &= ~in_buffer
        return found, ks

    def patch(self, batch: dict, slots, head: int, seen: int, base: int) -> None:
        """Put the exact next states of recorded jumps into ``batch["next_states"]``."""
        if "next_states" not in batch or not self.jcount:
            return
        found, ks = self.recorded(np.asarray(slots, np.int64), head, seen, base)
        if found.any():
            batch["next_states"][found] = self.jumps.states(ks[found])

    def jump_flags(self, slots: np.ndarray, head: int, seen: int, base: int) -> np.ndarray:
        """bool per slot: True where that slot's transition has a recorded jump (its next
        state is not the next row's state of the same env)."""
        if not self.jcount or not len(slots):
            return np.zeros(len(slots), bool)
        return self.recorded(np.asarray(slots, np.int64), head, seen, base)[0]


__all__ = ["Rows"]
