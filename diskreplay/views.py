"""Consistent views of a store, also beside a live writer: snapshots, chronological reads, info.

Everything here goes through the public API of :class:`~diskreplay.DiskReplay`; open the
store with ``mode="r"`` to read beside a running trainer. A live writer may add
transitions while we read; two rules keep what we return honest:

* counters are read as one snapshot (:func:`snapshot`), so ``size``, ``seen_size`` and
  ``head`` always agree with each other;
* after reading rows by slot we look at ``seen_size`` again: a slot holding transition
  ``t`` at the snapshot is overwritten by transition ``t + max_size``, so rows whose
  transition is that old may now hold something newer (:class:`ChronoReader`).
  ``get`` itself never returns a torn row.

Snapshots and :class:`ChronoReader` live in :mod:`diskreplay.chrono` (below the facade,
so that the store itself streams) and are re-exported here.

    from diskreplay import DiskReplay
    from diskreplay.views import ChronoReader

    with DiskReplay.open("runs/pong.replay", mode="r") as buf:
        for block in ChronoReader(buf, -1000):      # the newest 1000, oldest first
            print(block.transitions[0], block.batch["rewards"].sum())
"""
from __future__ import annotations

import os
import time

import numpy as np

from .core import ring
from .parts.priorities import tree as sumtree
from .chrono import (BLOCK_BYTES, TOO_FAST, Block, ChronoReader, Snapshot, block_rows, require_fields as _require_fields,
                     snapshot)
from .errors import EmptyStoreError, InvalidArgumentError, OvertakenError
from .backends.gather import cold_reads
from .format.lock import writer_alive
from .store import DiskReplay

CORE_KEYS = ("states", "actions", "rewards", "next_states", "dones")
_READ_TRIES = 50


def read_rows(buf: DiskReplay, *, head: int | None = None, tail: int | None = None,
              index=None) -> tuple[np.ndarray, dict]:
    """``(slots, batch)`` of the ``head`` oldest or the ``tail`` newest transitions (both
    oldest first), or of the slots ``index`` in the order given; give exactly one.
    :func:`read_block` also gives their transition numbers and takes ``env``."""
    block = read_block(buf, head=head, tail=tail, index=index)
    return block.slots, block.batch


def read_block(buf: DiskReplay, *, head: int | None = None, tail: int | None = None, index=None,
               env: int | None = None) -> Block:
    """The rows :func:`read_rows` reads as a :class:`Block` (positions, slots, transition
    numbers, batch), all from one snapshot; ``snapshot(buf).env(block.positions)`` are
    their envs. With ``env``, ``head`` and ``tail`` count only that env's transitions and
    ``index`` keeps only its slots. When the live writer overwrote any of the rows before
    they were read, they are read again from a fresh snapshot."""
    if sum(x is not None for x in (head, tail, index)) != 1:
        raise InvalidArgumentError("give exactly one of head, tail and index")
    _require_fields(buf)
    if env is not None and not (isinstance(env, (int, np.integer)) and 0 <= env < buf.num_envs):
        raise InvalidArgumentError(f"env must be in [0, {buf.num_envs}) (the store has {buf.num_envs} envs), "
                                   f"got {env!r}")
    count = head if head is not None else tail
    if index is None and count < 0:
        raise InvalidArgumentError(f"{'head' if head is not None else 'tail'} must be >= 0, got {count}")
    for _ in range(_READ_TRIES):
        snap = snapshot(buf)
        if index is not None:
            slots = np.asarray(index, np.int64).reshape(-1)
            positions = ring.transition_of_slots(slots, snap.seen, snap.base, snap.max_size) - snap.first
            keep = slice(None) if env is None else snap.env(positions) == env
            slots, positions = slots[keep], positions[keep]
            batch = buf.get(slots)
        else:
            per = 1 if env is None else snap.num_envs
            n = min(count * per, snap.size)
            lo = 0 if head is not None else snap.size - n
            hi = lo + n
            if env is not None:  # widen by a step so that count rows of env are inside
                lo, hi = (lo, min(snap.size, hi + per)) if head is not None else (max(0, lo - per), hi)
            positions = np.arange(lo, hi, dtype=np.int64)
            if env is not None:
                positions = positions[snap.env(positions) == env]
                positions = positions[:count] if head is not None else positions[max(0, len(positions) - count):]
            slots = (snap.slots(lo, hi)[positions - lo] if len(positions) else np.empty(0, np.int64))
            batch = buf.get(slots)
        transitions = snap.transition(positions)
        now = ring.transition_of_slots(slots, buf.seen_size, snap.base, snap.max_size)
        if (now == transitions).all():
            return Block(positions, slots, transitions, batch)
    raise OvertakenError(f"the live writer kept overwriting the requested rows; {TOO_FAST}")


