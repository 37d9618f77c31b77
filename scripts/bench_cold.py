"""The cold workloads of scripts/bench.py (W4, W6cold; its docstring gives the protocol): one
worker run sampling the store its warm workload built (``COLD_OF``), the page cache dropped
before every timed batch, then the training loops with a simulated compute step (serial,
the Prefetcher, the store's own ``batches``).

    python scripts/bench_cold.py --worker W4 SYSTEM --spec JSON --workdir DIR

Every cold worker imports the library (the Prefetcher), whichever its system.
"""
from __future__ import annotations

import mmap
import os
import statistics
import time

from bench_measure import Peak, drop_cache, io_counts, proc_mappings, read_bytes, resident_pages, store_files
from bench_systems import DiskReplaySystem, H5pyChunkedSystem, make_system, store_of
from bench_workloads import COLD_OF, fill, worker_main
from diskreplay.core.prefetch import Prefetcher


def run_cold(workload, system_name, spec, workdir):
    """The worker run of cold workload ``workload`` (on the stores of ``COLD_OF[workload]``)."""
    return run_cold_worker(system_name, spec, workdir, COLD_OF[workload])


def run_cold_worker(system_name, spec, workdir, source="W3"):
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


if __name__ == "__main__":
    worker_main(run_cold)
