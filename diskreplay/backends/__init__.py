"""Storage backends: where the rows of each field live. They know files, shapes and
dtypes, and nothing about replay."""
from __future__ import annotations

from ..errors import InvalidArgumentError
from .base import Backend, RowStorage
from .hdf5 import HDF5Backend
from .memmap import MemmapBackend

BACKENDS = {"memmap": MemmapBackend(), "hdf5": HDF5Backend()}


def get_backend(name) -> Backend:
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown backend {name!r}; expected one of {', '.join(map(repr, BACKENDS))}") from None


__all__ = ["BACKENDS", "Backend", "RowStorage", "get_backend"]
