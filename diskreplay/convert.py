"""Copying a store to another backend, block by block."""
from __future__ import annotations

import os

import numpy as np

from . import ring
from .errors import StoreLockedError
from .lock import writer_alive

BLOCK_BYTES = 8 << 20


def convert_store(src, dst, *, backend, progress=None, overwrite=False, block_rows=None) -> None:
    from .store import DiskReplay

    src_path = os.fspath(src)
    if writer_alive(os.path.abspath(src_path)):
        raise StoreLockedError(f"{src_path} is open for writing; close its writer before converting it")
    with DiskReplay.open(src_path, mode="r") as source:
        key, overlay, _ = source._reader_state
        if overlay is not None:
            raise StoreLockedError(
                f"{src_path} needs recovery (its last writer crashed); open it once with mode='r+' first")
        specs = source._fields
        with DiskReplay.create(dst, source.max_size, num_envs=source.num_envs, backend=backend,
                               batch_size=source.batch_size, use_cer=source.use_cer,
                               seed=source._desc["seed_entropy"],
                               fields=None if specs is None else {n: (s.shape, s.dtype) for n, s in specs.items()},
                               overwrite=overwrite, flush_every=source.flush_every) as target:
            seen, base, draws, resets = source._seen, source._base, source._draws, source._resets
            if specs is not None:
                _copy_rows(source, target, ring.ring_size(seen, base, source.max_size), progress, block_rows)
                target._ns[(seen // source.num_envs) % 2] = source._current_ns()
            target._counters.commit_state(seen, base, draws, resets)
            target._seen, target._base, target._resets = seen, base, resets
            target._sampler = ring.Sampler(source._desc["seed_entropy"], draws)
            target._set_flush_limit()
            target.flush()


def _copy_rows(source, target, size: int, progress, block_rows) -> None:
    """Copy slots ``[0, size)`` of every field in blocks of bounded bytes."""
    total = size
    row_bytes = max(spec.row_bytes for spec in source._fields.values())
    step = block_rows or max(1, BLOCK_BYTES // row_bytes)
    done = 0
    src_arrays = source._storage.arrays
    dst_arrays = target._storage.arrays
    for start in range(0, size, step):
        stop = min(start + step, size)
        for name in source._fields:
            dst_arrays[name][start:stop] = np.asarray(src_arrays[name][start:stop])
        done = stop
        if progress is not None:
            progress(done, total)
    if progress is not None and total == 0:
        progress(0, 0)
