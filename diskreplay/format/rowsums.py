"""``rowsums.npy``: a CRC-32 per slot over the row's fields and its transition number.

Sums are computed at ``flush()`` for the rows added since the previous flush (never on
the ``add`` hot path) and synced with them, so every row that was durable at the last
flush can be told whole or torn: ``verify`` checks them, recovery keeps them true.

``batch_sums`` computes many rows at once. Rows of a few hundred bytes (W1's shapes): in
C where ``_rows`` is built (``_rows.c``: slicing by eight, straight from the rows, the GIL
released; about 25 ns a W1 row), else with a table-driven CRC-32 run across all rows in
numpy, four bytes per step (slicing by four; about 120 ns a W1 row), where a Python call
per row would cost more than the bytes. Larger rows with zlib, whose per-row call is then
small beside the bytes (and whose CRC is about twice as fast as the C kernel's per byte).
All give zlib's CRC-32, the one in the format; ``implementation()`` says which is in use.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..core import ring

from .. import native

# native.rows: None where the kernel is not built or DISKREPLAY_PURE is set (numpy and zlib do
# the same, slower); looked up at each call, so native.turned_off("rows") gives the twin in a test

ROWSUMS_FILE = "rowsums.npy"


def implementation() -> str:
    """``"C"`` when the ``_rows`` kernels are built, else ``"numpy"``."""
    return "numpy" if native.rows is None else "C"


def byte_rows(storage) -> tuple[list[np.ndarray], list]:
    """Each field of a ``RowStorage`` as a (max_size, row_bytes) uint8 view in the file's
    row order, and each field's order (which row holds a slot: ``roworder.py``)."""
    arrays = storage.arrays
    return ([arr.reshape(arr.shape[0], -1).view(np.uint8) for arr in arrays.values()],
            [storage.order(name) for name in arrays])


def row_sum(rows: list[np.ndarray], slot: int, t: int) -> int:
    return _sum_at(rows, [slot] * len(rows), t)


def _sum_at(rows: list[np.ndarray], where, t: int) -> int:
    """The sum of transition ``t`` whose fields' rows are ``rows[f][where[f]]``."""
    crc = zlib.crc32(int(t).to_bytes(8, "little", signed=True))
    for field_rows, r in zip(rows, where):
        crc = zlib.crc32(field_rows[r], crc)
    return crc


VECTOR_ROW_BYTES = 512  # rows up to this size are summed across rows in numpy
_BATCH = 1 << 16  # rows per numpy pass (bounded temporaries: 64 Ki rows of <= 520 bytes)


def _tables() -> np.ndarray:
    """The four slicing-by-4 tables of the reflected CRC-32 polynomial (zlib's)."""
    t0 = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t0 = np.where(t0 & 1, (t0 >> 1) ^ np.uint32(0xEDB88320), t0 >> 1).astype(np.uint32)
    tables = [t0]
    for _ in range(3):
        prev = tables[-1]
        tables.append((prev >> 8) ^ t0[prev & 0xFF])
    return np.stack(tables)


_T = _tables()


def batch_sums(rows: list[np.ndarray], ts: np.ndarray) -> np.ndarray:
    """The CRC-32 (as ``row_sum``) of row ``i`` of every block in ``rows`` (each a
    ``(n, row_bytes)`` uint8 array, field order) with transition number ``ts[i]``."""
    ts = np.asarray(ts, dtype=np.int64)
    n = len(ts)
    if native.rows is not None and n and 8 + sum(r.shape[1] for r in rows) <= VECTOR_ROW_BYTES:
        return _crc_at([np.ascontiguousarray(r) for r in rows], np.arange(n, dtype=np.int64), ts)
    return batch_sums_numpy(rows, ts)


def batch_sums_numpy(rows: list[np.ndarray], ts: np.ndarray) -> np.ndarray:
    """``batch_sums`` without the C kernel (the fallback, and what tests compare it with)."""
    ts = np.asarray(ts, dtype=np.int64)
    n = len(ts)
    width = 8 + sum(r.shape[1] for r in rows)
    if width > VECTOR_ROW_BYTES:
        return np.fromiter((row_sum(rows, i, t) for i, t in enumerate(ts.tolist())), np.uint32, n)
    out = np.empty(n, np.uint32)
    for lo in range(0, n, _BATCH):
        hi = min(n, lo + _BATCH)
        data = np.concatenate([ts[lo:hi].astype("<i8").view(np.uint8).reshape(-1, 8)]
                              + [r[lo:hi] for r in rows], axis=1)
        out[lo:hi] = _crc_columns(data)
    return out


