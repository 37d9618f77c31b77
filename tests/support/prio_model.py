"""A plain model of a prioritized store's priorities: one float64 per slot and the formula.

It shares nothing with ``diskreplay/prioritized.py`` or ``sumtree.py``: slots are
computed from the count of transitions since the last reset, sampling is a flat
``cumsum`` and ``searchsorted`` over the occupied slots, with the same uniform stream
the store's sampler takes (PCG64 seeded by the store's seed, one draw per index).
"""
from __future__ import annotations

import numpy as np


class PriorityModel:
    def __init__(self, max_size: int, alpha: float = 0.6, epsilon: float = 1e-6, seed: int = 0):
        self.max_size, self.alpha, self.epsilon = max_size, alpha, epsilon
        self.p = np.zeros(max_size)
        self.max_p = 1.0
        self.count = 0  # transitions since the last reset
        self.seed = seed
        self.draws = 0

    @property
    def size(self) -> int:
        return min(self.count, self.max_size)

    def add(self, k: int) -> None:
        for _ in range(k):
            self.p[self.count % self.max_size] = self.max_p
            self.count += 1

    def update(self, idxs, raw) -> None:
        ps = (np.asarray(raw, np.float64) + self.epsilon) ** self.alpha
        for i, p in zip(np.asarray(idxs).tolist(), ps.tolist()):
            self.p[i] = p
        if len(ps):  # of duplicates only the last is held, and only what is held counts
            self.max_p = max(self.max_p, float(self.p[np.unique(idxs)].max()))

    def reset(self) -> None:
        self.p[:] = 0
        self.max_p = 1.0
        self.count = 0

    def uniforms(self, n: int) -> np.ndarray:
        bit_generator = np.random.PCG64(np.random.SeedSequence(self.seed))
        bit_generator.advance(self.draws)
        self.draws += n
        return np.random.Generator(bit_generator).random(n)

    def sample(self, n: int, beta: float = 0.4):
        """``(idxs, weights, masses)`` as the store must draw them."""
        p = self.p[:self.size]
        cs = np.cumsum(p)
        masses = self.uniforms(n) * cs[-1]
        idxs = np.minimum(np.searchsorted(cs, masses, side="right"), self.size - 1)
        probs = p / p.sum()
        weights = (self.size * probs[idxs]) ** -beta / (self.size * probs.min()) ** -beta
        return idxs, weights, masses, cs
