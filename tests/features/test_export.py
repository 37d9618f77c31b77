"""diskreplay.export from Python: npz and HDF5 files read back with plain numpy and h5py.

The wrapped store has max_size 10 and 2 envs and holds transitions 7..16 of 16; transition t
has states [t, t, t], actions t, rewards t/2, log_probs -t and next state [t+2]*3.
"""
from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from diskreplay import DiskReplay, EmptyStoreError, InvalidArgumentError
from diskreplay.export import export_store, format_for
from diskreplay.views import batch_keys, snapshot

MAX_SIZE, NUM_ENVS, STEPS = 10, 2, 8
FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool"), "log_probs": ((), "float32")}
KEYS = ["states", "actions", "rewards", "next_states", "dones", "log_probs"]


@pytest.fixture
def wrapped(tmp_path, backend):
    path = tmp_path / "w.replay"
    with DiskReplay.create(path, MAX_SIZE, num_envs=NUM_ENVS, backend=backend, seed=0, fields=FIELDS) as buf:
        for step in range(STEPS):
            ts = np.arange(1 + NUM_ENVS * step, 1 + NUM_ENVS * (step + 1))
            col = ts[:, None].astype(np.float32)
            buf.add(np.repeat(col, 3, 1), ts, (ts / 2).astype(np.float32), np.repeat(col + NUM_ENVS, 3, 1),
                    ts % 5 == 0, log_probs=-ts.astype(np.float32))
    return path


def read_back(out, fmt) -> dict:
    if fmt == "npz":
        with np.load(out) as z:
            return {k: z[k] for k in z.files}
    with h5py.File(out, "r") as f:
        return {k: f[k][:] for k in f}


