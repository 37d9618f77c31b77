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

Method: every (workload, system, repeat) is its own process (scripts/bench_workloads.py, or
scripts/bench_cold.py for W4 and W6cold, run with ``--worker``); repeats go round-robin over
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

The parts: this file is the driver (the command line, the round-robin of worker processes,
the machine's facts); bench_workloads.py the workloads' sizes and systems and a warm worker
run; bench_cold.py a cold one; bench_systems.py the systems but the other libraries
(bench_peers.py); bench_measure.py RssAnon, /proc/self/io, mincore and the page-cache drop;
bench_results.py the summaries, ratios, goals and tables.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata

import numpy as np

import bench_fio  # scripts/, this script's directory, is on sys.path
import bench_peers
import bench_scaling
import bench_stream
from bench_peers import PEERS
from bench_results import add_ratios, goals, goals_table, stacked_table, summarize, table, w5_table
from bench_systems import unavailable
from bench_workloads import COLD_OF, FULL, QUICK, SYSTEMS, WORKLOADS

HERE = os.path.dirname(os.path.abspath(__file__))

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


def worker_command(workload, system, spec, workdir):
    """The command of one worker process: bench_workloads.py (bench_cold.py for a cold
    workload), never this script, whose imports (the library among them) would count in a
    baseline's RssAnon."""
    script = "bench_cold.py" if workload in COLD_OF else "bench_workloads.py"
    return [sys.executable, os.path.join(HERE, script), "--worker", workload, system, "--spec", spec] + (
        ["--workdir", workdir] if workdir is not None else [])


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
                out = subprocess.run(worker_command(w, system, json.dumps(sizes[w]), workdir), capture_output=True,
                                     text=True)
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
        # the worker's own process image, as run_all starts it
        command = worker_command(args.worker[0], args.worker[1], args.spec, args.workdir)
        os.execv(command[0], command)
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
