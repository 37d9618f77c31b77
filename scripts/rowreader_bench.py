"""RowReader variants on one W3-sized store, cold and warm (a helper of scripts/bench.py).

    .venv/bin/python scripts/rowreader_bench.py STORE [--batches 60]

STORE is a diskreplay store with 4x84x84 uint8 states (e.g. one that scripts/bench.py
built with --workdir; or build one: --build STORE). For each batch of 32 sampled indices
every variant gathers states, next states and the small fields; variants take turns
batch by batch (so a burst of load from elsewhere hits all of them alike). Cold: before
each gather the store's pages are dropped as in bench.py W4 and checked with mincore.
Warm: the same rows, read again at once. Prints median ms per batch and MB read.
--keep-small drops only states.npy: the small fields stay in the page cache, as they do
in training (13 bytes a row against 28 KB).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import bench_measure  # scripts/, this script's directory, is on sys.path
import bench_systems
import bench_workloads
from diskreplay import DiskReplay
from diskreplay.core import ring
from diskreplay.disk.rowreader import RowReader


def requests_for(buf, idxs):
    session = buf._session
    ns_slots, _, _ = ring.next_state_sources(idxs, buf.head, buf.max_size, buf.num_envs)
    loc, fields = session.storage.locations, session.fields
    st = fields["states"]
    reqs = [loc["states"] + (np.concatenate([idxs, ns_slots]), np.empty((2 * len(idxs),) + st.shape, st.dtype))]
    for name, spec in fields.items():
        if name != "states":
            reqs.append(loc[name] + (idxs, np.empty((len(idxs),) + spec.shape, spec.dtype)))
    return reqs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--build", action="store_true", help="build a W3 store at STORE first")
    p.add_argument("--keep-small", action="store_true",
                   help="drop only the states' pages (small fields stay cached, as in real training)")
    args = p.parse_args()
    if args.build:
        system = bench_systems.DiskReplaySystem("memmap")
        system.create(bench_workloads.FULL["W3"], args.store)
        bench_workloads.fill(system, bench_workloads.FULL["W3"])
        system.close()
        os.sync()
    buf = DiskReplay.open(args.store, mode="r")
    files = bench_measure.store_files(args.store)
    checked = [f for f in files if os.path.basename(f) not in ("meta.bin", "lock")]
    if args.keep_small:  # memmap stores: states.npy only (an hdf5 store holds every field in one file)
        files = checked = [f for f in files if os.path.basename(f) == "states.npy"]
    mappings = [m for f in buf._session.mapped_files for m in f.maps]
    variants = {
        "store.sample()-like (states pread, small fields page faults)": None,
        "threads=16 plain": RowReader(16, nowait=False, hint=False),
        "threads=32 plain": RowReader(32, nowait=False, hint=False),
        "threads=16 nowait": RowReader(16, nowait=True, hint=False),
        "threads=16 nowait+hint": RowReader(16, nowait=True, hint=True),
        "threads=8 nowait+hint": RowReader(8, nowait=True, hint=True),
        "threads=32 nowait+hint": RowReader(32, nowait=True, hint=True),
    }
    store_reader = RowReader(16, nowait=False, hint=False)
    cold = {k: [] for k in variants}
    warm = {k: [] for k in variants}
    nbytes = {k: [] for k in variants}
    rng = np.random.default_rng(0)
    size = len(buf)
    for _ in range(args.batches):
        idxs = rng.integers(0, size, 32)
        for name, reader in variants.items():
            for phase in ("cold", "warm"):
                if phase == "cold":
                    bench_measure.drop_cache(files, mappings)
                    assert sum(bench_measure.resident_pages(f) for f in checked) == 0
                reqs = requests_for(buf, idxs)
                before = bench_measure.read_bytes()
                t = time.perf_counter()
                if reader is None:  # what Gatherer._gather_large did before gather_many
                    arrays = buf._session.storage.gather_arrays
                    futs = [store_reader.submit(arrays[n].take, idxs, 0) for n in ("actions", "rewards", "dones")]
                    store_reader.gather_many(reqs[:1])
                    [f.result() for f in futs]
                else:
                    reader.gather_many(reqs)
                elapsed = time.perf_counter() - t
                (cold if phase == "cold" else warm)[name].append(elapsed)
                if phase == "cold":
                    nbytes[name].append(bench_measure.read_bytes() - before)
    print(f"{'variant':<62} {'cold ms':>8} {'cold/s':>7} {'MB':>5} {'warm ms':>8}")
    for name in variants:
        c = statistics.median(cold[name])
        print(f"{name:<62} {1e3 * c:8.2f} {1 / c:7.0f} {statistics.median(nbytes[name]) / 1e6:5.2f} "
              f"{1e3 * statistics.median(warm[name]):8.3f}")
    for reader in variants.values():
        if reader is not None:
            reader.close()
    store_reader.close()
    buf.close()


if __name__ == "__main__":
    main()
