"""What README.md's "Disk, memory and flushes" says, checked on real stores: the disk a store
takes, what a full read does to RSS and to anonymous memory, and what the error of an
inferred dtype tells the user. (The flush policy is tests/durability/test_flush_limit.py's.)"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from diskreplay import DiskReplay, SchemaMismatchError
from diskreplay.views import store_info

RESERVE_BYTES = 16 << 20  # "an undo reserve of about 16 MiB of rows, at least 200 steps up to 48 MiB"
BLOCKS_PER_FILE = 2 * 4096  # "plus a filesystem block or two per file"


@pytest.mark.parametrize("shape, dtype, max_size, num_envs, flush_every", [
    ((3,), "float32", 10, 2, None),          # the command-line examples' store
    ((4, 84, 84), "uint8", 10, 8, None),     # a few slots of frames from many envs
    ((4, 84, 84), "uint8", 1000, 8, None),   # the first example's store
    ((8,), "float64", 5000, 4, 25),
])
def test_disk_footprint_is_what_the_readme_says(tmp_path, shape, dtype, max_size, num_envs, flush_every):
    fields = {"states": (shape, dtype), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}
    state = int(np.prod(shape)) * np.dtype(dtype).itemsize
    row = state + 8 + 4 + 1
    with DiskReplay.create(tmp_path / "s", max_size, num_envs=num_envs, seed=0, fields=fields,
                           flush_every=flush_every) as buf:
        s = np.zeros((num_envs,) + shape, dtype)
        for _ in range(max_size // num_envs + 3):  # wrapped, chained steps (no autoreset)
            buf.add(s, np.zeros(num_envs, np.int64), np.zeros(num_envs, np.float32), s + 1, np.zeros(num_envs, bool))
            s = s + 1
        info = store_info(buf)
    default = max(RESERVE_BYTES // row, min(200 * num_envs, (48 << 20) // row))
    reserve = min(max(default if flush_every is None else flush_every * num_envs, num_envs), max_size)
    files = len(list((tmp_path / "s").iterdir()))
    rows = max_size * row
    said = rows + 2 * reserve * row + 4 * num_envs * state + 12 * (max_size + reserve) + files * BLOCKS_PER_FILE
    assert rows <= info["disk_bytes"] <= said, (info["disk_bytes"], rows, said)
    if reserve == max_size:  # "a small one takes up to about 3x its rows and 4 * num_envs states"
        assert info["disk_bytes"] <= 3 * rows + 4 * num_envs * state + 12 * 2 * max_size + files * BLOCKS_PER_FILE


def test_reads_grow_rss_but_not_anonymous_memory(tmp_path):
    """Rows gathered through the maps (``get``, ``sample``) count in RSS, up to the store's
    size; RssAnon, what the process owns, stays flat, there and in the commands' scans
    (``verify``, ``stats``: blocks of about 16 MiB, never the store)."""
    script = textwrap.dedent("""
        import sys
        import threading
        import time
        import numpy as np
        from diskreplay import DiskReplay
        from diskreplay.stats import compute_stats
        from diskreplay.verify import verify_store

        def status():
            with open("/proc/self/status") as f:
                return {k: int(v.split()[0]) << 10 for k, v in (l.split(":", 1) for l in f) if k.startswith("Rss")}

        def growth(work):  # the peaks of RssFile and RssAnon above their values before, sampled every ms
            before, peak, done = status(), {}, []

            def sample():
                while not done:
                    for k, v in status().items():
                        peak[k] = max(peak.get(k, 0), v)
                    time.sleep(0.001)

            sampler = threading.Thread(target=sample)
            sampler.start()
            work()
            done.append(True)
            sampler.join()
            return peak["RssFile"] - before["RssFile"], peak["RssAnon"] - before["RssAnon"]

        path, size = sys.argv[1], 16384
        fields = {"states": ((4096,), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
                  "dones": ((), "bool")}
        with DiskReplay.create(path, size, num_envs=16, seed=0, fields=fields) as buf:  # 64 MiB of rows
            s = np.zeros((16, 4096), np.uint8)
            for t in range(size // 16):
                buf.add(s, np.zeros(16, np.int64), np.zeros(16, np.float32), s, np.zeros(16, bool))

        def gather():
            with DiskReplay.open(path, mode="r") as buf:
                for idxs in np.array_split(np.random.default_rng(0).permutation(size), size // 256):
                    buf.get(np.sort(idxs), fields=["states"])

        def scan():
            assert verify_store(path).ok
            with DiskReplay.open(path, mode="r") as buf:
                compute_stats(buf)

        print(*growth(gather), *growth(scan))
    """)
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    gather_file, gather_anon, scan_file, scan_anon = map(int, p.stdout.split())
    mib = 1 << 20
    assert gather_file > 32 * mib and gather_anon < 32 * mib, p.stdout  # the store's pages, in RSS
    assert scan_anon < 40 * mib and scan_file < 16 * mib, p.stdout  # not the store's 64 MiB


def test_an_inferred_dtype_error_says_it_was_inferred_and_how_to_declare_it(tmp_path):
    with DiskReplay.create(tmp_path / "s", 10, seed=0) as buf:
        buf.add(np.zeros(3, np.float32), 0, 0, np.zeros(3, np.float32), False)  # reward 0: int64 for good
        with pytest.raises(SchemaMismatchError) as err:
            buf.add(np.zeros(3, np.float32), 0, 0.5, np.zeros(3, np.float32), False)
        assert buf.seen_size == 1
    text = str(err.value)
    for said in ("rewards", "int64", "the first add gave", "for the life of the store",
                 "fields={'rewards': ((), 'float32')"):
        assert said in text, text
