"""The C kernels of ``_rows`` against what they stand in for: ``crc_rows`` against zlib and
the numpy CRC of ``rowsums``, ``step`` against the vector fast add's Python body
(byte-identical stores, ``test_commit_paths.py`` runs both), and the refusals that keep a
step whole (a jump, a strided input, a closed writer, slots past the ring). The kernel's own
tests skip where it is absent (not built, or DISKREPLAY_PURE=1); the comparisons run the
numpy twin always (``kernels.py``)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from diskreplay import DiskReplay, StoreClosedError, native

from diskreplay.session import fastadd

from diskreplay.format import rowsums
from diskreplay.format.counters import W_CHECK, W_INTENT, W_KEY, W_SEEN
from kernels import IMPLS, c_kernel, implementation

FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


def test_the_kernels_are_used_where_built():
    rows = c_kernel("rows")
    assert rowsums.implementation() == "C" and native.implementations()["rows"] == "C"
    assert fastadd.step_kernel() is rows.step


def test_turned_off_the_twins_are_used():
    with native.turned_off("rows"):
        assert native.rows is None and native.missing("rows") is not None
        assert rowsums.implementation() == "numpy" and fastadd.step_kernel() is None
        assert native.implementations()["rows"] == "python"
    with pytest.raises(ValueError, match="unknown kernel group"):
        native.missing("nope")


@pytest.mark.parametrize("widths", [[16, 8, 4, 1], [1], [7, 9], [504], [3, 0, 5]])
def test_crc_rows_is_zlibs_crc_of_each_row_in_place(widths):
    rng = np.random.default_rng(sum(widths) + len(widths))
    rows = 50
    fields = [rng.integers(0, 256, (rows, w), dtype=np.uint8) for w in widths]
    slots = rng.integers(0, rows, 200)
    ts = rng.integers(-(2 ** 62), 2 ** 62, 200)
    out = np.empty(200, np.uint32)
    c_kernel("rows").crc_rows(out, slots, ts, fields, rows)
    for i in range(200):
        data = int(ts[i]).to_bytes(8, "little", signed=True) + b"".join(f[slots[i]].tobytes() for f in fields)
        assert int(out[i]) == zlib.crc32(data) == rowsums.row_sum(fields, int(slots[i]), int(ts[i]))


@pytest.mark.parametrize("widths", [[16, 8, 4, 1], [3], [100, 200, 195], [rowsums.VECTOR_ROW_BYTES - 8]])
@pytest.mark.parametrize("impl", IMPLS)
def test_batch_sums_equal_the_numpy_fallback(widths, impl):
    rng = np.random.default_rng(7)
    rows = [rng.integers(0, 256, (300, w), dtype=np.uint8) for w in widths]
    ts = rng.integers(0, 10 ** 12, 300)
    strided = [r[::2] for r in rows]  # not contiguous: copied first
    with implementation("rows", impl):
        assert rowsums.implementation() == ("C" if impl == "C" else "numpy")
        assert np.array_equal(rowsums.batch_sums(rows, ts), rowsums.batch_sums_numpy(rows, ts))
        assert np.array_equal(rowsums.batch_sums(strided, ts[:150]), rowsums.batch_sums_numpy(strided, ts[:150]))
        assert rowsums.batch_sums(rows, ts[:0]).shape == (0,)


def test_crc_rows_refuses_bad_arguments():
    _rows = c_kernel("rows")
    field = np.zeros((4, 3), np.uint8)
    out = np.empty(2, np.uint32)
    with pytest.raises(IndexError):
        _rows.crc_rows(out, np.array([0, 4]), np.array([1, 2]), [field], 4)
    with pytest.raises(ValueError):
        _rows.crc_rows(out, np.array([0]), np.array([1, 2]), [field], 4)
    with pytest.raises(ValueError):
        _rows.crc_rows(out, np.array([0, 1]), np.array([1, 2]), [field], 5)  # 12 bytes are not 5 rows
    with pytest.raises(TypeError):
        _rows.crc_rows(np.empty(2, np.float64), np.array([0, 1]), np.array([1, 2]), [field], 4)
    with pytest.raises((TypeError, ValueError, BufferError)):
        _rows.crc_rows(bytes(8), np.array([0, 1]), np.array([1, 2]), [field], 4)  # not writable


def steps(num_envs: int, count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((num_envs, 3)).astype(np.float32)
    for _ in range(count):
        nxt = rng.standard_normal((num_envs, 3)).astype(np.float32)
        yield (obs, rng.integers(-5, 5, num_envs), rng.standard_normal(num_envs).astype(np.float32), nxt,
               rng.integers(0, 2, num_envs).astype(bool))
        obs = nxt


def test_step_writes_what_the_python_body_writes(tmp_path):
    """Two stores fed the same steps, one bound with the kernel and one without: the same
    rows, next states and counter words after every step (strided inputs take the Python
    copies inside the kernel's store too)."""
    _rows = c_kernel("rows")
    c_buf = DiskReplay.create(tmp_path / "c", 40, num_envs=4, fields=FIELDS, seed=1)
    with native.turned_off("rows"):  # looked up when the fast add is bound
        py_buf = DiskReplay.create(tmp_path / "py", 40, num_envs=4, fields=FIELDS, seed=1)
    assert _kernel_of(c_buf.add) is _rows.step and _kernel_of(py_buf.add) is None
    with c_buf, py_buf:
        for i, (s, a, r, ns, d) in enumerate(steps(4, 30)):
            if i % 7 == 3:
                a = np.repeat(a, 2)[::2]  # strided: the kernel says None, Python copies it
            c_buf.add(s, a, r, ns, d)
            py_buf.add(s, a, r, ns, d)
            for name, arr in c_buf._session.storage.arrays.items():
                assert arr.tobytes() == py_buf._session.storage.arrays[name].tobytes(), (i, name)
            assert c_buf._session.data.ns.tobytes() == py_buf._session.data.ns.tobytes()
            cw, pw = c_buf._session.words, py_buf._session.words
            for w in (W_SEEN, W_INTENT):
                assert cw[w] == pw[w]
            assert cw[W_CHECK] ^ cw[W_KEY] == pw[W_CHECK] ^ pw[W_KEY] == c_buf.seen_size


def _kernel_of(add):
    """The kernel a vector fast add was bound with (None: its Python body only)."""
    return add.__closure__[add.__code__.co_freevars.index("kernel")].cell_contents


def _plan_and_words(tmp_path):
    buf = DiskReplay.create(tmp_path / "k", 8, num_envs=2, fields=FIELDS, seed=1)
    return buf, fastadd.step_plan(buf._session), buf._session.words


def test_step_refuses_what_is_not_its_own_without_writing(tmp_path):
    """False for the general path's steps (a jump, a step across the ring end, a flush or
    its early work due), None for a strided input, errors for bad arguments: nothing written."""
    _rows = c_kernel("rows")
    buf, plan, words = _plan_and_words(tmp_path)
    with buf:
        s, a, r, ns, d = next(steps(2, 1))
        zeros = np.zeros((2, 3), np.float32)  # what ns area 0 holds before the first step
        arrays = buf._session.storage.arrays

        def snapshot():
            return [arr.tobytes() for arr in arrays.values()] + [words.tobytes(), buf._session.data.ns.tobytes()]

        before = snapshot()
        assert _rows.step(plan, words, 0, 0, 1 << 62, s, a, r, d, ns) is False  # a jump
        assert _rows.step(plan, words, 7, 0, 1 << 62, zeros, a, r, d, ns) is False  # slots 7, 8 of 8
        assert _rows.step(plan, words, 0, 0, 1, zeros, a, r, d, ns) is False  # t_end 2 past due 1
        assert _rows.step(plan, words, 0, 0, 1 << 62, zeros, np.repeat(a, 2)[::2], r, d, ns) is None
        with pytest.raises(ValueError):
            _rows.step(plan, words, 0, 0, 1 << 62, np.zeros((3, 3), np.float32), a, r, d, ns)  # 3 rows of states
        with pytest.raises(ValueError):
            _rows.step(plan, words, 0, 2, 1 << 62, zeros, a, r, d, ns)  # seen before base
        with pytest.raises(TypeError):
            _rows.step(plan[:-8], words, 0, 0, 1 << 62, zeros, a, r, d, ns)
        assert snapshot() == before
        assert _rows.step(plan, words, 8, 8, 1 << 62, zeros, a, r, d, ns) is True  # slot 0 of a ring based at 8
        assert words[W_SEEN] == words[W_INTENT] == 10 and words[W_CHECK] ^ words[W_KEY] == 10
        assert np.array_equal(arrays["states"][:2], zeros) and np.array_equal(arrays["actions"][:2], a)
        assert np.array_equal(buf._session.data.ns[(10 // 2) & 1], ns)
        words[W_SEEN] = words[W_INTENT] = 0  # back to what the writer committed
        words[W_CHECK] = words[W_KEY]


def test_a_kept_fast_add_refuses_after_close_through_the_kernel(tmp_path):
    """The kernel writes only while the counter words are writable: close makes them
    read-only, so a kept reference cannot store into the files even past the live check."""
    _rows = c_kernel("rows")
    buf, plan, words = _plan_and_words(tmp_path)
    s, a, r, ns, d = next(steps(2, 1))
    add = buf.add
    add(np.zeros((2, 3), np.float32), a, r, ns, d)
    buf.close()
    with pytest.raises(StoreClosedError):
        add(ns, a, r, ns, d)
    with pytest.raises(ValueError):  # the counter words are read-only now
        _rows.step(plan, words, 2, 0, 1 << 62, ns, a, r, d, ns)
    with DiskReplay.open(tmp_path / "k") as again:
        assert again.seen_size == 2
