"""Copying a store to another backend, block by block, on a ``Reader`` of the source and a
``Writer`` of the new store (below the facade: this module never imports ``store``): the
rows slot for slot, then each part's data through its ``copy_into`` hook."""
from __future__ import annotations

import os

import numpy as np

from ..core import ring
from ..disk.fsutil import atomic_replace
from ..errors import InvalidArgumentError, StoreLockedError
from ..format.directory import check_create_target, check_path, enclosing_store
from ..format.lock import writer_alive
from .files import OWN_NAMES
from .reader import Reader
from .writer import Writer

BLOCK_BYTES = 8 << 20


def convert_store(src, dst, *, backend, progress=None, overwrite=False, block_rows=None) -> None:
    """Copy the store at ``src`` to a new store at ``dst`` with ``backend``: fields, rows,
    counters, ``ns_buffer``, the exact next states of the jump ring and the sampler
    position; ``progress(done_rows, total_rows)``. A store whose last writer died is read
    as recovery would leave it, without writing to it (as ``info`` and ``export`` read
    it), so a read-only copy converts too. The new store is built under a temporary name
    beside ``dst`` and renamed into place when whole: an interrupted convert leaves no
    partial store at ``dst``, and an old one (``overwrite=True``) until the new one is
    complete."""
    src_path, dst_path = check_path(src, "src"), check_path(dst, "dst")
    if os.path.realpath(src_path) == os.path.realpath(dst_path):
        raise InvalidArgumentError(f"cannot convert {src_path} onto itself; give another dst")
    inside = enclosing_store(dst_path, include_self=False)
    if inside is not None:
        raise InvalidArgumentError(f"cannot create {dst_path}: it lies inside the store {inside}; "
                                   "put the converted store outside any store directory")
    _check_dst(os.path.abspath(dst_path), overwrite)
    if writer_alive(os.path.abspath(src_path)):
        raise StoreLockedError(f"{src_path} is open for writing; close its writer before converting it")
    source = Reader(src_path)
    try:
        with atomic_replace(os.path.abspath(dst_path), directory=True) as staging:
            _convert(source, staging, backend, progress, block_rows)
    finally:
        source.close()


def _check_dst(dst: str, overwrite: bool) -> None:
    """Refuse a ``dst`` that is a symlink, a file, a directory of other files, or (without
    ``overwrite``) a store, or whose store a writer holds, before anything is written."""
    if os.path.islink(dst):
        raise InvalidArgumentError(f"cannot create a store at {dst}: it is a symbolic link; give the path "
                                   "it points to, or another path")
    if check_create_target(dst, overwrite, OWN_NAMES, hint="") == "store" and writer_alive(dst):
        raise StoreLockedError(f"{dst} is open for writing; close its writer before replacing it")


def _convert(source: Reader, staging: str, backend: str, progress, block_rows) -> None:
    desc = source.desc
    target = Writer.create(staging, max_size=source.max_size, num_envs=source.num_envs,
                           backend=backend, batch_size=desc["batch_size"], use_cer=desc["use_cer"],
                           entropy=desc["seed_entropy"], specs=source.fields, overwrite=False,
                           flush_every=desc["flush_every"],
                           priority_keys={k: desc[k] for k in ("prioritized", "alpha", "epsilon") if k in desc},
                           frame_stack=source.frame_stack)
    try:
        state = source.state()  # a dead writer's store: the state recovery would give it
        ns_rows, counts = None, {}
        if source.fields is not None:
            _copy_rows(source, target, ring.ring_size(state.seen, state.base, source.max_size),
                       progress, block_rows)
            ns_rows = source.current_ns()
            source.current_parts()  # e.g. the priorities as a reader of this snapshot sees them
            for name, part in source.data.parts.items():  # a format 1 store has no jump ring
                counts[name] = part.copy_into(target.data.parts[name], source.part_counts().get(name),
                                              state.seen, state.base, source.num_envs)
        target.adopt(state, ns_rows, counts)
    finally:
        target.close()


def _copy_rows(source: Reader, target: Writer, size: int, progress, block_rows) -> None:
    """Copy slots ``[0, size)`` of every field in blocks of bounded bytes."""
    row_bytes = max(spec.row_bytes for spec in source.fields.values())
    step = block_rows or max(1, BLOCK_BYTES // row_bytes)
    src, dst, view = source.storage, target.storage, source.view
    for start in range(0, size, step):
        stop = min(start + step, size)
        block = {name: np.array(src.arrays[name][src.order(name).span(start, stop - start)])
                 for name in source.fields}  # slot by slot: either store's frames may lie env-major (roworder.py)
        if view is not None and view.overlay is not None:  # rows a dead writer's add left half-written
            source.patch_overlay(block, np.arange(start, stop), view)
        for name, rows in block.items():
            dst.arrays[name][dst.order(name).span(start, stop - start)] = rows
        if progress is not None:
            progress(stop, size)
    if progress is not None and size == 0:
        progress(0, 0)
