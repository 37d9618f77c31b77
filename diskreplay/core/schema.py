"""Fields of a store: their declaration, inference from the first add, and input checks."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError, SchemaMismatchError

CORE_FIELDS = ("states", "actions", "rewards", "dones")
# Names a field may not take, with what uses them: a store file (``<name>.npy`` of the
# memmap backend would be the same file), a key of the batches, episodes and exports the
# library returns, or a key the CLI adds to its JSON. One list, checked at ``create`` and
# at the first, inferring ``add`` (``check_field_name``); tests/durability/test_hostile.py tries each.
RESERVED_NAMES = {
    "next_states": "the next states derived from 'states' in every batch",
    "ns_buffer": "the store file ns_buffer.npy",
    "rowsums": "the store file rowsums.npy (the CRC of every row)",
    "priorities": "the per-slot priorities of a prioritized store",
    "weights": "the importance weights of prioritized batches",
    "discounts": "the discounts of n-step batches",
    "slots": "the slot of every row in exports and episodes",
    "slot": "the slot column of the CLI's show and sample output",
    "idxs": "the slots of prioritized batches from batches() and of the CLI's sample --json output",
    "env": "the env of every episode and of the CLI's show output",
    "transition": "the transition number in the CLI's show output",
    "complete": "the completeness flag of every episode",
}
# Reserved since the first format version: an existing store with one of these is damaged.
# The others were reserved later, and an existing store may hold them (it still opens).
_RESERVED_FROM_START = ("next_states", "ns_buffer", "rowsums")
_NUMERIC_KINDS = "biuf"
MAX_ROW_ELEMENTS = 1 << 32


@dataclass(frozen=True)
class FieldSpec:
    """One per-transition field: its name, per-transition shape and dtype."""

    name: str
    shape: tuple
    dtype: np.dtype

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # math.prod: no numpy call per sample

    def describe(self) -> str:
        return f"{self.shape} {self.dtype}"

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype.str}


def check_dtype(name: str, dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError, OverflowError) as exc:
        raise InvalidArgumentError(f"field {name!r}: {dtype!r} is not a numpy dtype") from exc
    if dt.kind not in _NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise InvalidArgumentError(
            f"field {name!r}: dtype {dt} is not supported; use a bool, integer or float dtype")
    return dt.newbyteorder("=") if dt.byteorder not in "=|" else dt


def check_shape(name: str, shape) -> tuple:
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in shape):
        raise InvalidArgumentError(f"field {name!r}: shape {shape!r} is not a tuple of ints")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"field {name!r}: shape {shape} has a negative dimension")
    if len(shape) > 16 or int(np.prod(shape, dtype=object)) > MAX_ROW_ELEMENTS:
        raise InvalidArgumentError(
            f"field {name!r}: shape {shape} is too large (at most 16 dimensions and {MAX_ROW_ELEMENTS} elements per row)")
    return shape


def check_count(name: str, value, minimum: int = 1) -> int:
    """A count argument (``max_size``, ``batch_size``, ...) as an int: integers and integral
    floats (SLM-Lab specs write ``1e6``), nothing else; one rule for every such argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif float(value).is_integer():
        value = int(value)
    else:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_row_sizes(specs) -> None:
    for name, spec in specs.items():
        if spec.row_bytes == 0:
            raise InvalidArgumentError(f"field {name!r} has shape {spec.shape}: rows of zero bytes are not supported")


def normalize_fields(fields, *, new: bool = True) -> dict[str, FieldSpec]:
    """Validate a user ``fields`` declaration ``{name: (shape, dtype)}``; ``new=False`` for
    the fields of an existing store, which may predate a reserved name."""
    if not isinstance(fields, dict):
        raise InvalidArgumentError(
            f"fields must be a dict {{name: (shape, dtype)}}, got {type(fields).__name__}")
    missing = [n for n in CORE_FIELDS if n not in fields]
    if missing:
        raise InvalidArgumentError(
            f"fields lacks {', '.join(missing)}; it must declare {', '.join(CORE_FIELDS)}")
    specs = {}
    for name in list(CORE_FIELDS) + [n for n in fields if n not in CORE_FIELDS]:
        check_field_name(name, reserved=new)
        spec = fields[name]
        if isinstance(spec, dict):
            shape, dtype = spec.get("shape"), spec.get("dtype")
        else:
            try:
                shape, dtype = spec
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(
                    f"field {name!r}: expected (shape, dtype), got {spec!r}") from exc
        specs[name] = FieldSpec(name, check_shape(name, shape), check_dtype(name, dtype))
    return specs


def check_field_name(name, reserved: bool = True) -> None:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise InvalidArgumentError(
            f"field name {name!r} is not allowed; use a Python identifier not starting with '_'")
    if name in RESERVED_NAMES and (reserved or name in _RESERVED_FROM_START):
        raise InvalidArgumentError(
            f"field name {name!r} is reserved (diskreplay uses it for {RESERVED_NAMES[name]}); "
            "give the field another name")


