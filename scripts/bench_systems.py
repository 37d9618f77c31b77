"""The systems of scripts/bench.py: what its worker creates, fills, samples and reopens
(bench_peers.System says what every system offers; the other libraries are in
bench_peers.py): diskreplay on both backends (uniform, prioritized, frame-stacked or whole
states), plain numpy arrays in RAM, np.memmap files, h5py chunked datasets, the seed's
in-RAM design (seed_replay.py), cpprb's PrioritizedReplayBuffer and the SLM-Lab port
(slm_per.py). ``make_system(name)`` builds one by its name in the results.
"""
from __future__ import annotations

import json
import mmap
import os
import random
import time

import numpy as np

import bench_peers  # scripts/, this script's directory, is on sys.path
from bench_measure import store_files
from bench_peers import PEERS
from seed_replay import SeedReplay
from slm_per import SLMPrioritizedReplay

FIELDS = ("states", "actions", "rewards", "next_states", "dones")

class System(bench_peers.System):
    """What every system offers the worker; ``path`` is its store (None in RAM)."""

    def reopen(self):
        raise NotImplementedError

    def checked_files(self):
        return store_files(self.path)


class DiskReplaySystem(System):
    def __init__(self, backend, prioritized=None, frame_stack=None):
        self.backend = backend
        self.prioritized = prioritized  # None: as the workload says
        self.frame_stack = frame_stack  # None: as the workload says; False: whole states (W6's like-for-like)

    def create(self, spec, path):
        # Imported here, not above: a baseline's worker process never loads the library, so
        # its RssAnon is its own (tests/test_import_rules.py, LAZY_LIBRARY).
        from diskreplay import DiskReplay

        fields = {"states": (tuple(spec["state"]), spec["dtype"]), "actions": ((), "int64"),
                  "rewards": ((), "float32"), "dones": ((), "bool")}
        fields.update({name: ((), dt) for name, dt in spec.get("extras", {}).items()})
        self.path = path
        prioritized = spec.get("prioritized", False) if self.prioritized is None else self.prioritized
        self.buf = DiskReplay.create(path, spec["max_size"], num_envs=spec["num_envs"], backend=self.backend,
                                     seed=0, fields=fields, overwrite=True, prioritized=prioritized,
                                     frame_stack=spec.get("frame_stack") if self.frame_stack is None else None)

    def touch(self):
        for arr in self.buf._session.storage.arrays.values():
            arr[:] = 0
        # Written behind the store's back, these pages are dirty, and the first flush (an add's,
        # once the reserve is used) would otherwise pay for syncing the whole warm-up.
        self.buf.flush()

    def add(self, s, a, r, ns, d):
        self.buf.add(s, a, r, ns, d)

    def add_extra(self, s, a, r, ns, d, extra):
        self.buf.add(s, a, r, ns, d, **extra)

    def sample(self, b):
        return self.buf.sample(b)

    def sample_update(self, b, errors):
        batch = self.buf.sample(b)
        self.buf.update_priorities(self.buf.batch_idxs, errors)
        return batch

    def finish_adds(self):
        self.buf.flush()

    def close(self):
        self.buf.close()

    def reopen(self):
        from diskreplay import DiskReplay

        t = time.perf_counter()
        self.buf = DiskReplay.open(self.path, mode="r+")
        elapsed = time.perf_counter() - t
        return elapsed

    def checked_files(self):
        # meta.bin is the counter page every sample() writes (the sampler position): always
        # dirty, so the page cache keeps it; it is not data.
        return [p for p in store_files(self.path) if os.path.basename(p) not in ("meta.bin", "lock")]

    def mappings(self):
        return [m for f in self.buf._session.mapped_files for m in f.maps]

    def pinned_ranges(self):
        """``{real path: [(start, end), ...]}``: the byte ranges of the small fields the cold
        path keeps in RAM on purpose (``gather.py``, from its first cold batch), which W4's
        check of resident pages does not count."""
        gatherer, found = self.buf._session.gatherer, {}
        for name, pin in zip(gatherer.resident or (), gatherer.pins):
            fd = self.buf._session.storage.locations[name][0]
            found.setdefault(os.path.realpath(f"/proc/self/fd/{fd}"), []).append(pin.span)
        return found


