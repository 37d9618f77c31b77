"""Benchmarks of diskreplay against baselines measured in the same run (docs/benchmarks.md).

    .venv/bin/python scripts/bench.py --json bench.json        # full run, about 10 minutes
    .venv/bin/python scripts/bench.py --quick --json out.json  # tiny sizes, seconds (the test suite)
    .venv/bin/python scripts/bench.py --workloads W1,W2 --repeats 5
    .venv/bin/python scripts/bench.py --workloads W5            # prioritized replay only
    .venv/bin/python scripts/bench.py --scaling --json s.json --plot s.png  # costs against store size
                                                                          # (scripts/bench_scaling.py)
    .venv/bin/python scripts/bench.py --cli-stream --slots 100000 --json c.json  # stats, plot and
                                        # export streaming a cold store (scripts/bench_stream.py)

Workloads (docs/benchmarks.md, "Workloads"): W1 cartpole single adds, then sampling at
b=32/256; W2 16-env adds;
W3 atari (4x84x84 uint8, 8 envs) adds, reopen and warm sampling; W4 the W3 stores sampled
cold (each system's own store from W3, built if missing). W1x: W1 plus two extra fields
(``truncateds`` bool, ``log_probs`` float32), adds against numpy. W3lat: W3's frames in a ring
of 25,000 slots that wraps 4 times, every add timed alone: p50/p99/p99.9/max latency. W3pace:
the same in a ring of 10,000 slots, with a 1.5 ms ``time.sleep`` before each add (an env or
learner step between adds; adds then come slower than the disk writes them).
W6 atari-stacked: W3's shapes created with ``frame_stack=4`` and filled with real overlapping
stacks (``stacked_steps``: episodes of 10 to 500 steps), adds and warm sampling, and the disk
bytes per transition (W3's too); W6cold samples W6's store cold as W4 samples W3's.
"diskreplay-whole" takes W6's steps into a memmap store of whole states (no frame_stack): the
like-for-like baseline (W3 adds one step over and over, always in the CPU cache; W6's cycle
of distinct steps is not).
W5 prioritized: W1's store created with ``prioritized=True``, its adds, then a loop of
``sample(32)`` and ``update_priorities`` of those 32 indices (errors from a fixed table),
against cpprb's ``PrioritizedReplayBuffer`` (C++, in RAM; ``sample(32, beta=0.4)`` then
``update_priorities(indexes, errors)``), a faithful port of SLM-Lab's ``PrioritizedReplay``
(scripts/slm_per.py, in RAM) and the uniform W1 store's adds of the same run
(``diskreplay-uniform``): ratios ``x_cpprb-per``, ``x_slm-per``, ``x_diskreplay-uniform``.

Systems: diskreplay on both backends; the seed's in-RAM design (scripts/seed_replay.py);
plain preallocated numpy arrays in RAM, next states stored (the limit); plain np.memmap
files with naive fancy indexing; h5py fancy indexing on chunked datasets (sorted unique
indices, then reordered; sampling only, its adds are written in blocks and not timed).
W4 adds "np.memmap+random" (np.memmap with MADV_RANDOM mappings). Other libraries (the
`[bench]` extra; scripts/bench_peers.py says how each is used): SB3's ReplayBuffer with and
without optimize_memory_usage, cpprb's ReplayBuffer, TorchRL's ReplayBuffer on
LazyTensorStorage and on LazyMemmapStorage (W4 too); torch with one thread. One that is not
installed is skipped with a line saying so. Every diskreplay figure is also given as a ratio
to the best of them on its line (x_best_peer).

Method: every (workload, system, repeat) is its own process; repeats go round-robin over
the systems, so a burst of load from elsewhere spreads over all of them. Reported: the
median over repeats and the spread (min-max). Warm-up, the same for every system:
  * storage is preallocated and every page is written once (zeros) before any add, so no
    first-touch page fault is timed (the seed port has nothing to preallocate: allocating
    a fresh float16 array per add is its design);
  * the first 10% of a workload's adds are untimed, the rate is over the other 90%;
  * sampling: a fixed number of untimed calls (200; 20 in --quick) before the timed ones
    (a fixed number too, or 3 s, whichever ends first: h5py is a thousand times slower).
W4, before every timed batch: madvise(MADV_DONTNEED) on all of the process's mappings of
the store, os.sync() once after building, then posix_fadvise(POSIX_FADV_DONTNEED) on
every file of the store; mincore (libc via ctypes, on a fresh mapping) then counts the
pages of the store's files still resident: none, except meta.bin (the store's one-page
counter record, written by every sample(); not counted) and, for diskreplay, the byte
ranges of the small fields that its cold path keeps in RAM (mapped and locked: the drop
cannot evict them; not counted, ``pinned_pages`` gives their size in pages). Bytes read per
batch are /proc/self/io read_bytes, read calls per batch its syscr (every read, pread and
preadv the batch made, those answered from the page cache included).
Where fio is installed, W4 also measures the disk's limit for its reads, once a round, on
the W3 memmap store's frames (scripts/bench_fio.py: random row reads at depth 32 through
io_uring, buffered and direct; and buffered a batch of 64 at a time, as a cold batch must
read), and gives W4 as a fraction of it (x_fio_buffered, x_fio_direct, x_fio_batch).
W4 also runs a training loop with a simulated compute step (time.sleep) with and without
diskreplay.core.prefetch.Prefetcher (the drop of the page cache is part of each sample call),
and on the store's own batches(32, prefetch=2), which reads the next batch ahead: there the
cache is dropped once before the loop, the bytes read per batch show the rows still come
from the disk, and learner_wait_pct is what a step costs beyond its compute (a share of it).
RssAnon (from /proc/self/status) is sampled at the end of every phase; the maximum is
reported. Ratios divide a system's median by a baseline's median from the same run.
Peers whose mapping objects are out of reach have their mappings of the store found in
/proc/self/maps for the W4 drop.
"""
from __future__ import annotations

