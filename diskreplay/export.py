"""Transitions in chronological order, to ``.npz`` or plain HDF5 files any tool can read.

    from diskreplay import DiskReplay
    from diskreplay.export import export_store

    with DiskReplay.open("runs/pong.replay", mode="r") as buf:
        export_store(buf, "last1000.h5", start=-1000)

The output holds ``states, actions, rewards, next_states`` (materialized), ``dones``, the
extra fields and ``slots`` (the slot each row came from), one row per transition, oldest
first. HDF5 files also carry the attributes ``source, backend, max_size, num_envs,
seen_size`` and ``first_transition``.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from .errors import InvalidArgumentError
from .fsutil import atomic_replace
from .layout import check_path, enclosing_store
from .store import DiskReplay
from .views import ChronoReader, Snapshot, batch_keys

FORMATS = ("npz", "hdf5")


def format_for(out, given: str | None = None) -> str:
    """``given``, or the format ``out``'s suffix names: ``.h5``/``.hdf5`` for HDF5, else npz."""
    if given:
        return given
    return "hdf5" if os.fspath(out).lower().endswith((".h5", ".hdf5")) else "npz"


def check_output_path(out) -> str:
    """``out`` as a ``str`` path, refused (``InvalidArgumentError``) when it lies inside a
    store directory, the exported one or any other: it could replace one of the store's
    files, and a foreign file there blocks ``create(overwrite=True)``. Used by every
    command that writes a file (export, plot)."""
    out = check_path(out, "out")
    inside = enclosing_store(out)
    if inside is not None:
        raise InvalidArgumentError(f"cannot write {out}: it lies inside the store {inside}; "
                                   "write it outside any store directory")
    return out


def export_store(buf: DiskReplay, out, *, fmt: str | None = None, start: int | None = None,
                 stop: int | None = None, snap: Snapshot | None = None,
                 progress: Callable[[int, int], None] | None = None) -> dict:
    """Write the chronological positions ``[start, stop)`` of ``snap`` (default: a fresh
    :func:`~diskreplay.views.snapshot`) to ``out``, oldest first; negative positions count
    from the newest, as in Python slices. ``fmt`` is ``"npz"`` or ``"hdf5"`` (default:
    :func:`format_for`). ``out`` is written beside itself and renamed into place when
    complete, so it never holds a partial export. HDF5 output is written in row blocks
    (bounded memory); npz output is built in memory.

    Returns ``{"rows": n, "skipped_overwritten": k, "format": fmt}``: ``k`` rows the live
    writer overwrote before they were read are left out.
    """
    out = check_output_path(out)
    fmt = format_for(out, fmt)
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    reader = ChronoReader(buf, start, stop, snap=snap, progress=progress)
    write = _write_hdf5 if fmt == "hdf5" else _write_npz
    with atomic_replace(os.fspath(out)) as tmp:
        rows = write(buf, reader, tmp)
    return {"rows": rows, "skipped_overwritten": reader.skipped, "format": fmt}


def _batch_specs(buf: DiskReplay) -> dict:
    """``{key: (row shape, dtype)}`` of every key of a batch."""
    specs = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in buf.fields.items()}
    specs["next_states"] = specs["states"]
    return {key: specs[key] for key in batch_keys(buf)}


def _write_npz(buf: DiskReplay, reader: ChronoReader, tmp: str) -> int:
    # np.savez needs whole arrays: the npz output is built in memory (HDF5 output is not).
    specs = _batch_specs(buf)
    parts = {key: [] for key in specs}
    slots = []
    for block in reader:
        for key in specs:
            parts[key].append(block.batch[key])
        slots.append(block.slots)
    arrays = {key: np.concatenate(parts[key]) if parts[key] else np.empty((0,) + shape, dtype)
              for key, (shape, dtype) in specs.items()}
    arrays["slots"] = np.concatenate(slots) if slots else np.empty(0, np.int64)
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return len(arrays["slots"])


def _write_hdf5(buf: DiskReplay, reader: ChronoReader, tmp: str) -> int:
    import h5py

    specs = _batch_specs(buf)
    total = reader.stop - reader.start
    chunks = True if total else None
    written = 0
    with h5py.File(tmp, "w") as f:
        dsets = {key: f.create_dataset(key, shape=(total,) + shape, maxshape=(None,) + shape, dtype=dtype,
                                       chunks=chunks)
                 for key, (shape, dtype) in specs.items()}
        dsets["slots"] = f.create_dataset("slots", shape=(total,), maxshape=(None,), dtype=np.int64,
                                          chunks=chunks)
        for block in reader:
            n = len(block.slots)
            for key in specs:
                dsets[key][written:written + n] = block.batch[key]
            dsets["slots"][written:written + n] = block.slots
            written += n
        if written != total:
            for dset in dsets.values():
                dset.resize(written, axis=0)
        snap = reader.snap
        f.attrs["source"] = os.path.basename(os.path.abspath(buf.path))
        f.attrs["backend"] = buf.backend
        f.attrs["max_size"] = buf.max_size
        f.attrs["num_envs"] = buf.num_envs
        f.attrs["seen_size"] = snap.seen
        f.attrs["first_transition"] = snap.transition(reader.start + reader.skipped)
    return written


__all__ = ["FORMATS", "check_output_path", "export_store", "format_for"]
