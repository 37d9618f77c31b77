"""Slot arithmetic of the replay ring and the sampler: pure functions, no I/O.

Transitions are numbered from 1 in the order they were added; ``seen`` is
the number of the newest one. ``base`` is ``seen`` at the last reset, so
transition ``t`` (``t > base``) lives in slot ``(t - base - 1) % max_size``.
Everything the seed keeps as mutable counters (``head``, ``size``) follows
from ``seen``, ``base`` and ``max_size``; the store persists only those.
"""
from __future__ import annotations

import numpy as np


class RingState:
    """Everything that changes as a store is used: the newest transition ``seen``, the
    ``base`` of the last reset, the sampler's ``draws`` and the number of ``resets``."""

    __slots__ = ("seen", "base", "draws", "resets")

    def __init__(self, seen: int, base: int, draws: int, resets: int):
        self.seen, self.base, self.draws, self.resets = seen, base, draws, resets

    def __eq__(self, other) -> bool:
        return isinstance(other, RingState) and self.as_tuple() == other.as_tuple()

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.seen, self.base, self.draws, self.resets)

    def __repr__(self) -> str:
        return f"RingState(seen={self.seen}, base={self.base}, draws={self.draws}, resets={self.resets})"


def ring_size(seen: int, base: int, max_size: int) -> int:
    """Number of occupied slots."""
    return min(seen - base, max_size)


def ring_head(seen: int, base: int, max_size: int) -> int:
    """Slot of the newest transition, -1 when the ring is empty."""
    return (seen - base - 1) % max_size if seen > base else -1


def slot_of(t, base: int, max_size: int):
    """Slot that transition number ``t`` occupies (or will occupy); ``t`` may be an array."""
    return (t - base - 1) % max_size


def transition_of_slots(slots: np.ndarray, seen: int, base: int, max_size: int) -> np.ndarray:
    """Transition numbers held by ``slots`` when the newest transition is ``seen``."""
    head = ring_head(seen, base, max_size)
    age = (head - slots) % max_size  # 0 for the newest
    return seen - age


def step_slots(seen: int, base: int, max_size: int, num_envs: int) -> tuple[int, int]:
    """First slot of the next step and how many of its rows fit before the end of the ring."""
    start = (seen - base) % max_size
    return start, min(num_envs, max_size - start)


def next_state_sources(idxs: np.ndarray, head: int, max_size: int, num_envs: int):
    """Where each slot's next state lives.

    Returns ``(ns_slots, in_buffer, buffer_idx)``: the next state of slot ``i`` is the
    state at slot ``(i + num_envs) % max_size`` unless ``in_buffer`` is set, in which
    case it is ``ns_buffer[buffer_idx]``. This is the seed's rule with its wrap-around
    bug fixed: the test ``(ns_idx - head - 1) mod max_size < num_envs`` also holds when
    ``head + num_envs`` passes the end of the ring.
    """
    ns_slots = idxs + num_envs
    ns_slots %= max_size
    buffer_idx = ns_slots - (head + 1)
    buffer_idx %= max_size
    in_buffer = buffer_idx < num_envs
    return ns_slots, in_buffer, buffer_idx


def chronological_slots(start: int, stop: int, seen: int, base: int, max_size: int) -> np.ndarray:
    """Slots of the ``start``-th to ``stop``-th oldest transitions (0 is the oldest)."""
    size = ring_size(seen, base, max_size)
    oldest = (ring_head(seen, base, max_size) - size + 1) % max_size
    return (oldest + np.arange(start, stop, dtype=np.int64)) % max_size


class Sampler:
    """Uniform slot sampler whose whole state is (entropy, number of draws).

    Each index costs exactly one 64-bit draw of PCG64 (``Generator.random`` maps one
    draw to one double), so the stream after ``draws`` draws is recreated by
    ``advance(draws)``: persisting one integer per batch makes sampling resumable.
    ``floor(u * size)`` with ``u = k / 2**53`` is always ``< size`` for ``size < 2**53``.
    """

    __slots__ = ("entropy", "draws", "_random")

    def __init__(self, entropy: int, draws: int = 0):
        self.entropy = int(entropy)
        self.draws = int(draws)
        bit_generator = np.random.PCG64(np.random.SeedSequence(self.entropy))
        bit_generator.advance(self.draws)
        self._random = np.random.Generator(bit_generator).random

    def sample_idxs(self, size: int, batch_size: int, use_cer: bool, head: int) -> np.ndarray:
        """``batch_size`` slot indices uniform in ``[0, size)``; with ``use_cer`` the last is ``head``."""
        u = self._random(batch_size)
        self.draws += batch_size
        u *= size
        idxs = u.astype(np.int64)
        if use_cer:
            idxs[-1] = head
        return idxs

    def peek_idxs(self, size: int, batch_size: int, use_cer: bool, head: int) -> np.ndarray:
        """The slots the next ``sample_idxs`` with these arguments will draw, without
        drawing them (the stream and ``draws`` stay where they were): what a prefetcher
        announces to the disk ahead of the batch."""
        bit_generator = self._random.__self__.bit_generator
        state, draws = bit_generator.state, self.draws
        try:
            return self.sample_idxs(size, batch_size, use_cer, head)
        finally:
            bit_generator.state, self.draws = state, draws

    def uniforms(self, count: int) -> np.ndarray:
        """``count`` doubles uniform in ``[0, 1)``, one draw each (the prioritized sampler
        scales them to masses of its sum tree): the same stream ``sample_idxs`` takes."""
        u = self._random(count)
        self.draws += count
        return u


def new_entropy(seed: int | None) -> int:
    """Entropy for a new store's sampler: the seed itself, or fresh OS entropy."""
    if seed is None:
        return int(np.random.SeedSequence().entropy)
    return int(seed)