import argparse
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

import bench_fio  # scripts/, this script's directory, is on sys.path
import bench_peers
from bench_measure import Peak, drop_cache, io_counts, proc_mappings, read_bytes, resident_pages, store_files
from bench_peers import PEERS
from bench_results import add_ratios, goals, goals_table, stacked_table, summarize, table, w5_table
from bench_systems import DiskReplaySystem, H5pyChunkedSystem, make_system, store_of, unavailable

HERE = os.path.dirname(os.path.abspath(__file__))

FULL = {
    "W1": dict(state=[4], dtype="float32", max_size=1_000_000, num_envs=1, steps=200_000, batches=[32, 256],
               sample_calls=5000, sample_warmup=200),
    "W2": dict(state=[4], dtype="float32", max_size=1_000_000, num_envs=16, steps=50_000, batches=[],
               sample_calls=0, sample_warmup=0),
    "W3": dict(state=[4, 84, 84], dtype="uint8", max_size=100_000, num_envs=8, steps=12_500, batches=[32],
               sample_calls=2000, sample_warmup=200),
    "W4": dict(state=[4, 84, 84], dtype="uint8", max_size=100_000, num_envs=8, steps=12_500, batches=[32],
               sample_calls=100, sample_warmup=3, loop_batches=60, compute_ms=4.0, prefetch=2),
    # W1 plus two extra fields (issue 19 item 4): the add path with extras against numpy
    "W1x": dict(state=[4], dtype="float32", max_size=1_000_000, num_envs=1, steps=200_000, batches=[32],
                sample_calls=5000, sample_warmup=200, extras={"truncateds": "bool", "log_probs": "float32"}),
    # W3's frames in a ring that wraps 4 times: every add timed alone (latency percentiles)
    "W3lat": dict(state=[4, 84, 84], dtype="uint8", max_size=25_000, num_envs=8, steps=12_500, batches=[],
                  sample_calls=0, sample_warmup=0, latency=True),
    # W3lat with a 1.5 ms pause before each add (time.sleep, which releases the GIL as an env
    # step or a learner step does): adds slower than the disk can write twice their bytes
    "W3pace": dict(state=[4, 84, 84], dtype="uint8", max_size=10_000, num_envs=8, steps=5_000, batches=[],
                   sample_calls=0, sample_warmup=0, latency=True, pace_ms=1.5),
    # W1 prioritized (issue 16): adds, then sample(32) + update_priorities of those 32
    "W5": dict(state=[4], dtype="float32", max_size=1_000_000, num_envs=1, steps=200_000, batches=[],
               sample_calls=5000, sample_warmup=200, prioritized=True),
    # W3's shapes as real frame stacks (issue 17): frame_stack=4, every state continuing its
    # env's previous one except where an episode ends (lengths uniform in `episode`) and at
    # the end of a cycle of `cycle` precomputed steps (every env starts anew there)
    "W6": dict(state=[4, 84, 84], dtype="uint8", max_size=100_000, num_envs=8, steps=12_500, batches=[32],
               sample_calls=2000, sample_warmup=200, frame_stack=4, episode=[10, 500], cycle=256),
    # W6's store sampled cold, as W4 samples W3's
    "W6cold": dict(state=[4, 84, 84], dtype="uint8", max_size=100_000, num_envs=8, steps=12_500, batches=[32],
                   sample_calls=100, sample_warmup=3, loop_batches=60, compute_ms=4.0, prefetch=2, frame_stack=4,
                   episode=[10, 500], cycle=256),
}
QUICK = {
    "W1": dict(FULL["W1"], max_size=20_000, steps=5_000, sample_calls=300, sample_warmup=20),
    "W2": dict(FULL["W2"], max_size=20_000, steps=500),
    "W3": dict(FULL["W3"], max_size=2_000, steps=250, sample_calls=50, sample_warmup=20),
    "W4": dict(FULL["W4"], max_size=2_000, steps=250, sample_calls=10, loop_batches=5),
    "W1x": dict(FULL["W1x"], max_size=20_000, steps=5_000, sample_calls=300, sample_warmup=20),
    "W3lat": dict(FULL["W3lat"], max_size=400, steps=200),
    "W3pace": dict(FULL["W3pace"], max_size=400, steps=200),
    "W5": dict(FULL["W5"], max_size=20_000, steps=5_000, sample_calls=300, sample_warmup=20),
    "W6": dict(FULL["W6"], max_size=2_000, steps=250, sample_calls=50, sample_warmup=20, cycle=64),
    "W6cold": dict(FULL["W6cold"], max_size=2_000, steps=250, sample_calls=10, loop_batches=5, cycle=64),
}
SYSTEMS = {
    "W1": ["diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked", *PEERS],
    "W2": ["diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", *PEERS],
    "W3": ["diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked", *PEERS],
    "W4": ["diskreplay-memmap", "diskreplay-hdf5", "np.memmap", "np.memmap+random", "h5py-chunked",
           "torchrl-memmap"],
    "W1x": ["diskreplay-memmap", "diskreplay-hdf5", "numpy"],
    "W3lat": ["diskreplay-memmap", "diskreplay-hdf5", "numpy", "np.memmap"],
    "W3pace": ["diskreplay-memmap", "diskreplay-hdf5", "numpy", "np.memmap"],
    "W5": ["diskreplay-memmap", "diskreplay-hdf5", "diskreplay-uniform", "cpprb-per", "slm-per"],
    "W6": ["diskreplay-memmap", "diskreplay-hdf5", "diskreplay-whole"],
    "W6cold": ["diskreplay-memmap", "diskreplay-hdf5", "diskreplay-whole"],
}
WORKLOADS = ("W1", "W2", "W3", "W4", "W1x", "W3lat", "W3pace", "W5", "W6", "W6cold")  # the run order: W4 samples W3's stores
COLD_OF = {"W4": "W3", "W6cold": "W6"}  # cold workloads and the workload whose stores they sample
TIME_CAP = 3.0  # seconds: slow systems stop their timed sampling loop early


