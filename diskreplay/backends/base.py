"""What every backend shares: files mapped into memory, rows addressed by (file, offset)."""
from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import CorruptStoreError
from ..fsutil import io_error


class MappedFile:
    """One file mapped whole, shared, read-only or read-write."""

    def __init__(self, path: str, writable: bool):
        self.path = path
        self.writable = writable
        try:
            self.fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError as exc:
            raise CorruptStoreError(f"{path} is missing") from exc
        except OSError as exc:
            raise io_error(f"opening {path}", exc) from exc
        try:
            self.size = os.fstat(self.fd).st_size
            if self.size == 0:
                raise CorruptStoreError(f"{path} is empty")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            try:
                self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, prot)
            except OSError as exc:
                raise io_error(f"memory-mapping {path} (is it a regular file on a local filesystem?)", exc) from exc
        except BaseException:
            os.close(self.fd)
            raise

    def array(self, offset: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A plain ndarray view (not np.memmap: that subclass costs microseconds per operation)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if offset + nbytes > self.size:
            raise CorruptStoreError(
                f"{self.path} is {self.size} bytes, expected at least {offset + nbytes}")
        arr = np.ndarray(shape, dtype, buffer=self.mm, offset=offset)
        if not self.writable:
            arr.flags.writeable = False
        return arr

    def advise_random(self) -> None:
        """No read-ahead on page faults: random row access would otherwise read megabytes per row."""
        if hasattr(mmap, "MADV_RANDOM"):
            self.mm.madvise(mmap.MADV_RANDOM)

    def sync(self) -> None:
        """Write dirty pages of the mapping to disk (msync, then fsync for the metadata)."""
        try:
            self.mm.flush()
            os.fsync(self.fd)
        except OSError as exc:
            raise io_error(f"syncing {self.path}", exc) from exc

    def close(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # a view is still alive somewhere; the mapping goes with it
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RowStorage:
    """The opened data of a store: one ndarray of ``max_size`` rows per field.

    ``locations[name]`` is ``(fd, offset, row_bytes)`` for positioned reads of whole rows.
    """

    def __init__(self, files: list[MappedFile], arrays: dict, locations: dict):
        self.files = files
        self.arrays = arrays
        self.locations = locations

    def sync(self) -> None:
        for f in self.files:
            f.sync()

    def close(self) -> None:
        self.arrays.clear()
        for f in self.files:
            f.close()
        self.files = []


class Backend:
    """Interface of a storage backend."""

    name = ""

    def data_files(self, fields) -> list[str]:
        """Names (relative to the store directory) of the files holding the data."""
        raise NotImplementedError

    def data_bytes(self, fields, max_size: int) -> int:
        """Disk space the data files need, for the free-space check."""
        return sum(spec.row_bytes * max_size for spec in fields.values()) + 64 * 1024

    def create(self, directory: str, fields, max_size: int) -> None:
        """Create and preallocate the data files, durably."""
        raise NotImplementedError

    def open(self, directory: str, fields, max_size: int, writable: bool) -> RowStorage:
        """Map the data files; raise CorruptStoreError when they do not match ``fields``."""
        raise NotImplementedError

    def validate(self, directory: str, fields, max_size: int) -> list[str]:
        """Problems of the data files, for ``verify`` (empty when sound)."""
        try:
            storage = self.open(directory, fields, max_size, writable=False)
        except CorruptStoreError as exc:
            return [str(exc)]
        storage.close()
        return []
