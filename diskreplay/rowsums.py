"""``rowsums.npy``: a CRC-32 per slot over the row's fields and its transition number.

Sums are computed at ``flush()`` for the rows added since the previous flush (never on
the ``add`` hot path) and synced with them, so every row that was durable at the last
flush can be told whole or torn: ``verify`` checks them, recovery keeps them true.
"""
from __future__ import annotations

import zlib

import numpy as np

from . import ring

ROWSUMS_FILE = "rowsums.npy"


def byte_rows(arrays: dict) -> list[np.ndarray]:
    """Each field as a (max_size, row_bytes) uint8 view, in field order."""
    return [arr.reshape(arr.shape[0], -1).view(np.uint8) for arr in arrays.values()]


def row_sum(rows: list[np.ndarray], slot: int, t: int) -> int:
    crc = zlib.crc32(int(t).to_bytes(8, "little", signed=True))
    for field_rows in rows:
        crc = zlib.crc32(field_rows[slot], crc)
    return crc


def update_sums(sums: np.ndarray, arrays: dict, t_lo: int, t_hi: int, base: int, max_size: int) -> None:
    """Store the sums of transitions ``(t_lo, t_hi]`` (those still in the ring)."""
    first = max(t_lo, base, t_hi - max_size) + 1
    if first > t_hi:
        return
    rows = byte_rows(arrays)
    for t in range(first, t_hi + 1):
        slot = ring.slot_of(t, base, max_size)
        sums[slot] = row_sum(rows, slot, t)


def set_sums_for(sums: np.ndarray, arrays: dict, slots: np.ndarray, ts: np.ndarray) -> None:
    rows = byte_rows(arrays)
    for slot, t in zip(slots.tolist(), ts.tolist()):
        sums[slot] = row_sum(rows, slot, t)


def torn_slots(sums: np.ndarray, arrays: dict, t_lo: int, t_hi: int, base: int, max_size: int,
               progress=None) -> list[int]:
    """Slots among transitions ``(t_lo, t_hi]`` whose row does not match its sum."""
    bad = []
    rows = byte_rows(arrays)
    first = max(t_lo, base, t_hi - max_size) + 1
    for i, t in enumerate(range(first, t_hi + 1)):
        slot = ring.slot_of(t, base, max_size)
        if row_sum(rows, slot, t) != int(sums[slot]):
            bad.append(slot)
        if progress is not None and i % 4096 == 0:
            progress(i)
    return bad
