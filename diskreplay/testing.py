"""A small testing surface for code that checks a store from the inside (diskreplay's own
tests, and users testing their integrations), as ``zarr.testing`` is zarr's: a few functions
instead of private attributes, so that the machinery can move without breaking tests that
are not about it. Everything returned is a copy or a read-only view."""
from __future__ import annotations

import numpy as np

import os

from .core.ring import RingState
from .parts import Geometry, parts_of
from .store import DiskReplay


def ring_state(buf: DiskReplay) -> RingState:
    """The ring's state as the open session holds it: ``seen``, ``base``, ``draws``, ``resets``."""
    return buf._session.state()


def raw_rows(buf: DiskReplay) -> dict[str, np.ndarray]:
    """Every field's rows as stored (one frame a row in a frame-stack store; the backend's
    row order), read-only views of the files."""
    views = {}
    for name, rows in buf._session.storage.arrays.items():
        view = rows.view()
        view.flags.writeable = False
        views[name] = view
    return views


def counter_words(buf: DiskReplay) -> np.ndarray:
    """A copy of the live counter words of ``meta.bin`` (FORMAT.md: "meta.bin")."""
    return np.array(buf._session.counters.words, copy=True)


def part_counts(buf: DiskReplay) -> dict[str, int]:
    """The records the session counts as committed in each side ring: ``jumps`` (the jump
    ring) and, in a frame-stack store, ``stacks`` (the stack ring)."""
    counts = {"jumps": 0, **buf._session.part_counts()}  # a format 1 store has no jump ring
    return {name: int(count) for name, count in counts.items()}


__all__ = ["counter_words", "part_counts", "raw_rows", "ring_state"]


def side_files(buf: DiskReplay) -> dict[str, bytes]:
    """The bytes of every file the store's parts keep beside their datasets in the backend
    (``diskreplay.parts``: the jump ring's and stack ring's ``.npy`` files, ``priorities.bin``),
    by file name, plus ``ns_buffer.npy`` and ``rowsums.npy``."""
    session = buf._session
    g = Geometry.of(session.desc, buf.prioritized)
    names = {"ns_buffer.npy", "rowsums.npy"}
    for part in parts_of(g):
        names |= set(part.files(g)) - set(g.backend.data_files(part.datasets(g)))
    out = {}
    for name in sorted(names):
        with open(os.path.join(session.directory, name), "rb") as f:
            out[name] = f.read()
    return out

