"""The benchmark keeps running (one --quick run: structure, never time), and the two
helpers it measures, RowReader and Prefetcher, are correct."""
import importlib.util
import json
import mmap
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import diskreplay.store as store_module
from diskreplay import DiskReplay
from diskreplay.backends import BACKENDS
from diskreplay.prefetch import Prefetcher
from diskreplay.rowreader import PAGE, RowReader, _page_ranges, page_cached

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

W4_SYSTEMS = {"diskreplay-memmap", "diskreplay-hdf5", "np.memmap", "np.memmap+random", "h5py-chunked"}
SYSTEMS = {
    "W1": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"},
    "W2": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap"},
    "W3": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"},
    "W4": W4_SYSTEMS,
}


# ---------------------------------------------------------------- the benchmark script
def test_quick_benchmark_reports_every_workload_and_system(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    results = data["results"]
    assert set(results) == set(SYSTEMS)
    for workload, systems in SYSTEMS.items():
        assert set(results[workload]) == systems, workload
    for workload, systems in results.items():
        for name, metrics in systems.items():
            rates = [k for k in metrics if k.endswith("_per_s")]
            assert rates, (workload, name)
            for key in rates:
                assert metrics[key]["median"] > 0, (workload, name, key)
                assert metrics[key]["min"] <= metrics[key]["median"] <= metrics[key]["max"]
            assert metrics["rss_anon_mb"]["median"] > 0, (workload, name)
    for name in ("diskreplay-memmap", "diskreplay-hdf5"):
        w1 = results["W1"][name]
        assert {"add_per_s", "sample32_per_s", "sample256_per_s"} <= set(w1)
        assert {"x_numpy", "x_seed", "x_np.memmap"} <= set(w1["add_per_s"])
        assert results["W2"][name]["add_per_s"]["median"] > 0
        w3 = results["W3"][name]
        assert {"add_per_s", "sample32_per_s", "open_s"} <= set(w3)
        assert "x_np.memmap" in w3["sample32_per_s"] and "x_h5py-chunked" in w3["sample32_per_s"]
    for name in W4_SYSTEMS:
        w4 = results["W4"][name]
        assert w4["resident_pages_before_batch"]["max"] == 0, name  # the cold measurement is honest
        assert w4["cold_bytes_per_batch"]["median"] > 0, name  # cold batches really read the disk
        assert w4["cold_ms_per_batch"]["median"] > 0 and w4["open_s"]["median"] > 0
        if name.startswith("diskreplay"):
            assert w4["loop_ms_serial"]["median"] > 0 and w4["loop_ms_prefetch"]["median"] > 0
            assert "x_np.memmap" in w4["sample32_per_s"]
    assert data["goals"] and {"nproc", "kernel", "numpy", "h5py", "mem_gib"} <= set(data["machine"])
    assert "| W1 | diskreplay-memmap | add_per_s |" in proc.stdout and "x numpy" in proc.stdout


def test_seed_port_keeps_the_seed_semantics():
    spec = importlib.util.spec_from_file_location("seed_replay", os.path.join(ROOT, "scripts", "seed_replay.py"))
    seed_replay = importlib.util.module_from_spec(spec)  # a script, not a package: loaded from its file
    spec.loader.exec_module(seed_replay)
    mem = seed_replay.SeedReplay(max_size=10, batch_size=4, num_envs=2)
    for t in range(7):
        s = np.full((2, 3), t, np.float32)
        mem.update(s, np.array([t, t]), np.array([0.5, 0.5]), s + 1, np.array([False, False]))
    assert mem.size == 10 and mem.seen_size == 14 and mem.head == 3
    assert mem.states[3].dtype == np.float16
    np.random.seed(0)
    batch = mem.sample()
    assert set(batch) == {"states", "actions", "rewards", "next_states", "dones"}
    assert batch["states"].shape == (4, 3) and batch["next_states"].dtype == np.float16


# ---------------------------------------------------------------- RowReader
def _store_with_rows(tmp_path, backend, rows=64):
    buf = DiskReplay.create(tmp_path / f"s-{backend}", rows, backend=backend, seed=1,
                            fields={"states": ((3, 5), "float32"), "actions": ((), "int64"),
                                    "rewards": ((), "float32"), "dones": ((), "bool")})
    for t in range(rows):
        buf.add(np.arange(15, dtype=np.float32).reshape(3, 5) + 100 * t, t, t / 2, np.zeros((3, 5), np.float32),
                t % 3 == 0)
    buf.flush()
    return buf


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [dict(), dict(threads=1), dict(threads=3, nowait=False, hint=False),
                                     dict(threads=4, nowait=True, hint=False, miss_limit=1)])
