"""Benchmarks of diskreplay against baselines measured in the same run.

    .venv/bin/python scripts/bench.py                 # full run (W1-W4, a few minutes)
    .venv/bin/python scripts/bench.py --quick --json out.json

Workloads (DESIGN.md): W1 cartpole single adds and sampling at b=32/256; W2 16-env adds;
W3 atari (4x84x84 uint8, 8 envs) adds and warm sampling; W4 the W3 store sampled cold.
Systems: diskreplay (memmap, hdf5), the seed's in-RAM design (scripts/seed_replay.py),
plain numpy arrays in RAM (the limit), plain np.memmap files with fancy indexing, and
h5py fancy indexing on a chunked dataset (sampling only).

Every (workload, system) runs in its own process, ``--repeats`` times; the table gives the
median and the spread (min-max). Warm-up, the same for every system: storage is
preallocated and written over once before the timed adds (first-touch page faults are not
timed), and 200 untimed sample calls precede the timed ones. Ratios are against the seed
port and numpy-in-RAM from the same run. RssAnon is the process's peak anonymous memory
(VmHWM is not split by kind, so it is sampled at the end of each phase).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

FULL = {
    "W1": dict(state=(4,), dtype="float32", max_size=1_000_000, num_envs=1, steps=200_000, batches=(32, 256),
               sample_calls=5000),
    "W2": dict(state=(4,), dtype="float32", max_size=1_000_000, num_envs=16, steps=50_000, batches=(),
               sample_calls=0),
    "W3": dict(state=(4, 84, 84), dtype="uint8", max_size=100_000, num_envs=8, steps=12_500, batches=(32,),
               sample_calls=1000),
    "W4": dict(state=(4, 84, 84), dtype="uint8", max_size=100_000, num_envs=8, steps=12_500, batches=(32,),
               sample_calls=100),
}
QUICK = {
    "W1": dict(FULL["W1"], max_size=20_000, steps=5_000, sample_calls=200),
    "W2": dict(FULL["W2"], max_size=20_000, steps=500),
    "W3": dict(FULL["W3"], max_size=2_000, steps=250, sample_calls=50),
    "W4": dict(FULL["W4"], max_size=2_000, steps=250, sample_calls=10),
}
SYSTEMS = {
    "W1": ["diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"],
    "W2": ["diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap"],
    "W3": ["diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"],
    "W4": ["diskreplay-memmap", "diskreplay-hdf5", "np.memmap", "h5py-chunked"],
}


# ---------------------------------------------------------------- measurement helpers
def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def resident_pages(path: str) -> int:
    """Pages of ``path`` in the page cache (mincore on a fresh private mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        buf = ctypes.c_char.from_buffer(mm)
        try:
            if _libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del buf
        return sum(1 for v in vec if v & 1)
    finally:
        mm.close()


def drop_cache(files: list[str], mappings: list[mmap.mmap]) -> None:
    """Drop our own mappings' pages, then the page cache of every file; check nothing stays."""
    for mm in mappings:
        mm.madvise(mmap.MADV_DONTNEED)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def check_cold(files: list[str]) -> int:
    return sum(resident_pages(p) for p in files)


# ---------------------------------------------------------------- systems
class DiskReplaySystem:
    def __init__(self, backend):
        self.backend = backend

    def create(self, spec, path):
        from diskreplay import DiskReplay

        fields = {"states": (spec["state"], spec["dtype"]), "actions": ((), "int64"),
                  "rewards": ((), "float32"), "dones": ((), "bool")}
        self.path = path
        self.buf = DiskReplay.create(path, spec["max_size"], num_envs=spec["num_envs"], backend=self.backend,
                                     seed=0, fields=fields, overwrite=True)
        for arr in self.buf._storage.arrays.values():  # warm-up: first touch of every page
            arr[:] = 0

    def add(self, s, a, r, ns, d):
        self.buf.add(s, a, r, ns, d)

    def sample(self, b):
        return self.buf.sample(b)

    def finish_adds(self):
        self.buf.flush()

    def close(self):
        self.buf.close()

    def reopen(self):
        from diskreplay import DiskReplay

        t = time.perf_counter()
        self.buf = DiskReplay.open(self.path, mode="r+")
        return time.perf_counter() - t

    def cold_files(self):
        # meta.bin is left out: it is the one counter page every sample() writes (the sampler
        # position), so it is always dirty and resident, as it would be in training.
        return [os.path.join(self.path, n) for n in os.listdir(self.path) if n not in ("lock", "meta.bin")]

    def mappings(self):
        buf = self.buf
        return [f.mm for f in buf._storage.files] + [buf._ns_file.mm, buf._sums_file.mm, buf._counters.file.mm]


class NumpySystem:
    """Plain preallocated arrays in RAM, next states stored: the limit."""

    def create(self, spec, path):
        m, shape = spec["max_size"], spec["state"]
        self.n = spec["num_envs"]
        self.m = m
        self.states = np.zeros((m,) + shape, spec["dtype"])
        self.next_states = np.zeros((m,) + shape, spec["dtype"])
        self.actions = np.zeros(m, np.int64)
        self.rewards = np.zeros(m, np.float32)
        self.dones = np.zeros(m, bool)
        self.head = -1
        self.size = 0
        self.rng = np.random.default_rng(0)

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
            stop = start + n
            self.states[start:stop] = s
            self.actions[start:stop] = a
            self.rewards[start:stop] = r
            self.next_states[start:stop] = ns
            self.dones[start:stop] = d
            self.head = stop - 1
        self.size = min(self.size + n, self.m)

    def sample(self, b):
        idxs = self.rng.integers(0, self.size, b)
        return {"states": self.states[idxs], "actions": self.actions[idxs], "rewards": self.rewards[idxs],
                "next_states": self.next_states[idxs], "dones": self.dones[idxs]}

    def finish_adds(self):
        pass

    def close(self):
        pass


class MemmapSystem(NumpySystem):
    """Plain np.memmap files (next states stored), naive fancy indexing."""

    def create(self, spec, path):
        os.makedirs(path, exist_ok=True)
        self.path = path
        m, shape = spec["max_size"], spec["state"]
        self.n, self.m = spec["num_envs"], m

        def mm(name, shp, dt):
            return np.lib.format.open_memmap(os.path.join(path, name + ".npy"), "w+", dt, shp)

        self.states = mm("states", (m,) + shape, spec["dtype"])
        self.next_states = mm("next_states", (m,) + shape, spec["dtype"])
        self.actions = mm("actions", (m,), np.int64)
        self.rewards = mm("rewards", (m,), np.float32)
        self.dones = mm("dones", (m,), bool)
        for arr in (self.states, self.next_states, self.actions, self.rewards, self.dones):
            arr[:] = 0
        self.head, self.size = -1, 0
        self.rng = np.random.default_rng(0)

    def finish_adds(self):
        for arr in (self.states, self.next_states, self.actions, self.rewards, self.dones):
            arr.flush()

    def reopen(self):
        t = time.perf_counter()
        for name in ("states", "next_states", "actions", "rewards", "dones"):
            setattr(self, name, np.load(os.path.join(self.path, name + ".npy"), mmap_mode="r"))
        return time.perf_counter() - t

    def cold_files(self):
        return [os.path.join(self.path, n) for n in os.listdir(self.path)]

    def mappings(self):
        return [a._mmap for a in (self.states, self.next_states, self.actions, self.rewards, self.dones)]


class H5pyChunkedSystem(NumpySystem):
    """h5py fancy indexing on chunked datasets (sorted unique indices, then reordered)."""

    def create(self, spec, path):
        import h5py

        os.makedirs(path, exist_ok=True)
        self.path = os.path.join(path, "data.h5")
        m, shape = spec["max_size"], spec["state"]
        self.n, self.m = spec["num_envs"], m
        self.f = h5py.File(self.path, "w")
        chunk = max(1, (1 << 16) // int(np.prod(shape) * np.dtype(spec["dtype"]).itemsize))
        for name, shp, dt in (("states", shape, spec["dtype"]), ("next_states", shape, spec["dtype"]),
                              ("actions", (), np.int64), ("rewards", (), np.float32), ("dones", (), bool)):
            self.f.create_dataset(name, (m,) + shp, dt, chunks=(min(chunk, m),) + shp)
        self.head, self.size = -1, 0
        self.rng = np.random.default_rng(0)
        self.pending = []

    def add(self, s, a, r, ns, d):  # buffered: h5py adds are not what this baseline measures
        self.pending.append((s, a, r, ns, d))
        self.size = min(self.size + self.n, self.m)

    def finish_adds(self):
        cols = list(zip(*self.pending))
        self.pending = []
        for name, col in zip(("states", "actions", "rewards", "next_states", "dones"), cols):
            data = np.asarray(col)
            data = data.reshape((-1,) + data.shape[(2 if self.n > 1 else 1):])
            self.f[name][: len(data)] = data
        self.f.flush()

    def sample(self, b):
        idxs = self.rng.integers(0, self.size, b)
        uniq, inverse = np.unique(idxs, return_inverse=True)
        return {name: self.f[name][uniq][inverse] for name in ("states", "actions", "rewards", "next_states", "dones")}

    def close(self):
        self.f.close()

    def reopen(self):
        import h5py

        t = time.perf_counter()
        self.f = h5py.File(self.path, "r")
        return time.perf_counter() - t

    def cold_files(self):
        return [self.path]

    def mappings(self):
        return []


class SeedSystem(NumpySystem):
    def create(self, spec, path):
        sys.path.insert(0, HERE)
        from seed_replay import SeedReplay

        self.n = spec["num_envs"]
        self.mem = SeedReplay(spec["max_size"], 32, num_envs=self.n)
        np.random.seed(0)

    def add(self, s, a, r, ns, d):
        self.mem.update(s, a, r, ns, d)

    def sample(self, b):
        return self.mem.sample(b)


def make_system(name):
    return {"diskreplay-memmap": lambda: DiskReplaySystem("memmap"),
            "diskreplay-hdf5": lambda: DiskReplaySystem("hdf5"),
            "numpy": NumpySystem, "np.memmap": MemmapSystem, "seed": SeedSystem,
            "h5py-chunked": H5pyChunkedSystem}[name]()


# ---------------------------------------------------------------- one worker run
def step_data(spec):
    n, shape, dt = spec["num_envs"], spec["state"], np.dtype(spec["dtype"])
    rng = np.random.default_rng(1)
    if n == 1:
        s = rng.integers(0, 100, shape).astype(dt)
        return [(s, 1, 0.5, s, False)]
    s = rng.integers(0, 100, (n,) + shape).astype(dt)
    return [(s, np.ones(n, np.int64), np.full(n, 0.5, np.float32), s, np.zeros(n, bool))]


def run_worker(workload, system_name, spec, workdir):
    system = make_system(system_name)
    path = os.path.join(workdir, f"{workload}-{system_name}")
    result = {}
    system.create(spec, path)
    (s, a, r, ns, d), = step_data(spec)
    steps, n = spec["steps"], spec["num_envs"]
    t = time.perf_counter()
    for _ in range(steps):
        system.add(s, a, r, ns, d)
    elapsed = time.perf_counter() - t
    if workload != "W4" and system_name != "h5py-chunked":
        result["add_per_s"] = steps * n / elapsed
    system.finish_adds()
    if workload == "W4":
        system.close()
        result["open_s"] = system.reopen()
        os.sync()  # written-back pages only: POSIX_FADV_DONTNEED leaves dirty pages cached
        files, mappings = system.cold_files(), system.mappings()
        for _ in range(3):
            system.sample(32)
        times, bytes_read, resident = [], [], []
        for _ in range(spec["sample_calls"]):
            drop_cache(files, mappings)
            resident.append(check_cold(files))
            before = read_bytes()
            t = time.perf_counter()
            system.sample(32)
            times.append(time.perf_counter() - t)
            bytes_read.append(read_bytes() - before)
        result["cold_ms_per_batch"] = 1000 * statistics.median(times)
        result["sample32_per_s"] = 1 / statistics.median(times)
        result["cold_bytes_per_batch"] = statistics.median(bytes_read)
        result["resident_pages_before_batch"] = max(resident)
    else:
        if workload == "W3" and hasattr(system, "reopen"):
            system.close()
            result["open_s"] = system.reopen()
        for b in spec["batches"]:
            for _ in range(200 if spec["sample_calls"] >= 200 else 10):
                system.sample(b)
            t = time.perf_counter()
            for _ in range(spec["sample_calls"]):
                system.sample(b)
            result[f"sample{b}_per_s"] = spec["sample_calls"] / (time.perf_counter() - t)
    result["rss_anon_mb"] = rss_anon_bytes() / 2 ** 20
    system.close()
    return result


# ---------------------------------------------------------------- driver
def machine_facts():
    import h5py

    mem = ""
    with open("/proc/meminfo") as f:
        mem = f.readline().split()[1]
    return {"nproc": os.cpu_count(), "mem_gib": round(int(mem) / 2 ** 20, 1), "kernel": platform.release(),
            "python": platform.python_version(), "numpy": np.__version__, "h5py": h5py.__version__}


def run_all(sizes, repeats, workloads, workdir):
    results = {}
    for w in workloads:
        for system in SYSTEMS[w]:
            runs = []
            for _ in range(repeats):
                out = subprocess.run([sys.executable, __file__, "--worker", w, system, "--spec",
                                      json.dumps(sizes[w]), "--workdir", workdir],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"{w} {system} failed:\n{out.stderr}")
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            results.setdefault(w, {})[system] = summarize(runs)
            print(f"  {w} {system}: " + ", ".join(f"{k}={v['median']:.4g}" for k, v in results[w][system].items()),
                  file=sys.stderr)
            if w != "W3":
                shutil.rmtree(os.path.join(workdir, f"{w}-{system}"), ignore_errors=True)
    return results


def summarize(runs):
    keys = runs[0].keys()
    return {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs)} for k in keys}


