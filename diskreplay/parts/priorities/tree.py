"""A wide sum tree (and the min structure importance weights need) over per-slot priorities.

numpy only, no I/O. The leaves are one float64 per slot; level ``l + 1`` holds, for
every block of ``fanout`` consecutive entries of level ``l``, their sum and the smallest
positive entry (``inf`` for a block with none). A binary tree costs numpy calls per level
and per operation (20 levels for 10^6 slots); with a fanout near the cube root of the
capacity (100 for 10^6 slots) drawing a batch is a cumulative sum over the top level and
two vectorized steps (gather the chosen blocks, cumulative sums, count the prefix sums
below each mass), and an update recomputes two or three levels.

Every node is recomputed from its children, never adjusted by a difference: a block's sum
depends only on the block's values, so a tree rebuilt from the leaves (at open) equals,
bit for bit, one that was updated step by step, and a resumed sampler draws the same
indices as a store that stayed open.
"""
from __future__ import annotations

import numpy as np

from ... import native
from . import native_tree  # the C tree, where native.sumtree is built (pyproject.toml's ext-modules)

FANOUT = None  # None: chosen per capacity (``fanout_for``); tests set a small one for deep trees
_CHUNK_BLOCKS = 1 << 13
# The ufuncs' own methods: numpy's module-level wrappers cost a microsecond or two per call.
_accumulate, _add, _min = np.add.accumulate, np.add.reduce, np.minimum.reduce  # blocks recomputed per numpy call in a rebuild (bounded temporary memory)


def fanout_for(capacity: int) -> int:
    """About the cube root of the capacity (16..256): two gathered levels and a top level
    of at most ``fanout`` entries for up to ~10^7 slots, each level a few numpy calls."""
    return int(min(256, max(16, round(capacity ** (1 / 3)))))


class SumTree:
    """Sums and positive minima over ``capacity`` leaves (``leaves`` is a padded float64 array)."""

    def __init__(self, capacity: int, fanout: int | None = None):
        fanout = fanout_for(capacity) if fanout is None else fanout
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
        self.blocks = [a.reshape(-1, fanout) for a in self.sums[:-1]]  # children of level l + 1, by parent
        self.min_blocks = [None] + [a.reshape(-1, fanout) for a in self.mins[1:-1]]
        self.leaves = self.sums[0]
        self._scratch = {}

    # ------------------------------------------------------------------ queries
    @property
    def total(self) -> float:
        """Sum of every leaf (of the top level's entries: the same on every rebuild)."""
        return float(self.sums[-1].sum())

    @property
    def min_positive(self) -> float:
        """The smallest positive leaf, ``inf`` when none is."""
        if len(self.sums) == 1:
            return float(np.min(self.leaves, where=self.leaves > 0, initial=np.inf))
        return float(self.mins[-1].min())

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass ``u`` in ``[0, total)``, the leaf ``i`` with
        ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])``: leaf ``i`` is found with probability
        ``leaves[i] / total`` for uniform masses. Per level: gather the chosen blocks, their
        cumulative sums, count those <= the mass. A mass that rounding carries past its
        block's end would land on a zero leaf; those (rare) take the nearest positive leaf
        before it."""
        u = np.array(masses, dtype=np.float64)
        k, b = len(u), self.fanout
        scratch = self._scratch.get(k)
        if scratch is None:  # cumulative sums with a leading 0 column: the prefix before child j is cs[j]
            scratch = self._scratch[k] = (np.zeros((k, b + 1)), np.arange(k), np.zeros((1, len(self.sums[-1]) + 1)))
        cs, rows, top_cs = scratch
        _accumulate(self.sums[-1], out=top_cs[0, 1:])
        idx = np.searchsorted(top_cs[0, 1:], u, side="right")
        np.minimum(idx, len(self.sums[-1]) - 1, out=idx)
        u -= top_cs[0, idx]
        for blocks in reversed(self.blocks):
            _accumulate(blocks.take(idx, axis=0), axis=1, out=cs[:, 1:])
            j = (cs[:, 1:] <= u[:, None]).sum(axis=1)
            np.minimum(j, b - 1, out=j)
            u -= cs[rows, j]
            idx = idx * b + j
        if not self.leaves[idx].all():
            self._past_block_ends(idx)
        return idx

    def draw(self, uniforms: np.ndarray, last: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """``(idxs, weights)``: the leaves holding masses ``uniforms * total`` (``last``
        replacing the final index when >= 0: CER's head), and each drawn leaf's
        ``(p / min_positive) ** -beta`` as float32."""
        idx = self.find(uniforms * self.total)
        if last >= 0 and len(idx):
            idx[-1] = last
        with np.errstate(divide="ignore"):  # CER's head at priority 0: an infinite weight, as documented
            weights = (self.leaves[idx] / self.min_positive) ** -beta
        return idx, weights.astype(np.float32)

    def _past_block_ends(self, idx: np.ndarray) -> None:
        for pos in np.flatnonzero(self.leaves[idx] == 0).tolist():
            before = np.flatnonzero(self.leaves[: idx[pos] + 1] > 0)
            idx[pos] = before[-1] if len(before) else np.flatnonzero(self.leaves > 0)[0]

    # ------------------------------------------------------------------ updates
    def update(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set ``leaves[slots] = values`` (no slot twice) and recompute every node above them
        (a parent listed twice is recomputed twice, to the same value)."""
        self.leaves[slots] = values
        parents = slots
        for level in range(1, len(self.sums)):
            parents = parents // self.fanout
            self._recompute(level, parents)

    def update_mirrored(self, slots: np.ndarray, values: np.ndarray, copy: np.ndarray, dirty: np.ndarray,
                        block: int) -> None:
        """``update``, and ``copy[slots] = values`` with ``dirty[slots // block] = 3`` (a
        store's live priorities and its snapshot map; the marks first). Duplicated slots:
        the last value wins everywhere."""
        slots, values = last_of_duplicates(slots, values)
        dirty[slots // block] = 3
        copy[slots] = values
        self.update(slots, values)

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
        children = self.blocks[level - 1][parents]
        self.sums[level][parents] = _add(children, axis=1)
        if level == 1:
            self.mins[1][parents] = _min(children, axis=1, where=children > 0, initial=np.inf)
        else:
            self.mins[level][parents] = _min(self.min_blocks[level - 1][parents], axis=1)

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


def last_of_duplicates(slots: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, values)`` sorted by slot, each slot once with the last value given for it."""
    if len(slots) < 2:
        return slots, values
    order = slots.argsort(kind="stable")
    slots, values = slots[order], values[order]
    last = np.empty(len(slots), bool)
    np.not_equal(slots[1:], slots[:-1], out=last[:-1])
    last[-1] = True
    return slots[last], values[last]


def new_tree(capacity: int):
    """The tree a store samples with: the C tree (``native_tree``) where the extension was
    built, else this module's numpy tree (also whenever a test sets ``FANOUT``)."""
    if native.sumtree is not None and FANOUT is None:
        return native_tree.BinarySumTree(capacity)
    return SumTree(capacity, FANOUT)


def implementation() -> str:
    """Which tree ``new_tree`` gives: ``"C"`` or ``"numpy"`` (``diskreplay info`` shows it)."""
    return "C" if native.sumtree is not None and FANOUT is None else "numpy"


__all__ = ["FANOUT", "SumTree", "implementation", "last_of_duplicates", "new_tree"]