def test_rowreader_gathers_what_fancy_indexing_gives(tmp_path, backend, options):
    buf = _store_with_rows(tmp_path, backend)
    try:
        idxs = np.array([5, 63, 0, 5, 17, 17, 2, 40, 63, 1])  # unsorted, with duplicates, both ends
        with RowReader(**options) as reader:
            for name, arr in buf._storage.arrays.items():
                fd, offset, row_bytes = buf._storage.locations[name]
                out = np.empty((len(idxs),) + arr.shape[1:], arr.dtype)
                assert reader.gather(fd, offset, row_bytes, idxs, out) is out
                np.testing.assert_array_equal(out, arr[idxs], err_msg=name)
            # several fields in one pass, from a cold page cache too
            for f in buf._storage.files:
                os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            requests = [buf._storage.locations[name] + (idxs[::-1], np.empty((len(idxs),) + arr.shape[1:], arr.dtype))
                        for name, arr in buf._storage.arrays.items()]
            outs = reader.gather_many(requests)
            for (name, arr), out in zip(buf._storage.arrays.items(), outs):
                np.testing.assert_array_equal(out, arr[idxs[::-1]], err_msg=name)
            empty = np.empty((0, 3, 5), np.float32)
            assert reader.gather(*buf._storage.locations["states"], [], empty) is empty
    finally:
        buf.close()