# ---------------------------------------------------------------- one worker run
def step_data(spec):
    n, shape, dt = spec["num_envs"], tuple(spec["state"]), np.dtype(spec["dtype"])
    rng = np.random.default_rng(1)
    if n == 1:
        s = rng.integers(0, 100, shape).astype(dt)
        if spec.get("extras"):
            return s, 1, 0.5, s, False, {"truncateds": False, "log_probs": np.float32(-0.5)}
        return s, 1, 0.5, s, False
    s = rng.integers(0, 100, (n,) + shape).astype(dt)
    return s, np.ones(n, np.int64), np.full(n, 0.5, np.float32), s, np.zeros(n, bool)


def fill(system, spec, result=None, peak=None):
    """Create, touch every page, add ``steps`` steps (the first 10% untimed)."""
    system.touch()
    if peak:
        peak()
    if spec.get("frame_stack"):
        return fill_stacked(system, spec, result, peak)
    step = system.prepare(*step_data(spec))  # the library's own input form, untimed
    steps, n = spec["steps"], spec["num_envs"]
    add = system.add_extra if spec.get("extras") else system.add
    if spec.get("latency") and result is not None:
        add_latencies(add, step, steps, n, spec["max_size"], result, spec.get("pace_ms", 0) / 1000)
        system.finish_adds()
        return
    warm = steps // 10
    for _ in range(warm):
        add(*step)
    t = time.perf_counter()
    for _ in range(steps - warm):
        add(*step)
    elapsed = time.perf_counter() - t
    if result is not None:
        result["add_per_s"] = (steps - warm) * n / elapsed
    if peak:
        peak()
    system.finish_adds()


