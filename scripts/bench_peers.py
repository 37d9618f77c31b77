"""Other replay buffers as systems of scripts/bench.py (the `[bench]` extra installs them).

Each is used the way its documentation shows; the step data of a workload is converted once
to what the library takes (untimed: it is what the environment or collector hands over),
and the conversions are listed in ``NOTES`` (printed by the report). Every peer stores the
next observation in its own array, as the workloads' numpy baseline does. torch runs with
one thread (``torch.set_num_threads(1)``) in every peer that imports it.
"""
from __future__ import annotations

import importlib.util
import os
import time

import numpy as np


# peer name -> the modules it needs (a peer whose modules are missing is skipped)
REQUIRES = {
    "sb3": ("stable_baselines3", "gymnasium", "torch"),
    "sb3-optimized": ("stable_baselines3", "gymnasium", "torch"),
    "cpprb": ("cpprb",),
    "torchrl-tensor": ("torchrl", "tensordict", "torch"),
    "torchrl-memmap": ("torchrl", "tensordict", "torch"),
}
PEERS = tuple(REQUIRES)
NOTES = {
    "sb3": "stable_baselines3.common.buffers.ReplayBuffer(device='cpu', n_envs=num_envs): obs, next_obs "
           "as (n_envs, *shape) arrays, action (n_envs, 1) int64, dones kept as float32, infos [{}] per env "
           "(handle_timeout_termination=True, the default); sample() returns torch tensors (copies)",
    "sb3-optimized": "as sb3 with optimize_memory_usage=True (next obs read from the next slot; requires "
                     "handle_timeout_termination=False)",
    "cpprb": "cpprb.ReplayBuffer(max_size, env_dict) with obs, act (int64), rew, next_obs, done (float32, "
             "cpprb's default dtype) stored explicitly; add(**kwargs) per step (a vector step adds its "
             "num_envs rows in one call); sample() returns numpy arrays (rew, done as (b, 1))",
    "torchrl-tensor": "torchrl.data.ReplayBuffer(storage=LazyTensorStorage(max_size)): one TensorDict per step "
                      "(observation, action, ('next', observation/reward/done), done bool) built once as a "
                      "collector hands it over; add() per single-env step, extend() for a vector step; "
                      "sample(b) returns a TensorDict",
    "torchrl-memmap": "as torchrl-tensor on LazyMemmapStorage(max_size, scratch_dir=...) (memory-mapped "
                      "files); reopened by ReplayBuffer.dumps/loads on the scratch directory (zero-copy)",
}


class System:
    """What scripts/bench.py's worker calls (its own systems share these defaults)."""

    path = None

    def prepare(self, *step):
        return step

    def touch(self):
        pass

    def finish_adds(self):
        pass

    def close(self):
        pass

    def mappings(self):
        return []


def missing(name: str) -> str | None:
    """Why peer ``name`` cannot run here (None when it can)."""
    absent = [m for m in REQUIRES[name] if importlib.util.find_spec(m) is None]
    return f"not installed (missing {', '.join(absent)}; pip install -e .[bench])" if absent else None


def _one_torch_thread():
    import torch

    torch.set_num_threads(1)
    return torch


def _scalar_env_arrays(spec, s, a, r, ns, d):
    """A step as (n_envs, ...) arrays, as a vector env returns it."""
    n, shape = spec["num_envs"], tuple(spec["state"])
    return (np.asarray(s).reshape((n,) + shape), np.asarray(ns).reshape((n,) + shape),
            np.asarray(a, np.int64).reshape(n), np.asarray(r, np.float32).reshape(n),
            np.asarray(d, bool).reshape(n))


class SB3System(System):
    def __init__(self, optimize_memory_usage=False):
        self.optimize = optimize_memory_usage

    def create(self, spec, path):
        _one_torch_thread()
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        shape, dtype = tuple(spec["state"]), np.dtype(spec["dtype"])
        if dtype == np.uint8:
            obs_space = spaces.Box(0, 255, shape, np.uint8)
        else:
            obs_space = spaces.Box(-np.inf, np.inf, shape, dtype)
        self.spec = spec
        self.rb = ReplayBuffer(spec["max_size"], obs_space, spaces.Discrete(2), device="cpu",
                               n_envs=spec["num_envs"], optimize_memory_usage=self.optimize,
                               handle_timeout_termination=not self.optimize)

    def touch(self):
        for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
            arr = getattr(self.rb, name, None)
            if arr is not None:
                arr[:] = 0

    def prepare(self, s, a, r, ns, d):
        obs, next_obs, action, reward, done = _scalar_env_arrays(self.spec, s, a, r, ns, d)
        return obs, next_obs, action.reshape(-1, 1), reward, done, [{} for _ in range(len(obs))]

    def add(self, obs, next_obs, action, reward, done, infos):
        self.rb.add(obs, next_obs, action, reward, done, infos)

    def sample(self, b):
        return self.rb.sample(b)