def add_ratios(results):
    for w, systems in results.items():
        for name, metrics in systems.items():
            for key, value in metrics.items():
                for base in ("seed", "numpy", "np.memmap"):
                    ref = systems.get(base, {}).get(key)
                    if ref and ref["median"] and base != name and key.endswith("_per_s"):
                        value[f"x_{base}"] = value["median"] / ref["median"]
    return results


def print_table(results):
    print(f"{'workload':<5} {'system':<18} {'metric':<20} {'median':>11} {'spread':>21} "
          f"{'x seed':>7} {'x numpy':>7} {'x memmap':>8}")
    for w, systems in results.items():
        for name, metrics in systems.items():
            for key, v in metrics.items():
                spread = f"{v['min']:.4g}-{v['max']:.4g}"

                def ratio(base):
                    return f"{v[base]:.2f}" if base in v else "-"

                print(f"{w:<5} {name:<18} {key:<20} {v['median']:>11.4g} {spread:>21} "
                      f"{ratio('x_seed'):>7} {ratio('x_numpy'):>7} {ratio('x_np.memmap'):>8}")


def main(argv=None):
    parser = argparse.ArgumentParser(description="diskreplay benchmarks (see the module docstring)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--repeats", type=int, default=None, help="runs per system (default 3, quick 1)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--workdir", default=None, help="where stores are written (default: a temp dir)")
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "SYSTEM"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.spec)
        spec["state"] = tuple(spec["state"])
        spec["batches"] = tuple(spec["batches"])
        print(json.dumps(run_worker(args.worker[0], args.worker[1], spec, args.workdir)))
        return
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 3)
    workloads = [w.strip() for w in args.workloads.split(",")]
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    workdir = args.workdir or tempfile.mkdtemp(prefix="diskreplay-bench-", dir=os.getcwd() if args.quick else None)
    # W4 samples the store W3 built; run W3 first when both are asked for.
    try:
        results = add_ratios(run_all(sizes, repeats, workloads, workdir))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_facts(), "quick": args.quick, "repeats": repeats,
                       "sizes": sizes, "results": results}, f, indent=1, default=list)


if __name__ == "__main__":
    main()
