"""The workloads of scripts/bench.py (its docstring says what each measures and how) and
one warm worker run: the sizes (``FULL``, ``QUICK``), the systems of each, the run order, the
step data, the timed adds (rates, latencies, W6's frame stacks) and the timed sampling.

Every (workload, system, repeat) is a process of its own, started by bench.py's driver:

    python scripts/bench_workloads.py --worker WORKLOAD SYSTEM --spec JSON --workdir DIR

(scripts/bench_cold.py for the cold workloads); it prints its result as one line of JSON.
The worker imports the library only when its system is diskreplay's, so that a baseline's
RssAnon is its own.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench_measure import Peak, store_files  # scripts/, this script's directory, is on sys.path
from bench_peers import PEERS
from bench_systems import make_system

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


def worker_main(run, argv=None):
    """A worker process: ``run(workload, system, spec, workdir)``, its result printed as JSON."""
    parser = argparse.ArgumentParser(description="one (workload, system) run of scripts/bench.py")
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "SYSTEM"), required=True)
    parser.add_argument("--spec", required=True, help="the workload's sizes, as JSON")
    parser.add_argument("--workdir", default=None, help="where the stores are written")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.worker[0], args.worker[1], json.loads(args.spec), args.workdir)))


if __name__ == "__main__":
    worker_main(run_worker)