def stacked_steps(spec):
    """W6's steps: one cycle of ``cycle`` env steps of ``num_envs`` frame-stacked envs whose
    frames advance (random frames) and whose episodes end after lengths uniform in
    ``episode`` (a first state repeats its first frame, as ``FrameStackObservation`` pads).
    Frames and episode ends repeat with the cycle's period, so the cycle runs on seamlessly
    (its end is no reset). A step's states are the previous step's next states (the same
    array where no env ended)."""
    n, k, frame, cycle = spec["num_envs"], spec["frame_stack"], tuple(spec["state"][1:]), spec["cycle"]
    lo, hi = spec["episode"]
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (n, cycle) + frame, dtype=np.uint8)  # env e's frame at step i
    starts = np.empty((n, cycle), np.int64)  # the step its episode started (may be before 0)
    for e in range(n):
        offset = pos = int(rng.integers(0, cycle))
        first = []  # the steps where its episodes start, periodic with the cycle
        while pos - offset < cycle:
            first.append(pos % cycle)
            pos += int(rng.integers(lo, hi + 1))
        first.sort()
        for i in range(cycle):
            before = [b for b in first if b <= i]
            starts[e, i] = before[-1] if before else first[-1] - cycle

    def stack(e, start, i):  # the k newest frames at step i of the episode begun at ``start``
        return frames[e, [max(start, i - k + 1 + j) % cycle for j in range(k)]]
    states = [np.stack([stack(e, starts[e, i], i) for e in range(n)]) for i in range(cycle)]
    actions, rewards = np.ones(n, np.int64), np.full(n, 0.5, np.float32)
    steps = []
    for i in range(cycle):
        after = (i + 1) % cycle
        ended = np.array([starts[e, after] == after for e in range(n)])  # env e starts anew next step
        if ended.any():
            nxt = np.stack([stack(e, starts[e, i], i + 1) for e in range(n)])  # final states continue
        else:
            nxt = states[after]
        steps.append((states[i], actions, rewards, nxt, ended))
    return steps


def fill_stacked(system, spec, result=None, peak=None):
    """``fill`` for W6: the steps of ``stacked_steps`` in a cycle (the first 10% untimed);
    then the store's disk use per transition (blocks allocated, all files)."""
    steps = [system.prepare(*step) for step in stacked_steps(spec)]
    count, n, add = spec["steps"], spec["num_envs"], system.add
    warm = count // 10
    for i in range(warm):
        add(*steps[i % len(steps)])
    t = time.perf_counter()
    for i in range(warm, count):
        add(*steps[i % len(steps)])
    elapsed = time.perf_counter() - t
    if result is not None:
        result["add_per_s"] = (count - warm) * n / elapsed
    if peak:
        peak()
    system.finish_adds()


def disk_bytes_per_transition(path, spec):
    blocks = sum(os.stat(p).st_blocks for p in store_files(path))
    return 512 * blocks / min(spec["steps"] * spec["num_envs"], spec["max_size"])


