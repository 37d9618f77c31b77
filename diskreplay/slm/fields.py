"""The fields of the SLM-Lab drop-in: a spec's ``[shape, dtype]`` declarations (``parse_field``),
the dtypes the store would infer (``inferred_dtype``), values checked and converted to a field
(``as_field``), and ``FieldTypes``, what each field's values must be at any moment."""
from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from ..errors import MemorySpecError, SchemaMismatchError

NUMERIC = "biuf"  # the dtype kinds a field may have: bool, integers, floats


def parse_field(name: str, decl):
    """``(shape, dtype)`` of the spec's ``fields[name]``: ``[shape, dtype]`` or ``{"shape", "dtype"}``."""
    if isinstance(decl, Mapping):
        shape, dtype = decl.get("shape"), decl.get("dtype")
    else:
        try:
            shape, dtype = decl
        except (TypeError, ValueError):
            raise MemorySpecError(
                f"the memory spec's fields[{name!r}] must be [shape, dtype], e.g. [[4], \"float32\"] or "
                f"[[], \"int64\"], got {decl!r}") from None
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise MemorySpecError(
            f"the memory spec's fields[{name!r}] has shape {shape!r}; a shape is a list of sizes, [] for a scalar")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        dt = None
    if dt is None or dt.kind not in NUMERIC or dt.fields is not None or dt.subdtype is not None:
        raise MemorySpecError(
            f"the memory spec's fields[{name!r}] has dtype {dtype!r}; use a bool, integer or float dtype "
            "such as \"bool\", \"int64\", \"uint8\" or \"float32\"")
    return tuple(int(d) for d in shape), dt


def inferred_dtype(name: str, value) -> np.dtype:
    """The store's inference: numpy data keeps its dtype; Python bool/int/float become bool/int64/float32."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype
    try:
        kind = np.asarray(value).dtype.kind
    except (TypeError, ValueError):
        kind = "O"
    if kind == "b":
        return np.dtype(bool)
    if kind in "iu":
        return np.dtype(np.int64)
    if kind == "f":
        return np.dtype(np.float32)
    raise SchemaMismatchError(
        f"{name}: got non-numeric data ({type(value).__name__}); fields must be bool, int or float")


def as_field(name: str, value, shape: tuple, dtype: np.dtype, copy: bool) -> np.ndarray:
    """``value`` as an array of ``shape`` and ``dtype``, refusing what would change the data
    (floats into integer or bool fields, integers out of range, wrong shapes): the rules the
    store applies to ``add``, applied here to transitions the drop-in handles itself."""
    where = f"{name}: the memory stores {describe(shape, dtype)}"
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise SchemaMismatchError(f"cannot read {type(value).__name__} as an array; {where}") from None
    if arr.dtype.kind not in NUMERIC:
        raise SchemaMismatchError(f"got non-numeric data ({arr.dtype}); {where}")
    if arr.shape != shape:
        raise SchemaMismatchError(f"got shape {arr.shape}; {where}")
    if arr.dtype != dtype:
        if dtype.kind != "f":
            if arr.dtype.kind == "f":
                raise SchemaMismatchError(f"got float data ({arr.dtype}) for an integer or bool field; {where}")
            if dtype.kind == "b":
                if arr.size and not np.isin(arr, (0, 1)).all():
                    raise SchemaMismatchError(f"got values other than 0/1 for a bool field; {where}")
            elif arr.size:
                info = np.iinfo(dtype)
                if arr.min() < info.min or arr.max() > info.max:
                    raise SchemaMismatchError(f"values [{arr.min()}, {arr.max()}] do not fit {dtype}; {where}")
        return arr.astype(dtype)
    return arr.copy() if copy and arr is value else arr


def describe(shape, dtype) -> str:
    return f"shape {tuple(shape)} {np.dtype(dtype)}"


class FieldTypes:
    """``{name: (shape, dtype)}`` each field's values must have: the store's fields once it
    has them (``known``), else those resolved from the first transition (``first``, kept
    until the store has fields), else None before any transition; ``declared`` holds what
    the memory spec declares, which resolving a first transition takes before inferring."""

    def __init__(self, declared: dict, field_names: tuple, value_names: tuple):
        self.declared = declared
        self.field_names = field_names
        self.value_names = value_names
        self.known = None  # the store's fields once it has them
        self.first = None  # field specs resolved from the first transition, until the store has them

    def current(self):
        """The specs the values must have now, or None before any transition."""
        return self.known if self.known is not None else self.first

    def convert(self, values: tuple, copy: bool = False) -> dict:
        """One transition checked and converted to the field dtypes (declared, stored, or
        inferred as the store infers them: numpy data keeps its dtype, Python bool, int and
        float become bool, int64 and float32), with the store's rules for what it refuses."""
        given = dict(zip(self.value_names, values))
        specs = self.current()
        resolved = specs is None
        if resolved:
            specs = {}
            for name in self.field_names:
                specs[name] = self.declared[name] if name in self.declared else (
                    tuple(np.shape(given[name])), inferred_dtype(name, given[name]))
        out = {}
        for name in self.value_names:
            shape, dtype = specs["states" if name == "next_states" else name]
            out[name] = as_field(name, given[name], tuple(shape), np.dtype(dtype), copy)
        if resolved:
            self.first = specs
        return out
