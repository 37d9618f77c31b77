"""The contract of a storage backend (``diskreplay/backends/base.py``), as one suite that every
backend's test class subclasses (the form of zarr's ``StoreTests``).

A subclass names the backend and implements two raw hooks that bypass it: they read and
write one row of one field with plain ``numpy.load``/``np.memmap``, plain h5py, or whatever
library owns the backend's file format, and never call diskreplay::

    class TestMemmap(BackendContract):
        name = "memmap"

        def read_row(self, directory, field, slot):
            return np.load(os.path.join(directory, f"{field}.npy"), mmap_mode="r")[slot].copy()

        def write_row(self, directory, field, slot, value):
            ...

Rows are seeded through ``write_row`` and checked through the backend's views, and written
through the backend and checked through ``read_row``, so a backend that agrees only with
itself (a wrong offset, dtype or layout that it reads back the same wrong way) fails.
"""
from __future__ import annotations

import abc
import os

import numpy as np
import pytest

from diskreplay.backends import BACKENDS, Backend, RowStorage, get_backend
from diskreplay.format.description import FORMAT_VERSION
from diskreplay.errors import CorruptStoreError
from diskreplay.core.schema import FieldSpec

MAX_SIZE = 13  # odd, so no row offset is a round number by chance

FIELD_SETS = {
    # Atari frames: 28 KiB rows, several pages each, next to one-byte and eight-byte scalars.
    "frames": {"states": ((4, 84, 84), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
               "dones": ((), "bool")},
    # Scalars only, rows smaller than a page and not a multiple of 8 bytes.
    "scalars": {"dones": ((), "bool"), "actions": ((), "int64"), "rewards": ((), "float32")},
    # Vectors and matrices of other dtypes.
    "vectors": {"states": ((4,), "float32"), "log_probs": ((2, 3), "float64"), "tags": ((5,), "int16"),
                "masks": ((3,), "bool"), "ids": ((2,), "uint32")},
}
KINDS = sorted(FIELD_SETS)


def specs(kind: str) -> dict[str, FieldSpec]:
    return {name: FieldSpec(name, tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in FIELD_SETS[kind].items()}


def row_value(spec: FieldSpec, slot: int, salt: int = 0) -> np.ndarray:
    """A value for one row that differs from every other (field, slot, salt)'s."""
    rng = np.random.default_rng([sum(map(ord, spec.name)), slot, salt])
    if spec.dtype.kind == "b":
        value = rng.integers(0, 2, spec.shape).astype(bool)
        value.reshape(-1)[:1] = (slot + salt) % 2 == 0  # scalars: alternate from slot to slot
        return value
    if spec.dtype.kind in "iu":
        info = np.iinfo(spec.dtype)
        return rng.integers(info.min, info.max, spec.shape, dtype=spec.dtype, endpoint=True)
    return (rng.standard_normal(spec.shape) * 1000 + slot).astype(spec.dtype)


def edge_values(spec: FieldSpec) -> np.ndarray:
    """A row of the extreme values of the field's dtype (cycled over the row's elements)."""
    if spec.dtype.kind == "b":
        edges = [True, False]
    elif spec.dtype.kind in "iu":
        info = np.iinfo(spec.dtype)
        edges = [info.min, info.max, 0, 1, info.max - 1]
    else:
        info = np.finfo(spec.dtype)
        edges = [np.nan, np.inf, -np.inf, -0.0, info.max, info.min, info.tiny, info.eps]
    n = int(np.prod(spec.shape, dtype=np.int64))
    return np.array([edges[k % len(edges)] for k in range(max(n, 1))], dtype=spec.dtype)[:n].reshape(spec.shape)


def assert_same_bytes(got, want, what="") -> None:
    """Equal bit for bit (NaN payloads and the sign of zero included) and of the same dtype.

    Pass copies (``np.array(view)``), not views of a storage: a failure report shows the
    arguments after the test closed the storage, and a view of an unmapped file crashes."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == want.tobytes(), (what, got, want)


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_dev, st.st_ino


class BackendContract(abc.ABC):
    """What every backend promises. Subclass it as ``Test<Backend>`` with ``name`` and the hooks."""

    name: str = ""

    # ------------------------------------------------------------------ raw hooks
    @abc.abstractmethod
    def read_row(self, directory: str, field: str, slot: int) -> np.ndarray:
        """Row ``slot`` of ``field`` in the store's data files at ``directory``, read without the backend."""

    @abc.abstractmethod
    def write_row(self, directory: str, field: str, slot: int, value) -> None:
        """Write row ``slot`` of ``field`` into the data files at ``directory`` without the backend,
        durably enough that a later ``open`` of the backend sees it."""

    # ------------------------------------------------------------------ helpers
    @property
    def backend(self) -> Backend:
        return get_backend(self.name)

    def create(self, directory, kind: str, max_size: int = MAX_SIZE) -> dict[str, FieldSpec]:
        fields = specs(kind)
        os.makedirs(directory, exist_ok=True)
        self.backend.create(str(directory), fields, max_size, FORMAT_VERSION)
        return fields

    def open(self, directory, fields, writable: bool, max_size: int = MAX_SIZE) -> RowStorage:
        return self.backend.open(str(directory), fields, max_size, writable)

    def data_paths(self, directory, fields) -> list[str]:
        return [os.path.join(directory, name) for name in self.backend.data_files(fields)]

    # ------------------------------------------------------------------ identity and files
    def test_the_backend_is_registered_under_its_name(self):
        assert self.name in BACKENDS
        assert isinstance(self.backend, Backend) and self.backend.name == self.name

    @pytest.mark.parametrize("kind", KINDS)
    def test_create_makes_exactly_the_data_files(self, tmp_path, kind):
        fields = self.create(tmp_path, kind)
        names = self.backend.data_files(fields)
        assert names and len(set(names)) == len(names)
        assert all(not os.path.isabs(n) and os.path.normpath(n) == n and not n.startswith("..") for n in names)
        assert sorted(os.listdir(tmp_path)) == sorted(names)
        assert all(os.path.isfile(p) for p in self.data_paths(tmp_path, fields))

    @pytest.mark.parametrize("kind", KINDS)
    def test_data_bytes_covers_the_files_created(self, tmp_path, kind):
        fields = self.create(tmp_path, kind)
        on_disk = sum(os.path.getsize(p) for p in self.data_paths(tmp_path, fields))
        rows = sum(spec.row_bytes for spec in fields.values()) * MAX_SIZE
        assert rows <= on_disk <= self.backend.data_bytes(fields, MAX_SIZE)

    def test_create_syncs_every_data_file(self, tmp_path, monkeypatch):
        synced = set()
        real = os.fsync

        def fsync(fd):
            st = os.fstat(fd)
            synced.add((st.st_dev, st.st_ino))
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        fields = self.create(tmp_path, "vectors")
        assert {_identity(p) for p in self.data_paths(tmp_path, fields)} <= synced

    # ------------------------------------------------------------------ views
    @pytest.mark.parametrize("writable", [False, True])
    @pytest.mark.parametrize("kind", KINDS)
    def test_views_have_the_declared_shapes_and_dtypes(self, tmp_path, kind, writable):
        fields = self.create(tmp_path, kind)
        storage = self.open(tmp_path, fields, writable)
        try:
            for views in (storage.arrays, storage.gather_arrays):
                assert set(views) == set(fields)
                for name, spec in fields.items():
                    arr = views[name]
                    assert type(arr) is np.ndarray, name  # a plain ndarray, not an np.memmap
                    assert arr.shape == (MAX_SIZE,) + spec.shape and arr.dtype == spec.dtype, name
                    assert arr.flags.c_contiguous, name
            for name in fields:
                assert storage.arrays[name].flags.writeable is writable, name
                assert storage.gather_arrays[name].flags.writeable is False, name
        finally:
            storage.close()

    def test_read_only_views_refuse_writes(self, tmp_path):
        fields = self.create(tmp_path, "scalars")
        storage = self.open(tmp_path, fields, writable=False)
        try:
            for name, spec in fields.items():
                with pytest.raises(ValueError):
                    storage.arrays[name][0] = row_value(spec, 0)
                with pytest.raises(ValueError):
                    storage.gather_arrays[name][0] = row_value(spec, 0)
        finally:
            storage.close()

    @pytest.mark.parametrize("kind", KINDS)
    def test_locations_address_the_rows_of_each_field(self, tmp_path, kind):
        fields = self.create(tmp_path, kind)
        storage = self.open(tmp_path, fields, writable=False)
        try:
            assert set(storage.locations) == set(fields)
            spans = {}
            for name, spec in fields.items():
                fd, offset, row_bytes = storage.locations[name]
                assert row_bytes == spec.row_bytes and offset >= 0, name
                assert offset + MAX_SIZE * row_bytes <= os.fstat(fd).st_size, name
                spans.setdefault(os.fstat(fd).st_ino, []).append((offset, offset + MAX_SIZE * row_bytes))
            for ranges in spans.values():  # fields sharing a file do not overlap
                ranges.sort()
                assert all(end <= nxt for (_, end), (nxt, _) in zip(ranges, ranges[1:])), ranges
        finally:
            storage.close()

    # ------------------------------------------------------------------ raw rows in, backend out
    @pytest.mark.parametrize("kind", KINDS)
    def test_rows_seeded_raw_read_back_through_every_view(self, tmp_path, kind):
        fields = self.create(tmp_path, kind)
        for name, spec in fields.items():
            for slot in range(MAX_SIZE):
                self.write_row(str(tmp_path), name, slot, row_value(spec, slot))
        storage = self.open(tmp_path, fields, writable=False)
        try:
            for name, spec in fields.items():
                fd, offset, row_bytes = storage.locations[name]
                for slot in range(MAX_SIZE):
                    want = row_value(spec, slot)
                    assert_same_bytes(np.array(storage.arrays[name][slot]), want, (name, slot, "arrays"))
                    assert_same_bytes(np.array(storage.gather_arrays[name][slot]), want, (name, slot, "gather_arrays"))
                    raw = os.pread(fd, row_bytes, offset + slot * row_bytes)
                    assert raw == want.tobytes(), (name, slot, "locations")
                idxs = np.array([MAX_SIZE - 1, 0, 5, 5, 2])
                assert_same_bytes(storage.gather_arrays[name][idxs],
                                  np.stack([row_value(spec, int(i)) for i in idxs]), (name, "fancy index"))
        finally:
            storage.close()

    # ------------------------------------------------------------------ backend in, raw rows out
    @pytest.mark.parametrize("kind", KINDS)
    def test_rows_written_through_the_backend_are_in_the_files(self, tmp_path, kind):
        fields = self.create(tmp_path, kind)
        slots = [0, 1, MAX_SIZE // 2, MAX_SIZE - 1]
        storage = self.open(tmp_path, fields, writable=True)
        try:
            for name, spec in fields.items():
                for slot in slots:
                    storage.arrays[name][slot] = row_value(spec, slot, salt=1)
            storage.sync()
            for name, spec in fields.items():  # shared mappings: visible to others before close
                for slot in slots:
                    assert_same_bytes(self.read_row(str(tmp_path), name, slot), row_value(spec, slot, salt=1),
                                      (name, slot))
        finally:
            storage.close()
        for name, spec in fields.items():
            for slot in slots:
                assert_same_bytes(self.read_row(str(tmp_path), name, slot), row_value(spec, slot, salt=1),
                                  (name, slot, "after close"))

    def test_a_row_written_through_the_backend_leaves_its_neighbours_alone(self, tmp_path):
        fields = self.create(tmp_path, "vectors")
        for name, spec in fields.items():
            for slot in range(MAX_SIZE):
                self.write_row(str(tmp_path), name, slot, row_value(spec, slot))
        storage = self.open(tmp_path, fields, writable=True)
        try:
            for name, spec in fields.items():
                storage.arrays[name][6] = row_value(spec, 6, salt=2)
            storage.sync()
        finally:
            storage.close()
        for name, spec in fields.items():
            for slot in range(MAX_SIZE):
                assert_same_bytes(self.read_row(str(tmp_path), name, slot),
                                  row_value(spec, slot, salt=2 if slot == 6 else 0), (name, slot))

    def test_extreme_values_round_trip_bit_for_bit(self, tmp_path):
        kinds = {**FIELD_SETS["vectors"], "rewards": ((), "float32"), "wide": ((9,), "float64"),
                 "small": ((5,), "int8"), "counts": ((), "uint64")}
        fields = {name: FieldSpec(name, tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in kinds.items()}
        os.makedirs(tmp_path, exist_ok=True)
        self.backend.create(str(tmp_path), fields, MAX_SIZE, FORMAT_VERSION)
        storage = self.open(tmp_path, fields, writable=True)
        try:
            for name, spec in fields.items():
                storage.arrays[name][3] = edge_values(spec)
            storage.sync()
        finally:
            storage.close()
        for name, spec in fields.items():
            self.write_row(str(tmp_path), name, 9, edge_values(spec))
            assert_same_bytes(self.read_row(str(tmp_path), name, 3), edge_values(spec), (name, "backend to raw"))
        storage = self.open(tmp_path, fields, writable=False)
        try:
            for name, spec in fields.items():
                assert_same_bytes(np.array(storage.arrays[name][9]), edge_values(spec), (name, "raw to backend"))
        finally:
            storage.close()

    # ------------------------------------------------------------------ sessions
    def test_a_reader_sees_a_live_writers_rows_at_once(self, tmp_path):
        fields = self.create(tmp_path, "frames")
        writer = self.open(tmp_path, fields, writable=True)
        reader = self.open(tmp_path, fields, writable=False)
        try:
            for slot in (0, 7):
                for name, spec in fields.items():
                    writer.arrays[name][slot] = row_value(spec, slot, salt=3)
                for name, spec in fields.items():  # no sync: the mappings are shared
                    want = row_value(spec, slot, salt=3)
                    assert_same_bytes(np.array(reader.arrays[name][slot]), want, (name, slot))
                    assert_same_bytes(np.array(reader.gather_arrays[name][slot]), want, (name, slot))
                    assert_same_bytes(np.array(writer.gather_arrays[name][slot]), want, (name, slot))
        finally:
            reader.close()
            writer.close()

    def test_reopen_keeps_every_row(self, tmp_path):
        fields = self.create(tmp_path, "vectors")
        storage = self.open(tmp_path, fields, writable=True)
        for name, spec in fields.items():
            storage.arrays[name][2] = row_value(spec, 2, salt=4)
        storage.sync()
        storage.close()
        storage = self.open(tmp_path, fields, writable=True)
        try:
            for name, spec in fields.items():
                assert_same_bytes(np.array(storage.arrays[name][2]), row_value(spec, 2, salt=4), name)
                storage.arrays[name][11] = row_value(spec, 11, salt=4)
            storage.sync()
        finally:
            storage.close()
        storage = self.open(tmp_path, fields, writable=False)
        try:
            for name, spec in fields.items():
                for slot in (2, 11):
                    assert_same_bytes(np.array(storage.gather_arrays[name][slot]), row_value(spec, slot, salt=4), (name, slot))
        finally:
            storage.close()

    def test_sync_syncs_every_data_file(self, tmp_path, monkeypatch):
        fields = self.create(tmp_path, "vectors")
        storage = self.open(tmp_path, fields, writable=True)
        try:
            for name, spec in fields.items():
                storage.arrays[name][0] = row_value(spec, 0, salt=5)
            synced = set()
            real = os.fsync

            def fsync(fd):
                st = os.fstat(fd)
                synced.add((st.st_dev, st.st_ino))
                return real(fd)

            monkeypatch.setattr(os, "fsync", fsync)
            storage.sync()
            assert {_identity(p) for p in self.data_paths(tmp_path, fields)} <= synced
        finally:
            storage.close()

    def test_close_releases_the_views_and_may_be_repeated(self, tmp_path):
        fields = self.create(tmp_path, "scalars")
        storage = self.open(tmp_path, fields, writable=True)
        storage.close()
        assert storage.arrays == {} and storage.gather_arrays == {} and storage.files == []
        storage.close()

    # ------------------------------------------------------------------ refusals
    @pytest.mark.parametrize("writable", [False, True])
    def test_a_missing_data_file_is_refused(self, tmp_path, writable):
        fields = self.create(tmp_path, "vectors")
        for path in self.data_paths(tmp_path, fields):
            os.rename(path, path + ".away")
            try:
                with pytest.raises(CorruptStoreError):
                    self.open(tmp_path, fields, writable).close()
            finally:
                os.rename(path + ".away", path)
        self.open(tmp_path, fields, writable).close()  # and whole again, it opens

    @pytest.mark.parametrize("size", ["empty", "one byte", "half", "one row short", "one byte short",
                                      "one page long"])
    def test_a_data_file_of_another_size_is_refused(self, tmp_path, size):
        fields = self.create(tmp_path, "frames")
        for path in self.data_paths(tmp_path, fields):
            with open(path, "rb") as f:
                original = f.read()
            n = len(original)
            row = max(spec.row_bytes for spec in fields.values() if spec.row_bytes < n)  # a row of this file
            new = {"empty": 0, "one byte": 1, "half": n // 2, "one row short": n - row, "one byte short": n - 1,
                   "one page long": n + 4096}[size]
            with open(path, "r+b") as f:
                f.truncate(new)
            try:
                with pytest.raises(CorruptStoreError):
                    self.open(tmp_path, fields, writable=False).close()
                with pytest.raises(CorruptStoreError):
                    self.open(tmp_path, fields, writable=True).close()
            finally:
                with open(path, "wb") as f:
                    f.write(original)

    @pytest.mark.parametrize("where", ["start", "first page"])
    def test_a_data_file_with_a_garbled_header_is_refused(self, tmp_path, where):
        fields = self.create(tmp_path, "vectors")
        for path in self.data_paths(tmp_path, fields):
            with open(path, "rb") as f:
                original = f.read()
            garbage = bytes([0xA5]) * (16 if where == "start" else min(4096, len(original)))
            with open(path, "r+b") as f:
                f.write(garbage)
            try:
                with pytest.raises(CorruptStoreError):
                    self.open(tmp_path, fields, writable=False).close()
            finally:
                with open(path, "wb") as f:
                    f.write(original)

    @pytest.mark.parametrize("change", ["dtype", "shape", "max_size larger", "max_size smaller", "extra field"])
    def test_files_that_do_not_match_the_fields_are_refused(self, tmp_path, change):
        fields = self.create(tmp_path, "vectors")
        other, max_size = dict(fields), MAX_SIZE
        if change == "dtype":
            other["states"] = FieldSpec("states", (4,), np.dtype("float64"))
        elif change == "shape":
            other["states"] = FieldSpec("states", (2, 2), np.dtype("float32"))
        elif change == "max_size larger":
            max_size = MAX_SIZE + 1
        elif change == "max_size smaller":
            max_size = MAX_SIZE - 1
        else:
            other["extra"] = FieldSpec("extra", (), np.dtype("int64"))
        with pytest.raises(CorruptStoreError):
            self.open(tmp_path, other, writable=False, max_size=max_size).close()
        self.open(tmp_path, fields, writable=False).close()  # the files themselves are sound
