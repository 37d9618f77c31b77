"""How a batch is split across shards so that the union is sampled uniformly.

Drawing ``batch_size`` slots uniformly from the union of shards of sizes ``n_i`` is the
same as drawing the per-shard counts ``k ~ Multinomial(batch_size, n_i / sum n)`` and then
``k_i`` slots uniformly within shard ``i``; a random permutation of the gathered rows
restores the order of independent draws. numpy only, no Ray: tested without a cluster.
"""
from __future__ import annotations

import numpy as np

__all__ = ["split_batch", "chunk_counts"]


def split_batch(rng: np.random.Generator, batch_size: int, sizes) -> np.ndarray:
    """Rows each shard contributes: ``Multinomial(batch_size, sizes / sum(sizes))``.
    Shards of size 0 (empty, or left out as unavailable) get none. ``sum(sizes)`` must be > 0."""
    sizes = np.asarray(sizes, dtype=np.float64)
    return rng.multinomial(batch_size, sizes / sizes.sum())


def chunk_counts(k: int, requests: int, min_rows: int = 1) -> list[int]:
    """Split ``k`` rows into at most ``requests`` nearly equal requests of at least
    ``min_rows`` rows each (fewer requests when ``k`` is small), so that several requests
    are in flight per shard without many tiny ones."""
    if k <= 0:
        return []
    n = max(1, min(requests, k // max(1, min_rows)))
    base, extra = divmod(k, n)
    return [base + (1 if j < extra else 0) for j in range(n)]
