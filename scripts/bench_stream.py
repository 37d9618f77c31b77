"""How fast the commands that scan a whole store stream it (issue 20 item 2):
`scripts/bench.py --cli-stream`.

A W3-shaped store ((4, 84, 84) uint8 frames, 8 envs, the memmap backend unless
``--backend``) is built once and flushed; then each command runs as a user runs it
(``diskreplay stats``, ``plot``, ``export`` to .npz, .h5 and d4rl), each in its own
process, on a cold cache: before every run each store file is dropped from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)`` after ``os.sync()``; nothing else on the machine is
evicted). Measured per command:

  * wall time, and the bytes of the store's rows over it, as a fraction of the disk's sequential
    read rate measured in the same run (``dd`` of the frames file, cold, 16 MiB blocks, before
    every run of every command; the median of those); the frames file is the largest by
    blocks on disk, since jump_states.npy is as large but sparse. ``--repeats N`` runs every
    command N times, round-robin, and takes the median; ``--against EXE`` runs another
    install's ``diskreplay`` (main's, say) beside each command in the same round-robin;
  * the command's anonymous memory: the maximum of ``RssAnon`` in ``/proc/PID/status``
    sampled every 20 ms (RSS also counts the store's page-cache pages it maps);
  * for the exports, the bytes of the output file, and those bytes over the wall time as a
    fraction of the disk's sequential write rate, measured in the same run (random bytes
    in 16 MiB writes then ``fsync``, as many as the store's rows, at most 1 GiB, before every
    run of an export; the median): an export writes about twice what it reads, so where
    the disk writes no faster than it reads, 0.5x the read rate needs the write rate.

Goals (the issue): at least 0.5x the sequential read rate, RssAnon under 200 MB. An
export writes about twice what it reads (next states are part of the npz and HDF5
outputs), so its rate is bounded by the disk's writes as well.

    .venv/bin/python scripts/bench.py --cli-stream --slots 100000 --repeats 3 --json stream.json
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

from diskreplay import DiskReplay

FRAME = (4, 84, 84)
NUM_ENVS = 8
RSS_GOAL_MB, RATE_GOAL = 200, 0.5
COMMANDS = {  # name: arguments after the store's path ({out} is a file in the work directory)
    "stats": ["stats"],
    "plot": ["plot", "{out}.png"],
    "export-npz": ["export", "{out}.npz"],
    "export-h5": ["export", "{out}.h5"],
    "export-d4rl": ["export", "{out}.h5", "--format", "d4rl"],
}


def build(path: str, slots: int, backend: str, log) -> int:
    """A W3-shaped store of ``slots`` rows, the ring just full; returns its data bytes."""
    rng = np.random.default_rng(0)
    steps = slots // NUM_ENVS
    fields = {"states": (FRAME, "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    frames = rng.integers(0, 256, (64, NUM_ENVS) + FRAME, dtype=np.uint8)
    t0 = time.perf_counter()
    with DiskReplay.create(path, slots, num_envs=NUM_ENVS, backend=backend, fields=fields, overwrite=True) as buf:
        for step in range(steps):
            s = frames[step % 64]
            buf.add(s, rng.integers(0, 6, NUM_ENVS), rng.normal(size=NUM_ENVS).astype(np.float32),
                    frames[(step + 1) % 64], rng.random(NUM_ENVS) < 0.01)
    log(f"built {path}: {slots} slots in {time.perf_counter() - t0:.0f} s")
    # The bytes of the rows a scan reads; not the files' sizes, which count the sparse
    # jump_states.npy (as many bytes as the frames, none of them written here).
    return slots * sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in fields.values())


def allocated(path: str) -> int:
    """Bytes of disk ``path`` occupies (a sparse file counts only what was written)."""
    return os.stat(path).st_blocks * 512


def store_files(path: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)


def drop_cache(paths) -> None:
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sequential_read(path: str) -> float:
    """Bytes per second of ``dd`` reading ``path`` cold."""
    drop_cache([path])
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)
    return os.path.getsize(path) / (time.perf_counter() - t0)


def sequential_write(workdir: str, nbytes: int) -> float:
    """Bytes per second of writing ``nbytes`` of random data to a new file in ``workdir``
    in 16 MiB writes, then ``fsync`` (the file is removed)."""
    block = np.random.default_rng().integers(0, 256, min(nbytes, 16 << 20), dtype=np.uint8)
    path = os.path.join(workdir, "seq-write.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for done in range(0, nbytes, len(block)):
            block[:8] = done // len(block)  # no two blocks alike
            os.write(fd, block[:nbytes - done])
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return nbytes / seconds


def rss_anon_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"^RssAnon:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def run_command(args: list[str], exe: str | None = None) -> tuple[float, int]:
    """``(seconds, max RssAnon in kB)`` of one command, which must succeed; ``exe`` is the
    ``diskreplay`` to run (default: this interpreter's)."""
    exe = exe or os.path.join(os.path.dirname(sys.executable), "diskreplay")
    t0 = time.perf_counter()
    proc = subprocess.Popen([exe] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, rss_anon_kb(proc.pid) or 0)
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"diskreplay {' '.join(args)} exited {proc.returncode}: {err}")
    return seconds, peak


