"""Stable-Baselines3: ``DiskReplayBuffer``, a ``replay_buffer_class`` whose transitions live in a store.

    from stable_baselines3 import DQN
    from diskreplay.sb3 import DiskReplayBuffer
    model = DQN("MlpPolicy", env, replay_buffer_class=DiskReplayBuffer,
                replay_buffer_kwargs={"path": "runs/dqn.replay"})

SB3's row ``pos`` of env ``e`` is the store's slot ``pos * n_envs + e`` (one SB3 ``add``
is one store step of ``n_envs`` transitions), so the buffer holds what SB3's own
``ReplayBuffer`` would, states once. Next observations are exact: those SB3 passes for
episode ends (``terminal_observation``) go to the store's ``add`` as next states, and its
jump ring (``parts/jumps.py``) keeps them. A ``<path>.finals`` side store that earlier
versions kept beside the store is ignored: never opened, read nor removed (README.md,
"Integrations").
Pickling (``model.save_replay_buffer``) flushes the store and writes only its path and
position; unpickling reopens it, so in the process that saved it the buffer holding the
store must be closed first (one writer per store, in a process as across processes). Importing this module imports stable_baselines3 and torch.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.utils import get_device

from .envspaces import check_holdable, open_or_create
from .errors import InvalidArgumentError, SchemaMismatchError, StoreLockedError, StoreNotFoundError
from .store import DiskReplay


def _expected_fields(observation_space, action_space) -> dict:
    """The store's fields in SB3's layout: observations as ``get_obs_shape`` gives them, actions
    as ``(action_dim,)`` in the dtype SB3's ``ReplayBuffer`` casts them to, and ``timeouts``."""
    check_holdable(observation_space, "observation", "DiskReplayBuffer")
    check_holdable(action_space, "action", "DiskReplayBuffer")
    obs_dtype = np.dtype(observation_space.dtype)
    act_dtype = np.dtype(ReplayBuffer._maybe_cast_dtype(action_space.dtype))
    return {"states": (tuple(get_obs_shape(observation_space)), obs_dtype),
            "actions": ((get_action_dim(action_space),), act_dtype),
            "rewards": ((), np.dtype(np.float32)), "dones": ((), np.dtype(bool)),
            "timeouts": ((), np.dtype(bool))}


def _open_or_create(path: str, max_size: int, n_envs: int, fields: dict, backend: str, seed, flush_every):
    """The store at ``path`` (resumed) or a new one, checked against the spaces. One buffer
    owns a store: another buffer of this process holding it is refused, as one in another
    process is (``StoreLockedError``)."""
    if seed is None:  # SB3's set_random_seed seeds numpy's global generator: follow it (new stores only)
        seed = lambda: int(np.random.randint(0, 2**62))  # noqa: E731
    try:
        return open_or_create(path, fields, n_envs, max_size, backend=backend, seed=seed,
                              flush_every=flush_every, asker="the buffer")
    except StoreLockedError as exc:
        if not exc.in_this_process:
            raise
        raise StoreLockedError(
            exc.errno, f"{exc.strerror}. Another DiskReplayBuffer of this process holds {path}: before "
            "model.load_replay_buffer(...) close the model's buffer (model.replay_buffer.close()), or give "
            "this buffer its own path") from None


def _timeouts(infos, n: int, handle_timeout_termination: bool) -> np.ndarray:
    """The step's ``TimeLimit.truncated`` flags, from what SB3's own buffer accepts as
    ``infos``: a list of ``n`` dicts (SB3's VecEnv), a Gymnasium vector env's dict of
    arrays (CleanRL passes that; its ``_TimeLimit.truncated`` mask honoured, an empty dict
    holds none), or anything when ``handle_timeout_termination`` is off (SB3 then never
    reads ``infos``)."""
    if not handle_timeout_termination:
        return np.zeros(n, bool)
    if isinstance(infos, dict):
        flags = infos.get("TimeLimit.truncated")
        if flags is None:
            return np.zeros(n, bool)
        flags = np.asarray(flags, bool).reshape(-1)
        mask = infos.get("_TimeLimit.truncated")
        if mask is not None:
            flags = flags & np.asarray(mask, bool).reshape(-1)
        if len(flags) != n:
            raise SchemaMismatchError(f"DiskReplayBuffer.add: infos['TimeLimit.truncated'] has {len(flags)} "
                                      f"values for {n} envs")
        return flags
    if len(infos) != n:
        raise SchemaMismatchError(f"DiskReplayBuffer.add: got {len(infos)} infos for {n} envs; pass a list of "
                                  "one dict per env, or a vector env's infos dict")
    return np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])


