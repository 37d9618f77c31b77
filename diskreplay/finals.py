"""Exact next states at episode ends, for the integrations (``sb3``, ``torchrl``, ``gym``).

A store derives the next state of a transition from the state of the same env's next
step, which is the first state of a new episode when the transition ended one. The
integrations keep the true final state of such a transition in a side store next to
the main one (``<path>.finals``), keyed by the transition's number, and put it back
into the batches they return. ``FinalStates`` is that side store; when the core keeps
final states itself, the integrations drop it and ``next_states`` is already exact.
"""
from __future__ import annotations

import os

import numpy as np

from .errors import StoreMismatchError, StoreNotFoundError
from .store import DiskReplay
from .views import ChronoReader

SUFFIX = ".finals"


def final_states_path(path) -> str:
    """Where the side store of the store at ``path`` lives."""
    return os.fspath(path).rstrip(os.sep) + SUFFIX


class FinalStates:
    """The true next states of transitions that ended an episode, by transition number.

    Rows of the side store: ``states`` the final state, ``actions`` the transition's
    number (``seen_size`` of the main store once it was added). ``capacity`` rows are
    kept (default: the main store's ``max_size``, so that no live transition loses its
    final state however short the episodes are).
    """

    def __init__(self, store: DiskReplay, capacity: int | None = None):
        self.path = final_states_path(store.path)
        states_shape, states_dtype = store.fields["states"]
        try:
            self.side = DiskReplay.open(self.path, mode=store.mode)
        except StoreNotFoundError:
            if store.mode == "r":
                self.side = None  # nothing recorded yet: every next state is the store's own
            else:
                self.side = DiskReplay.create(
                    self.path, capacity or store.max_size, backend=store.backend, seed=0,
                    fields={"states": (states_shape, states_dtype), "actions": ((), np.int64),
                            "rewards": ((), np.float32), "dones": ((), bool)})
        if self.side is not None:
            have = self.side.fields["states"]
            if (tuple(have[0]), np.dtype(have[1])) != (tuple(states_shape), np.dtype(states_dtype)):
                self.side.close()
                raise StoreMismatchError(
                    f"{self.path} holds final states of shape {tuple(have[0])} {np.dtype(have[1])}, but the "
                    f"store {store.path} holds states of shape {tuple(states_shape)} {np.dtype(states_dtype)}; "
                    f"remove {self.path} or use the store it belongs to")
        self._index: dict[int, int] = {}  # transition number -> side slot
        self._owner = None  # side slot -> transition number, to drop entries a wrap overwrote
        if self.side is not None:
            self._owner = np.full(self.side.max_size, -1, np.int64)
            for block in ChronoReader(self.side):  # oldest first: a number recorded twice keeps its newest row
                for slot, number in zip(block.slots.tolist(), block.batch["actions"].tolist()):
                    self._index[number] = slot
                    self._owner[slot] = number

    def record(self, number: int, state) -> None:
        """Keep ``state`` as the true next state of transition ``number`` (before the main add)."""
        self.side.add(state, np.int64(number), np.float32(0.0), state, True)
        slot = self.side.head
        old = int(self._owner[slot])
        if self._index.get(old) == slot:
            del self._index[old]
        self._owner[slot] = number
        self._index[int(number)] = slot

    def patch(self, numbers: np.ndarray, next_states: np.ndarray, candidates: np.ndarray) -> None:
        """Replace ``next_states[j]`` by the recorded final state of transition ``numbers[j]``,
        for the positions ``candidates`` (e.g. the done transitions of a batch)."""
        if not self._index or not len(candidates):
            return
        found = [(j, self._index[n]) for j, n in zip(candidates, numbers[candidates].tolist()) if n in self._index]
        if found:
            where, slots = map(np.asarray, zip(*found))
            next_states[where] = self.side.get(slots)["states"]

    def flush(self) -> None:
        if self.side is not None:
            self.side.flush()

    def close(self) -> None:
        if self.side is not None:
            self.side.close()


def transition_numbers(store: DiskReplay, slots: np.ndarray) -> np.ndarray:
    """Numbers (``seen_size`` once added) of the transitions the store holds at ``slots``."""
    age = (store.head - np.asarray(slots, np.int64)) % store.max_size  # 0 for the newest
    return store.seen_size - age
