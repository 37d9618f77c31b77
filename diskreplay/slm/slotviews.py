"""The drop-in's read-only views, read as SLM-Lab's ``Replay`` lists are: ``SlotView``, one
field's slots (``memory.states``, ...), ``NextStateView`` (``memory.ns_buffer``), and
``field_view``, the memory property that gives a field's view and refuses assignment.

A view reads through the memory it belongs to: ``max_size``, ``size``, ``ns_idx_offset``,
``store.path``, and the memory's ``_rows``, ``_next_state_rows`` and ``_specs``."""
from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidArgumentError, ReadOnlyViewError, SlotIndexError

CHUNK = 4096  # slots read per store.get when iterating over a whole view


def field_view(name: str) -> property:
    """The memory's property ``name``: its ``SlotView``; assigning to it raises ``ReadOnlyViewError``."""
    def get(self):
        return self._views[name]

    def refuse(self, value):
        raise ReadOnlyViewError(
            f"memory.{name} is a read-only view of the store at {self.store.path}; transitions are added "
            "with memory.update(...) (one env step) or memory.add_experience(...) (one transition)")

    return property(get, refuse, doc=f"Read-only view of the {name} slots (``len`` is ``max_size``).")


class SlotView(Sequence):
    """One field's slots, read like SLM-Lab's ``[None] * max_size`` list: ``len`` is
    ``max_size``; ``view[i]`` is slot ``i``'s value (numpy, the stored dtype) for
    ``0 <= i < size`` and None from ``size`` on; negative indices count from ``max_size``;
    a slice gives a list; an integer array gives an array (of objects if it reaches a
    slot past ``size``). Read-only: assignment raises :class:`ReadOnlyViewError`."""

    __slots__ = ("_memory", "_name")

    def __init__(self, memory, name: str):
        self._memory = memory
        self._name = name

    def __len__(self) -> int:
        return self._memory.max_size

    def __getitem__(self, key):
        memory, name = self._memory, self._name
        slots, form = _slots(key, memory.max_size, f"memory.{name}", "slot")
        values = _slot_values(memory, name, slots)
        if form is None:
            return values[0]
        if form == "list":
            return values
        specs = memory._specs()
        return _stack(values, form, specs[name] if specs else None)

    def __iter__(self):
        memory, m = self._memory, self._memory.max_size
        for start in range(0, m, CHUNK):
            yield from _slot_values(memory, self._name, np.arange(start, min(start + CHUNK, m), dtype=np.int64))

    def __setitem__(self, key, value):
        raise ReadOnlyViewError(
            f"memory.{self._name} is read-only (a view of the store at {self._memory.store.path}); add "
            "transitions with memory.update(...) (one env step) or memory.add_experience(...) (one transition)")

    def __delitem__(self, key):
        self.__setitem__(key, None)

    def __repr__(self) -> str:
        return f"<read-only view of {self._name!r}: {self._memory.size} of {len(self)} slots filled>"


class NextStateView(Sequence):
    """SLM-Lab's ``ns_buffer``, read-only: the next states of the newest ``ns_idx_offset``
    transitions, oldest first (fewer right after a reset)."""

    __slots__ = ("_memory",)

    def __init__(self, memory):
        self._memory = memory

    def __len__(self) -> int:
        return len(self._memory._next_state_rows())

    def __getitem__(self, key):
        rows = self._memory._next_state_rows()
        idxs, form = _slots(key, len(rows), "memory.ns_buffer", "entry")
        values = [rows[i] for i in idxs]
        if form is None:
            return values[0]
        if form == "list":
            return values
        specs = self._memory._specs()
        return _stack(values, form, specs["states"] if specs else None)

    def __iter__(self):
        return iter(self._memory._next_state_rows())

    def _refuse(self, *args, **kwargs):
        raise ReadOnlyViewError(
            "memory.ns_buffer is read-only (it follows the store); next states are given to "
            "memory.update(...) or memory.add_experience(...)")

    __setitem__ = __delitem__ = append = appendleft = extend = clear = pop = _refuse

    def __repr__(self) -> str:
        return f"<read-only ns_buffer: {len(self)} of {self._memory.ns_idx_offset} next states>"


def _slot_values(memory, name: str, slots: np.ndarray) -> list:
    """The values of field ``name`` at ``slots`` (each in ``[0, max_size)``); None past ``size``."""
    filled = slots < memory.size
    values = [None] * len(slots)
    if filled.any():
        column = memory._rows(slots[filled])[name]
        for pos, row in zip(np.flatnonzero(filled), column):
            values[pos] = row
    return values


def _slots(key, length: int, what: str, unit: str):
    """``(indices in [0, length), form)``: form None for one index, "list" for a slice,
    else the shape of the index array."""
    if isinstance(key, slice):
        return np.arange(*key.indices(length), dtype=np.int64), "list"
    if isinstance(key, (np.ndarray, list, tuple)):
        arr = np.asarray(key)
        if arr.ndim == 0:
            key = arr.item()
        else:
            if arr.size == 0:
                arr = arr.astype(np.int64)
            if arr.dtype.kind not in "iu":
                raise InvalidArgumentError(
                    f"{what}: an index array must hold integers, got {arr.dtype} "
                    "(boolean masks are not supported)")
            flat = arr.astype(np.int64).reshape(-1)
            _check_range(flat, length, what, unit)
            return flat % length if length else flat, arr.shape
    try:
        i = operator.index(key)
    except TypeError:
        raise InvalidArgumentError(
            f"{what}: indices must be integers, slices or integer arrays, not {type(key).__name__}") from None
    flat = np.array([i], dtype=np.int64)
    _check_range(flat, length, what, unit)
    return flat % length, None


def _check_range(idxs: np.ndarray, length: int, what: str, unit: str) -> None:
    bad = idxs[(idxs < -length) | (idxs >= length)]
    if bad.size:
        extra = (" (slots from size on read as None)" if unit == "slot" else "")
        raise SlotIndexError(
            f"{what}: {unit} index {bad[0]} is out of range; it has {length} {unit}s, so use an index in "
            f"[-{length}, {length}){extra}")


def _stack(values: list, shape: tuple, spec):
    """Values of an index-array read as one array: of the field's dtype if every slot is
    filled, else of objects (None where a slot is past ``size``)."""
    if all(v is not None for v in values):
        if values:
            return np.stack(values).reshape(shape + np.shape(values[0]))
        if spec is not None:
            return np.empty(shape + tuple(spec[0]), spec[1])
        return np.empty(shape)
    out = np.empty(len(values), dtype=object)
    for pos, value in enumerate(values):
        out[pos] = value
    return out.reshape(shape)
