"""Sharded replay on a local Ray cluster against one in-process store of the same total size
(docs/scale-out.md).

    .venv/bin/python scripts/bench_ray.py --json ray.json           # full run, a few minutes
    .venv/bin/python scripts/bench_ray.py --quick --json out.json   # tiny sizes, seconds (the test suite)
    .venv/bin/python scripts/bench_ray.py --shards 2,4 --repeats 5 --total 400000

Workload: W1's transitions (state (4,) float32, action int64, reward float32, done bool),
``--total`` slots in all, filled completely, then sampled at batch 32 and 256.
Systems:
  * ``in-process``: one ``DiskReplay`` of ``--total`` slots, single adds from this process;
  * ``ray-N``: ``ShardedReplay`` of N shards of ``total / N`` slots, one env-runner task per
    shard adding ``add_many`` chunks of ``--chunk`` steps; the learner samples from the driver.
Adds: transitions/s over the wall time of the whole fill (all runners together); sampling:
batches/s of ``sample(b)`` after 20 untimed calls, over ``--seconds`` of calls, and of
``batches(b, prefetch=4)``. Ray itself, for the model of docs/scale-out.md: round trips
per second to a shard actor, and MB/s of a 64 MiB result moving from a worker into the driver. Each repeat runs every system once, in turn (load from
elsewhere spreads over all of them); median and spread (min-max) over repeats; ratios
divide by the in-process store's median from the same run. Ray's cluster starts once,
with ``--cpus`` CPUs; every shard and runner shares this one machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import ray

from diskreplay import DiskReplay
from diskreplay.ray import ShardedReplay

FIELDS = {"states": ((4,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}
BATCHES = (32, 256)


def rows(start, n):
    ids = np.arange(start, start + n)
    states = np.repeat(ids[:, None], 4, axis=1).astype(np.float32)
    return states, ids, ids.astype(np.float32), states + 1, np.zeros(n, bool)


@ray.remote(num_cpus=0)
def run_env(writer, steps, chunk):
    """An env runner beside its shard: makes its rows and sends them straight to it."""
    for start in range(0, steps, chunk):
        ray.get(writer.add_many.remote(*rows(start, min(chunk, steps - start))))
    return steps


def rate(fn, seconds, warmup=20):
    for _ in range(warmup):
        fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 5:
        fn()
        calls += 1
    return calls / elapsed


def prefetched_rate(batches, seconds):
    with batches as it:
        for _ in range(5):
            next(it)
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or calls < 5:
            next(it)
            calls += 1
    return calls / elapsed


def bench_in_process(work, total, seconds):
    path = os.path.join(work, "local")
    shutil.rmtree(path, ignore_errors=True)
    out = {}
    with DiskReplay.create(path, total, fields=FIELDS, seed=0) as buf:
        s, a, r, ns, d = rows(0, total)
        start = time.perf_counter()
        for t in range(total):
            buf.add(s[t], a[t], r[t], ns[t], d[t])
        out["add_transitions_per_s"] = total / (time.perf_counter() - start)
        for b in BATCHES:
            out[f"sample_b{b}_batches_per_s"] = rate(lambda: buf.sample(b), seconds)
        out["prefetch_b256_batches_per_s"] = prefetched_rate(buf.batches(256, prefetch=4), seconds)
    shutil.rmtree(path, ignore_errors=True)
    return out


def bench_sharded(work, total, shards, chunk, seconds):
    paths = [os.path.join(work, f"shard{i}") for i in range(shards)]
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    per = total // shards
    out = {}
    with ShardedReplay.create(paths, per, fields=FIELDS, seed=0) as sharded:
        start = time.perf_counter()
        ray.get([run_env.remote(sharded.writer(i), per, chunk) for i in range(shards)])
        out["add_transitions_per_s"] = per * shards / (time.perf_counter() - start)
        for b in BATCHES:
            out[f"sample_b{b}_batches_per_s"] = rate(lambda: sharded.sample(b), seconds)
        out["prefetch_b256_batches_per_s"] = prefetched_rate(sharded.batches(256, prefetch=4), seconds)
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    return out


@ray.remote(num_cpus=0)
def payload(nbytes):
    return np.ones(nbytes, np.uint8)


def bench_link(work, seconds):
    """What one remote call costs: round trips to a shard actor (its ``size``), and the rate
    at which a 64 MiB result moves from a worker into the driver."""
    path = os.path.join(work, "link")
    shutil.rmtree(path, ignore_errors=True)
    with ShardedReplay.create([path], 16, fields=FIELDS) as sharded:
        actor = sharded.writer(0)
        calls = rate(lambda: ray.get(actor.size.remote()), seconds)
    shutil.rmtree(path, ignore_errors=True)
    nbytes = 64 << 20
    ray.get(payload.remote(1))
    start, moved = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or moved < 3 * nbytes:
        moved += ray.get(payload.remote(nbytes)).nbytes
    return {"roundtrip_calls_per_s": calls, "transfer_mb_per_s": moved / 1e6 / (time.perf_counter() - start)}


def summarize(runs):
    keys = runs[0].keys()
    return {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs)} for k in keys}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (the test suite)")
    parser.add_argument("--total", type=int, default=200_000, help="slots in all (default 200000)")
    parser.add_argument("--shards", default="2,4", help="shard counts to run, comma-separated (default 2,4)")
    parser.add_argument("--chunk", type=int, default=1000, help="steps per add_many call (default 1000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per sampling figure")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster (default 2)")
    parser.add_argument("--workdir", default=None, help="where the stores go (default: a temporary directory)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.total, args.repeats, args.seconds, args.chunk = 4000, 1, 0.2, 500
    shard_counts = [int(n) for n in args.shards.split(",")]
    work = args.workdir or tempfile.mkdtemp(prefix="bench_ray_")
    os.makedirs(work, exist_ok=True)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    runs = {"in-process": []} | {f"ray-{n}": [] for n in shard_counts} | {"ray-link": []}
    try:
        for _ in range(args.repeats):
            runs["ray-link"].append(bench_link(work, args.seconds))
            runs["in-process"].append(bench_in_process(work, args.total, args.seconds))
            for n in shard_counts:
                runs[f"ray-{n}"].append(bench_sharded(work, args.total, n, args.chunk, args.seconds))
    finally:
        ray.shutdown()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    results = {name: summarize(r) for name, r in runs.items()}
    link = results.pop("ray-link")
    base = results["in-process"]
    print(f"total {args.total} slots, {args.repeats} repeats, Ray {ray.__version__} with {args.cpus} CPUs, "
          f"{os.cpu_count()} cores here; median (min-max), ratio to in-process")
    for key in base:
        print(f"\n{key}")
        for name, metrics in results.items():
            m = metrics[key]
            print(f"  {name:<11} {m['median']:>12.1f}  ({m['min']:.1f}-{m['max']:.1f})  "
                  f"x{m['median'] / base[key]['median']:.3f}")
    print("\nRay itself (no store)")
    for key, m in link.items():
        print(f"  {key:<22} {m['median']:>10.1f}  ({m['min']:.1f}-{m['max']:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ray": ray.__version__, "python": sys.version.split()[0],
                       "machine": platform.machine(), "cpu_count": os.cpu_count(), "results": results,
                   "link": link}, f, indent=1)


if __name__ == "__main__":
    main()