def test_read_ahead_hints_cover_exactly_the_pages_of_the_rows():
    rng = np.random.default_rng(5)
    for row_bytes in (1, 8, 100, PAGE, 28_224):
        for _ in range(50):
            positions = np.sort(rng.integers(0, 200 * PAGE, rng.integers(1, 40))) + 128
            ranges = _page_ranges(positions.tolist(), row_bytes)
            wanted = set()
            for p in positions.tolist():
                wanted.update(range(p // PAGE, (p + row_bytes - 1) // PAGE + 1))
            covered = [page for start, length in ranges for page in range(start // PAGE, (start + length) // PAGE)]
            assert len(covered) == len(set(covered)) and set(covered) == wanted  # no page twice, none extra
            assert all(start % PAGE == 0 and length % PAGE == 0 for start, length in ranges)
            ends = [start + length for start, length in ranges]
            assert all(nxt > end for end, (nxt, _) in zip(ends, ranges[1:]))  # merged: a gap between runs


def test_page_cached_tells_resident_pages_from_dropped_ones(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(64 * 4096))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert page_cached(fd, 10 * 4096) is False
        os.pread(fd, 1, 10 * 4096 + 7)
        assert page_cached(fd, 10 * 4096) is True
        assert page_cached(fd, 40 * 4096) is False  # a lone small read is not read ahead that far
    finally:
        os.close(fd)


def test_cold_large_rows_are_read_by_positioned_reads(tmp_path, monkeypatch):
    """After the page cache drops a store's frames, sample() takes the parallel-read path
    (decided by the residency probe), reads the same rows, and the next batch is warm."""
    fields = {"states": ((4, 64, 64), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 255, (40, 4, 64, 64), dtype=np.uint8)
    buf = DiskReplay.create(tmp_path / "s", 40, fields=fields, seed=4)
    for t in range(40):
        buf.add(frames[t], t, float(t), frames[(t + 1) % 40], False)
    buf.close()
    buf = DiskReplay.open(tmp_path / "s", mode="r")
    try:
        for f in buf._storage.files:
            for m in f.maps:
                m.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        taken = []
        real = DiskReplay._gather_large
        monkeypatch.setattr(buf, "_gather_large", lambda *a: taken.append(1) or real(buf, *a), raising=False)
        batch = buf.sample(16)
        assert taken == [1]
        np.testing.assert_array_equal(batch["states"], frames[buf.batch_idxs])
        np.testing.assert_array_equal(batch["actions"], buf.batch_idxs)
        buf.get(np.arange(40))  # brings every row into RAM, by whichever path
        # The mapping is trusted again after WARM_STREAK probes in a row found their rows.
        probes_per_batch = min(16, store_module.PROBE_ROWS)
        warming = -(-store_module.WARM_STREAK // probes_per_batch)
        buf._probe_streak = 0  # as right after a probe miss
        before = len(taken)
        for _ in range(warming - 1):
            buf.sample(16)
        assert len(taken) == before + warming - 1
        batch = buf.sample(16)
        assert len(taken) == before + warming - 1  # warm now: the gather mapping
        np.testing.assert_array_equal(batch["states"], frames[buf.batch_idxs])
    finally:
        buf.close()


def test_rowreader_refuses_bad_output_and_rows_past_the_end(tmp_path):
    buf = _store_with_rows(tmp_path, "memmap", rows=8)
    fd, offset, row_bytes = buf._storage.locations["states"]
    try:
        with RowReader(threads=2) as reader:
            with pytest.raises(ValueError):
                reader.gather(fd, offset, row_bytes, [0, 1], np.empty((3, 3, 5), np.float32))
            with pytest.raises(ValueError):
                reader.gather(fd, offset, row_bytes, [0, 1], np.empty((3, 2, 5), np.float32)[:, :, ::2].T)
            with pytest.raises(ValueError):
                reader.gather(fd, offset, row_bytes, [-1], np.empty((1, 3, 5), np.float32))
            with pytest.raises(OSError):
                reader.gather(fd, offset, row_bytes, [0, 10 ** 6], np.empty((2, 3, 5), np.float32))
    finally:
        buf.close()


# ---------------------------------------------------------------- Prefetcher
def test_prefetcher_gives_the_direct_batches_in_order(tmp_path):
    def build(name):
        buf = DiskReplay.create(tmp_path / name, 50, seed=7)
        for t in range(60):
            buf.add(np.full(4, t, np.float32), t % 2, float(t), np.full(4, t + 1, np.float32), False)
        return buf

    direct = build("a")
    expected = [(direct.sample(8), direct.batch_idxs.copy()) for _ in range(20)]
    direct.close()
    buf = build("b")
    got = []
    with Prefetcher(lambda: (buf.sample(8), buf.batch_idxs.copy()), prefetch=3) as batches:
        for _ in range(20):
            got.append(next(batches))
    assert batches.closed
    for (g, gi), (e, ei) in zip(got, expected):
        np.testing.assert_array_equal(gi, ei)
        for key in e:
            np.testing.assert_array_equal(g[key], e[key], err_msg=key)
    buf.close()


def test_prefetcher_stays_ahead_and_closes_cleanly():
    calls = []

    def slow():
        calls.append(threading.current_thread().name)
        time.sleep(0.01)
        return len(calls)

    p = Prefetcher(slow, prefetch=2)
    assert next(p) == 1 and next(p) == 2
    time.sleep(0.1)  # the producer fills its queue (2 ahead) plus one batch in hand, then waits
    assert 3 <= len(calls) <= 5
    p.close()
    p.close()  # idempotent
    assert not p._thread.is_alive()
    with pytest.raises(StopIteration):
        next(p)
    assert set(calls) == {"diskreplay-prefetch"}  # one thread calls sample_fn, so the order is fixed


def test_prefetcher_count_and_errors():
    assert list(Prefetcher(iter(range(100)).__next__, prefetch=2, count=5)) == [0, 1, 2, 3, 4]
    items = iter([1, 2])
    p = Prefetcher(lambda: next(items), prefetch=4)
    assert next(p) == 1 and next(p) == 2
    with pytest.raises(StopIteration):  # the error of the third call, raised in the consumer
        next(p)
    assert not p._thread.is_alive()

    def boom():
        raise KeyError("no data")

    with Prefetcher(boom) as p:
        with pytest.raises(KeyError):
            next(p)
        with pytest.raises(StopIteration):
            next(p)
    with pytest.raises(ValueError):
        Prefetcher(boom, prefetch=0)
