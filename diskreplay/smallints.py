"""Exact statistics of one- and two-byte integers (and bools): frames, flags, small actions.

``moments`` gives min, max, sum and sum of squares as exact Python ints; ``tally`` adds
counts per value into a table indexed by the raw bits. Both use the C kernels of
``_scan`` (built at install where a compiler is; one vectorized pass, the GIL released,
about 0.15 and 0.3 ns a byte) and fall back to numpy (a pass per quantity, about 1.4
and 2.75 ns a byte) with the same results; ``implementation()`` says which is in use.

    flat = frames.reshape(-1)
    lo, hi, total, squares = moments(flat)
    counts = np.zeros(256, np.int64); tally(flat, counts)
"""
from __future__ import annotations

import numpy as np

from . import native

# native.scan: None where not built or DISKREPLAY_PURE is set (numpy does the same, slower);
# looked up at each call, so native.turned_off("scan") gives numpy's results in a test

__all__ = ["implementation", "moments", "moments_numpy", "tally", "tally_numpy"]

MAX_BYTES = 2  # the widest integers handled here
_PIECE = 1 << 30  # elements per kernel call: every 64-bit total of the kernel stays exact
_TALLY_CHUNK = 1 << 20  # elements per bincount call (its intp copy: 8 MiB)


def implementation() -> str:
    """``"C"`` when the ``_scan`` kernels are built, else ``"numpy"``."""
    return "numpy" if native.scan is None else "C"


def _kind(dtype: np.dtype) -> str | None:
    """The kernel's letter for ``dtype`` (B, b, H, h), or None when numpy must do it."""
    if dtype.kind == "b":
        return "B"
    if dtype.kind in "iu" and dtype.itemsize <= MAX_BYTES and dtype.isnative:
        return dtype.char if dtype.char in "BbHh" else None
    return None


def moments(flat: np.ndarray) -> tuple[int, int, int, int]:
    """``(min, max, sum, sum of squares)`` of a non-empty 1-d contiguous array of one- or
    two-byte integers or bools (bools as their byte values), all exact ints."""
    scan = native.scan
    kind = None if scan is None else _kind(flat.dtype)
    if kind is None:
        return moments_numpy(flat)
    parts = [scan.moments(flat[lo:lo + _PIECE], kind) for lo in range(0, flat.size, _PIECE)]
    return (min(p[0] for p in parts), max(p[1] for p in parts), sum(p[2] for p in parts),
            sum(p[3] for p in parts))


def moments_numpy(flat: np.ndarray) -> tuple[int, int, int, int]:
    """``moments`` in numpy (the fallback; a pass per quantity)."""
    if flat.dtype.kind == "b":
        flat = flat.view(np.uint8)
    squares = int(np.einsum("i,i->", flat, flat, dtype=np.int64, casting="unsafe"))
    return int(flat.min()), int(flat.max()), int(flat.sum(dtype=np.int64)), squares


def tally(flat: np.ndarray, counts: np.ndarray) -> None:
    """``counts[bits] +=`` the occurrences of each raw bit pattern in ``flat`` (a 1-d
    contiguous array of one- or two-byte elements); ``counts``: int64, 256 or 65536 long."""
    scan = native.scan
    kind = None if scan is None else _kind(flat.dtype)
    if kind is None:
        tally_numpy(flat, counts)
        return
    for lo in range(0, flat.size, _PIECE):
        scan.tally(flat[lo:lo + _PIECE], kind, counts)


def tally_numpy(flat: np.ndarray, counts: np.ndarray) -> None:
    """``tally`` in numpy (the fallback; bincount in chunks, as it copies its input as intp)."""
    raw = flat.view(np.uint8 if flat.dtype.itemsize == 1 else np.uint16)
    for lo in range(0, raw.size, _TALLY_CHUNK):
        counts += np.bincount(raw[lo:lo + _TALLY_CHUNK], minlength=len(counts))
