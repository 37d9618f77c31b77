"""Gymnasium spaces as store fields: the one mapping the integrations (``sb3``, ``gym``) share.

An integration declares a new store's fields from its env's spaces, and checks a store it
resumes against them, so that an env the store cannot hold, or a store made for another
env, is refused when the buffer or wrapper is built (naming both sides), never at the
first add or sample. Importing this module imports gymnasium.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from gymnasium import spaces

from .errors import EnvProtocolError, InvalidArgumentError, StoreMismatchError, StoreNotFoundError
from .store import DiskReplay

# Spaces whose elements are one fixed-shape numeric array: a store row.
HOLDABLE = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_holdable(space, role: str, holder: str) -> None:
    """Refuse (``EnvProtocolError``) a ``role`` space ("observation", "action") whose
    elements are not one fixed-shape numeric array."""
    if not isinstance(space, HOLDABLE):
        hint = (" (flatten it with gymnasium.wrappers.FlattenObservation)"
                if isinstance(space, (spaces.Dict, spaces.Tuple)) else "")
        raise EnvProtocolError(
            f"{holder} stores Box, Discrete, MultiDiscrete or MultiBinary {role} spaces, got {space}{hint}")


def space_field(space, role: str, holder: str) -> tuple[tuple, np.dtype]:
    """``(shape, dtype)`` of one element of ``space``, as the env gives it: a Box's shape
    and dtype, ``()`` int64 for a Discrete, the vector of a MultiDiscrete or MultiBinary."""
    check_holdable(space, role, holder)
    return tuple(int(d) for d in space.shape), np.dtype(space.dtype)


def describe(fields: dict) -> str:
    """``states (4,) float32, ...``: fields as error messages name them."""
    return ", ".join(f"{name} {tuple(shape)} {np.dtype(dtype)}" for name, (shape, dtype) in sorted(fields.items()))


def store_fields(store: DiskReplay) -> dict:
    """``{name: (shape tuple, numpy dtype)}`` of a store, comparable with a declaration."""
    return {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in (store.fields or {}).items()}


def check_store(store: DiskReplay, fields: dict, num_envs: int, max_size: int | None = None, *,
                asker: str = "the env") -> None:
    """Refuse (``StoreMismatchError``) a store whose fields are not ``fields`` exactly, or
    whose ``num_envs`` (and ``max_size``, when given) differ from what ``asker`` asks for."""
    have = store_fields(store)
    if have != fields:
        raise StoreMismatchError(
            f"the store at {store.path} holds {describe(have) or 'no fields yet'}, but the env's spaces need "
            f"{describe(fields)}; use another path for this env")
    if store.num_envs != num_envs or (max_size is not None and store.max_size != max_size):
        asked = f"n_envs {num_envs}" if max_size is None else f"{max_size} with n_envs {num_envs}"
        raise StoreMismatchError(
            f"the store at {store.path} has max_size {store.max_size} with num_envs {store.num_envs}, but "
            f"{asker} asks for {asked}; use another path, or the same size and number of envs")


def open_or_create(path, fields: dict, num_envs: int, max_size: int | None, *, backend: str = "memmap",
                   seed: int | None | Callable[[], int | None] = None, flush_every: int | None = None,
                   asker: str = "the env") -> DiskReplay:
    """The store at ``path`` opened for writing (resumed, and checked against ``fields``,
    ``num_envs`` and ``max_size``), or a new one declared with ``fields``. ``seed`` may be a
    function, called only when a store is created. A path that exists but is not a store
    raises ``NotAStoreError``; no store and no ``max_size`` raises ``InvalidArgumentError``."""
    try:
        store = DiskReplay.open(path, mode="r+")
    except StoreNotFoundError:
        if max_size is None:
            raise InvalidArgumentError(f"there is no store at {path}: pass max_size to create one") from None
        store = DiskReplay.create(path, max_size, num_envs=num_envs, backend=backend,
                                  seed=seed() if callable(seed) else seed, fields=fields, flush_every=flush_every)
    try:
        check_store(store, fields, num_envs, max_size, asker=asker)
    except BaseException:
        store.close()
        raise
    return store


__all__ = ["HOLDABLE", "check_holdable", "check_store", "describe", "open_or_create", "space_field", "store_fields"]
