"""RowReader (positioned reads after read-ahead hints), page_cached, and the cold-row path
of sample() that uses them."""
import errno
import mmap
import os

import numpy as np
import pytest

import diskreplay.backends.gather as gather_module
from diskreplay import DiskReplay
from diskreplay.backends import BACKENDS
from diskreplay.errors import InvalidArgumentError, StoreIOError
from diskreplay.disk.rowreader import PAGE, RowReader, _page_ranges, page_cached
from diskreplay.testing import raw_rows


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
            for name, arr in raw_rows(buf).items():
                fd, offset, row_bytes = buf._session.storage.locations[name]
                out = np.empty((len(idxs),) + arr.shape[1:], arr.dtype)
                assert reader.gather(fd, offset, row_bytes, idxs, out) is out
                np.testing.assert_array_equal(out, arr[idxs], err_msg=name)
            # several fields in one pass, from a cold page cache too
            for f in buf._session.storage.files:
                os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            requests = [buf._session.storage.locations[name] + (idxs[::-1], np.empty((len(idxs),) + arr.shape[1:], arr.dtype))
                        for name, arr in raw_rows(buf).items()]
            outs = reader.gather_many(requests)
            for (name, arr), out in zip(raw_rows(buf).items(), outs):
                np.testing.assert_array_equal(out, arr[idxs[::-1]], err_msg=name)
            empty = np.empty((0, 3, 5), np.float32)
            assert reader.gather(*buf._session.storage.locations["states"], [], empty) is empty
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
        for f in buf._session.storage.files:
            for m in f.maps:
                m.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        taken = []
        gatherer = buf._session.gatherer
        real = type(gatherer)._gather_large
        monkeypatch.setattr(gatherer, "_gather_large", lambda *a: taken.append(1) or real(gatherer, *a),
                            raising=False)
        batch = buf.sample(16)
        assert taken == [1]
        np.testing.assert_array_equal(batch["states"], frames[buf.batch_idxs])
        np.testing.assert_array_equal(batch["actions"], buf.batch_idxs)
        buf.get(np.arange(40))  # brings every row into RAM, by whichever path
        # The mapping is trusted again after WARM_STREAK probes in a row found their rows.
        probes_per_batch = min(16, gather_module.PROBE_ROWS)
        warming = -(-gather_module.WARM_STREAK // probes_per_batch)
        gatherer.probe_streak = 0  # as right after a probe miss
        before = len(taken)
        for _ in range(warming - 1):
            buf.sample(16)
        assert len(taken) == before + warming - 1
        batch = buf.sample(16)
        assert len(taken) == before + warming - 1  # warm now: the gather mapping
        np.testing.assert_array_equal(batch["states"], frames[buf.batch_idxs])
    finally:
        buf.close()


LARGE = {"states": ((4, 64, 64), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
         "dones": ((), "bool")}


def _drop(buf):
    """The store's pages out of the page cache, as the benchmark's W4 drops them."""
    for f in buf._session.storage.files:
        for m in f.maps:
            m.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cold_batches_keep_the_small_fields_in_ram(tmp_path, backend):
    """The first cold batch reads the small fields in whole and keeps them (PinnedRange):
    dropping the page cache leaves them resident while the frames go, the live writer's
    new rows show through them at once, and batches equal the mapping path's rows."""
    rng = np.random.default_rng(8)
    frames = rng.integers(0, 255, (60, 4, 64, 64), dtype=np.uint8)
    buf = DiskReplay.create(tmp_path / "s", 40, fields=LARGE, seed=4, backend=backend)
    try:
        for t in range(40):
            buf.add(frames[t], t, float(t), frames[t + 1], t % 7 == 0)
        buf.flush()
        gatherer = buf._session.gatherer
        assert gatherer.pinned == "nothing yet (no cold batch)"
        for _ in range(3):
            _drop(buf)
            batch = buf.sample(16)
            idxs = buf.batch_idxs
            np.testing.assert_array_equal(batch["states"], frames[idxs])
            np.testing.assert_array_equal(batch["actions"], idxs)
            np.testing.assert_array_equal(batch["rewards"], idxs.astype(np.float32))
            np.testing.assert_array_equal(batch["dones"], idxs % 7 == 0)
        assert sorted(gatherer.resident) == ["actions", "dones", "rewards"]
        assert gatherer.pinned.startswith("actions, rewards, dones: ")
        fd, offset, row_bytes = buf._session.storage.locations["actions"]
        _drop(buf)
        assert page_cached(fd, offset + 39 * row_bytes) is True  # kept through the drop
        fd, offset, row_bytes = buf._session.storage.locations["states"]
        assert page_cached(fd, offset + 39 * row_bytes) is False
        for t in range(40, 52):  # the writer overwrites slots 0..11: seen through the pinned pages
            buf.add(frames[t], 1000 + t, -1.0, frames[t + 1], True)
        _drop(buf)
        batch = buf.get(np.arange(12))
        np.testing.assert_array_equal(batch["actions"], 1000 + np.arange(40, 52))
        assert batch["dones"].all() and (batch["rewards"] == -1).all()
    finally:
        buf.close()
    assert gatherer.pins == [] and gatherer.resident == {}


@pytest.mark.parametrize("fail", ["budget", "map"])
def test_cold_batches_read_small_fields_when_they_cannot_stay(tmp_path, monkeypatch, fail):
    """Over RESIDENT_BYTES, or when mapping fails, the small fields are read with the frames."""
    if fail == "budget":
        monkeypatch.setattr(gather_module, "RESIDENT_BYTES", 100)
    else:
        def refuse(*args):
            raise OSError(errno.ENOMEM, "no room")
        monkeypatch.setattr(gather_module, "PinnedRange", refuse)
    frames = np.random.default_rng(9).integers(0, 255, (41, 4, 64, 64), dtype=np.uint8)
    buf = DiskReplay.create(tmp_path / "s", 40, fields=LARGE, seed=4)
    try:
        for t in range(40):
            buf.add(frames[t], t, float(t), frames[t + 1], False)
        buf.flush()
        _drop(buf)
        batch = buf.sample(16)
        np.testing.assert_array_equal(batch["states"], frames[buf.batch_idxs])
        np.testing.assert_array_equal(batch["actions"], buf.batch_idxs)
        assert buf._session.gatherer.pinned == "nothing" and buf._session.gatherer.pins == []
    finally:
        buf.close()


def test_cold_reads_names_what_stays_in_ram(monkeypatch):
    import diskreplay.disk.mapped as mapped_module

    atari = {"states": 28_224, "actions": 8, "rewards": 4, "dones": 1, "infos": 8_192}
    assert gather_module.cold_reads({"states": 16, "actions": 8}, 10 ** 6) == "through the mapping (small rows)"
    assert gather_module.cold_reads({"states": 7_056, "actions": 8}, 10, frame_stack=True).startswith("frames by")
    assert gather_module.resident_fields(atari, 100_000) == (["actions", "rewards", "dones"], 1_300_000)
    monkeypatch.setattr(gather_module, "lock_refused", lambda nbytes: None)
    assert gather_module.cold_reads(atari, 100_000) == \
        "frames by hinted reads; actions, rewards, dones in RAM (1.2 MiB, locked)"
    assert gather_module.cold_reads(atari, 10 ** 7) == \
        "hinted reads of every field (small fields 124.0 MiB, over the 64 MiB kept in RAM)"
    monkeypatch.setattr(gather_module, "lock_refused", mapped_module.lock_refused)
    monkeypatch.setattr(mapped_module, "CAP_IPC_LOCK", 63)  # as a process without the capability
    limit = mapped_module.resource.getrlimit(mapped_module.resource.RLIMIT_MEMLOCK)[0]
    if limit != mapped_module.resource.RLIM_INFINITY:
        assert mapped_module.lock_refused(limit + 1) == f"RLIMIT_MEMLOCK {limit >> 10} KiB"
    assert mapped_module.lock_refused(0) is None


def test_pinned_range_says_why_it_is_not_locked(tmp_path, monkeypatch):
    import diskreplay.disk.mapped as mapped_module

    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 64)
    monkeypatch.setattr(mapped_module, "_mlock", lambda address, length: "mlock failed: no (RLIMIT_MEMLOCK)")
    fd = os.open(path, os.O_RDONLY)
    try:
        pin = mapped_module.PinnedRange(fd, 300, 1000)
        assert pin.locked.startswith("mlock failed")
        arr = pin.array(0, (1000,), np.uint8)
        np.testing.assert_array_equal(arr, (np.arange(300, 1300) % 256).astype(np.uint8))
        assert not arr.flags.writeable
        del arr
        pin.close()
    finally:
        os.close(fd)


def test_rowreader_refuses_bad_output_and_rows_past_the_end(tmp_path):
    buf = _store_with_rows(tmp_path, "memmap", rows=8)
    fd, offset, row_bytes = buf._session.storage.locations["states"]
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


def test_rowreader_errors_are_diskreplay_errors(tmp_path):
    """Bad arguments are InvalidArgumentError, failed reads StoreIOError (errno kept)."""
    path = tmp_path / "rows"
    path.write_bytes(os.urandom(10 * 16))
    fd = os.open(path, os.O_RDONLY)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for threads in (0, -1, 1.5, "2", None):
            with pytest.raises(InvalidArgumentError):
                RowReader(threads=threads)
        with RowReader() as reader:
            with pytest.raises(InvalidArgumentError):
                reader.gather(fd, 0, 16, [0, 1], np.empty((3, 4), np.float32))  # 3 rows for 2
            with pytest.raises(InvalidArgumentError):
                reader.gather(fd, 0, 16, [0, 1], np.empty((4, 2), np.float32).T)  # not C-contiguous
            with pytest.raises(InvalidArgumentError):
                reader.gather(fd, 0, 16, [-1], np.empty((1, 4), np.float32))
            with pytest.raises(StoreIOError, match="short read"):
                reader.gather(fd, 0, 16, [3, 10], np.empty((2, 4), np.float32))  # row 10 is past the end
            with pytest.raises(StoreIOError) as caught:
                reader.gather(dir_fd, 0, 16, [0], np.empty((1, 4), np.float32))
            assert caught.value.errno == errno.EISDIR
            out = reader.gather(fd, 0, 16, [9, 0], np.empty((2, 4), np.float32))
            assert out.tobytes() == path.read_bytes()[9 * 16:] + path.read_bytes()[:16]
    finally:
        os.close(fd)
        os.close(dir_fd)


def test_neighbouring_rows_asked_in_order_are_one_read(tmp_path, monkeypatch):
    """A frame stack's env-major rows (roworder.py) cost one preadv a span, not one a row;
    rows asked out of order, repeated or apart are still each where they belong."""
    path = tmp_path / "rows.bin"
    data = np.arange(100 * 24, dtype=np.uint8).reshape(100, 24)
    data.tofile(path)
    calls = []
    real = os.preadv

    def counting(fd, buffers, offset, *flags):
        calls.append(sum(len(b) for b in buffers))
        return real(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "preadv", counting)
    fd = os.open(path, os.O_RDONLY)
    try:
        with RowReader(nowait=False) as reader:  # as a cold batch's reads after its misses
            for idxs, spans in (([3, 4, 5, 6, 7, 40, 41, 42, 43, 44], [120, 120]),
                                ([7, 3, 4, 5, 90, 7, 6], [24, 72, 24, 24, 24])):
                calls.clear()
                out = np.empty((len(idxs), 24), np.uint8)
                reader.gather(fd, 0, 24, idxs, out)
                np.testing.assert_array_equal(out, data[idxs])
                assert sorted(calls) == sorted(spans)
    finally:
        os.close(fd)
