"""``PartialStep``: the transitions of a vector env's step that is not whole yet, kept in
the process until the store can take them as one step, and the store read with them."""
from __future__ import annotations

import numpy as np

from ..store import DiskReplay as Store


class PartialStep:
    """The store takes whole env steps (the next state of slot ``i`` is the state
    ``num_envs`` slots on), while SLM-Lab may give ``add_experience`` one transition at a
    time. Those transitions wait here (converted, in ``transitions``) until ``num_envs`` of
    them form a step, which goes to the store as one add. Meanwhile ``size``, ``head``,
    ``seen_size``, ``rows`` and ``next_state_rows`` read the store as if they were in it.
    A crash loses them; ``dropped`` counts those a reset dropped (seen, never stored)."""

    def __init__(self, store: Store, num_envs: int, value_names: tuple):
        self.store = store
        self.num_envs = num_envs
        self.value_names = value_names
        self.transitions: list[dict] = []
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.transitions)

    def push(self, transition: dict, write) -> bool:
        """Buffer one converted transition; when it completes a step, ``write`` the step (a
        tuple of arrays with a leading env axis, in ``value_names`` order) and empty the
        buffer. True when a step was written; if writing fails, the transition is not kept."""
        pending = self.transitions
        pending.append(transition)
        if len(pending) < self.num_envs:
            return False
        try:
            write(tuple(np.stack([t[name] for t in pending]) for name in self.value_names))
        except BaseException:
            pending.pop()  # as if this transition had not been given
            raise
        pending.clear()
        return True

    def drop(self, seen: bool) -> int:
        """Forget the buffered transitions and say how many there were; ``seen``: they stay
        counted in ``seen_size`` (a reset), else they vanish (a close)."""
        k = len(self.transitions)
        self.transitions.clear()
        if seen:
            self.dropped += k
        return k

    # ------------------------------------------------------------------ the store, buffered transitions included
    @property
    def size(self) -> int:
        k = len(self.transitions)
        return self.store.size if not k else min(self.store.size + k, self.store.max_size)

    @property
    def head(self) -> int:
        k = len(self.transitions)
        return self.store.head if not k else (self.store.head + k) % self.store.max_size

    @property
    def seen_size(self) -> int:
        return self.store.seen_size + self.dropped + len(self.transitions)

    def rows(self, idxs: np.ndarray, keys: list, specs: dict) -> dict:
        """The transitions at slots ``idxs`` (each in ``[0, size)``) as ``{key: array}`` for
        ``keys``; ``specs`` gives each field's shape and dtype."""
        k = len(self.transitions)
        if not k:
            batch = self.store.get(idxs)
            return {key: batch[key] for key in keys}
        m, committed_head = self.store.max_size, self.store.head
        where = (idxs - committed_head - 1) % m  # position in the buffered step, for its slots
        buffered = where < k
        stored = ~buffered
        got = self.store.get(idxs[stored]) if stored.any() else None
        batch = {}
        for key in keys:
            shape, dtype = specs["states" if key == "next_states" else key]
            out = np.empty((len(idxs),) + tuple(shape), dtype)
            if got is not None:
                out[stored] = got[key]
            for pos in np.flatnonzero(buffered):
                out[pos] = self.transitions[where[pos]][key]
            batch[key] = out
        # A stored transition keeps the store's next state (exact: the one given to add),
        # also when the transition n later is still buffered here.
        return batch

    def next_state_rows(self) -> list:
        """The newest ``num_envs`` next states, oldest first."""
        k = len(self.transitions)
        rows = []
        if self.store.size:
            stored = self.store.ns_buffer
            rows = [stored[i] for i in range(k, self.num_envs)]
        return rows + [t["next_states"] for t in self.transitions]