class NumpySystem(System):
    """Plain preallocated arrays in RAM, next states stored: the limit. One assignment per
    field per add (a slice per field for vector envs), fancy-index gathers."""

    extras = {}

    def _alloc(self, spec, make):
        m, shape = spec["max_size"], tuple(spec["state"])
        self.n, self.m = spec["num_envs"], m
        self.states = make("states", (m,) + shape, spec["dtype"])
        self.next_states = make("next_states", (m,) + shape, spec["dtype"])
        self.actions = make("actions", (m,), np.int64)
        self.rewards = make("rewards", (m,), np.float32)
        self.dones = make("dones", (m,), bool)
        self.extras = {name: make(name, (m,), dt) for name, dt in spec.get("extras", {}).items()}
        self.head, self.size = -1, 0
        self.rng = np.random.default_rng(0)

    def create(self, spec, path):
        self._alloc(spec, lambda name, shape, dt: np.zeros(shape, dt))

    def arrays(self):
        return [self.states, self.next_states, self.actions, self.rewards, self.dones, *self.extras.values()]

    def touch(self):
        for arr in self.arrays():
            arr[:] = 0

    def add(self, s, a, r, ns, d):
        n = self.n
        if n == 1:
            h = self.head = (self.head + 1) % self.m
            self.states[h] = s
            self.actions[h] = a
            self.rewards[h] = r
            self.next_states[h] = ns
            self.dones[h] = d
        else:
            start = (self.head + 1) % self.m
            stop = start + n  # the workloads' max_size are multiples of num_envs
            self.states[start:stop] = s
            self.actions[start:stop] = a
            self.rewards[start:stop] = r
            self.next_states[start:stop] = ns
            self.dones[start:stop] = d
            self.head = stop - 1
        self.size = min(self.size + n, self.m)

    def add_extra(self, s, a, r, ns, d, extra):  # single env (W1x)
        h = self.head = (self.head + 1) % self.m
        self.states[h] = s
        self.actions[h] = a
        self.rewards[h] = r
        self.next_states[h] = ns
        self.dones[h] = d
        for name, value in extra.items():
            self.extras[name][h] = value
        self.size = min(self.size + 1, self.m)

    def sample(self, b):
        idxs = self.rng.integers(0, self.size, b)
        batch = {"states": self.states[idxs], "actions": self.actions[idxs], "rewards": self.rewards[idxs],
                 "next_states": self.next_states[idxs], "dones": self.dones[idxs]}
        for name, arr in self.extras.items():
            batch[name] = arr[idxs]
        return batch


class MemmapSystem(NumpySystem):
    """Plain np.memmap files (next states stored), naive fancy indexing."""

    def __init__(self, random=False):
        self.random = random

    def create(self, spec, path):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.spec = spec
        self._alloc(spec, lambda name, shape, dt: np.lib.format.open_memmap(
            os.path.join(path, name + ".npy"), "w+", dt, shape))

    def finish_adds(self):
        for arr in self.arrays():
            arr.flush()
        with open(os.path.join(self.path, "counters.json"), "w") as f:
            json.dump({"size": self.size, "head": self.head}, f)

    def close(self):
        for name in FIELDS:
            setattr(self, name, None)

    def reopen(self):
        t = time.perf_counter()
        for name in FIELDS:
            arr = np.load(os.path.join(self.path, name + ".npy"), mmap_mode="r")
            if self.random:
                arr._mmap.madvise(mmap.MADV_RANDOM)
            setattr(self, name, arr)
        with open(os.path.join(self.path, "counters.json")) as f:
            c = json.load(f)
        self.size, self.head, self.m = c["size"], c["head"], len(self.states)
        self.rng = np.random.default_rng(0)
        return time.perf_counter() - t

    def mappings(self):
        return [a._mmap for a in self.arrays()]