def add_latencies(add, step, steps, n, max_size, result, pace_s=0.0):
    """Every add timed alone, the ring wrapping ``steps * n / max_size`` times: percentiles in
    us. ``pace_s``: an untimed ``time.sleep`` before each add (W3pace)."""
    clock = time.perf_counter_ns
    lat = np.empty(steps, np.int64)
    for i in range(steps):
        if pace_s:
            time.sleep(pace_s)
        t = clock()
        add(*step)
        lat[i] = clock() - t
    us = lat / 1000
    result["wraps"] = steps * n / max_size
    for q, key in ((50, "add_p50_us"), (99, "add_p99_us"), (99.9, "add_p999_us")):
        result[key] = float(np.percentile(us, q))
    result["add_max_us"] = float(us.max())
    result["adds_over_1ms"] = float(np.count_nonzero(us > 1000))
    result["add_per_s"] = steps * n / (lat.sum() / 1e9)


def run_worker(workload, system_name, spec, workdir):
    if workload in COLD_OF:
        return run_cold_worker(system_name, spec, workdir, COLD_OF[workload])
    system = make_system(system_name)
    path = os.path.join(workdir, f"{workload}-{system_name}")
    result, peak = {}, Peak()
    system.create(spec, path)
    fill(system, spec, result, peak)
    if system_name == "h5py-chunked":
        del result["add_per_s"]  # written in blocks: not what this baseline measures
    if workload in ("W3", "W6") and system_name.startswith("diskreplay"):  # W3, W6 and W6's whole-state store
        result["disk_bytes_per_transition"] = disk_bytes_per_transition(path, spec)
    if workload in ("W3", "W6") and system.path is not None:
        system.spec = spec
        system.close()
        result["open_s"] = system.reopen()
    for b in spec["batches"]:
        result[f"sample{b}_per_s"] = sample_rate(system.sample, b, spec)
        peak()
    if workload == "W5" and hasattr(system, "sample_update") and system_name != "diskreplay-uniform":
        errors = np.random.default_rng(2).random((64, 32))
        calls = iter(range(1 << 62))
        result["sample32_update_per_s"] = sample_rate(
            lambda b: system.sample_update(b, errors[next(calls) % 64]), 32, spec)
        peak()
    result["rss_anon_mb"] = peak.value / 2 ** 20
    system.close()
    return result


def sample_rate(sample, b, spec):
    """Batches/s over ``sample_calls`` timed calls (or ``TIME_CAP`` seconds, whichever ends
    first) after ``sample_warmup`` untimed calls."""
    for _ in range(spec["sample_warmup"]):
        sample(b)
    t = time.perf_counter()
    calls = 0
    while calls < spec["sample_calls"]:
        sample(b)
        calls += 1
        if not calls % 16 and time.perf_counter() - t > TIME_CAP:
            break
    return calls / (time.perf_counter() - t)