class DiskReplayBuffer(ReplayBuffer):
    """SB3's ``ReplayBuffer`` with its transitions in a diskreplay store at ``path``.

    Built by SB3 as ``replay_buffer_class`` with ``replay_buffer_kwargs={"path": ...}``
    (optionally ``backend``, ``seed``, ``flush_every`` as in ``DiskReplay.create``). An
    existing store at ``path`` resumes (its spaces must match: ``StoreMismatchError``
    otherwise). Sampling draws from the store's own persisted generator (seeded from
    numpy's global one, which SB3 seeds, when ``seed`` is None). ``optimize_memory_usage``
    is accepted with or without ``handle_timeout_termination``: the store keeps states once.
    """

    def __init__(self, buffer_size: int, observation_space, action_space, device="auto", n_envs: int = 1,
                 optimize_memory_usage: bool = False, handle_timeout_termination: bool = True, *,
                 path=None, backend: str = "memmap", seed: int | None = None, flush_every: int | None = None):
        # Not ReplayBuffer.__init__: it allocates the arrays this class keeps on disk.
        if path is None:
            raise InvalidArgumentError("DiskReplayBuffer needs a store path: replay_buffer_kwargs={'path': ...}")
        self.observation_space, self.action_space = observation_space, action_space
        fields = _expected_fields(observation_space, action_space)
        self.obs_shape = fields["states"][0]
        self.action_dim = fields["actions"][0][0]
        self.n_envs = int(n_envs)
        self.buffer_size = max(int(buffer_size) // self.n_envs, 1)
        self.device = get_device(device)
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.path = os.fspath(path)
        self._options = {"buffer_size": buffer_size, "backend": backend, "seed": seed, "flush_every": flush_every}
        self._store = _open_or_create(self.path, self.buffer_size * self.n_envs, self.n_envs, fields,
                                      backend, seed, flush_every)
        self._fields = fields

    # ------------------------------------------------------------------ the store
    @property
    def store(self) -> DiskReplay:
        """The ``DiskReplay`` holding the transitions."""
        return self._store

    @property
    def pos(self) -> int:
        """SB3's next row to write."""
        return ((self.store.head + 1) % self.store.max_size) // self.n_envs

    @property
    def full(self) -> bool:
        return self.store.size == self.store.max_size

    def size(self) -> int:
        return self.buffer_size if self.full else self.pos

    def reset(self) -> None:
        """Empty the buffer (the store's ``reset``; durable at once)."""
        self.store.reset()

    def flush(self) -> None:
        """Make everything added so far survive a power cut."""
        self.store.flush()

    def close(self) -> None:
        """Flush and close the store (and every buffer of this process sharing it)."""
        self.store.close()

    # ------------------------------------------------------------------ adding
    def add(self, obs, next_obs, action, reward, done, infos) -> None:
        """One step of ``n_envs`` transitions, as SB3's ``ReplayBuffer.add``."""
        n = self.n_envs
        obs_shape, obs_dtype = self._fields["states"]
        try:
            obs = np.asarray(obs).reshape((n, *obs_shape))
            next_obs = np.asarray(next_obs).reshape((n, *obs_shape))
            action = np.asarray(action).reshape((n, self.action_dim))
            reward = np.asarray(reward, dtype=np.float32).reshape(n)
            done = np.asarray(done).reshape(n).astype(bool)
        except ValueError as exc:
            raise SchemaMismatchError(
                f"DiskReplayBuffer.add: {exc}; expected obs and next_obs of shape {(n, *obs_shape)} {obs_dtype}, "
                f"action of {n} x {self.action_dim} values, reward and done of {n}") from exc
        timeouts = _timeouts(infos, n, self.handle_timeout_termination)
        # Cast as SB3's arrays would on assignment (e.g. float64 actions into float32).
        obs = obs.astype(obs_dtype, copy=False)
        next_obs = next_obs.astype(obs_dtype, copy=False)
        action = action.astype(self._fields["actions"][1], copy=False)
        # next_obs holds the final observations at episode ends: the store's jump ring keeps them.
        store = self.store
        if n == 1:
            store.add(obs[0], action[0], reward[0], next_obs[0], done[0], timeouts=timeouts[0])
        else:
            store.add(obs, action, reward, next_obs, done, timeouts=timeouts)

    # ------------------------------------------------------------------ reading
    def sample(self, batch_size: int, env=None) -> ReplayBufferSamples:
        """``batch_size`` transitions drawn uniformly, as SB3's ``ReplayBuffer.sample``."""
        batch = self.store.sample(batch_size)
        return self._samples(batch, env)

    def _get_samples(self, batch_inds: np.ndarray, env=None) -> ReplayBufferSamples:
        """SB3's hook: rows ``batch_inds``, each of an env drawn at random (numpy's global generator)."""
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        slots = np.asarray(batch_inds, np.int64) * self.n_envs + env_indices
        return self._samples(self.store.get(slots), env)

    def _samples(self, batch: dict, env) -> ReplayBufferSamples:
        dones = batch["dones"].astype(np.float32)
        if self.handle_timeout_termination:
            dones *= ~batch["timeouts"]
        data = (self._normalize_obs(batch["states"], env), batch["actions"],
                self._normalize_obs(batch["next_states"], env), dones.reshape(-1, 1),
                self._normalize_reward(batch["rewards"].reshape(-1, 1), env))
        return ReplayBufferSamples(*tuple(map(self.to_torch, data)))

    def arrays(self) -> dict:
        """Every row in SB3's layout ``(buffer_size, n_envs, ...)``, as SB3's ``ReplayBuffer``
        would hold them (``observations``, ``next_observations``, ``actions``, ``rewards``,
        ``dones``, ``timeouts``; zeros in rows never written). Reads the whole store: for
        inspection and tests of small buffers."""
        store, rows, n = self.store, self.buffer_size, self.n_envs
        size = store.size
        slots = np.arange(size, dtype=np.int64)
        batch = store.get(slots) if size else None
        out = {}
        for key, name in (("observations", "states"), ("next_observations", "next_states"),
                          ("actions", "actions"), ("rewards", "rewards"), ("dones", "dones"),
                          ("timeouts", "timeouts")):
            spec = self._fields["states" if name == "next_states" else name]
            dtype = np.float32 if name in ("dones", "timeouts") else spec[1]
            arr = np.zeros((rows * n, *spec[0]), dtype)
            if size and (name != "timeouts" or self.handle_timeout_termination):
                arr[:size] = batch[name]
            out[key] = arr.reshape((rows, n, *spec[0]))
        return out

    # ------------------------------------------------------------------ pickling: a reference, not a copy
    def __getstate__(self) -> dict:
        self.flush()
        return {"path": os.path.abspath(self.path), "seen_size": self.store.seen_size,
                "observation_space": self.observation_space, "action_space": self.action_space,
                "device": str(self.device), "n_envs": self.n_envs,
                "optimize_memory_usage": self.optimize_memory_usage,
                "handle_timeout_termination": self.handle_timeout_termination, "options": self._options}

    def __setstate__(self, state: dict) -> None:
        if not os.path.isfile(os.path.join(state["path"], "store.json")):  # never a new empty store in its place
            raise StoreNotFoundError(
                f"this replay buffer was saved as a reference to the store at {state['path']}, which is not there "
                "(deleted, or on another machine): a DiskReplayBuffer's save keeps the path, not the transitions; "
                "copy the store to that path, or give the model a new buffer")
        options = dict(state["options"])
        buffer_size = options.pop("buffer_size")
        self.__init__(buffer_size, state["observation_space"], state["action_space"], device=state["device"],
                      n_envs=state["n_envs"], optimize_memory_usage=state["optimize_memory_usage"],
                      handle_timeout_termination=state["handle_timeout_termination"], path=state["path"],
                      **options)
        if self.store.seen_size < state["seen_size"]:
            warnings.warn(f"the store at {self.path} holds {self.store.seen_size} transitions, fewer than the "
                          f"{state['seen_size']} it held when this buffer was saved (it was reset, replaced or "
                          "lost unflushed adds)", RuntimeWarning, stacklevel=2)


__all__ = ["DiskReplayBuffer"]
