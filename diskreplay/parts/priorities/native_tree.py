"""The sum tree in C (``_sumtree``, built at install when a compiler is there): a binary
tree whose per-batch walks cost a few microseconds where numpy pays a call per level.

Same interface and the same guarantees as ``sumtree.SumTree``, the numpy tree it
stands in for: every node recomputed from its children (a rebuilt tree equals an updated
one bit for bit, so a reopened store draws the same indices), zero leaves never drawn,
the min over positive leaves only. ``sumtree.new_tree`` picks this one when it imports.
"""
from __future__ import annotations

import numpy as np

from ... import native

_kernel = native.sumtree  # None where not built or DISKREPLAY_PURE is set: tree.new_tree never builds this tree then


class BinarySumTree:
    """Sums and positive minima over ``capacity`` leaves, in two float64 arrays of ``2 * cap``
    entries (``cap`` the next power of two): node 1 the root, leaf ``i`` at ``cap + i``."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.cap = 1 << max(0, (capacity - 1).bit_length())
        self.sums = np.zeros(2 * self.cap)
        self.mins = np.full(2 * self.cap, np.inf)
        self.leaves = self.sums[self.cap:]  # padded past capacity with zeros, as the wide tree's

    @property
    def total(self) -> float:
        return float(self.sums[1])

    @property
    def min_positive(self) -> float:
        return float(self.mins[1])

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass ``u`` in ``[0, total)``, the leaf ``i`` with
        ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])``; a mass rounding past the end takes
        the last positive leaf on its path, so a zero leaf is never returned."""
        u = np.ascontiguousarray(masses, dtype=np.float64)
        out = np.empty(len(u), np.int64)
        _kernel.find(self.sums, u, out)
        return out

    def draw(self, uniforms: np.ndarray, last: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """``(idxs, weights)`` in one C call: the leaves holding masses ``uniforms * total``
        (``last`` replacing the final index when >= 0: CER's head), and each drawn leaf's
        ``(p / min_positive) ** -beta`` as float32."""
        u = np.ascontiguousarray(uniforms, dtype=np.float64)
        idxs, weights = np.empty(len(u), np.int64), np.empty(len(u), np.float32)
        _kernel.draw(self.sums, self.mins, u, idxs, weights, last, beta)
        return idxs, weights

    def update_mirrored(self, slots: np.ndarray, values: np.ndarray, copy: np.ndarray, dirty: np.ndarray,
                        block: int) -> None:
        """``update``, and ``copy[slots] = values`` with ``dirty[slots // block] = 3``, in one
        C call (a store's live priorities and its snapshot map: Ctrl-C cannot part them from
        the tree). Duplicated slots: the last value wins everywhere."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        values = np.ascontiguousarray(values, dtype=np.float64)
        _kernel.update(self.sums, self.mins, slots, values, copy, dirty, block)

    def update(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set ``leaves[slots] = values`` and repair the paths above them (in C; duplicated
        slots: the last value wins)."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        values = np.ascontiguousarray(values, dtype=np.float64)
        if values.shape != slots.shape:  # a scalar for every slot
            values = np.full(slots.shape, values, np.float64)
        _kernel.update(self.sums, self.mins, slots, values)

    def update_range(self, lo: int, hi: int, value) -> None:
        """Set the leaves ``[lo, hi)`` to ``value`` (a scalar or an array) and recompute above."""
        if hi <= lo:
            return
        if (hi - lo) * 16 > self.cap:  # a large share of the tree: one pass over all of it
            self.leaves[lo:hi] = value
            self.rebuild()
        else:
            self.update(np.arange(lo, hi), value)

    def rebuild(self) -> None:
        """Recompute the min leaves and every inner node from ``leaves`` (loaded in place)."""
        _kernel.build(self.sums, self.mins)

    def problems(self) -> list[str]:
        """Every node that differs from a recomputation from the leaves (exact comparison)."""
        fresh = BinarySumTree(self.capacity)
        fresh.leaves[:] = self.leaves
        fresh.rebuild()
        out = []
        if np.any(self.leaves[self.capacity:] != 0):
            out.append("padding leaves past the capacity are not zero")
        for name, mine, theirs in (("sum", self.sums[1:], fresh.sums[1:]), ("min", self.mins[1:], fresh.mins[1:])):
            bad = np.flatnonzero(mine != theirs)
            if len(bad):
                out.append(f"{len(bad)} {name} node(s) disagree with their children (first at node {int(bad[0]) + 1})")
        return out