def run_cold_worker(system_name, spec, workdir, source="W3"):
    from diskreplay.core.prefetch import Prefetcher

    system = make_system(system_name)
    system.spec = spec
    path = os.path.join(workdir, f"{source}-{store_of(system_name)}")
    result, peak = {}, Peak()
    if not os.path.exists(path):  # W4 (W6cold) alone: build W3's (W6's) store first (untimed)
        system.create(spec, path)
        fill(system, spec)
        system.close()
        if isinstance(system, DiskReplaySystem):
            system = make_system(system_name)
            system.path = path
            system.spec = spec
    else:
        system.path = path if not isinstance(system, H5pyChunkedSystem) else os.path.join(path, "data.h5")
    os.sync()  # POSIX_FADV_DONTNEED leaves dirty pages cached: write everything back first
    if isinstance(system, H5pyChunkedSystem):
        result["open_s"] = system.reopen(cold=True)
    else:
        result["open_s"] = system.reopen()
    files = store_files(path)
    # peers' mapping objects are out of reach: their mappings of the store, from /proc/self/maps
    checked, mappings = system.checked_files(), system.mappings() or proc_mappings(files)
    sample = system.sample
    for _ in range(spec["sample_warmup"]):
        sample(32)
    peak()
    times, nbytes, calls, resident, drops = [], [], [], [], []
    for _ in range(spec["sample_calls"]):
        t = time.perf_counter()
        drop_cache(files, mappings)
        drops.append(time.perf_counter() - t)
        pinned = system.pinned_ranges() if isinstance(system, DiskReplaySystem) else {}
        resident.append(sum(resident_pages(p, pinned.get(os.path.realpath(p), ())) for p in checked))
        before = io_counts()
        t = time.perf_counter()
        sample(32)
        times.append(time.perf_counter() - t)
        after = io_counts()
        nbytes.append(after[0] - before[0])
        calls.append(after[1] - before[1])
    peak()
    med = statistics.median(times)
    result["cold_ms_per_batch"] = 1000 * med
    result["sample32_per_s"] = 1 / med
    result["cold_bytes_per_batch"] = statistics.median(nbytes)
    result["cold_read_calls_per_batch"] = statistics.median(calls)
    result["resident_pages_before_batch"] = max(resident)
    if isinstance(system, DiskReplaySystem):
        result["pinned_pages"] = sum(-(-pin.nbytes // mmap.PAGESIZE) for pin in system.buf._session.gatherer.pins)
    result["drop_ms"] = 1000 * statistics.median(drops)
    if system_name.startswith("diskreplay"):
        compute = spec["compute_ms"] / 1000

        def cold_sample():
            drop_cache(files, mappings)
            return sample(32)

        t = time.perf_counter()
        for _ in range(spec["loop_batches"]):
            cold_sample()
            time.sleep(compute)
        serial = (time.perf_counter() - t) / spec["loop_batches"]
        with Prefetcher(cold_sample, prefetch=spec["prefetch"]) as batches:
            next(batches)  # the pipeline fills once, as at the start of training
            t = time.perf_counter()
            for _ in range(spec["loop_batches"]):
                next(batches)
                time.sleep(compute)
            ahead = (time.perf_counter() - t) / spec["loop_batches"]
        peak()
        result["loop_ms_serial"] = 1000 * serial
        result["loop_ms_prefetch"] = 1000 * ahead
        result["loop_prefetch_speedup"] = serial / ahead
        result.update(batches_loop(system.buf, spec, files, mappings))
        peak()
    result["rss_anon_mb"] = peak.value / 2 ** 20
    system.close()
    return result


def batches_loop(buf, spec, files, mappings):
    """The learner's loop on the store's own ``batches(32, prefetch=2)`` (which starts the
    next batch's reads while it hands over one, where the Prefetcher around ``cold_sample``
    above cannot: its drop would evict them): the page cache dropped once before the loop,
    not before each batch, so rows read ahead stay; ``loop_bytes_per_batch`` (/proc/self/io
    over the loop, per batch drawn, one more for the batch read ahead) shows the batches still come from the disk (a batch
    meets a row read before about loop_batches * 64 / max_size of the time: 4% at the end
    of W4's 60). ``learner_wait_pct``: what a step costs beyond its 4 ms, as a share of them
    (the time in ``next()``, ``in_next_pct``, plus the GIL taken back after the sleep and the
    sleep's own overshoot)."""
    compute, steps = spec["compute_ms"] / 1000, spec["loop_batches"]
    drop_cache(files, mappings)
    sampler = buf._session.sampler
    before, waited, draws = read_bytes(), 0.0, sampler.draws
    with buf.batches(32, prefetch=spec["prefetch"]) as batches:
        next(batches)  # the pipeline fills once, as at the start of training
        t = time.perf_counter()
        for _ in range(steps):
            w = time.perf_counter()
            next(batches)
            waited += time.perf_counter() - w
            time.sleep(compute)
        loop = (time.perf_counter() - t) / steps
    drawn = (sampler.draws - draws) // 32  # the thread draws ahead of the learner (prefetch)
    return {"loop_ms_batches": 1000 * loop, "learner_wait_pct": 100 * (loop - compute) / compute,
            "in_next_pct": 100 * waited / (steps * compute), "loop_bytes_per_batch": (read_bytes() - before) / (drawn + 1)}  # + the one read ahead


# ---------------------------------------------------------------- driver
def machine_facts(workdir):
    import h5py

    facts = {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
             "numpy": np.__version__, "h5py": h5py.__version__, "peers": peer_versions()}
    with open("/proc/meminfo") as f:
        facts["mem_gib"] = round(int(f.readline().split()[1]) / 2 ** 20, 1)
    try:
        with open("/proc/cpuinfo") as f:
            facts["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        dev = os.stat(workdir).st_dev
        name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
        q = f"/sys/block/{name}/queue"
        facts["disk"] = {"device": name, "rotational": _read(f"{q}/rotational"),
                         "read_ahead_kb": _read(f"{q}/read_ahead_kb"), "scheduler": _read(f"{q}/scheduler")}
        with open("/proc/mounts") as f:
            best = ""
            for line in f:
                dev_, mnt, fstype = line.split()[:3]
                if os.path.realpath(workdir).startswith(mnt) and len(mnt) >= len(best):
                    best, facts["disk"]["fs"] = mnt, fstype
    except OSError:
        pass
    return facts


def peer_versions():
    from importlib import metadata

    found = {}
    for dist in ("stable-baselines3", "cpprb", "torchrl", "tensordict", "torch", "gymnasium"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def git_state():
    """The commit measured, and the library files that differed from it (others may be editing)."""
    root = os.path.dirname(HERE)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "diskreplay"], cwd=root,
                               capture_output=True, text=True).stdout.split("\n")
        return {"commit": commit, "uncommitted": sorted(line[3:] for line in dirty if line.strip())}
    except OSError:
        return {}


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def run_all(sizes, repeats, workloads, workdir, log, skipped, only=None):
    results = {}
    order = [w for w in WORKLOADS if w in workloads]
    for w in order:
        systems = []
        for system in SYSTEMS[w]:
            if only is not None and system not in only:
                continue
            why = unavailable(system)
            if why:
                skipped.setdefault(system, why)
                log(f"  {w} {system}: skipped, {why}")
            else:
                systems.append(system)
        runs = {system: [] for system in systems}
        fio_runs = []
        for rep in range(repeats):
            for system in systems:
                t = time.perf_counter()
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", w, system, "--spec",
                                      json.dumps(sizes[w]), "--workdir", workdir], capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"{w} {system} failed:\n{out.stderr}")
                runs[system].append(json.loads(out.stdout.strip().splitlines()[-1]))
                log(f"  {w} {system} run {rep + 1}/{repeats} ({time.perf_counter() - t:.1f} s): "
                    + ", ".join(f"{k}={v:.4g}" for k, v in runs[system][-1].items()))
            if w == "W4":  # the disk's limit for the same reads, once a round (bench_fio.py)
                fio_runs += disk_limit(workdir, log, skipped)
        if fio_runs:
            runs["fio"] = fio_runs
        results[w] = {system: summarize(r) for system, r in runs.items()}
        if not any(COLD_OF[cold] == w and cold in workloads for cold in COLD_OF):
            for system in systems:
                shutil.rmtree(os.path.join(workdir, f"{w}-{system}"), ignore_errors=True)
    return results