def _inferred_dtype(value) -> np.dtype:
    """numpy arrays and scalars keep their dtype; Python bool/int/float become bool/int64/float32."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype
    arr = np.asarray(value)
    if arr.dtype.kind == "b":
        return np.dtype(bool)
    if arr.dtype.kind in "iu":
        return np.dtype(np.int64)
    if arr.dtype.kind == "f":
        return np.dtype(np.float32)
    return arr.dtype


def infer_fields(values: dict, num_envs: int) -> dict[str, FieldSpec]:
    """Field specs from the values of a first ``add`` (leading env axis removed if num_envs > 1)."""
    specs = {}
    for name, value in values.items():
        check_field_name(name)
        dtype = _inferred_dtype(value)
        if dtype.kind not in _NUMERIC_KINDS:
            raise SchemaMismatchError(
                f"{name}: got non-numeric data ({_describe(value)}); fields must be bool, int or float")
        shape = np.shape(value)
        if num_envs > 1:
            if len(shape) == 0 or shape[0] != num_envs:
                raise SchemaMismatchError(
                    f"{name}: got shape {shape}, expected a leading env axis of {num_envs}")
            shape = shape[1:]
        specs[name] = FieldSpec(name, tuple(shape), check_dtype(name, dtype))
    return specs


def _describe(value) -> str:
    if isinstance(value, (np.ndarray, np.generic)):
        return f"shape {value.shape} {value.dtype}"
    return type(value).__name__


INFERRED_HINT = ("A field's dtype is what create(fields=...) declared or, without a declaration, what the "
                 "first add gave (a Python int such as a first reward of 0 makes it int64, for the life of the "
                 "store); to store floats, create the store with ")


def coerce(spec: FieldSpec, value, num_envs: int) -> np.ndarray:
    """``value`` as an array of the field's dtype and shape (with env axis), or a clear error.

    Refuses what would silently change data: floats into integer fields, integers
    out of the field's range, finite values that overflow a float field (``float_bounds``),
    non-numeric data, and wrong shapes.
    """
    expected = spec.shape if num_envs == 1 else (num_envs,) + spec.shape
    where = f"{spec.name}: store has {spec.describe()}"
    if num_envs > 1:
        where += f" per env with {num_envs} envs"
    target = spec.dtype
    try:
        arr = np.asarray(value)
        if arr.dtype == object and target.kind == "f" and arr.size and all(
                isinstance(x, numbers.Integral) for x in arr.flat):
            arr = np.asarray(value, dtype=np.float64)  # Python ints beyond int64, as a float would take them
    except OverflowError as exc:
        raise SchemaMismatchError(f"{spec.name}: a value is too large for {target}; {where}") from exc
    except (TypeError, ValueError) as exc:
        raise SchemaMismatchError(f"{spec.name}: cannot read {_describe(value)} as an array; {where}") from exc
    if arr.dtype.kind not in _NUMERIC_KINDS:
        raise SchemaMismatchError(f"{spec.name}: got non-numeric data ({arr.dtype}); {where}")
    if arr.shape != expected:
        raise SchemaMismatchError(f"{spec.name}: got shape {arr.shape}, expected {expected}; {where}")
    if arr.dtype == target:
        return arr
    if target.kind == "f":
        _check_float_range(spec, arr, where)
        return arr.astype(target)
    if arr.dtype.kind == "f":
        raise SchemaMismatchError(
            f"{spec.name}: got float data ({arr.dtype}) for an integer/bool field; {where}. {INFERRED_HINT}"
            f"fields={{{spec.name!r}: ({spec.shape}, 'float32'), ...}}")
    if target.kind == "b":
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise SchemaMismatchError(f"{spec.name}: got values other than 0/1 for a bool field; {where}")
        return arr.astype(bool)
    info = np.iinfo(target)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise SchemaMismatchError(
            f"{spec.name}: values [{arr.min()}, {arr.max()}] do not fit {target} "
            f"[{info.min}, {info.max}]; {where}")
    return arr.astype(target)


def float_bounds(dtype: np.dtype) -> tuple[float, float]:
    """The finite range of a float dtype: a finite value outside it is refused (the one rule
    on every add path); NaN and infinities given as such are stored as they are."""
    big = float(np.finfo(dtype).max)
    return -big, big


def _check_float_range(spec: FieldSpec, arr: np.ndarray, where: str) -> None:
    if not arr.size or arr.dtype.kind == "b" or arr.dtype.kind == "f" and arr.dtype.itemsize <= spec.dtype.itemsize:
        return
    lo, hi = float_bounds(spec.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        over = np.isfinite(arr) & ((arr > hi) | (arr < lo))
    if over.any():
        raise SchemaMismatchError(
            f"{spec.name}: value {arr[over].flat[0]} overflows {spec.dtype} (finite values must lie within "
            f"[{lo:g}, {hi:g}]; pass inf explicitly, or declare the field with a wider dtype); {where}")


def fields_from_json(obj) -> dict[str, FieldSpec]:
    """Parse the ``fields`` object of a store description (raises InvalidArgumentError)."""
    if not isinstance(obj, dict):
        raise InvalidArgumentError("fields is not an object")
    return normalize_fields({k: (v.get("shape"), v.get("dtype")) if isinstance(v, dict) else v
                             for k, v in obj.items()}, new=False)
