"""A wide sum tree (and the min structure importance weights need) over per-slot priorities.

numpy only, no I/O. The leaves are one float64 per slot; level ``l + 1`` holds, for
every block of ``fanout`` consecutive entries of level ``l``, their sum and the smallest
positive entry (``inf`` for a block with none). A binary tree costs a numpy call per
level and per operation; with a fanout of 128 a store of 10^6 slots has three levels, so
drawing a batch is three vectorized steps (gather the chosen blocks, cumulative sums,
count the prefix sums below each mass) and an update touches three levels.

Every node is recomputed from its children, never adjusted by a difference: a block's sum
depends only on the block's values, so a tree rebuilt from the leaves (at open) equals,
bit for bit, one that was updated step by step, and a resumed sampler draws the same
indices as a store that stayed open.
"""
from __future__ import annotations

import numpy as np

FANOUT = 128
_CHUNK_BLOCKS = 1 << 13  # blocks recomputed per numpy call in a rebuild (bounded temporary memory)


class SumTree:
    """Sums and positive minima over ``capacity`` leaves (``leaves`` is a padded float64 array)."""

    def __init__(self, capacity: int, fanout: int = FANOUT):
        if capacity < 1 or fanout < 2:
            raise ValueError("capacity must be >= 1 and fanout >= 2")
        self.capacity = capacity
        self.fanout = fanout
        sizes = [capacity]
        while sizes[-1] > fanout:
            sizes.append(-(-sizes[-1] // fanout))
        # Level 0 (the leaves) and every level below the top are padded to whole blocks.
        padded = [-(-n // fanout) * fanout for n in sizes[:-1]] + [sizes[-1]]
        self.sums = [np.zeros(n) for n in padded]
        self.mins = [None] + [np.full(n, np.inf) for n in padded[1:]]
        self.leaves = self.sums[0]

    # ------------------------------------------------------------------ queries
    @property
    def total(self) -> float:
        """Sum of every leaf (of the top level's entries: the same on every rebuild)."""
        return float(self.sums[-1].sum()) if len(self.sums) > 1 else float(self.leaves.sum())

    @property
    def min_positive(self) -> float:
        """The smallest positive leaf, ``inf`` when none is."""
        if len(self.sums) == 1:
            return _positive_min(self.leaves[None, :])[0]
        return float(self.mins[-1].min())

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass ``u`` in ``[0, total)``, the leaf ``i`` with
        ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])``: leaf ``i`` is found with probability
        ``leaves[i] / total`` for uniform masses. A mass rounding past a block's end
        takes the block's last positive entry, so a zero leaf is never returned."""
        u = np.array(masses, dtype=np.float64)
        top = self.sums[-1]
        cs = np.cumsum(top)
        j = np.minimum(np.searchsorted(cs, u, side="right"), np.searchsorted(cs, cs[-1], side="left"))
        u -= np.where(j > 0, cs[j - 1], 0.0)
        idx = j
        b = self.fanout
        rows = np.arange(len(u))
        for level in range(len(self.sums) - 2, -1, -1):
            block = self.sums[level].reshape(-1, b)[idx]
            cs = np.cumsum(block, axis=1)
            j = np.minimum((cs <= u[:, None]).sum(axis=1), (cs < cs[:, -1:]).sum(axis=1))
            u -= np.where(j > 0, cs[rows, j - 1], 0.0)
            idx = idx * b + j
        return idx

    # ------------------------------------------------------------------ updates
    def update(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set ``leaves[slots] = values`` (``slots`` sorted, without duplicates) and
        recompute every node above them."""
        self.leaves[slots] = values
        parents = slots
        for level in range(1, len(self.sums)):
            parents = parents // self.fanout
            if len(parents) > 1:
                parents = parents[np.concatenate(([True], parents[1:] != parents[:-1]))]
            self._recompute(level, parents)

    def update_range(self, lo: int, hi: int, value) -> None:
        """Set the leaves ``[lo, hi)`` to ``value`` (a scalar or an array) and recompute above."""
        if hi <= lo:
            return
        self.leaves[lo:hi] = value
        self._recompute_ranges(lo, hi)

    def rebuild(self) -> None:
        """Recompute every level from the leaves (after they were loaded in place)."""
        self._recompute_ranges(0, self.capacity)

    def _recompute_ranges(self, lo: int, hi: int) -> None:
        b = self.fanout
        for level in range(1, len(self.sums)):
            lo, hi = lo // b, (hi - 1) // b + 1
            for start in range(lo, hi, _CHUNK_BLOCKS):
                self._recompute(level, slice(start, min(hi, start + _CHUNK_BLOCKS)))

    def _recompute(self, level: int, parents) -> None:
        """Recompute the entries ``parents`` (indices or a slice) of ``level`` from their blocks."""
        b = self.fanout
        children = self.sums[level - 1].reshape(-1, b)[parents]
        self.sums[level][parents] = children.sum(axis=1)
        if level == 1:
            self.mins[1][parents] = _positive_min(children)
        else:
            self.mins[level][parents] = self.mins[level - 1].reshape(-1, b)[parents].min(axis=1)

    # ------------------------------------------------------------------ checking
    def problems(self) -> list[str]:
        """Every node that differs from a recomputation from the leaves (exact comparison)."""
        fresh = SumTree(self.capacity, self.fanout)
        fresh.leaves[:] = self.leaves
        fresh.rebuild()
        out = []
        if np.any(self.leaves[self.capacity:] != 0):
            out.append("padding leaves past the capacity are not zero")
        for level in range(1, len(self.sums)):
            for name, mine, theirs in (("sum", self.sums[level], fresh.sums[level]),
                                       ("min", self.mins[level], fresh.mins[level])):
                bad = np.flatnonzero(mine != theirs)
                if len(bad):
                    out.append(f"level {level}: {len(bad)} {name} node(s) disagree with their children "
                               f"(first at node {int(bad[0])})")
        return out


def _positive_min(rows: np.ndarray) -> np.ndarray:
    """Per row, the smallest entry > 0 (``inf`` where none is)."""
    return np.where(rows > 0, rows, np.inf).min(axis=1)


__all__ = ["FANOUT", "SumTree"]
