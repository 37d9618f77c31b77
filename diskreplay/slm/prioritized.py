"""``DiskPrioritizedReplay``: SLM-Lab's ``PrioritizedReplay`` on a prioritized store.

SLM-Lab's semantics (``slm_lab/agent/memory/prioritized.py``, v4 and v5): the memory spec
adds ``alpha`` and ``epsilon``; every new transition gets the priority ``(error +
epsilon) ** alpha`` of the ``error`` given to ``add_experience`` (100000 by default, and
for every transition ``update`` adds); ``sample`` draws by priority and its batch has a
``priorities`` key; ``update_priorities(errors)`` sets the priorities of the last batch
(``batch_idxs``). Both interfaces, as the uniform drop-in: ``(spec, body)`` (v4) and
``(spec, agent)`` (v5), chosen by what is given.

What differs from SLM-Lab (README.md, "SLM-Lab drop-in"): with ``use_cer``, SLM-Lab's
``update_priorities`` changes the tree leaf that was drawn (v4) or no leaf (v5) for the
index CER replaced, so its tree and its ``priorities`` disagree from then on; here the
replaced index's slot gets the priority, in both. While ``add_experience`` buffers a
partial vector-env step, ``sample`` draws from the whole steps in the store.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidArgumentError, MemorySpecError, StoreMismatchError
from ..parts.priorities.args import check_priorities, settings_keys
from .arguments import batch_count
from .memory import DiskReplay, DiskReplayV4, DiskReplayV5, interface_for
from .slotviews import SlotView, field_view
from .spec import MemorySpec

DEFAULT_ERROR = 100000  # SLM-Lab's add_experience default: new transitions are drawn early


class PrioritizedSpec(MemorySpec):
    """A memory spec with ``alpha`` and ``epsilon`` (SLM-Lab's keys; 0.6 and 1e-6 when absent)."""

    def __init__(self, memory_spec, field_names, extras, slm_version):
        super().__init__(memory_spec, field_names, extras, slm_version)
        try:
            self.priority = settings_keys(True, memory_spec.get("alpha", 0.6), memory_spec.get("epsilon", 1e-6))
        except InvalidArgumentError as exc:
            raise MemorySpecError(f"the memory spec's alpha or epsilon: {exc}") from None

    def create_options(self) -> dict:
        return dict(self.priority)

    def _check_resumed(self, store, num_envs, owner_name) -> None:
        super()._check_resumed(store, num_envs, owner_name)
        want = (True, self.priority["alpha"], self.priority["epsilon"])
        if (store.prioritized, store.alpha, store.epsilon) != want:
            raise StoreMismatchError(
                f"{self.settings['path']} holds a store that disagrees with the memory spec: it has "
                f"prioritized={store.prioritized}, alpha={store.alpha}, epsilon={store.epsilon}; the spec asks "
                f"for a prioritized store with alpha={want[1]}, epsilon={want[2]}; give another path")


class DiskPrioritizedReplay(DiskReplay):
    """SLM-Lab's ``PrioritizedReplay`` over a prioritized store (see the module docstring).
    ``DiskPrioritizedReplay(spec, x)`` is a :class:`DiskPrioritizedReplayV4` for a v4 body and
    a :class:`DiskPrioritizedReplayV5` for a v5 agent."""

    _spec_type = PrioritizedSpec

    def __new__(cls, memory_spec=None, owner=None, *args, **kwargs):
        auto = cls is DiskPrioritizedReplay
        if auto:
            cls = DiskPrioritizedReplayV4 if interface_for(owner) is DiskReplayV4 else DiskPrioritizedReplayV5
        memory = DiskReplay.__new__(cls, memory_spec, owner)
        if auto:
            memory._chosen = ("it was given a body (an object with .agent)" if cls is DiskPrioritizedReplayV4
                              else "it was given an agent (an object with .env and no .agent)")
        return memory

    def __init__(self, memory_spec, owner):
        super().__init__(memory_spec, owner)
        # As SLM-Lab holds them: one-element arrays (its code and tests read memory.alpha[0]).
        self.alpha, self.epsilon = np.full((1,), self.store.alpha), np.full((1,), self.store.epsilon)
        self.data_keys = list(self._value_names) + ["priorities"]
        self._errors: list = []  # errors of transitions buffered in a partial step
        self._views["priorities"] = SlotView(self, "priorities")
        self.tree_idxs = None  # SLM-Lab's tree leaves of the last batch; here the slots are what counts

    priorities = field_view("priorities")

    @property
    def tree(self) -> "PriorityTree":
        """SLM-Lab's ``SumTree`` as its code and tests read it (``write``, ``total()``,
        ``print_tree()``), over the store's priorities; read-only."""
        return PriorityTree(self)

    def _rows(self, idxs: np.ndarray) -> dict:
        rows = super()._rows(idxs)
        p = np.zeros(len(idxs), np.float64)
        held = idxs < self.store.size
        if held.any():
            p[held] = self.store.get(idxs[held], fields="priorities")["priorities"]
        m = self.store.max_size
        for j, error in enumerate(self._errors):  # a buffered partial step's: its priority once added
            p[idxs == (self.store.head + 1 + j) % m] = self.get_priority(error)
        rows["priorities"] = p
        return rows

    # ------------------------------------------------------------------ adding
    def update(self, *args, **kwargs) -> None:
        """As SLM-Lab's ``update``: every transition added gets the default error's priority."""
        before = self.store.seen_size
        super().update(*args, **kwargs)
        self._prioritize_new(before, [DEFAULT_ERROR] * max(0, self.store.seen_size - before))

    def add_experience(self, *args, error=DEFAULT_ERROR, **kwargs) -> None:
        """Add one transition with priority ``(error + epsilon) ** alpha`` (SLM-Lab v4 also
        passes ``error`` as the sixth positional argument)."""
        if self.slm_version == "v4" and len(args) == 6:
            args, error = args[:5], args[5]
        error = check_priorities(np.ravel(error), 1)[0]  # refused before the transition is added
        before = self.store.seen_size
        super().add_experience(*args, **kwargs)
        self._errors.append(error)
        added = self.store.seen_size - before
        if added:  # the transition (and a buffered partial step with it) reached the store
            errors, self._errors = self._errors[-added:], []
            self._prioritize_new(before, errors)

    def _prioritize_new(self, before: int, errors: list) -> None:
        k = len(errors)
        if k == 0:
            return
        slots = (self.store.head - k + 1 + np.arange(k)) % self.store.max_size
        self.store.update_priorities(slots, np.asarray(errors, np.float64))

    # ------------------------------------------------------------------ sampling
    def _draw(self, batch_size) -> tuple:
        if self._partial:  # whole steps only: the store draws by priority
            batch = self.store.sample(batch_count(batch_size))
            idxs = self.store.batch_idxs.copy()
            batch = {key: batch[key] for key in self._value_names}
        else:
            idxs, batch = super()._draw(batch_size)
        batch["priorities"] = self.store.get(idxs)["priorities"]
        return idxs, batch

    def update_priorities(self, errors) -> None:
        """Set the priorities of the last batch (``batch_idxs``) from ``errors``, one per index."""
        if self.batch_idxs is None:
            raise InvalidArgumentError("update_priorities(errors) sets the priorities of the last batch: "
                                       "call sample() first")
        self.store.update_priorities(self.batch_idxs, np.asarray(errors, np.float64).reshape(-1))

    def get_priority(self, error) -> np.ndarray:
        """SLM-Lab's ``(error + epsilon) ** alpha`` (squeezed, as SLM-Lab's)."""
        return np.power(np.asarray(error, np.float64) + self.epsilon, self.alpha).squeeze()

    def reset(self) -> None:
        super().reset()
        self._errors = []


class PriorityTree:
    """What SLM-Lab's code and tests read of its ``SumTree``: ``write`` (the slot the next
    transition goes to), ``total()`` (the sum of the priorities held) and ``print_tree()``,
    from the store's priorities (its own sum tree draws the samples)."""

    def __init__(self, memory):
        self._memory = memory

    @property
    def write(self) -> int:
        memory = self._memory
        return (memory.head + 1) % memory.max_size

    def _held(self) -> np.ndarray:
        size = self._memory.size
        return np.asarray(self._memory._rows(np.arange(size, dtype=np.int64))["priorities"]) if size else np.zeros(0)

    def total(self) -> float:
        return float(self._held().sum())

    def print_tree(self) -> None:
        for i, p in enumerate(self._held().tolist()):
            print(f"Idx: {i}, Data idx: {i}, Prio: {p}")


class DiskPrioritizedReplayV4(DiskPrioritizedReplay, DiskReplayV4):
    """SLM-Lab v4's ``PrioritizedReplay(memory_spec, body)`` interface."""


class DiskPrioritizedReplayV5(DiskPrioritizedReplay, DiskReplayV5):
    """SLM-Lab v5's ``PrioritizedReplay(memory_spec, agent)`` interface (keyword ``add_experience``)."""