def sample_batch(buf: DiskReplay, batch_size: int | None = None, *, seed: int | None = None,
                 n_step: int = 1, gamma: float = 0.99) -> tuple[np.ndarray, dict]:
    """``(slots, batch)`` of a batch of ``batch_size`` (default: the store's ``batch_size``),
    of n-step rows when ``n_step > 1`` (``DiskReplay.sample``).

    Without ``seed`` it is ``buf.sample()`` (on a store opened with ``mode="r"``, the
    batch the store's own sampler draws next, and the persisted sampler does not move);
    with ``seed`` the slots are uniform in ``[0, size)`` from ``numpy.random.default_rng(seed)``."""
    _require_fields(buf)
    n = buf.batch_size if batch_size is None else batch_size
    if seed is None:
        batch = buf.sample(n, n_step=n_step, gamma=gamma)
        return np.asarray(buf.batch_idxs), batch
    size = buf.size
    if size == 0:
        raise EmptyStoreError(f"cannot sample from {buf.path}: the store is empty; add transitions first")
    buf.get([], n_step=n_step, gamma=gamma)  # bad arguments refused before drawing
    slots = np.random.default_rng(seed).integers(0, size, n, dtype=np.int64)
    return slots, buf.get(slots, n_step=n_step, gamma=gamma)


def disk_bytes(path) -> int:
    """Bytes the files of the store at ``path`` occupy on disk (allocated blocks)."""
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat().st_blocks * 512
    return total


def store_info(buf: DiskReplay) -> dict:
    """What the store holds, as JSON-ready values: backend, sizes, counters, fields, disk use,
    whether a writer is live and the time of the last flush. The keys are the same for every
    store: what does not apply (``alpha`` of a uniform store, ``frame_stack`` of a store of
    single states, ``cold_reads`` before the first add declared the fields) is None."""
    fields = buf.fields or {}
    snap = snapshot(buf)
    flush_ns = buf.last_flush_ns
    return {
        "path": os.path.abspath(buf.path),
        "backend": buf.backend,
        "format_version": buf.format_version,
        "max_size": buf.max_size,
        "size": snap.size,
        "seen_size": snap.seen,
        "head": snap.head,
        "num_envs": buf.num_envs,
        "batch_size": buf.batch_size,
        "use_cer": buf.use_cer,
        "prioritized": buf.prioritized,
        "alpha": buf.alpha,
        "epsilon": buf.epsilon,
        # which sum tree samples it here: "C" (the extension built at install) or "numpy"
        "priority_tree": sumtree.implementation() if buf.prioritized else None,
        "fields": {name: {"shape": list(shape), "dtype": np.dtype(dtype).name}
                   for name, (shape, dtype) in fields.items()},
        "disk_bytes": disk_bytes(buf.path),
        "writer_alive": writer_alive(buf.path),
        "last_flush": (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(flush_ns / 1e9))
                       if flush_ns else None),
        # frame stacks: states are stacks of this many frames, stored one frame per transition
        "frame_stack": buf.frame_stack or None,
        # how a batch not in RAM is read (gather.py): which fields the cold path keeps in RAM
        "cold_reads": (cold_reads(_row_bytes(fields, buf.frame_stack), buf.max_size, bool(buf.frame_stack))
                       if fields else None),
    }


def _row_bytes(fields: dict, frame_stack) -> dict:
    """Bytes a stored row of each field (a frame-stack store stores one frame of a state)."""
    return {name: int(np.prod(shape[1:] if frame_stack and name == "states" else shape, dtype=np.int64))
            * np.dtype(dtype).itemsize for name, (shape, dtype) in fields.items()}


def batch_keys(buf: DiskReplay) -> list[str]:
    """Keys of a batch in a stable order: the core keys, then the extras."""
    fields = _require_fields(buf)
    return list(CORE_KEYS) + [name for name in fields if name not in CORE_KEYS]


__all__ = ["BLOCK_BYTES", "Block", "ChronoReader", "Snapshot", "batch_keys", "block_rows", "disk_bytes", "read_block",
           "read_rows", "sample_batch", "snapshot", "store_info"]
