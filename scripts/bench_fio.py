"""The disk's limit for W4's reads, measured by fio in the same run (a helper of scripts/bench.py).

W4 reads, per cold batch of 32, 64 random frames of 28,224 bytes (states and next states;
the small fields stay in RAM). fio reads the same file (the W3 memmap store's
``states.npy``) the same way: random reads of whole rows at queue depth 32 through
io_uring, buffered (``bs`` the row, rows aligned to the file's rows) and direct (``bs`` the
row rounded up to whole pages, page-aligned: O_DIRECT needs that). The file's page cache is
dropped first; fio's random map reads no block twice in a run, so no read is served from
RAM. ``reads_per_s / 64`` is the rate of batches the disk allows; W4 is reported as a
fraction of it (``x_fio_buffered``, ``x_fio_direct``). A third run, ``batch``, reads as a
cold batch must: buffered, 64 reads submitted at once and all 64 awaited before the next
64 (``iodepth_batch_submit`` = ``iodepth_batch_complete_min`` = 64), so the queue drains at
the end of every batch as it does for W4, where depth 32 keeps it full (``x_fio_batch``).
Skipped where fio is not installed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np

READS_PER_BATCH = 64  # 32 frames and their 32 next frames
DEPTH = 32
IOS = 20_000  # reads a run at most: a fifth of W3's 100,000 rows (fio's random map repeats none)


def unavailable() -> str | None:
    return None if shutil.which("fio") else "not installed (fio: the disk's limit for W4's reads)"


def measure(states_path: str) -> dict:
    """Reads/s of buffered and direct random row reads of ``states_path`` (a .npy of rows)."""
    arr = np.load(states_path, mmap_mode="r")
    offset, row_bytes, rows = arr.offset, arr[0].nbytes, len(arr)
    del arr
    page = os.sysconf("SC_PAGE_SIZE")
    direct_bs = -(-row_bytes // page) * page
    ios = min(IOS, rows // 2)
    out = {}
    buffered = [f"--bs={row_bytes}", f"--blockalign={row_bytes}", f"--offset={offset}",
                f"--size={rows * row_bytes}", "--direct=0"]
    batch = [f"--iodepth={READS_PER_BATCH}", f"--iodepth_batch_submit={READS_PER_BATCH}",
             f"--iodepth_batch_complete_min={READS_PER_BATCH}"]
    for mode, args in (("buffered", buffered + [f"--iodepth={DEPTH}"]),
                       ("direct", [f"--bs={direct_bs}", f"--blockalign={page}", f"--size={rows * row_bytes}",
                                   "--direct=1", f"--iodepth={DEPTH}"]),
                       ("batch", buffered + batch)):
        _drop(states_path)
        run = subprocess.run(["fio", "--name=w4", f"--filename={states_path}", "--rw=randread", "--ioengine=io_uring",
                              f"--number_ios={ios}", "--invalidate=1", "--fadvise_hint=random",
                              "--output-format=json", *args], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"fio ({mode}) failed: {run.stderr.strip()}")
        reads = json.loads(run.stdout[run.stdout.index("{"):])["jobs"][0]["read"]
        out[f"{mode}_reads_per_s"] = reads["iops"]
        out[f"{mode}_batches_per_s"] = reads["iops"] / READS_PER_BATCH
    return out


def add_ratios(results) -> None:
    """``x_fio_buffered``, ``x_fio_direct`` and ``x_fio_batch`` on every W4 ``sample32_per_s`` (medians)."""
    systems = results.get("W4", {})
    fio = systems.get("fio")
    if not fio:
        return
    for name, metrics in systems.items():
        v = metrics.get("sample32_per_s")
        if v:
            for mode in ("buffered", "direct", "batch"):
                if f"{mode}_batches_per_s" in fio:
                    v[f"x_fio_{mode}"] = v["median"] / fio[f"{mode}_batches_per_s"]["median"]


def table(results) -> str:
    """W4 next to the disk's limit for the same reads."""
    systems = results.get("W4", {})
    fio = systems.get("fio")
    if not fio:
        return ""
    lines = [f"fio, random row reads ({READS_PER_BATCH} a batch) at depth {DEPTH}: buffered "
             f"{fio['buffered_reads_per_s']['median']:,.0f} reads/s ({fio['buffered_batches_per_s']['median']:.0f} "
             f"batches/s), direct {fio['direct_reads_per_s']['median']:,.0f} reads/s "
             f"({fio['direct_batches_per_s']['median']:.0f} batches/s)"]
    if "batch_batches_per_s" in fio:
        lines[0] += (f"; buffered a batch at a time ({READS_PER_BATCH} submitted, all awaited) "
                     f"{fio['batch_reads_per_s']['median']:,.0f} reads/s ({fio['batch_batches_per_s']['median']:.0f} batches/s)")
    lines += ["", "| system | W4 batches/s | x fio buffered | x fio direct | x fio a batch at a time |",
              "|---|---:|---:|---:|---:|"]
    for name, metrics in systems.items():
        v = metrics.get("sample32_per_s")
        if v and "x_fio_buffered" in v:
            lines.append(f"| {name} | {v['median']:.0f} | {v['x_fio_buffered']:.2f} | {v['x_fio_direct']:.2f} | "
                         f"{v.get('x_fio_batch', float('nan')):.2f} |")
    return "\n".join(lines)


def _drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
