"""The shard actor: one local ``DiskReplay`` on its node's disk, served to Ray callers.

A ``Shard`` is a plain class; ``shard_actor`` wraps it with ``ray.remote`` (restartable,
threaded). The first start is an explicit ``start()`` call, so that bad input comes back
as the ``DiskReplayError`` it is and the driver can undo what it created; when Ray
restarts the actor after a crash, ``__init__`` reopens the store itself (recovery keeps
every acknowledged transition), so the shard rejoins sampling with no driver action.
"""
from __future__ import annotations

import os
import shutil
import threading

import numpy as np
import ray

from ..errors import InvalidArgumentError, StoreMismatchError, StoreNotFoundError
from ..store import DiskReplay

__all__ = ["Shard", "shard_actor"]


class Shard:
    """The body of a shard actor (``max_size=None``: open an existing store only)."""

    def __init__(self, path: str, max_size: int | None, mode: str, create_kwargs: dict):
        self.path, self.max_size, self.mode, self.create_kwargs = path, max_size, mode, create_kwargs
        self.buf: DiskReplay | None = None
        self.created = False
        self._lock = threading.Lock()
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self.buf = DiskReplay.open(path, mode=mode)  # a restart: the store exists, recover it

    # ------------------------------------------------------------------ life cycle
    def start(self) -> dict:
        """Create the store, or resume (open) it when it exists; returns ``info()``."""
        with self._lock:
            if self.buf is None:
                self.buf = self._open_or_create()
            return self.info()

    def _open_or_create(self) -> DiskReplay:
        if self.max_size is None:
            return DiskReplay.open(self.path, mode=self.mode)
        try:
            buf = DiskReplay.open(self.path, mode="r+")
        except StoreNotFoundError:
            self.created = True
            return DiskReplay.create(self.path, self.max_size, **self.create_kwargs)
        if buf.max_size != self.max_size:
            buf.close()
            raise StoreMismatchError(f"{self.path}: the store there has max_size {buf.max_size}, not "
                                     f"{self.max_size}; give its max_size or another path")
        return buf

    def info(self) -> dict:
        """Where the shard runs and what its store holds."""
        buf = self.buf
        fields = None if buf.fields is None else {n: (tuple(s), np.dtype(d).str) for n, (s, d) in buf.fields.items()}
        return {"path": self.path, "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "created": self.created, "size": buf.size, "seen_size": buf.seen_size,
                "max_size": buf.max_size, "num_envs": buf.num_envs, "fields": fields, "prioritized": buf.prioritized}

    def size(self) -> int:
        return self.buf.size

    def destroy(self) -> None:
        """Close the store and remove it if this actor created it (undoing a failed ``create``)."""
        if self.buf is not None:
            self.buf.close()
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()

    # ------------------------------------------------------------------ writing
    def add(self, state, action, reward, next_state, done, **extra) -> int:
        """One env step into the store; returns ``seen_size`` once it is acknowledged (crash-safe)."""
        self.buf.add(state, action, reward, next_state, done, **extra)
        return self.buf.seen_size

    def add_many(self, states, actions, rewards, next_states, dones, **extras) -> int:
        """Several env steps in one call (each argument has a leading step axis); returns
        ``seen_size`` once all of them are acknowledged."""
        steps = len(states)
        for name, value in (("actions", actions), ("rewards", rewards), ("next_states", next_states),
                            ("dones", dones), *extras.items()):
            if len(value) != steps:
                raise InvalidArgumentError(f"add_many: {name} has {len(value)} steps, states has {steps}; "
                                           "every argument needs the same leading step axis")
        buf = self.buf
        for t in range(steps):
            buf.add(states[t], actions[t], rewards[t], next_states[t], dones[t],
                    **{name: value[t] for name, value in extras.items()})
        return buf.seen_size

    def flush(self) -> int:
        self.buf.flush()
        return self.buf.seen_size

    # ------------------------------------------------------------------ reading
    def sample_rows(self, k: int, seed: int) -> tuple[int, np.ndarray, dict]:
        """``k`` slots drawn uniformly from ``[0, size)`` with a driver-given seed, and their rows.
        Slots below ``size`` stay valid while writers add (size only grows, or stays full)."""
        size = self.buf.size
        idxs = np.random.default_rng(seed).integers(0, size, k) if size else np.empty(0, np.int64)
        return size, idxs, self.buf.get(idxs) if size else {}

    def get(self, idxs) -> dict:
        return self.buf.get(np.asarray(idxs, dtype=np.int64))

    def pid(self) -> int:
        return os.getpid()


def shard_actor(max_restarts: int, concurrency: int):
    """``Shard`` as a Ray actor class: restarted up to ``max_restarts`` times (-1: always),
    ``concurrency`` calls at once (the store's mutex orders them). Tasks are not retried:
    an ``add`` either returned (acknowledged) or failed, never ran twice."""
    return ray.remote(max_restarts=max_restarts, max_task_retries=0, max_concurrency=concurrency)(Shard)