def run(workdir: str, slots: int, backend: str = "memmap", commands=None, log=print, repeats: int = 1,
        against: str | None = None) -> dict:
    """Build the store in ``workdir``, time every command cold ``repeats`` times (round-robin),
    each run right after a ``dd`` of the frames file; returns the medians.

    The virtual disk's rate swings by several times within seconds (the host caches it),
    so the sequential rate is the median of all those ``dd`` runs (their range is kept),
    and each command's ratio divides its median rate by it. ``against`` names another
    install's ``diskreplay`` (e.g. main's), run beside each command on the same store, in
    the same round-robin (``"against"`` in each command's results)."""
    path = os.path.join(workdir, "W3-stream.replay")
    data_bytes = build(path, slots, backend, log)
    frames = max((f for f in store_files(path) if f.endswith((".npy", ".h5"))), key=allocated)
    names = list(commands or COMMANDS)
    runs = [(name, None) for name in names] + ([(name, against) for name in names] if against else [])
    runs.sort(key=lambda r: names.index(r[0]))
    seqs, writes, times, peaks = [], [], {run: [] for run in runs}, {run: 0 for run in runs}
    out_bytes = {}
    for rep in range(repeats):
        for name, exe in runs:
            out = os.path.join(workdir, f"out-{name}")
            args = [a.format(out=out) for a in COMMANDS[name]]
            if name.startswith("export"):
                writes.append(sequential_write(workdir, min(data_bytes, 1 << 30)))
            seqs.append(sequential_read(frames))
            drop_cache(store_files(path))
            seconds, peak_kb = run_command([args[0], path] + args[1:], exe)
            times[name, exe].append(seconds)
            peaks[name, exe] = max(peaks[name, exe], peak_kb)
            log(f"{name}{' (against)' if exe else ''} (run {rep + 1}): {seconds:.1f} s, "
                f"{data_bytes / seconds / 1e6:.0f} MB/s; dd just before: {seqs[-1] / 1e6:.0f} MB/s; "
                f"RssAnon {peak_kb / 1024:.0f} MB")
            for leftover in (out + ext for ext in (".png", ".npz", ".h5")):
                if os.path.exists(leftover):
                    if name.startswith("export"):
                        out_bytes[name, exe] = os.path.getsize(leftover)
                    os.unlink(leftover)
    seq = float(np.median(seqs))
    results = {"slots": slots, "backend": backend, "store_bytes": data_bytes, "repeats": repeats,
               "seq_read_mb_s": seq / 1e6, "seq_read_range_mb_s": [min(seqs) / 1e6, max(seqs) / 1e6],
               "against": against, "commands": {}}
    write_rate = float(np.median(writes)) if writes else None
    if writes:
        results["seq_write_mb_s"] = write_rate / 1e6
        results["seq_write_range_mb_s"] = [min(writes) / 1e6, max(writes) / 1e6]

    def summary(run) -> dict:
        seconds = float(np.median(times[run]))
        rate = data_bytes / seconds
        out = {"seconds": seconds, "seconds_range": [min(times[run]), max(times[run])], "mb_s": rate / 1e6,
               "x_seq_read": rate / seq, "rss_anon_mb": peaks[run] / 1024,
               "met": rate / seq >= RATE_GOAL and peaks[run] / 1024 < RSS_GOAL_MB}
        if run in out_bytes and write_rate:
            out.update(out_bytes=out_bytes[run], x_seq_write=out_bytes[run] / seconds / write_rate)
        return out

    for name in names:
        results["commands"][name] = summary((name, None))
        if against:
            results["commands"][name]["against"] = summary((name, against))
    shutil.rmtree(path, ignore_errors=True)
    return results


def table(results: dict) -> str:
    lo, hi = results["seq_read_range_mb_s"]
    lines = [f"W3-shaped store of {results['slots']} slots ({results['store_bytes'] / 1e9:.2f} GB of rows, "
             f"{results['backend']}), cold cache, {results['repeats']} run(s) each; sequential read (dd, cold, "
             f"the median of one before every run) {results['seq_read_mb_s']:.0f} MB/s (range {lo:.0f}-{hi:.0f})",
             "| command | seconds (median) | range | MB/s | x seq. read | RssAnon MB | goal met "
             "| output GB | x seq. write |", "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    if "seq_write_mb_s" in results:
        wlo, whi = results["seq_write_range_mb_s"]
        lines.insert(1, f"sequential write (random bytes then fsync, the median of one before every export run) "
                        f"{results['seq_write_mb_s']:.0f} MB/s (range {wlo:.0f}-{whi:.0f})")
    for name, r in results["commands"].items():
        for label, x in [(name, r)] + ([(f"{name} (against)", r["against"])] if "against" in r else []):
            a, b = x["seconds_range"]
            lines.append(f"| {label} | {x['seconds']:.1f} | {a:.1f}-{b:.1f} | {x['mb_s']:.0f} | "
                         f"{x['x_seq_read']:.2f} | {x['rss_anon_mb']:.0f} | {'yes' if x['met'] else 'NO'} | "
                         + (f"{x['out_bytes'] / 1e9:.2f} | {x['x_seq_write']:.2f} |" if "out_bytes" in x else "| |"))
    if results.get("against"):
        lines.append(f"(against): {results['against']}, in the same runs")
    lines.append(f"goals: >= {RATE_GOAL}x the sequential read rate and RssAnon < {RSS_GOAL_MB} MB")
    return "\n".join(lines)
