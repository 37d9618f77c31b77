"""Preallocated ``.npy`` files that ``numpy.load(path, mmap_mode="r")`` opens as they are."""
from __future__ import annotations

import io
import os
import tokenize

import numpy as np

from .mapped import MappedFile
from ..errors import CorruptStoreError, DiskReplayError
from .fsutil import io_error, preallocate

_fmt = np.lib.format


def write_npy_header(f, shape: tuple, dtype: np.dtype) -> None:
    """The header of a C-order ``.npy`` array file, written at ``f``'s position."""
    header = {"descr": _fmt.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    _fmt.write_array_header_2_0(f, header) if _needs_v2(header) else _fmt.write_array_header_1_0(f, header)


def create_npy(path: str, shape: tuple, dtype: np.dtype) -> None:
    """Write the header and reserve the blocks of a C-order array file; contents are zeros."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    try:
        with open(path, "wb") as f:
            write_npy_header(f, shape, dtype)
            offset = f.tell()
            f.flush()
            preallocate(f.fileno(), offset, nbytes, path)
            f.truncate(offset + nbytes)
            os.fsync(f.fileno())
    except DiskReplayError:
        raise
    except OSError as exc:
        raise io_error(f"creating {path}", exc) from exc


def _needs_v2(header: dict) -> bool:
    return len(repr(header)) > 65000


def read_npy_header(path: str) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, data offset) of an ``.npy`` file, or CorruptStoreError."""
    try:
        with open(path, "rb") as f:
            try:
                version = _fmt.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = _fmt.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = _fmt.read_array_header_2_0(f)
                else:
                    raise ValueError(f"unsupported .npy version {version}")
            except (ValueError, SyntaxError, TypeError, EOFError, KeyError) as exc:
                raise CorruptStoreError(f"{path} is not a valid .npy file: {exc}") from exc
            except tokenize.TokenError as exc:  # numpy tokenizes the header's dict; damage can cut it open
                raise CorruptStoreError(f"{path} is not a valid .npy file: its header is damaged") from exc
            if fortran:
                raise CorruptStoreError(f"{path} is stored in Fortran order; expected C order")
            return tuple(shape), dtype, f.tell()
    except FileNotFoundError as exc:
        raise CorruptStoreError(f"{path} is missing") from exc
    except OSError as exc:
        raise io_error(f"reading {path}", exc) from exc


def expected_npy_bytes(shape: tuple, dtype: np.dtype) -> int:
    """Size of the file ``create_npy`` writes for ``shape`` and ``dtype``."""
    header = {"descr": _fmt.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    buf = io.BytesIO()
    _fmt.write_array_header_2_0(buf, header) if _needs_v2(header) else _fmt.write_array_header_1_0(buf, header)
    return buf.tell() + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def open_npy(path: str, shape: tuple, dtype: np.dtype, writable: bool) -> tuple[MappedFile, np.ndarray, int]:
    """Map an ``.npy`` file after checking its header and size against ``shape`` and ``dtype``."""
    try:
        actual = os.stat(path).st_size
    except FileNotFoundError:
        raise CorruptStoreError(f"{path} is missing") from None
    except OSError as exc:
        raise io_error(f"reading {path}", exc) from exc
    expected_total = expected_npy_bytes(shape, dtype)
    if actual < expected_total:
        raise CorruptStoreError(
            f"{path} is {actual} bytes, expected {expected_total} bytes: the file is truncated")
    found_shape, found_dtype, offset = read_npy_header(path)
    if found_shape != tuple(shape) or found_dtype != np.dtype(dtype):
        raise CorruptStoreError(
            f"{path} holds {found_shape} {found_dtype}, expected {tuple(shape)} {np.dtype(dtype)}")
    expected = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    actual = os.stat(path).st_size
    if actual != expected:
        raise CorruptStoreError(f"{path} is {actual} bytes, expected {expected} bytes")
    mapped = MappedFile(path, writable)
    return mapped, mapped.array(offset, tuple(shape), dtype), offset
