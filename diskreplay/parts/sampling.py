"""The ``Sampler`` protocol: how a session draws slots and what a read adds per slot.

A session holds one sampler and never asks whether its store is prioritized: it draws with
``draw``, announces the next batch's reads with ``peek`` (None: no read-ahead), stores
priorities with ``update`` and adds ``keys`` to a ``get``. Both samplers take their random
numbers from the store's one resumable stream (:class:`diskreplay.core.ring.Sampler`,
``stream``), whose ``draws`` the checkpoint and ``meta.bin`` persist.

* :class:`UniformSampler`: slots uniform over the occupied ones (SLM-Lab's ``Replay``).
* :class:`PrioritizedSampler`: slots by priority, with importance weights, from the
  priorities' sum tree (:mod:`diskreplay.parts.priorities.files`).

:func:`sampler_for` chooses between them, the one place that does.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..core import ring


class Sampler:
    """Draws slots from a ring of ``size`` occupied slots whose newest is ``head``."""

    def __init__(self, stream: ring.Sampler):
        self.stream = stream

    @property
    def draws(self) -> int:
        """Random numbers drawn so far (what makes the stream resumable)."""
        return self.stream.draws

    def draw(self, size: int, batch_size: int, use_cer: bool, head: int,
             beta: float) -> tuple[np.ndarray, np.ndarray | None]:
        """``(idxs, weights)``; ``weights`` None where the draw needs none."""
        raise NotImplementedError

    def peek(self, size: int, batch_size: int, use_cer: bool, head: int) -> np.ndarray | None:
        """The slots the next ``draw`` with these arguments will return, without drawing
        (None: this sampler cannot tell, so nothing is read ahead)."""
        return None

    def update(self, idxs: np.ndarray, raw: np.ndarray, seen: int, base: int) -> None:
        """Store priorities (the facade refuses a uniform store's before this is reached)."""

    def keys(self, idxs: np.ndarray) -> dict:
        """What a ``get`` of ``idxs`` returns beside the rows (a prioritized store: ``priorities``)."""
        return {}


class UniformSampler(Sampler):
    def draw(self, size, batch_size, use_cer, head, beta):
        return self.stream.sample_idxs(size, batch_size, use_cer, head), None

    def peek(self, size, batch_size, use_cer, head):
        return self.stream.peek_idxs(size, batch_size, use_cer, head)


class PrioritizedSampler(Sampler):
    """``current()`` brings the priorities up to the session's snapshot before they are read
    (the writer assigns pending transitions the largest priority; a reader re-reads the
    writer's priorities)."""

    def __init__(self, stream: ring.Sampler, priorities, current: Callable[[], None]):
        super().__init__(stream)
        self.priorities = priorities
        self.current = current
        self.update = priorities.update  # the bound method itself: one call less per update

    def draw(self, size, batch_size, use_cer, head, beta):
        self.current()
        return self.priorities.draw(self.stream, size, batch_size, use_cer, head, beta)

    def keys(self, idxs):
        self.current()
        return {"priorities": self.priorities.of(idxs)}


def sampler_for(stream: ring.Sampler, priorities, current: Callable[[], None]) -> Sampler:
    """The sampler of a store whose priorities are ``priorities`` (None: a uniform store)."""
    if priorities is None:
        return UniformSampler(stream)
    return PrioritizedSampler(stream, priorities, current)
