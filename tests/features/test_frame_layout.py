"""Where a frame-stack store's frames lie in the ``states`` file (``diskreplay/roworder.py``,
FORMAT.md "Frame stacks"): env-major when ``max_size % num_envs == 0`` (``store.json``'s
``frames_layout``), slot order otherwise and in stores made before the layout existed
(no key). Both orders on every backend: the rows are where FORMAT.md says, reads return
the stacks given (warm and cold, reopened, beside a live writer), ``convert`` carries
them over between backends and orders, and ``verify`` finds a damaged frame row.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from crash_common import add_step, stack_of, store_problems
from test_frame_stack import fill_stacked

from diskreplay import DiskReplay
from diskreplay.backends import BACKENDS
from diskreplay.backends.gather import Gatherer
from diskreplay.verify import verify_store

K = 4
# (num_envs, max_size, layout): env-major, slot order (max_size not a multiple), one env
CASES = [(3, 30, "env-major"), (3, 29, None), (1, 23, "env-major"), (4, 24, "env-major")]
# ... and stores made before the layout existed (old=True): slot order, whatever max_size
ORDERS = [case + (False,) for case in CASES] + [case + (True,) for case in CASES if case[2]]


def assert_rows_as_given(buf, idxs=None):
    """Every slot (or ``idxs``) holds the state and exact next state ``add_step`` gave."""
    idxs = np.arange(buf.size) if idxs is None else np.asarray(idxs)
    got = buf.get(idxs)
    for i, slot in enumerate(idxs.tolist()):
        t = buf.seen_size - (buf.head - slot) % buf.max_size
        np.testing.assert_array_equal(got["states"][i], stack_of(t, buf.num_envs, K), err_msg=f"slot {slot}")
        np.testing.assert_array_equal(got["next_states"][i], stack_of(t, buf.num_envs, K, True),
                                      err_msg=f"slot {slot}")
    return got


def as_old_store(path):
    """Make a just-created store one of a diskreplay before the layout: no ``frames_layout``
    (the data files of both orders are the same until the first add), format version 2."""
    desc = json.load(open(os.path.join(path, "store.json")))
    desc.pop("frames_layout")
    desc["format_version"] = 2
    with open(os.path.join(path, "store.json"), "w") as f:
        json.dump(desc, f)


def made(tmp_path, backend, n, m, old=False, steps=40):
    """A store of ``steps`` steps of ``crash_common.add_step`` (episodes of 7 steps per env)."""
    path = str(tmp_path / "s")
    fill_stacked(path, backend, num_envs=n, max_size=m, steps=0).close()
    if old:
        as_old_store(path)
    buf = DiskReplay.open(path, mode="r+")
    for t in range(1, 1 + steps * n, n):
        add_step(buf, t)
    return path, buf


def frame_rows(path, backend, m):
    """The ``states`` rows as stored, read without diskreplay."""
    if backend == "hdf5":
        import h5py
        with h5py.File(os.path.join(path, "data.h5"), "r") as f:
            return f["states"][:]
    return np.array(np.load(os.path.join(path, "states.npy"), mmap_mode="r"))


def row_of(desc, slot):
    """FORMAT.md's rule: the row of the states file that holds a slot's frame."""
    m, n = desc["max_size"], desc["num_envs"]
    if desc.get("frames_layout") == "env-major":
        return slot % n * (m // n) + slot // n
    return slot


@pytest.mark.parametrize("n, m, layout, old", ORDERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_frames_lie_where_format_md_says(tmp_path, backend, n, m, layout, old):
    path, buf = made(tmp_path, backend, n, m, old)
    seen, head = buf.seen_size, buf.head
    buf.close()
    desc = json.load(open(os.path.join(path, "store.json")))
    assert desc.get("frames_layout") == (None if old else layout)
    rows = frame_rows(path, backend, m)
    for slot in range(m):
        t = seen - (head - slot) % m
        np.testing.assert_array_equal(rows[row_of(desc, slot)], stack_of(t, n, K)[-1], err_msg=f"slot {slot}")
    with DiskReplay.open(path, mode="r") as ro:
        assert store_problems(ro, min_seen=seen, max_seen=seen) == []


@pytest.mark.parametrize("n, m, layout, old", ORDERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_both_orders_read_warm_cold_reopened_and_live(tmp_path, monkeypatch, backend, n, m, layout, old):
    path, buf = made(tmp_path, backend, n, m, old, steps=25)
    seen = buf.seen_size
    with DiskReplay.open(path, mode="r") as reader:  # beside the live writer, as it wraps
        for _ in range(3 * m // n):
            add_step(buf, seen + 1)
            seen += n
            assert store_problems(reader, min_seen=seen, max_seen=seen) == []
    buf.flush()
    buf.reset()
    for t in range(seen + 1, seen + 1 + 5 * n, n):  # after a reset: the ring starts again at slot 0
        add_step(buf, t)
    seen += 5 * n
    want = assert_rows_as_given(buf)
    buf.close()
    with DiskReplay.open(path, mode="r+") as buf:  # reopened: the same rows, and it carries on
        got = buf.get(np.arange(buf.size))
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        for t in range(seen + 1, seen + 1 + 2 * m * n, n):  # wraps twice
            add_step(buf, t)
        assert_rows_as_given(buf)
        buf.flush()
    monkeypatch.setattr(Gatherer, "rows_cached", lambda self, idxs: False)  # the cold path: spans of frames
    with DiskReplay.open(path, mode="r") as ro:
        assert_rows_as_given(ro)
        rng = np.random.default_rng(n + m)
        for _ in range(5):
            assert_rows_as_given(ro, rng.integers(0, ro.size, 32))
            ro.sample(32)
    assert verify_store(path).ok


@pytest.mark.parametrize("n, m, layout, old", [o for o in ORDERS if o[0] == 3])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("other", BACKENDS)
def test_convert_carries_frames_between_backends_and_orders(tmp_path, backend, other, n, m, layout, old):
    """A converted store gets the layout a new store gets: an old store's frames are
    rewritten env-major where ``max_size`` is a multiple of ``num_envs``."""
    path, buf = made(tmp_path, backend, n, m, old)
    seen = buf.seen_size
    want = buf.get(np.arange(buf.size))
    buf.close()
    DiskReplay.convert(path, str(tmp_path / "c"), backend=other)
    desc = json.load(open(tmp_path / "c" / "store.json"))
    assert desc.get("frames_layout") == layout
    assert verify_store(str(tmp_path / "c")).ok
    with DiskReplay.open(str(tmp_path / "c"), mode="r+") as conv:
        got = conv.get(np.arange(conv.size))
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        for t in range(seen + 1, seen + 1 + 20 * n, n):
            add_step(conv, t)
        assert store_problems(conv, min_seen=seen + 20 * n, max_seen=seen + 20 * n) == []
        head = conv.head
    rows = frame_rows(str(tmp_path / "c"), other, m)
    for slot in range(m):
        t = seen + 20 * n - (head - slot) % m
        np.testing.assert_array_equal(rows[row_of(desc, slot)], stack_of(t, n, K)[-1], err_msg=f"slot {slot}")


@pytest.mark.parametrize("n, m, layout", CASES[:2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_finds_a_damaged_frame_row(tmp_path, backend, n, m, layout):
    path, buf = made(tmp_path, backend, n, m, steps=30)
    buf.flush()  # every row has its CRC
    storage = buf._session.storage
    fd, offset, row_bytes = storage.locations["states"]
    slot = 7
    row = int(storage.rows("states", np.array([slot]))[0])
    buf.close()
    desc = json.load(open(os.path.join(path, "store.json")))
    assert row == row_of(desc, slot) and (row != slot) == (layout == "env-major" and n > 1)
    assert verify_store(path).ok
    target = os.path.join(path, "states.npy" if backend == "memmap" else "data.h5")
    with open(target, "r+b") as f:
        f.seek(offset + row * row_bytes + 3)
        byte = f.read(1)
        f.seek(offset + row * row_bytes + 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = verify_store(path)
    assert not report.ok
    assert any(f"slots {slot}" in p and "CRC" in p for p in report.problems), report.problems


def test_a_bad_layout_key_is_a_corrupt_description(tmp_path):
    from diskreplay.errors import CorruptStoreError

    path, buf = made(tmp_path, "memmap", 3, 29, steps=2)
    buf.close()
    desc = json.load(open(os.path.join(path, "store.json")))
    desc["frames_layout"] = "env-major"  # 29 is not a multiple of 3: no such layout
    with open(os.path.join(path, "store.json"), "w") as f:
        json.dump(desc, f)
    with pytest.raises(CorruptStoreError, match="frames_layout"):
        DiskReplay.open(path, mode="r")


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_major_stores_are_format_3_so_older_readers_refuse_them(tmp_path, backend):
    """A diskreplay that reads up to version 2 would read env-major frames in slot order: the
    stores with that layout say version 3 (and only they), and a description that pairs the
    version and the layout otherwise is refused."""
    from diskreplay.errors import CorruptStoreError

    versions = {}
    for n, m in ((3, 30), (3, 29)):
        path = str(tmp_path / f"s{m}")
        fill_stacked(path, backend, num_envs=n, max_size=m, steps=2).close()
        desc = json.load(open(os.path.join(path, "store.json")))
        versions[m] = desc["format_version"]
        if backend == "hdf5":
            import h5py
            with h5py.File(os.path.join(path, "data.h5"), "r") as f:
                assert int(f.attrs["diskreplay_format_version"]) == versions[m]
        desc["format_version"] = 5 - desc["format_version"]  # 3 <-> 2, the layout key kept
        with open(os.path.join(path, "store.json"), "w") as f:
            json.dump(desc, f)
        with pytest.raises(CorruptStoreError, match="format_version"):
            DiskReplay.open(path, mode="r")
    assert versions == {30: 3, 29: 2}
    DiskReplay.create(str(tmp_path / "plain"), 30, num_envs=3, seed=0).close()
    assert json.load(open(tmp_path / "plain" / "store.json"))["format_version"] == 2


def test_only_frame_stack_stores_get_a_layout(tmp_path):
    DiskReplay.create(str(tmp_path / "w"), 30, num_envs=3, seed=0).close()
    assert "frames_layout" not in json.load(open(tmp_path / "w" / "store.json"))