def disk_limit(workdir, log, skipped) -> list:
    """fio on the W3 memmap store's frames (``bench_fio.measure``), or nothing, noted why."""
    states = os.path.join(workdir, "W3-diskreplay-memmap", "states.npy")
    why = bench_fio.unavailable() or (None if os.path.exists(states) else "no W3 diskreplay-memmap store in this run")
    if not why:
        try:
            found = bench_fio.measure(states)
        except (RuntimeError, OSError, ValueError) as exc:
            why = str(exc)
        else:
            log("  W4 fio: " + ", ".join(f"{k}={v:.4g}" for k, v in found.items()))
            return [found]
    if "fio" not in skipped:
        skipped["fio"] = why
        log(f"  W4 fio: skipped, {why}")
    return []


def main_scaling(args, argv):
    import bench_scaling

    shapes = [s.strip() for s in args.shapes.split(",")]
    if set(shapes) - set(bench_scaling.SHAPES):
        raise SystemExit(f"--shapes: unknown shape(s) {', '.join(sorted(set(shapes) - set(bench_scaling.SHAPES)))}")
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="diskreplay-scaling-", dir=args.workdir)
    started, code = time.perf_counter(), git_state()
    try:
        results, skipped = bench_scaling.run(args.quick, workdir, lambda m: print(m, file=sys.stderr), shapes)
        facts = machine_facts(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(bench_scaling.table(results))
    for line in bench_scaling.spreads(results):
        print(line)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if args.plot:
        bench_scaling.plot(results, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": facts, "code": code, "command": " ".join(["scripts/bench.py"] + (argv or sys.argv[1:])),
                       "quick": args.quick, "scaling": results, "skipped": skipped,
                       "wall_s": time.perf_counter() - started}, f, indent=1)


