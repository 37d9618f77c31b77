"""The arguments of prioritized replay, checked: the settings ``create`` takes (and reads
back from ``store.json``), ``beta``, raw priorities, and the field names a prioritized
store reserves. numpy only; ``prioritized.py`` owns the files."""
from __future__ import annotations

import math
import numbers

import numpy as np

from ...errors import CorruptStoreError, InvalidArgumentError, InvalidPriorityError

RESERVED_NAMES = ("priorities", "weights")  # keys a prioritized batch adds: no field may take them

_FLOAT64 = np.dtype(np.float64)
_smallest, _largest = np.minimum.reduce, np.maximum.reduce  # the ufuncs' own methods: no wrapper per call


def settings_keys(prioritized, alpha, epsilon, new: bool = True) -> dict:
    """The ``store.json`` keys of ``create(..., prioritized, alpha, epsilon)`` (checked);
    none for a uniform store, whose description stays as it was. A ``new`` store's
    settings must also store a priority of 0 (``epsilon ** alpha`` 0 or a normal float:
    ``Priorities.stored``); an existing store's are read as they are."""
    if not isinstance(prioritized, (bool, np.bool_)):
        raise InvalidArgumentError(f"prioritized must be True or False, got {prioritized!r}")
    alpha = _real("alpha", alpha)
    epsilon = _real("epsilon", epsilon)
    if not alpha >= 0:
        raise InvalidArgumentError(f"alpha must be >= 0 (0 samples uniformly), got {alpha!r}")
    if not epsilon >= 0:
        raise InvalidArgumentError(f"epsilon must be >= 0 (> 0 keeps every priority positive), got {epsilon!r}")
    if not prioritized:
        return {}
    if new and epsilon > 0 and alpha > 0 and not epsilon ** alpha >= np.finfo(np.float64).tiny:
        raise InvalidArgumentError(
            f"epsilon {epsilon!r} ** alpha {alpha!r} underflows below the smallest normal float64, so a priority "
            "of 0 could not be stored; use a larger epsilon (1e-6 is usual), epsilon=0, or a smaller alpha")
    return {"prioritized": True, "alpha": alpha, "epsilon": epsilon}


def _real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def is_prioritized(desc: dict) -> bool:
    return desc.get("prioritized") is True


def read_settings(desc: dict, path: str) -> tuple[float, float]:
    """``(alpha, epsilon)`` of a prioritized description, or CorruptStoreError."""
    try:
        keys = settings_keys(True, desc.get("alpha"), desc.get("epsilon"), new=False)
    except InvalidArgumentError as exc:
        raise CorruptStoreError(f"{path}: {exc}") from None
    return keys["alpha"], keys["epsilon"]


def check_beta(beta) -> float:
    beta = _real("beta", beta)
    if not 0.0 <= beta <= 1.0:
        raise InvalidArgumentError(f"beta must be in [0, 1], got {beta!r}")
    return beta


def check_field_names(names) -> None:
    taken = [n for n in RESERVED_NAMES if n in names]
    if taken:
        raise InvalidArgumentError(
            f"field {taken[0]!r} is reserved on a prioritized store (sample adds 'weights', get adds "
            "'priorities'); rename it")


def check_priorities(priorities, count: int) -> np.ndarray:
    """Raw priorities as float64, one per index, each finite and >= 0 (checked before any write)."""
    if priorities.__class__ is np.ndarray and priorities.dtype == _FLOAT64 and priorities.shape == (count,) and count:
        if _smallest(priorities) >= 0 and _largest(priorities) < np.inf:  # the usual batch: two reductions
            return priorities
    arr = np.asarray(priorities)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise InvalidPriorityError(f"priorities must be numbers, got {arr.dtype} data")
    arr = arr.astype(np.float64).reshape(-1)
    if len(arr) != count:
        raise InvalidPriorityError(f"got {len(arr)} priorities for {count} indices; pass one per index")
    if len(arr) and not (arr.min() >= 0 and arr.max() < np.inf):  # NaN fails both
        bad = arr[~np.isfinite(arr) | (arr < 0)][0]
        raise InvalidPriorityError(f"priorities must be finite and >= 0 (e.g. |TD error|), got {bad!r}")
    return arr