@pytest.mark.parametrize("fmt", ["npz", "hdf5"])
def test_export_reads_back_as_the_store_holds_it(wrapped, tmp_path, fmt):
    out = tmp_path / f"all.{'h5' if fmt == 'hdf5' else 'npz'}"
    with DiskReplay.open(wrapped, mode="r") as buf:
        result = export_store(buf, out)
        snap = snapshot(buf)
        want = buf.get(snap.slots(0, snap.size))
        assert batch_keys(buf) == KEYS
    assert result == {"rows": 10, "skipped_overwritten": 0, "format": fmt}
    got = read_back(out, fmt)
    assert sorted(got) == sorted(KEYS + ["slots"])
    assert got["slots"].tolist() == [6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
    assert got["actions"].tolist() == list(range(7, 17))
    for key in KEYS:
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
    assert got["next_states"][:, 0].tolist() == list(range(9, 19))
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_export_to_hdf5_records_where_the_rows_came_from(wrapped, tmp_path, backend):
    out = tmp_path / "part.h5"
    with DiskReplay.open(wrapped, mode="r") as buf:
        assert export_store(buf, out, start=-4, stop=-1)["rows"] == 3
    with h5py.File(out, "r") as f:
        assert f["actions"][:].tolist() == [13, 14, 15]
        assert f["slots"][:].tolist() == [2, 3, 4]
        assert dict(f.attrs) == {"source": "w.replay", "backend": backend, "max_size": MAX_SIZE,
                                 "num_envs": NUM_ENVS, "seen_size": 16, "first_transition": 13}
        for name, dset in f.items():  # chunks of whole rows: frames are never cut across columns
            assert dset.chunks == (3,) + dset.shape[1:], name


def test_hdf5_export_chunks_frames_by_whole_rows(tmp_path):
    fields = {"states": ((4, 84, 84), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    with DiskReplay.create(tmp_path / "f.replay", 100, fields=fields) as buf:
        for t in range(100):
            frame = np.full((4, 84, 84), t, np.uint8)
            buf.add(frame, t, 1.0, frame + 1, False)
        export_store(buf, tmp_path / "f.h5")
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f["states"].chunks == (37, 4, 84, 84)  # 1 MiB // 28 KiB rows
        assert f["actions"].chunks == (100,) and f["next_states"].chunks == (37, 4, 84, 84)
        assert (f["next_states"][:, 0, 0, 0] == np.arange(1, 101)).all()


def test_export_of_a_range_and_of_nothing(wrapped, tmp_path):
    with DiskReplay.open(wrapped, mode="r") as buf:
        export_store(buf, tmp_path / "mid.npz", start=2, stop=5)
        assert read_back(tmp_path / "mid.npz", "npz")["actions"].tolist() == [9, 10, 11]
        for fmt in ("npz", "hdf5"):
            out = tmp_path / f"none.{fmt}"
            assert export_store(buf, out, fmt=fmt, start=4, stop=4)["rows"] == 0
            got = read_back(out, fmt)
            assert got["states"].shape == (0, 3) and got["states"].dtype == np.float32
            assert got["slots"].shape == (0,)


def test_a_failed_export_leaves_the_old_file(wrapped, tmp_path):
    out = tmp_path / "keep.npz"
    out.write_bytes(b"old")

    def interrupt(done, total):
        raise KeyboardInterrupt

    with DiskReplay.open(wrapped, mode="r") as buf:
        for kwargs in ({"progress": interrupt}, {"fmt": "hdf5", "progress": interrupt}):
            with pytest.raises(KeyboardInterrupt):
                export_store(buf, out, **kwargs)
        for kwargs in ({"start": 1.5}, {"stop": "5"}, {"fmt": "csv"}):
            with pytest.raises(InvalidArgumentError):
                export_store(buf, out, **kwargs)
    assert out.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["keep.npz", "w.replay"]  # no temporary file left


def test_export_of_an_undeclared_store(tmp_path):
    with DiskReplay.create(tmp_path / "u.replay", 4, seed=0) as buf:
        with pytest.raises(EmptyStoreError):
            export_store(buf, tmp_path / "u.npz")
    assert not (tmp_path / "u.npz").exists()


def test_format_for():
    assert format_for("a.h5") == format_for("a.HDF5") == "hdf5"
    assert format_for("a.npz") == format_for("a") == "npz"
    assert format_for("a.h5", "npz") == "npz"


@pytest.mark.parametrize("fmt", ["npz", "hdf5"])
def test_export_beside_a_live_writer_that_laps_the_read(tmp_path, backend, monkeypatch, fmt):
    """Rows the writer overwrote before they were read are left out: the file holds fewer
    rows than announced (npz members moved down, HDF5 datasets cut), each the row the
    writer added, in order. Blocks of one row, and 3 steps added after each: the reads run a
    few blocks ahead of the writes on a second thread, not more, so rows are overtaken."""
    import diskreplay.chrono as chrono

    monkeypatch.setattr(chrono, "BLOCK_BYTES", 12 + 8 + 4 + 12 + 1 + 4)  # one row of every key
    path = tmp_path / "live.replay"
    writer = DiskReplay.create(path, MAX_SIZE, num_envs=NUM_ENVS, backend=backend, fields=FIELDS)
    step = iter(range(1000))

    def add_step(*_):
        ts = np.arange(1, 1 + NUM_ENVS) + NUM_ENVS * next(step)  # the transition numbers
        col = ts[:, None].astype(np.float32)
        writer.add(np.repeat(col, 3, 1), ts, (ts / 2).astype(np.float32), np.repeat(col + NUM_ENVS, 3, 1),
                   ts % 5 == 0, log_probs=-ts.astype(np.float32))

    for _ in range(STEPS):
        add_step()
    out = tmp_path / f"live.{'h5' if fmt == 'hdf5' else 'npz'}"
    with DiskReplay.open(path, mode="r") as buf:
        result = export_store(buf, out, progress=lambda *a: [add_step() for _ in range(3)])
    writer.close()
    got = read_back(out, fmt)
    assert result["skipped_overwritten"] > 0 and result["rows"] == MAX_SIZE - result["skipped_overwritten"]
    t = got["actions"]
    assert len(t) == result["rows"] and (np.diff(t) > 0).all()
    for key in KEYS + ["slots"]:
        assert len(got[key]) == len(t), key
    assert np.array_equal(got["states"], np.repeat(t[:, None], 3, 1).astype(np.float32))
    assert np.array_equal(got["next_states"][:, 0], (t + NUM_ENVS).astype(np.float32))
    assert np.array_equal(got["log_probs"], -t.astype(np.float32)) and np.array_equal(got["slots"], (t - 1) % MAX_SIZE)
