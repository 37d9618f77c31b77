"""HDF5 backend: one ``data.h5`` with a contiguous dataset per field, memory-mapped.

Datasets are created contiguous, uncompressed, allocated early and never filled,
then the file is closed for good: rows are read and written through memory maps
at each dataset's file offset, so HDF5's own metadata is never written again and
a killed writer cannot leave the file unreadable to HDF5 tools.
"""
from __future__ import annotations

import errno
import os
import re

import numpy as np

from ..errors import CorruptStoreError, StoreLockedError
from ..disk.fsutil import io_error, preallocate_file
from ..disk.mapped import MappedFile
from .base import Backend, RowStorage

DATA_FILE = "data.h5"


def _h5py():
    import h5py  # imported lazily: memmap stores never need it

    return h5py


class HDF5Backend(Backend):
    name = "hdf5"

    def data_files(self, fields) -> list[str]:
        return [DATA_FILE]

    def create(self, directory, fields, max_size, format_version: int) -> None:
        h5py = _h5py()
        path = os.path.join(directory, DATA_FILE)
        try:
            with h5py.File(path, "w") as f:
                for name, spec in fields.items():
                    _create_contiguous(h5py, f, name, (max_size,) + spec.shape, spec.dtype)
                    f[name].attrs["diskreplay_shape"] = list(spec.shape)
                    f[name].attrs["diskreplay_dtype"] = spec.dtype.str
                f.attrs["diskreplay_max_size"] = max_size
                f.attrs["diskreplay_format_version"] = format_version
        except OSError as exc:
            raise io_error(f"creating {path}", exc) from exc
        preallocate_file(path, os.stat(path).st_size)

    def dataset_offsets(self, directory, fields, max_size) -> dict:
        """File offset of each field's dataset, after checking layout, shape and dtype."""
        h5py = _h5py()
        path = os.path.join(directory, DATA_FILE)
        if not os.path.exists(path):
            raise CorruptStoreError(f"{path} is missing")
        try:
            f = h5py.File(path, "r")
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK) or "unable to lock file" in str(exc):
                raise StoreLockedError(
                    errno.EAGAIN, f"{path} is held open by another HDF5 program (HDF5's own file lock); "
                    "close it there (or set HDF5_USE_FILE_LOCKING=FALSE in that program) and try again") from None
            raise CorruptStoreError(f"{path} is not a readable HDF5 file ({exc})") from exc
        offsets = {}
        try:
            for name, spec in fields.items():
                offsets[name] = _checked_offset(h5py, f, path, name, (max_size,) + spec.shape, spec.dtype)
        except (KeyError, ValueError, RuntimeError, OSError) as exc:  # h5py's errors on a damaged file
            reason = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
            reason = re.sub(r"^Unable to (synchronously )?[a-z ]+? \((.*)\)$", r"\2", reason)
            raise CorruptStoreError(f"{path}: its HDF5 structure cannot be read ({reason})") from exc
        finally:
            f.close()
        size = os.stat(path).st_size
        hdf5_size = _superblock_eof(path)
        if hdf5_size is not None and size > hdf5_size:
            raise CorruptStoreError(
                f"{path} is {size} bytes, expected {hdf5_size} bytes: the file is longer than HDF5 wrote it")
        for name, spec in fields.items():
            end = offsets[name] + spec.row_bytes * max_size
            if end > size:
                raise CorruptStoreError(
                    f"{path} is {size} bytes, but dataset {name!r} ends at byte {end}: the file is truncated")
        return offsets

    def open(self, directory, fields, max_size, writable) -> RowStorage:
        offsets = self.dataset_offsets(directory, fields, max_size)
        mapped = MappedFile(os.path.join(directory, DATA_FILE), writable)
        try:
            arrays = {name: mapped.array(offsets[name], (max_size,) + spec.shape, spec.dtype)
                      for name, spec in fields.items()}
            mapped.open_for_gathers()
            gather_arrays = {name: mapped.gather_array(offsets[name], arr.shape, arr.dtype)
                             for name, arr in arrays.items()}
        except BaseException:
            mapped.close()
            raise
        locations = {name: (mapped.read_fd, offsets[name], spec.row_bytes) for name, spec in fields.items()}
        return RowStorage([mapped], arrays, gather_arrays, locations)


def _superblock_eof(path: str) -> int | None:
    """End-of-file address the HDF5 superblock records (None when the layout is not one we parse)."""
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) < 56 or head[:8] != b"\x89HDF\r\n\x1a\n":
        return None
    version = head[8]
    if version in (0, 1):
        if head[13] != 8:  # size of offsets
            return None
        return int.from_bytes(head[40 + 4 * version: 48 + 4 * version], "little")
    if version in (2, 3):
        if head[9] != 8:
            return None
        return int.from_bytes(head[28:36], "little")
    return None


def _create_contiguous(h5py, f, name, shape, dtype) -> None:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    space = h5py.h5s.create_simple(shape)
    tid = h5py.h5t.py_create(np.dtype(dtype), logical=True)
    h5py.h5d.create(f.id, name.encode(), tid, space, dcpl=dcpl)


def _checked_offset(h5py, f, path, name, shape, dtype) -> int:
    if name not in f:
        raise CorruptStoreError(f"{path}: dataset {name!r} is missing; expected {shape} {np.dtype(dtype)}")
    dset = f[name]
    if not isinstance(dset, h5py.Dataset):
        raise CorruptStoreError(f"{path}: {name!r} is a group, expected a dataset {shape} {np.dtype(dtype)}")
    if dset.shape != shape or dset.dtype != np.dtype(dtype):
        raise CorruptStoreError(
            f"{path}: dataset {name!r} is {dset.shape} {dset.dtype}, expected {shape} {np.dtype(dtype)}")
    plist = dset.id.get_create_plist()
    if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_nfilters() > 0:
        raise CorruptStoreError(
            f"{path}: dataset {name!r} is chunked or compressed; diskreplay needs a contiguous, "
            "uncompressed dataset (recreate the store or convert it)")
    offset = dset.id.get_offset()
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if offset is None or dset.id.get_storage_size() != expected:
        raise CorruptStoreError(
            f"{path}: dataset {name!r} has {dset.id.get_storage_size()} bytes allocated, expected {expected}")
    return int(offset)
