"""Where the row of each slot lies in a field's file: the one place that says so.

Every field of every store keeps slot ``s`` at row ``s`` (``SLOT_ORDER``), except the
``states`` field of a frame-stack store created with ``max_size % num_envs == 0``
(``store.json``'s ``"frames_layout": "env-major"``, FORMAT.md "Frame stacks"): there slot
``s = q * n + e`` (``n`` = ``num_envs``, ``e`` the env) lies at row ``e * (m / n) + q``, so
the frames of one env's consecutive transitions are neighbouring rows and a stack plus
its next frame is one span of ``k + 1`` rows (two at the end of the env's region), not
``k + 1`` rows ``n`` apart. ``RowStorage`` holds the order of each field
(``backends/base.py``); code that indexes a field's rows by slot asks it for rows.
Numpy only, no I/O.
"""
from __future__ import annotations

import numpy as np

ENV_MAJOR = "env-major"
LAYOUT_KEY = "frames_layout"


class SlotOrder:
    """Row ``s`` holds slot ``s``."""

    identity = True

    def rows(self, slots):
        """The rows holding ``slots`` (an int64 array, returned as is)."""
        return slots

    def span(self, start: int, count: int):
        """An index of the rows of slots ``[start, start + count)`` (no wrap), for a step's
        write or a block's copy: a slice where one exists."""
        return slice(start, start + count)

    def runs(self, start: int, count: int) -> list[tuple[int, int]]:
        """``(first row, rows)`` of the runs of neighbouring rows that hold slots
        ``[start, start + count)`` (``start < max_size``, wrapping at the ring's end)."""
        return [(start, count)]

    def read_block(self, read, start: int, count: int, row_bytes: int) -> bytes:
        """The bytes of slots ``[start, start + count)`` in slot order, where ``read(row,
        rows)`` returns the bytes of ``rows`` rows from ``row`` (no wrap)."""
        return read(start, count)


class EnvMajor(SlotOrder):
    """Slot ``q * n + e`` at row ``e * (m / n) + q`` (``max_size`` a multiple of ``num_envs``)."""

    identity = False

    def __init__(self, max_size: int, num_envs: int):
        self.n, self.per_env, self.max_size = num_envs, max_size // num_envs, max_size

    def rows(self, slots):
        q, e = np.divmod(slots, self.n)
        e *= self.per_env
        e += q
        return e

    def span(self, start: int, count: int):
        if count == self.n and start % self.n == 0:  # one step: row start/n of each env's region
            return slice(start // self.n, self.max_size, self.per_env)
        return self.rows(np.arange(start, start + count, dtype=np.int64))

    def runs(self, start: int, count: int) -> list[tuple[int, int]]:
        rows = np.sort(self.rows(np.arange(start, start + count, dtype=np.int64) % self.max_size))
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        firsts = rows[np.concatenate([[0], breaks])].tolist() if len(rows) else []
        lengths = np.diff(np.concatenate([[0], breaks, [len(rows)]])).tolist()
        return list(zip(firsts, lengths))

    def read_block(self, read, start: int, count: int, row_bytes: int) -> bytes:
        n = self.n
        if start % n or count % n:
            rows = self.rows(np.arange(start, start + count, dtype=np.int64)).tolist()
            return b"".join(read(r, 1) for r in rows)
        per = count // n  # each env's rows of the block are one run; interleave them back
        parts = [np.frombuffer(read(e * self.per_env + start // n, per), np.uint8) for e in range(n)]
        if any(len(p) != per * row_bytes for p in parts):
            return b""  # past the end of the file: the caller reports it
        return np.stack([p.reshape(per, row_bytes) for p in parts], axis=1).tobytes()


SLOT_ORDER = SlotOrder()


def frames_layout(frame_stack: int | None, max_size: int, num_envs: int) -> str | None:
    """The layout a new store's frames get: env-major where ``max_size`` is a multiple of
    ``num_envs`` (else the slot order, and no key in ``store.json``)."""
    return ENV_MAJOR if frame_stack and max_size % num_envs == 0 else None


def states_order(layout: str | None, max_size: int, num_envs: int) -> SlotOrder:
    """The order of the ``states`` rows of a store whose description names ``layout``."""
    if layout == ENV_MAJOR and num_envs > 1:  # one env: env-major is the slot order
        return EnvMajor(max_size, num_envs)
    return SLOT_ORDER


__all__ = ["ENV_MAJOR", "LAYOUT_KEY", "SLOT_ORDER", "EnvMajor", "SlotOrder", "frames_layout", "states_order"]