class CpprbSystem(System):
    def create(self, spec, path):
        from cpprb import ReplayBuffer

        shape, dtype = tuple(spec["state"]), np.dtype(spec["dtype"])
        self.spec = spec
        self.env_dict = {"obs": {"shape": shape, "dtype": dtype}, "act": {"dtype": np.int64}, "rew": {},
                         "next_obs": {"shape": shape, "dtype": dtype}, "done": {}}
        self.rb = ReplayBuffer(spec["max_size"], self.env_dict)

    def touch(self):
        # cpprb's arrays are not public: write every row once through add(), then clear()
        chunk, m = 1024, self.spec["max_size"]
        rows = {k: np.zeros((chunk,) + tuple(np.atleast_1d(v.get("shape", 1))), v.get("dtype", np.float32))
                for k, v in self.env_dict.items()}
        for start in range(0, m, chunk):
            n = min(chunk, m - start)
            self.rb.add(**{k: v[:n] for k, v in rows.items()})
        self.rb.clear()

    def prepare(self, s, a, r, ns, d):
        return ({"obs": s, "act": a, "rew": r, "next_obs": ns, "done": d},)

    def add(self, kwargs):
        self.rb.add(**kwargs)

    def sample(self, b):
        return self.rb.sample(b)


class TorchRLSystem(System):
    def __init__(self, memmap=False):
        self.memmap = memmap

    def _storage(self, max_size, existsok=False):
        from torchrl.data import LazyMemmapStorage, LazyTensorStorage

        if self.memmap:
            return LazyMemmapStorage(max_size, scratch_dir=os.path.join(self.path, "storage"), existsok=existsok)
        return LazyTensorStorage(max_size)

    def create(self, spec, path):
        _one_torch_thread()
        from torchrl.data import ReplayBuffer

        self.spec = spec
        self.path = path if self.memmap else None
        if self.memmap:
            os.makedirs(path, exist_ok=True)
        self.rb = ReplayBuffer(storage=self._storage(spec["max_size"], existsok=True))

    def _step_td(self, s, a, r, ns, d):
        import torch
        from tensordict import TensorDict

        obs, next_obs, action, reward, done = _scalar_env_arrays(self.spec, s, a, r, ns, d)
        n = len(obs)
        td = TensorDict({"observation": torch.from_numpy(obs), "action": torch.from_numpy(action),
                         "done": torch.from_numpy(done).reshape(n, 1),
                         "next": {"observation": torch.from_numpy(next_obs),
                                  "reward": torch.from_numpy(reward).reshape(n, 1),
                                  "done": torch.from_numpy(done).reshape(n, 1)}}, batch_size=[n])
        return td[0] if self.spec["num_envs"] == 1 else td

    def touch(self):
        # the storage is allocated by the first write: extend by zero rows, then empty it
        zero = self._step_td(*self._zero_step())
        m, chunk = self.spec["max_size"], 1024
        block = (zero.unsqueeze(0) if zero.batch_dims == 0 else zero[:1]).expand(chunk).clone()
        for start in range(0, m, chunk):
            self.rb.extend(block[:min(chunk, m - start)])
        self.rb.empty()

    def _zero_step(self):
        n, shape, dt = self.spec["num_envs"], tuple(self.spec["state"]), np.dtype(self.spec["dtype"])
        s = np.zeros((n,) + shape, dt)
        return s, np.zeros(n, np.int64), np.zeros(n, np.float32), s, np.zeros(n, bool)

    def prepare(self, s, a, r, ns, d):
        return (self._step_td(s, a, r, ns, d),)

    def add(self, td):
        if td.batch_dims:
            self.rb.extend(td)
        else:
            self.rb.add(td)

    def sample(self, b):
        return self.rb.sample(b)

    def finish_adds(self):
        if self.memmap:
            self.rb.dumps(self.path)  # zero-copy: the data is already in path/storage

    def close(self):
        self.rb = None

    def reopen(self):
        _one_torch_thread()
        from torchrl.data import ReplayBuffer

        t = time.perf_counter()
        self.rb = ReplayBuffer(storage=self._storage(self.spec["max_size"], existsok=True))
        self.rb.loads(self.path)  # maps path/storage in place (its scratch_dir)
        return time.perf_counter() - t

    def checked_files(self):
        return [p for p in store_tree(self.path) if p.endswith(".memmap")]


def store_tree(path):
    return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)


def make_peer(name):
    return {"sb3": SB3System, "sb3-optimized": lambda: SB3System(optimize_memory_usage=True),
            "cpprb": CpprbSystem, "torchrl-tensor": TorchRLSystem,
            "torchrl-memmap": lambda: TorchRLSystem(memmap=True)}[name]()
