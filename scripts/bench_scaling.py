"""How diskreplay's costs grow with the store (issue 19 item 3): `scripts/bench.py --scaling`.

For W1-shaped stores (state (4,) float32, one env) of 10^4..10^7 slots and W3-shaped ones
((4, 84, 84) uint8, 8 envs) of 10^4..10^6 slots, each size in its own process on the memmap
backend: the store is created and filled exactly once round (no page pre-touched: the first
pass pays its page faults, as in use; the first 10% of the adds untimed), flushed and closed;
then measured:
  * open: ``DiskReplay.open(path, "r")``, warm (files just written) and cold (every store file
    dropped from the page cache first), median of 5 each;
  * sample b=32, warm: after 200 untimed calls, over 2 s; cold: the W4 protocol of bench.py
    (the process's mappings and the files' cache dropped before each of 30 timed batches);
  * verify: ``diskreplay.verify.verify_store`` on a cold cache, store bytes per second, next to
    the disk's sequential read rate measured in the same process: a plain read (8 MiB
    ``os.read`` calls) of the largest data file by blocks on disk, cold (at most 4 GiB of it;
    store bytes are blocks on disk too: ``jump_states.npy`` is sparse);
  * RssAnon: the maximum over all phases.
A size whose store would not leave 16 GiB free in the work directory is skipped with a line
saying so.

    .venv/bin/python scripts/bench.py --scaling --json scaling.json [--plot docs/scaling.png]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

import bench_measure  # scripts/, this script's directory, is on sys.path
import bench_results
import bench_workloads
from bench_stream import allocated
from diskreplay import DiskReplay
from diskreplay.verify import verify_store

SHAPES = {
    "W1": dict(state=[4], dtype="float32", num_envs=1, sizes=[10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7]),
    "W3": dict(state=[4, 84, 84], dtype="uint8", num_envs=8, sizes=[10 ** 4, 10 ** 5, 10 ** 6]),
}
QUICK_SIZES = {"W1": [10 ** 3, 10 ** 4], "W3": [10 ** 3, 2 * 10 ** 3]}
SAMPLE_SECONDS, COLD_BATCHES, OPEN_REPEATS, DISK_READ_CAP = 2.0, 30, 5, 4 << 30
HEADROOM = 16 << 30  # bytes a run leaves free on the work disk


def row_bytes(shape_name) -> int:
    s = SHAPES[shape_name]
    return int(np.prod(s["state"])) * np.dtype(s["dtype"]).itemsize + 8 + 4 + 1


def fits(shape_name, size, workdir) -> str | None:
    """Why a store of ``size`` slots is not built here (None when it is): it must leave
    ``HEADROOM`` free for the other programs of the machine."""
    need = row_bytes(shape_name) * size * 1.1
    free = shutil.disk_usage(workdir).free
    if need + HEADROOM > free:
        return (f"needs {need / 2 ** 30:.1f} GiB plus {HEADROOM / 2 ** 30:.0f} GiB to spare, "
                f"{free / 2 ** 30:.1f} GiB free in the work directory")
    return None


def cold_read_rate(path) -> float:
    """Bytes/s of a plain sequential read of ``path`` from a cold page cache."""
    bench_measure.drop_cache([path], [])
    fd = os.open(path, os.O_RDONLY)
    try:
        total, t = 0, time.perf_counter()
        while total < DISK_READ_CAP:
            chunk = os.read(fd, 8 << 20)
            if not chunk:
                break
            total += len(chunk)
        return total / (time.perf_counter() - t)
    finally:
        os.close(fd)


def run_worker(shape_name, size, workdir):
    shape = SHAPES[shape_name]
    spec = dict(state=shape["state"], dtype=shape["dtype"], num_envs=shape["num_envs"], max_size=size)
    path = os.path.join(workdir, f"{shape_name}-{size}")
    peak, result = bench_measure.Peak(), {"slots": size}
    fields = {"states": (tuple(shape["state"]), shape["dtype"]), "actions": ((), "int64"),
              "rewards": ((), "float32"), "dones": ((), "bool")}
    buf = DiskReplay.create(path, size, num_envs=shape["num_envs"], seed=0, fields=fields, overwrite=True)
    step = bench_workloads.step_data(spec)
    steps = size // shape["num_envs"]
    warm = steps // 10
    add = buf.add
    for _ in range(warm):
        add(*step)
    t = time.perf_counter()
    for _ in range(steps - warm):
        add(*step)
    result["add_per_s"] = (steps - warm) * shape["num_envs"] / (time.perf_counter() - t)
    peak()
    t = time.perf_counter()
    buf.close()  # flushes
    result["close_s"] = time.perf_counter() - t
    os.sync()
    files = bench_measure.store_files(path)
    # Bytes on disk, not the files' sizes: jump_states.npy is as large as the states but
    # sparse (nothing of it is written here), and neither verify nor dd reads its holes.
    result["store_bytes"] = sum(allocated(p) for p in files)

    def open_once(cold):
        if cold:
            bench_measure.drop_cache(files, [])
        t = time.perf_counter()
        b = DiskReplay.open(path, "r")
        elapsed = time.perf_counter() - t
        b.close()
        return elapsed

    result["open_warm_ms"] = 1000 * statistics.median(open_once(False) for _ in range(OPEN_REPEATS))
    result["open_cold_ms"] = 1000 * statistics.median(open_once(True) for _ in range(OPEN_REPEATS))

    buf = DiskReplay.open(path, "r")
    for _ in range(200):
        buf.sample(32)
    calls, t = 0, time.perf_counter()
    while time.perf_counter() - t < SAMPLE_SECONDS:
        for _ in range(16):
            buf.sample(32)
        calls += 16
    result["sample32_warm_per_s"] = calls / (time.perf_counter() - t)
    peak()
    mappings = [m for f in buf._session.mapped_files for m in f.maps]
    times = []
    for _ in range(COLD_BATCHES):
        bench_measure.drop_cache(files, mappings)
        t = time.perf_counter()
        buf.sample(32)
        times.append(time.perf_counter() - t)
    result["sample32_cold_per_s"] = 1 / statistics.median(times)
    peak()
    buf.close()

    bench_measure.drop_cache(files, [])
    t = time.perf_counter()
    report = verify_store(path)
    elapsed = time.perf_counter() - t
    if report.problems:
        raise SystemExit(f"verify found problems in {path}: {report.problems}")
    result["verify_bytes_per_s"] = result["store_bytes"] / elapsed
    peak()
    largest = max(files, key=allocated)
    result["disk_read_bytes_per_s"] = cold_read_rate(largest)
    result["verify_x_disk"] = result["verify_bytes_per_s"] / result["disk_read_bytes_per_s"]
    result["rss_anon_mb"] = peak.value / 2 ** 20
    shutil.rmtree(path, ignore_errors=True)
    return result


def run(quick, workdir, log, shapes=("W1", "W3")):
    results, skipped = {}, {}
    for shape_name in shapes:
        sizes = QUICK_SIZES[shape_name] if quick else SHAPES[shape_name]["sizes"]
        results[shape_name] = {}
        for size in sizes:
            why = fits(shape_name, size, workdir)
            if why:
                skipped[f"{shape_name}-{size}"] = why
                log(f"  scaling {shape_name} {size:,} slots: skipped, {why}")
                continue
            t = time.perf_counter()
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", shape_name, str(size),
                                  workdir], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"scaling {shape_name} {size} failed:\n{out.stderr}")
            results[shape_name][str(size)] = r = json.loads(out.stdout.strip().splitlines()[-1])
            log(f"  scaling {shape_name} {size:,} slots ({time.perf_counter() - t:.0f} s): "
                + ", ".join(f"{k}={v:.4g}" for k, v in r.items()))
    return results, skipped


COLUMNS = [("open_warm_ms", "open warm ms", 1), ("open_cold_ms", "open cold ms", 1),
           ("add_per_s", "add transitions/s", 1), ("sample32_warm_per_s", "sample b=32 warm /s", 1),
           ("sample32_cold_per_s", "sample b=32 cold /s", 1), ("verify_bytes_per_s", "verify MB/s", 1e-6),
           ("disk_read_bytes_per_s", "disk read MB/s", 1e-6), ("verify_x_disk", "verify x disk", 1),
           ("rss_anon_mb", "RssAnon MB", 1)]


def table(results) -> str:
    lines = ["| shape | slots | store GB | " + " | ".join(c[1] for c in COLUMNS) + " |",
             "|---|---:|---:|" + "---:|" * len(COLUMNS)]
    for shape_name, sizes in results.items():
        for size, r in sizes.items():
            cells = [bench_results.fmt(r[key] * scale) for key, _, scale in COLUMNS]
            lines.append(f"| {shape_name} | {int(size):,} | {r['store_bytes'] / 1e9:.3g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spreads(results) -> list[str]:
    """Largest over smallest size, per shape, for the costs that should stay flat."""
    out = []
    for shape_name, sizes in results.items():
        if len(sizes) < 2:
            continue
        rs = list(sizes.values())
        first, last = rs[0], rs[-1]
        out.append(f"{shape_name} {int(first['slots']):,} -> {int(last['slots']):,} slots: open cold "
                   f"x{last['open_cold_ms'] / first['open_cold_ms']:.2f}, sample warm "
                   f"x{last['sample32_warm_per_s'] / first['sample32_warm_per_s']:.2f}, sample cold "
                   f"x{last['sample32_cold_per_s'] / first['sample32_cold_per_s']:.2f}, RssAnon max "
                   f"{max(r['rss_anon_mb'] for r in rs):.0f} MB, verify x disk min "
                   f"{min(r['verify_x_disk'] for r in rs):.2f}")
    return out


def plot(results, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("open_cold_ms", "open, cold cache (ms)"), ("add_per_s", "add (transitions/s)"),
              ("sample32_warm_per_s", "sample b=32 warm (batches/s)"),
              ("sample32_cold_per_s", "sample b=32 cold (batches/s)"),
              ("verify_x_disk", "verify / disk sequential read"), ("rss_anon_mb", "RssAnon (MB)")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        for shape_name, sizes in results.items():
            xs = [int(s) for s in sizes]
            ax.plot(xs, [r[key] for r in sizes.values()], marker="o", label=shape_name)
        ax.set_xscale("log")
        if key not in ("verify_x_disk",):
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("slots")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    print(json.dumps(run_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
