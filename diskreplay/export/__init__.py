"""Transitions in chronological order, to ``.npz`` or plain HDF5 files any tool can read,
or to the layouts offline-RL code reads: a D4RL file (:mod:`diskreplay.export.d4rl`) and a
Minari dataset (:mod:`diskreplay.export.minari`).

    from diskreplay import DiskReplay
    from diskreplay.export import export_store

    with DiskReplay.open("runs/pong.replay", mode="r") as buf:
        export_store(buf, "last1000.h5", start=-1000)

The npz and HDF5 outputs hold ``states, actions, rewards, next_states`` (materialized),
``dones``, the extra fields and ``slots`` (the slot each row came from), one row per
transition, oldest first. HDF5 files also carry the attributes ``source, backend,
max_size, num_envs, seen_size`` and ``first_transition``.

Every format streams: rows are read in blocks and written as they come, so the process's
anonymous memory stays flat whatever the store's size (each npz member has its place in
the archive from the start, and so has each HDF5 chunk, so rows are written straight
there, once: :mod:`diskreplay.export.placed`). The next block is read on a second thread while
this one is written, and the disk writes each stretch back as soon as it is written.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from ..chrono import require_fields
from ..errors import InvalidArgumentError, OutputExistsError
from .d4rl import provenance, write_d4rl
from .minari import export_minari
from ..disk.fsutil import atomic_replace
from ..format.directory import check_path, enclosing_store
from .npz import NpzWriter
from .placed import PlacedRows, WriteBehind, create_placed
from ..store import DiskReplay
from ..views import ChronoReader, Snapshot, batch_keys

FORMATS = ("npz", "hdf5", "d4rl", "minari")
CHUNK_BYTES = 1 << 20


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
                 progress: Callable[[int, int], None] | None = None, overwrite: bool = True,
                 dataset_id: str | None = None, include_incomplete: bool = False) -> dict:
    """Write the chronological positions ``[start, stop)`` of ``snap`` (default: a fresh
    :func:`~diskreplay.views.snapshot`) to ``out``, oldest first; negative positions count
    from the newest, as in Python slices. ``fmt`` is ``"npz"``, ``"hdf5"``, ``"d4rl"`` or
    ``"minari"`` (default: :func:`format_for`). A file is written beside itself and renamed
    into place when complete, so it never holds a partial export; an existing one is
    replaced unless ``overwrite=False`` (then :class:`OutputExistsError`).

    For ``"minari"``, ``out`` is a Minari datasets root (a directory, created if missing)
    and the dataset goes to ``out/<dataset_id>`` (default: the store's name plus
    ``-v0``); see :func:`diskreplay.export.minari.export_minari` and
    ``include_incomplete``. The other formats take neither argument.

    Returns ``{"rows": n, "skipped_overwritten": k, "format": fmt}`` (Minari adds
    ``episodes``, ``skipped_incomplete``, ``dataset_id`` and ``path``): ``k`` rows the
    live writer overwrote before they were read are left out.
    """
    out = check_output_path(out)
    fmt = format_for(out, fmt)
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    require_fields(buf)
    if fmt == "minari":
        return export_minari(buf, out, start=start, stop=stop, progress=progress, overwrite=overwrite,
                             dataset_id=dataset_id, include_incomplete=include_incomplete)
    if dataset_id is not None or include_incomplete:
        raise InvalidArgumentError(f"dataset_id and include_incomplete are for the minari format, not {fmt}")
    if os.path.isdir(out):
        raise InvalidArgumentError(f"cannot write {out}: it is a directory; name a file")
    if not overwrite and os.path.lexists(out):
        raise OutputExistsError(f"{out} exists; pass overwrite=True to replace it")
    reader = ChronoReader(buf, start, stop, snap=snap, progress=progress, ahead=True)  # reads beside the writes
    write = {"npz": _write_npz, "hdf5": _write_hdf5, "d4rl": write_d4rl}[fmt]
    with atomic_replace(os.fspath(out)) as tmp:
        rows = write(buf, reader, tmp)
    return {"rows": rows, "skipped_overwritten": reader.skipped, "format": fmt}


def _batch_specs(buf: DiskReplay) -> dict:
    """``{key: (row shape, dtype)}`` of every key of a batch."""
    specs = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in buf.fields.items()}
    specs["next_states"] = specs["states"]
    return {key: specs[key] for key in batch_keys(buf)}


def _write_npz(buf: DiskReplay, reader: ChronoReader, tmp: str) -> int:
    """What ``np.savez`` writes (an uncompressed zip of ``.npy`` members), streamed: every
    member has its place in the file from the start (:class:`~diskreplay.export.npz.NpzWriter`),
    so each block's rows go straight to their members, written once."""
    specs = _batch_specs(buf)
    specs["slots"] = ((), np.dtype(np.int64))
    rows = 0
    with NpzWriter(tmp, specs, reader.stop - reader.start) as npz:
        for block in reader:
            for key in specs:
                npz.append(key, block.slots if key == "slots" else block.batch[key])
            rows += len(block.slots)
        npz.finish()
    return rows


def _write_hdf5(buf: DiskReplay, reader: ChronoReader, tmp: str) -> int:
    import h5py

    specs = _batch_specs(buf)
    specs["slots"] = ((), np.dtype(np.int64))
    total = reader.stop - reader.start
    written = 0
    with h5py.File(tmp, "w") as f, WriteBehind.opening(tmp) as out:
        # Chunks of whole rows (about CHUNK_BYTES), allocated at creation, so that each
        # block's rows are written straight to their place (outfile.PlacedRows): h5py's own
        # guess cut frames into chunks across columns, and its chunk cache copied every block.
        if total:
            dsets = {key: create_placed(f, key, total, shape, dtype, _row_chunks(shape, dtype, total)[0])
                     for key, (shape, dtype) in specs.items()}
        else:
            dsets = {key: f.create_dataset(key, shape=(0,) + shape, maxshape=(None,) + shape, dtype=dtype)
                     for key, (shape, dtype) in specs.items()}
        places = {key: PlacedRows(dset, out) for key, dset in dsets.items()} if total else {}
        for block in reader:
            for key, place in places.items():
                place.write(written, block.slots if key == "slots" else block.batch[key])
            written += len(block.slots)
        for place in places.values():
            place.flush()
        if written != total:
            for dset in dsets.values():
                dset.resize(written, axis=0)
        f.attrs.update(provenance(buf, reader))
    return written


def _row_chunks(shape: tuple, dtype: np.dtype, total: int) -> tuple:
    row = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
    return (max(1, min(total, CHUNK_BYTES // max(1, row))),) + tuple(shape)


__all__ = ["FORMATS", "atomic_replace", "check_output_path", "export_store", "format_for"]
