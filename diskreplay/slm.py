"""A drop-in for SLM-Lab's ``Replay`` memory backed by a diskreplay store.

    "memory": {"name": "Replay", "batch_size": 32, "max_size": 1e6, "use_cer": false,
               "path": "runs/pong.replay", "backend": "memmap"}

Reopening an existing ``path`` resumes it (its counters, contents and sampler). SLM-Lab
itself is not imported: ``body`` only needs ``env.is_venv``, ``env.num_envs`` and
``agent.algorithm`` with ``training_start_step``, ``training_frequency`` and ``to_train``.
"""
from __future__ import annotations

import os

from . import store as _store
from .errors import InvalidArgumentError


class DiskReplay:
    """SLM-Lab's ``Replay`` interface (``update``, ``sample``, ``reset``, ``batch_idxs``,
    ``size``, ``seen_size``, ``head``) over an on-disk store."""

    def __init__(self, memory_spec: dict, body):
        self.memory_spec = memory_spec
        self.body = body
        for key in ("batch_size", "max_size", "path"):
            if key not in memory_spec:
                raise InvalidArgumentError(f"memory_spec lacks {key!r}; it needs batch_size, max_size and path")
        self.batch_size = int(memory_spec["batch_size"])
        self.max_size = memory_spec["max_size"]
        self.use_cer = bool(memory_spec.get("use_cer", False))
        self.is_episodic = False
        self.is_venv = bool(getattr(body.env, "is_venv", False))
        self.ns_idx_offset = body.env.num_envs if self.is_venv else 1
        self.data_keys = ["states", "actions", "rewards", "next_states", "dones"]
        path = memory_spec["path"]
        if os.path.exists(os.path.join(path, "store.json")):
            self.store = _store.DiskReplay.open(path, mode="r+")
            if self.store.num_envs != self.ns_idx_offset:
                self.store.close()
                raise InvalidArgumentError(
                    f"{path} holds steps of {self.store.num_envs} envs, but the body has {self.ns_idx_offset}")
        else:
            # The seed's next-state offset is num_envs: the store keeps whole env steps.
            self.store = _store.DiskReplay.create(
                path, self.max_size, num_envs=self.ns_idx_offset, backend=memory_spec.get("backend", "memmap"),
                batch_size=self.batch_size, use_cer=self.use_cer, seed=memory_spec.get("seed"))
        self.max_size = self.store.max_size

    @property
    def batch_idxs(self):
        return self.store.batch_idxs

    @property
    def size(self) -> int:
        return self.store.size

    @property
    def seen_size(self) -> int:
        return self.store.seen_size

    @property
    def head(self) -> int:
        return self.store.head

    def reset(self) -> None:
        """Empty the memory (``size`` 0, ``head`` -1) as the seed's ``reset`` does."""
        self.store.reset()

    def update(self, state, action, reward, next_state, done) -> None:
        """Add one step: for a vector env, one transition per env, env-major, as the seed's
        per-env loop does (written as one step; ``to_train`` is updated per transition)."""
        seen_before = self.store.seen_size
        self.store.add(state, action, reward, next_state, done)
        first = seen_before + 1 - self.store.seen_size + self.store.head  # head after the first env
        for k in range(self.ns_idx_offset):
            self._update_to_train(seen_before + k + 1, (first + k) % self.max_size)

    def _update_to_train(self, seen_size: int, head: int) -> None:
        """The seed's rule, verbatim, evaluated after each transition."""
        algorithm = self.body.agent.algorithm
        algorithm.to_train = algorithm.to_train or (
            seen_size > algorithm.training_start_step and head % algorithm.training_frequency == 0)

    def sample(self) -> dict:
        """A batch of ``batch_size`` transitions, as the seed returns it."""
        return self.store.sample(self.batch_size)

    def close(self) -> None:
        self.store.close()