class H5pyChunkedSystem(NumpySystem):
    """h5py fancy indexing on chunked datasets (~64 KiB chunks): sorted unique indices, then
    reordered. Adds are written in blocks of 1024 steps (not timed: a sampling baseline)."""

    BLOCK = 1024

    def touch(self):
        pass  # h5py allocates chunks as they are written

    def create(self, spec, path):
        import h5py

        os.makedirs(path, exist_ok=True)
        self.path = os.path.join(path, "data.h5")
        m, shape = spec["max_size"], tuple(spec["state"])
        self.n, self.m = spec["num_envs"], m
        self.f = h5py.File(self.path, "w")
        row = int(np.prod(shape)) * np.dtype(spec["dtype"]).itemsize
        for name, shp, dt in (("states", shape, spec["dtype"]), ("next_states", shape, spec["dtype"]),
                              ("actions", (), np.int64), ("rewards", (), np.float32), ("dones", (), bool)):
            rows = max(1, (1 << 16) // (row if shp else np.dtype(dt).itemsize))
            self.f.create_dataset(name, (m,) + shp, dt, chunks=(min(rows, m),) + shp)
        self.dsets = {name: self.f[name] for name in FIELDS}
        self.head, self.size, self.written = -1, 0, 0
        self.rng = np.random.default_rng(0)
        self.pending = []

    def add(self, s, a, r, ns, d):
        self.pending.append((s, a, r, ns, d))
        if len(self.pending) == self.BLOCK:
            self._write_block()

    def _write_block(self):
        if not self.pending:
            return
        cols = list(zip(*self.pending))
        for name, col in zip(("states", "actions", "rewards", "next_states", "dones"), cols):
            data = np.asarray(col)
            data = data.reshape((-1,) + data.shape[(2 if self.n > 1 else 1):])
            start = self.written % self.m
            self.dsets[name][start:start + len(data)] = data
        self.written += len(self.pending) * self.n
        self.size = min(self.written, self.m)
        self.pending = []

    def finish_adds(self):
        self._write_block()
        self.f.attrs["size"] = self.size
        self.f.flush()

    def sample(self, b):
        idxs = self.rng.integers(0, self.size, b)
        uniq, inverse = np.unique(idxs, return_inverse=True)
        return {name: dset[uniq][inverse] for name, dset in self.dsets.items()}

    def close(self):
        self.f.close()

    def reopen(self, cold=False):
        import h5py

        t = time.perf_counter()
        # Cold: no chunk cache either (h5py would otherwise keep decompressed chunks in RAM).
        self.f = h5py.File(self.path, "r", **({"rdcc_nbytes": 0} if cold else {}))
        self.dsets = {name: self.f[name] for name in FIELDS}
        self.size = int(self.f.attrs["size"])
        self.m = self.dsets["states"].shape[0]
        self.rng = np.random.default_rng(0)
        return time.perf_counter() - t

    def checked_files(self):
        return [self.path]


class SeedSystem(System):
    """The seed's in-RAM design (scripts/seed_replay.py)."""

    def create(self, spec, path):
        self.mem = SeedReplay(spec["max_size"], 32, num_envs=spec["num_envs"])
        np.random.seed(0)

    def add(self, s, a, r, ns, d):
        self.mem.update(s, a, r, ns, d)

    def sample(self, b):
        return self.mem.sample(b)


class CpprbPERSystem(System):
    """cpprb's PrioritizedReplayBuffer (C++, in RAM; alpha 0.6 as diskreplay's default):
    obs, act, rew, next_obs, done as in the cpprb peer (scripts/bench_peers.py); new rows get
    cpprb's running maximum priority; sample(b, beta=0.4) then update_priorities(indexes, errors)."""

    def create(self, spec, path):
        from cpprb import PrioritizedReplayBuffer

        shape, dtype = tuple(spec["state"]), np.dtype(spec["dtype"])
        self.spec = spec
        self.env_dict = {"obs": {"shape": shape, "dtype": dtype}, "act": {"dtype": np.int64}, "rew": {},
                         "next_obs": {"shape": shape, "dtype": dtype}, "done": {}}
        self.rb = PrioritizedReplayBuffer(spec["max_size"], self.env_dict, alpha=0.6)

    def touch(self):
        chunk, m = 1024, self.spec["max_size"]
        rows = {k: np.zeros((chunk,) + tuple(np.atleast_1d(v.get("shape", 1))), v.get("dtype", np.float32))
                for k, v in self.env_dict.items()}
        for start in range(0, m, chunk):
            self.rb.add(**{k: v[:min(chunk, m - start)] for k, v in rows.items()})
        self.rb.clear()

    def add(self, s, a, r, ns, d):
        self.rb.add(obs=s, act=a, rew=r, next_obs=ns, done=d)

    def sample_update(self, b, errors):
        batch = self.rb.sample(b, beta=0.4)
        self.rb.update_priorities(batch["indexes"], errors)
        return batch


class SLMPERSystem(System):
    """A faithful port of SLM-Lab's PrioritizedReplay (scripts/slm_per.py), in RAM."""

    def create(self, spec, path):
        self.mem = SLMPrioritizedReplay(spec["max_size"], 32, alpha=0.6, epsilon=1e-6, num_envs=spec["num_envs"])
        np.random.seed(0)
        random.seed(0)

    def add(self, s, a, r, ns, d):
        self.mem.update(s, a, r, ns, d)

    def sample_update(self, b, errors):
        batch = self.mem.sample(b)
        self.mem.update_priorities(errors)
        return batch


def make_system(name):
    if name in PEERS:
        return bench_peers.make_peer(name)
    return {"diskreplay-memmap": lambda: DiskReplaySystem("memmap"),
            "diskreplay-hdf5": lambda: DiskReplaySystem("hdf5"),
            "diskreplay-uniform": lambda: DiskReplaySystem("memmap", prioritized=False),
            "diskreplay-whole": lambda: DiskReplaySystem("memmap", frame_stack=False),
            "cpprb-per": CpprbPERSystem, "slm-per": SLMPERSystem,
            "numpy": NumpySystem, "np.memmap": MemmapSystem,
            "np.memmap+random": lambda: MemmapSystem(random=True),
            "seed": SeedSystem, "h5py-chunked": H5pyChunkedSystem}[name]()


def store_of(system_name):
    """W4 systems sample the store their W3 counterpart built."""
    return {"np.memmap+random": "np.memmap"}.get(system_name, system_name)


def unavailable(system_name):
    """Why a system cannot run here (None when it can): peers may not be installed."""
    if system_name == "cpprb-per":
        return bench_peers.missing("cpprb")
    return bench_peers.missing(system_name) if system_name in PEERS else None
