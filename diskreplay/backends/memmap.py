"""The default backend: one preallocated ``.npy`` file per field."""
from __future__ import annotations

import os

from ..disk.npyfile import create_npy, open_npy
from .base import Backend, RowStorage


class MemmapBackend(Backend):
    name = "memmap"

    def data_files(self, fields) -> list[str]:
        return [f"{name}.npy" for name in fields]

    def create(self, directory, fields, max_size, format_version: int) -> None:
        for name, spec in fields.items():
            create_npy(os.path.join(directory, f"{name}.npy"), (max_size,) + spec.shape, spec.dtype)

    def open(self, directory, fields, max_size, writable) -> RowStorage:
        files, arrays, gather_arrays, locations = [], {}, {}, {}
        try:
            for name, spec in fields.items():
                mapped, arr, offset = open_npy(
                    os.path.join(directory, f"{name}.npy"), (max_size,) + spec.shape, spec.dtype, writable)
                files.append(mapped)
                arrays[name] = arr
                mapped.open_for_gathers()
                gather_arrays[name] = mapped.gather_array(offset, arr.shape, arr.dtype)
                locations[name] = (mapped.read_fd, offset, spec.row_bytes)
        except BaseException:
            arrays.clear()
            gather_arrays.clear()
            for f in files:
                f.close()
            raise
        return RowStorage(files, arrays, gather_arrays, locations)
