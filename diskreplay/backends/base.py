"""The backend interface: rows of each field in files mapped into memory, addressed by
(file, offset). A backend knows files, shapes and dtypes; nothing about replay."""
from __future__ import annotations

from ..disk.mapped import MappedFile
from ..core.roworder import SLOT_ORDER, SlotOrder


class RowStorage:
    """The opened data of a store: one ndarray of ``max_size`` rows per field.

    ``arrays[name]`` is the view to write rows through and to scan in order;
    ``gather_arrays[name]`` the read-only view for random gathers (``MADV_RANDOM``);
    ``locations[name]`` is ``(fd, offset, row_bytes)`` for positioned reads of whole rows
    (``fd`` advised ``POSIX_FADV_RANDOM``). Arrays and locations are in the file's row
    order; ``orders[name]`` (``roworder.py``) says which row holds a slot, and code that
    indexes rows by slot asks ``order(name)`` or ``rows(name, slots)``.
    """

    def __init__(self, files: list[MappedFile], arrays: dict, gather_arrays: dict, locations: dict):
        self.files = files
        self.arrays = arrays
        self.gather_arrays = gather_arrays
        self.locations = locations
        self.orders: dict[str, SlotOrder] = {}  # fields not named keep slot s at row s

    def order(self, name: str) -> SlotOrder:
        return self.orders.get(name, SLOT_ORDER)

    def rows(self, name: str, slots):
        """The rows of field ``name`` that hold ``slots``."""
        return self.order(name).rows(slots)

    def sync(self) -> None:
        for f in self.files:
            f.sync()

    def close(self) -> None:
        self.arrays.clear()
        self.gather_arrays.clear()
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

    def create(self, directory: str, fields, max_size: int, format_version: int) -> None:
        """Create and preallocate the data files, durably (``format_version`` is the store's,
        for backends whose files carry it)."""
        raise NotImplementedError

    def open(self, directory: str, fields, max_size: int, writable: bool) -> RowStorage:
        """Map the data files; raise CorruptStoreError when they do not match ``fields``."""
        raise NotImplementedError
