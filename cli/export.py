"""``diskreplay export``: transitions in chronological order to ``.npz`` or plain HDF5."""
from __future__ import annotations

import os

import numpy as np

from diskreplay import DiskReplay

from .inspect import ChronoReader, Snapshot, batch_keys, block_rows


def format_for(out: str, given: str | None) -> str:
    if given:
        return given
    return "hdf5" if out.lower().endswith((".h5", ".hdf5")) else "npz"


def _dtypes(buf: DiskReplay) -> dict:
    fields = buf.fields
    out = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in fields.items()}
    out["next_states"] = out["states"]
    return out


def export_store(buf: DiskReplay, snap: Snapshot, out: str, fmt: str, start: int, stop: int,
                 progress=None) -> dict:
    """Write positions ``[start, stop)`` of ``snap`` to ``out`` (through a temporary file,
    renamed at the end). Returns ``{"rows": n, "skipped_overwritten": k}``."""
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        if fmt == "hdf5":
            result = _export_hdf5(buf, snap, tmp, start, stop, progress)
        else:
            result = _export_npz(buf, snap, tmp, start, stop, progress)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return result


def _export_npz(buf, snap, tmp, start, stop, progress) -> dict:
    # np.savez needs whole arrays: the npz output is built in memory (HDF5 output is not).
    keys = batch_keys(buf)
    specs = _dtypes(buf)
    parts = {k: [] for k in keys}
    reader = ChronoReader(buf, snap, start, stop, block_rows(buf))
    for positions, batch in reader:
        for k in keys:
            parts[k].append(batch[k])
        if progress is not None:
            progress(len(positions))
    arrays = {k: (np.concatenate(parts[k]) if parts[k] else np.empty((0,) + specs[k][0], specs[k][1]))
              for k in keys}
    n = len(arrays["states"])
    arrays["slots"] = reader.snap.slot(np.arange(start + reader.skipped, start + reader.skipped + n))
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return {"rows": n, "skipped_overwritten": reader.skipped}


def _export_hdf5(buf, snap, tmp, start, stop, progress) -> dict:
    import h5py

    keys = batch_keys(buf)
    specs = _dtypes(buf)
    total = stop - start
    reader = ChronoReader(buf, snap, start, stop, block_rows(buf))
    written = 0
    with h5py.File(tmp, "w") as f:
        dsets = {}
        for k in keys:
            shape, dtype = specs[k]
            dsets[k] = f.create_dataset(k, shape=(total,) + shape, maxshape=(None,) + shape, dtype=dtype,
                                        chunks=True if total else None)
        slots = f.create_dataset("slots", shape=(total,), maxshape=(None,), dtype=np.int64,
                                 chunks=True if total else None)
        for positions, batch in reader:
            n = len(positions)
            for k in keys:
                dsets[k][written:written + n] = batch[k]
            slots[written:written + n] = reader.snap.slot(positions)
            written += n
            if progress is not None:
                progress(n)
        if written != total:
            for d in list(dsets.values()) + [slots]:
                d.resize(written, axis=0)
        f.attrs["source"] = os.path.basename(os.path.abspath(buf.path))
        f.attrs["backend"] = buf.backend
        f.attrs["max_size"] = buf.max_size
        f.attrs["num_envs"] = buf.num_envs
        f.attrs["seen_size"] = reader.snap.seen
        f.attrs["first_transition"] = reader.snap.transition(start + reader.skipped)
    return {"rows": written, "skipped_overwritten": reader.skipped}