def main_stream(args, argv):
    import bench_stream

    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="diskreplay-stream-", dir=args.workdir)
    started, code = time.perf_counter(), git_state()
    slots = args.slots or (2_000 if args.quick else 100_000)
    try:
        results = bench_stream.run(workdir, slots, args.backend, log=lambda m: print(m, file=sys.stderr),
                                   repeats=args.repeats or 1, against=args.against,
                                   commands=args.commands.split(",") if args.commands else None)
        facts = machine_facts(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(bench_stream.table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": facts, "code": code, "command": " ".join(["scripts/bench.py"] + (argv or sys.argv[1:])),
                       "quick": args.quick, "cli_stream": results, "wall_s": time.perf_counter() - started}, f,
                      indent=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description="diskreplay benchmarks (see the module docstring)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds (the test suite runs this)")
    parser.add_argument("--repeats", type=int, default=None, help="processes per system (default 3, quick 1)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W1x,W3lat,W3pace,W5,W6,W6cold")
    parser.add_argument("--workdir", default=None, help="where stores are written (default: a new temp dir)")
    parser.add_argument("--systems", default=None,
                        help="only these systems (comma-separated), e.g. diskreplay-memmap,diskreplay-whole")
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "SYSTEM"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--scaling", action="store_true",
                        help="costs against the store size instead (scripts/bench_scaling.py)")
    parser.add_argument("--shapes", default="W1,W3", help="with --scaling: W1, W3 or both")
    parser.add_argument("--plot", metavar="PNG", help="with --scaling: also draw the curves (matplotlib)")
    parser.add_argument("--cli-stream", action="store_true",
                        help="stats, plot and export of a cold W3-shaped store instead (scripts/bench_stream.py)")
    parser.add_argument("--slots", type=int, help="with --cli-stream: the store's slots (default 100000)")
    parser.add_argument("--backend", default="memmap", help="with --cli-stream: the store's backend")
    parser.add_argument("--commands", help="with --cli-stream: only these (comma-separated), e.g. stats,plot")
    parser.add_argument("--against", metavar="EXE",
                        help="with --cli-stream: also run another install's diskreplay (e.g. main's), "
                             "in the same runs")
    args = parser.parse_args(argv)
    if args.cli_stream:
        return main_stream(args, argv)
    if args.worker:
        print(json.dumps(run_worker(args.worker[0], args.worker[1], json.loads(args.spec), args.workdir)))
        return
    if args.scaling:
        return main_scaling(args, argv)
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 3)
    workloads = [w.strip() for w in args.workloads.split(",")]
    unknown = set(workloads) - set(FULL)
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}")
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="diskreplay-bench-", dir=args.workdir)
    started = time.perf_counter()
    code = git_state()  # before the run: what the workers import
    skipped = {}
    try:
        only = None if args.systems is None else {name.strip() for name in args.systems.split(",")}
        results = add_ratios(run_all(sizes, repeats, workloads, workdir, lambda m: print(m, file=sys.stderr),
                                     skipped, only))
        bench_fio.add_ratios(results)
        facts = machine_facts(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    goal_rows = goals(results)
    print(table(results))
    if "W5" in results:
        print()
        print(w5_table(results))
    if "W6" in results or "W6cold" in results:
        print()
        print(stacked_table(results))
    if bench_fio.table(results):
        print()
        print(bench_fio.table(results))
    print()
    print(goals_table(goal_rows))
    for system, why in skipped.items():
        print(f"skipped {system}: {why}")
    print(f"\n{repeats} process(es) per system; wall time {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": facts, "code": code, "command": " ".join(["scripts/bench.py"] + (argv or sys.argv[1:])),
                       "quick": args.quick, "repeats": repeats, "sizes": sizes, "results": results,
                       "skipped": skipped, "peer_notes": {p: bench_peers.NOTES[p] for p in PEERS if p not in skipped},
                       "goals": goal_rows, "wall_s": time.perf_counter() - started}, f, indent=1)


if __name__ == "__main__":
    main()
