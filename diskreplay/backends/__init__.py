"""Storage backends: where the rows of each field live. They know files, shapes and
dtypes, and nothing about replay."""
from __future__ import annotations

from ..errors import InvalidArgumentError
from .base import Backend, RowStorage
from .hdf5 import HDF5Backend
from .memmap import MemmapBackend

_IMPLEMENTATIONS = {b.name: b for b in (MemmapBackend(), HDF5Backend())}

BACKENDS: tuple[str, ...] = tuple(_IMPLEMENTATIONS)
"""Names of the backends, the default first. The one list of them: take it from here."""


def get_backend(name) -> Backend:
    try:
        return _IMPLEMENTATIONS[name]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown backend {name!r}; expected one of {', '.join(map(repr, BACKENDS))}") from None


__all__ = ["BACKENDS", "Backend", "RowStorage", "get_backend"]
