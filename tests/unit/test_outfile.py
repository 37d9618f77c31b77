"""Rows written straight into an HDF5 file's pre-allocated chunks (outfile.PlacedRows) read
back through h5py exactly as written, across chunk edges, for raw and h5py-written dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from diskreplay.export.placed import PlacedRows, WriteBehind, create_placed, writes_raw

import h5py  # noqa: E402


@pytest.mark.parametrize("dtype,shape", [("uint8", (3, 5)), ("int64", ()), ("float32", (2,)), ("bool", ()),
                                         ("float16", (4,)), (">f4", (2,)), ("complex64", ())])
def test_placed_rows_read_back_as_written(tmp_path, dtype, shape):
    path = str(tmp_path / "f.h5")
    rows = 103
    rng = np.random.default_rng(0)
    want = rng.normal(size=(rows,) + shape) * 50
    want = (want > 0) if dtype == "bool" else want.astype(dtype)
    with h5py.File(path, "w") as f, WriteBehind.opening(path) as out:
        place = PlacedRows(create_placed(f, "x", rows, shape, np.dtype(dtype), chunk_rows=7), out)
        assert place.raw == writes_raw(np.dtype(dtype))
        lo = 0
        for n in (1, 6, 7, 15, 0, 30, 44):  # blocks that start and end inside chunks and on their edges
            place.write(lo, want[lo:lo + n])
            lo += n
        assert lo == rows
    with h5py.File(path, "r") as f:
        got = f["x"][:]
        assert f["x"].chunks == (7,) + shape and f["x"].maxshape == (None,) + shape
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)


def test_placed_rows_then_a_shorter_dataset(tmp_path):
    """Fewer rows than announced (a live writer overtook some): the dataset is cut to them."""
    path = str(tmp_path / "f.h5")
    want = np.arange(40 * 6, dtype=np.uint8).reshape(40, 6)
    with h5py.File(path, "w") as f, WriteBehind.opening(path) as out:
        dset = create_placed(f, "x", 50, (6,), np.dtype(np.uint8), chunk_rows=8)
        PlacedRows(dset, out).write(0, want)
        dset.resize(40, axis=0)
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["x"][:], want)


def test_write_behind_asks_for_writeback_of_merged_ranges(tmp_path, monkeypatch):
    import diskreplay.export.placed as outfile

    advised = []
    monkeypatch.setattr(outfile, "KICK_BYTES", 100)
    monkeypatch.setattr(outfile, "DROP_LAG", 1)
    monkeypatch.setattr(outfile, "MIN_BYTES", 50)
    monkeypatch.setattr(outfile, "GAP_BYTES", 10)
    monkeypatch.setattr(outfile, "_advise", lambda fd, ranges: advised.append(list(ranges)))
    path = str(tmp_path / "f.bin")
    open(path, "wb").close()
    with WriteBehind.opening(path) as out:
        out.write(memoryview(b"a" * 60), 0)
        out.write(memoryview(b"b" * 55), 65)  # 115 bytes: one request, the writes 5 bytes apart merged
        out.write(memoryview(b"c" * 10), 300)  # too small to ask for alone: left to the final fsync
        out.write(memoryview(b"d" * 90), 500)  # the next request; the first stretch dropped
    assert advised == [[(0, 120)], [(500, 90)], [(0, 120)]]
    assert open(path, "rb").read(120) == b"a" * 60 + b"\0" * 5 + b"b" * 55


def test_rows_apart_in_memory_are_gathered_into_place(tmp_path, monkeypatch):
    """Every third row of a block (one env's rows, say), large rows: written by pwritev
    without a copy, in pieces of at most IOV_MAX rows, across chunk edges."""
    import diskreplay.export.placed as outfile

    monkeypatch.setattr(outfile, "IOV_MAX", 4)
    path = str(tmp_path / "f.h5")
    block = np.random.default_rng(1).integers(0, 256, (90, 64, 80), dtype=np.uint8)  # 5120-byte rows
    env_rows = block[1::3]
    assert not env_rows.flags.c_contiguous and outfile._rows_apart(env_rows, np.dtype(np.uint8), 5120)
    with h5py.File(path, "w") as f, WriteBehind.opening(path) as out:
        place = PlacedRows(create_placed(f, "x", 40, (64, 80), np.dtype(np.uint8), chunk_rows=7), out)
        place.write(3, env_rows[:17])
        place.write(20, env_rows[17:])
        place.write(0, block[:3])
        place.write(33, block[3:10])
    with h5py.File(path, "r") as f:
        got = f["x"][:]
    assert np.array_equal(got, np.concatenate([block[:3], env_rows, block[3:10]]))


def test_small_writes_are_gathered_and_a_rewrite_lands_after_them(tmp_path, monkeypatch):
    """Few-row writes to several regions (envs) become one write per region; a row written
    again while still gathered (a timeout set after the fact) first sends what was gathered
    around it, so it ends up with its last value."""
    import diskreplay.export.placed as outfile

    calls = []
    real = outfile.pwrite_all
    monkeypatch.setattr(outfile, "pwrite_all", lambda fd, view, offset: (calls.append(len(view)),
                                                                        real(fd, view, offset)))
    path = str(tmp_path / "f.h5")
    with h5py.File(path, "w") as f, WriteBehind.opening(path) as out:
        place = PlacedRows(create_placed(f, "t", 60, (), np.dtype(bool), chunk_rows=60), out)
        for lo in range(0, 30, 3):  # two envs' regions, three rows at a time each
            place.write(lo, np.zeros(3, bool))
            place.write(30 + lo, np.zeros(3, bool))
        assert not calls
        place.write(29, np.ones(1, bool))  # env 0's last row, still gathered: env 0's rows go first
        assert calls == [30]
        place.flush()
        place.write(59, np.ones(1, bool))  # gathered again, written when the file is done with
    assert sorted(calls) == [1, 1, 30, 30]
    with h5py.File(path, "r") as f:
        assert np.flatnonzero(f["t"][:]).tolist() == [29, 59]