def _crc_columns(data: np.ndarray) -> np.ndarray:
    """zlib.crc32 of each row of a uint8 matrix, all rows at once."""
    t0, t1, t2, t3 = _T
    crc = np.full(len(data), 0xFFFFFFFF, np.uint32)
    whole = data.shape[1] // 4 * 4
    if whole:
        words = np.ascontiguousarray(data[:, :whole]).view("<u4")
        for j in range(words.shape[1]):
            c = crc ^ words[:, j]
            crc = t3[c & 0xFF] ^ t2[(c >> 8) & 0xFF] ^ t1[(c >> 16) & 0xFF] ^ t0[c >> 24]
    for j in range(whole, data.shape[1]):
        crc = t0[(crc ^ data[:, j]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def _crc_at(rows: list[np.ndarray], slots: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The C kernel's sums of rows ``slots`` of ``rows`` (C-contiguous, equally many rows)."""
    out = np.empty(len(ts), np.uint32)
    native.rows.crc_rows(out, np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(ts, np.int64), rows,
                         len(rows[0]))
    return out


def _ring_slots(t_lo: int, t_hi: int, base: int, max_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ts, slots)`` of transitions ``(t_lo, t_hi]`` still in the ring."""
    first = max(t_lo, base, t_hi - max_size) + 1
    ts = np.arange(first, t_hi + 1, dtype=np.int64)
    return ts, ring.slot_of(ts, base, max_size)


def _sums_at(rows: list[np.ndarray], orders: list, slots: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Sums of the rows at ``slots``: small rows gathered and summed at once, large ones
    one by one in place (a gather would copy them for nothing); small ones in C in place
    where every field keeps slot order (env-major frames are never small rows)."""
    if 8 + sum(r.shape[1] for r in rows) <= VECTOR_ROW_BYTES:
        if native.rows is not None and all(o.identity for o in orders) and all(r.flags.c_contiguous for r in rows):
            return _crc_at(rows, slots, ts)
        return batch_sums([r[order.rows(slots)] for r, order in zip(rows, orders)], ts)
    at = [order.rows(slots) for order in orders]
    return np.fromiter((_sum_at(rows, where, t) for where, t in zip(zip(*(a.tolist() for a in at)), ts.tolist())),
                       np.uint32, len(ts))


def _batch(rows: list[np.ndarray]) -> int:
    """Rows per pass: 64 Ki small rows, or about 64 MiB of large ones (progress stays live)."""
    return max(1, min(_BATCH, (1 << 26) // (8 + sum(r.shape[1] for r in rows))))


def update_sums(sums: np.ndarray, storage, t_lo: int, t_hi: int, base: int, max_size: int) -> None:
    """Store the sums of transitions ``(t_lo, t_hi]`` (those still in the ring) of the rows
    of ``storage`` (a ``RowStorage``)."""
    set_sums_for(sums, storage, *_ring_slots(t_lo, t_hi, base, max_size)[::-1])


def set_sums_for(sums: np.ndarray, storage, slots: np.ndarray, ts: np.ndarray) -> None:
    rows, orders = byte_rows(storage)
    slots, ts = np.asarray(slots, np.int64), np.asarray(ts, np.int64)
    step = _batch(rows)
    for lo in range(0, len(ts), step):
        sums[slots[lo:lo + step]] = _sums_at(rows, orders, slots[lo:lo + step], ts[lo:lo + step])


def torn_slots(sums: np.ndarray, storage, t_lo: int, t_hi: int, base: int, max_size: int,
               progress=None) -> list[int]:
    """Slots among transitions ``(t_lo, t_hi]`` whose row does not match its sum."""
    bad = []
    rows, orders = byte_rows(storage)
    ts, slots = _ring_slots(t_lo, t_hi, base, max_size)
    step = _batch(rows)
    for lo in range(0, len(ts), step):
        part = slots[lo:lo + step]
        wrong = _sums_at(rows, orders, part, ts[lo:lo + step]) != sums[part]
        bad.extend(part[wrong].tolist())
        if progress is not None:
            progress(lo)
    return bad
