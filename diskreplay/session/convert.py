"""Copying a store to another backend, block by block, on a ``Reader`` of the source and a
``Writer`` of the new store (below the facade: this module never imports ``store``)."""
from __future__ import annotations

import os

import numpy as np

from ..core import ring
from ..errors import InvalidArgumentError, StoreLockedError
from ..format.directory import check_path, enclosing_store
from ..format.lock import writer_alive
from .reader import Reader
from .writer import Writer

BLOCK_BYTES = 8 << 20


def convert_store(src, dst, *, backend, progress=None, overwrite=False, block_rows=None) -> None:
    """Copy the store at ``src`` to a new store at ``dst`` with ``backend``: fields, rows,
    counters, ``ns_buffer``, the exact next states of the jump ring and the sampler
    position; ``progress(done_rows, total_rows)``."""
    src_path, dst_path = check_path(src, "src"), check_path(dst, "dst")
    if os.path.realpath(src_path) == os.path.realpath(dst_path):
        raise InvalidArgumentError(f"cannot convert {src_path} onto itself; give another dst")
    inside = enclosing_store(dst_path, include_self=False)
    if inside is not None:
        raise InvalidArgumentError(f"cannot create {dst_path}: it lies inside the store {inside}; "
                                   "put the converted store outside any store directory")
    if writer_alive(os.path.abspath(src_path)):
        raise StoreLockedError(f"{src_path} is open for writing; close its writer before converting it")
    source = Reader(src_path)
    try:
        if source.needs_recovery():
            raise StoreLockedError(
                f"{src_path} needs recovery (its last writer crashed); open it once with mode='r+' first")
        desc = source.desc
        target = Writer.create(dst_path, max_size=source.max_size, num_envs=source.num_envs,
                               backend=backend, batch_size=desc["batch_size"], use_cer=desc["use_cer"],
                               entropy=desc["seed_entropy"], specs=source.fields, overwrite=overwrite,
                               flush_every=desc["flush_every"],
                               priority_keys={k: desc[k] for k in ("prioritized", "alpha", "epsilon") if k in desc},
                               frame_stack=source.frame_stack)
        try:
            state = source.state()
            ns_rows, jumps, stacks = None, 0, 0
            if source.fields is not None:
                _copy_rows(source, target, ring.ring_size(state.seen, state.base, source.max_size),
                           progress, block_rows)
                ns_rows = source.current_ns()
                jumps = _copy_jumps(source, target, state)
                stacks = _copy_stacks(source, target)
            if source.prio is not None:  # a prioritized store: its priorities as a reader sees them
                source._current_priorities()
                target.prio.adopt(source.prio.tree.leaves[:source.max_size], source.prio.view_max_p,
                                  state.seen, state.base)
            target.adopt(state, ns_rows, jumps, stacks)
        finally:
            target.close()
    finally:
        source.close()


def _copy_jumps(source: Reader, target: Writer, state: ring.RingState) -> int:
    """Copy the jump records of the transitions the ring holds (all but the newest step,
    whose next states are the ``ns_buffer``'s), in blocks; returns how many."""
    if source.data.jumps is None:  # a format 1 store: its next states follow the ring's rule
        return 0
    first = max(state.base, state.seen - source.max_size) + 1
    ts, ks = source.data.jumps.window_records(source.jcount, first, state.seen - source.num_envs)
    step = max(1, BLOCK_BYTES // max(1, source.fields["states"].row_bytes))
    count = 0
    for lo in range(0, len(ts), step):
        count = target.data.jumps.append(count, ts[lo:lo + step], source.data.jumps.states(ks[lo:lo + step]))
    return count


def _copy_stacks(source: Reader, target: Writer) -> int:
    """A frame-stack store: the stack ring's records in its lookup window (whole states that
    live stacks may start from), and the tail of overwritten frames, row for row."""
    if source.data.stacks is None:
        return 0
    src, dst = source.data.stacks, target.data.stacks
    ts, ks = src.records.window_records(source.scount, 0, source.seen)
    step = max(1, BLOCK_BYTES // max(1, src.records.spec.row_bytes))
    count = 0
    for lo in range(0, len(ts), step):
        count = dst.append(count, ts[lo:lo + step], src.records.states(ks[lo:lo + step]))
    dst.tail[:] = src.tail
    return count


def _copy_rows(source: Reader, target: Writer, size: int, progress, block_rows) -> None:
    """Copy slots ``[0, size)`` of every field in blocks of bounded bytes."""
    row_bytes = max(spec.row_bytes for spec in source.fields.values())
    step = block_rows or max(1, BLOCK_BYTES // row_bytes)
    src, dst = source.storage, target.storage
    for start in range(0, size, step):
        stop = min(start + step, size)
        for name in source.fields:  # slot by slot: either store's frames may lie env-major (roworder.py)
            rows = np.asarray(src.arrays[name][src.order(name).span(start, stop - start)])
            dst.arrays[name][dst.order(name).span(start, stop - start)] = rows
        if progress is not None:
            progress(stop, size)
    if progress is not None and size == 0:
        progress(0, 0)
