"""Deciding what state a store is in when it is opened, and restoring it.

Three cases, told apart by the live counters and the boot id they were written in:

* clean: the last writer closed the store; the live counters are the state.
* process crash (same boot, not clean): every ``add`` that returned is in the page
  cache, so the live counters are the state; the rows of the one step that was in
  flight may be half-written and are restored from the undo reserve.
* power cut or OS crash (another boot), or live counters that fail their checks:
  pages reached the disk in any order, so the state is the newest valid checkpoint,
  and every row written after it is restored from the undo reserve.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import counters as counters_file
from ..core import ring
from .checkpoint import CHECKPOINT_FILE, Checkpoint, CheckpointFile
from .counters import W_BOOT, W_CLEAN, W_JUMPS, W_STACKS, Counters
from ..errors import CorruptStoreError
from .rowsums import set_sums_for


@dataclass
class OpenState:
    seen: int
    base: int
    draws: int
    resets: int
    # Transitions (lo, hi] whose slots must be read from the undo reserve, if any.
    restore_from: int
    restore_to: int
    from_checkpoint: bool
    reason: str | None  # why recovery was needed, None when the store was closed cleanly
    jumps: int = 0  # records of the jump ring, before ``JumpRing.committed`` leaves out an uncommitted step's
    stacks: int = 0  # records of a frame-stack store's stack ring, likewise


def decide_state(counters: Counters, checkpoint: Checkpoint | None, num_envs: int,
                 reserve_rows: int, both_slots_valid: bool = True) -> OpenState:
    problem = counters.problem(num_envs)
    words = counters.words
    if problem is None:
        seen, intent, base, draws, resets = counters.snapshot()
        clean = int(words[W_CLEAN]) == 1
        boot = counters_file.current_boot_id()
        same_boot = int(words[W_BOOT]) == boot and boot != 0
        # close() flushes, so a clean record equals the newest checkpoint; when one slot is
        # damaged the newest valid one may be older, and the clean record is still right.
        if clean and checkpoint is not None and both_slots_valid and (checkpoint.seen, checkpoint.base) != (seen, base):
            problem = (f"marked clean at seen_size {seen}, but close() flushed seen_size "
                       f"{checkpoint.seen} (the record was edited or damaged)")
        elif clean:
            return OpenState(seen, base, draws, resets, seen, seen, False, None, int(words[W_JUMPS]),
                             int(words[W_STACKS]))
        elif same_boot or checkpoint is None and seen == 0:
            reason = None if intent == seen else (
                f"the last writer stopped during an add; restored the {intent - seen} rows it was writing")
            if reason is None:
                reason = "the last writer stopped without closing the store; nothing was lost"
            return OpenState(seen, base, draws, resets, seen, intent, False, reason, int(words[W_JUMPS]),
                             int(words[W_STACKS]))
        else:
            problem = "written before the last reboot, power cut or OS crash"
    if checkpoint is None:
        raise CorruptStoreError(
            f"{counters.path}: the live counters cannot be used ({problem}) and no valid "
            "checkpoint exists to fall back on; the store cannot be recovered")
    c = checkpoint
    return OpenState(c.seen, c.base, c.draws, c.resets, c.seen, c.seen + reserve_rows, True,
                     f"the live counters were {problem}; rolled back to the last flush "
                     f"(seen_size {c.seen})", c.jumps, c.stacks)


def reserve_indices(t_lo: int, t_hi: int, checkpoint: Checkpoint, base: int, max_size: int):
    """Transitions in ``(t_lo, t_hi]`` whose slots held older rows, with their reserve row index.

    Only slots that were occupied need restoring (``t - base > max_size``); the reserve
    covers ``[reserve_first, reserve_first + reserve_count)``.
    """
    first = max(t_lo + 1, base + max_size + 1, checkpoint.reserve_first)
    last = min(t_hi, checkpoint.reserve_first + checkpoint.reserve_count - 1)
    if first > last:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ts = np.arange(first, last + 1, dtype=np.int64)
    return ts, ts - checkpoint.reserve_first


def check_reserve_covers(t_lo: int, t_hi: int, checkpoint: Checkpoint | None, base: int,
                         max_size: int, path: str) -> None:
    """Fail loudly if some overwritten row has no undo copy (it would mean lost data)."""
    first = max(t_lo + 1, base + max_size + 1)
    if first > t_hi:
        return
    if checkpoint is None or first < checkpoint.reserve_first or (
            t_hi > checkpoint.reserve_first + checkpoint.reserve_count - 1):
        raise CorruptStoreError(
            f"{path}: rows of transitions {first}..{t_hi} were being overwritten but the undo "
            "reserve does not cover them; the store cannot be recovered")


def restore_rows(storage, ckfile: CheckpointFile, checkpoint: Checkpoint, t_lo: int, t_hi: int,
                 base: int, max_size: int) -> int:
    """Copy undo-reserve rows back into the ring (``storage``, a ``RowStorage``) for
    transitions in ``(t_lo, t_hi]``."""
    ts, ks = reserve_indices(t_lo, t_hi, checkpoint, base, max_size)
    if len(ts) == 0:
        return 0
    slots = ring.slot_of(ts, base, max_size)
    for name, arr in storage.arrays.items():
        arr[storage.rows(name, slots)] = ckfile.read_reserve_rows(checkpoint.slot, name, ks)
    return len(ts)


@dataclass(frozen=True)
class WriterRecovery:
    state: ring.RingState
    checkpoint: Checkpoint | None
    note: str | None  # what recovery did, None when the store was closed cleanly
    jumps: int = 0  # committed records of the jump ring
    from_checkpoint: bool = False  # rolled back to ``checkpoint`` (a power cut): priorities follow
    stacks: int = 0  # committed records of a frame-stack store's stack ring


def committed_jumps(state: OpenState, data, num_envs: int) -> int:
    """The jump ring's committed record count in ``state`` (0 without a jump ring)."""
    if data is None or data.jumps is None:
        return 0
    return data.jumps.committed(state.jumps, state.seen, num_envs)


def committed_stacks(state: OpenState, data) -> int:
    """The stack ring's committed record count in ``state`` (0 without frame stacks)."""
    if data is None or data.stacks is None:
        return 0
    return data.stacks.committed(state.stacks, state.seen)


def recover_for_writer(path: str, counters: Counters, data, fields, num_envs: int, max_size: int,
                       reserve_rows: int | None) -> WriterRecovery:
    """Bring the store's files to the state ``decide_state`` chooses, durably: restore the
    rows of an interrupted add (or of everything after the last flush) from the undo
    reserve, the ``ns_buffer`` and the CRCs of a rolled-back flush, then the counters."""
    ckfile = data.ckfile if data is not None else None
    checkpoint = ckfile.newest() if ckfile else None
    if fields is not None and checkpoint is None:
        raise CorruptStoreError(
            f"{os.path.join(os.path.abspath(path), CHECKPOINT_FILE)}: neither checkpoint slot is valid")
    state = decide_state(counters, checkpoint, num_envs, reserve_rows or 0,
                         ckfile.both_valid if ckfile else True)
    if fields is None and state.seen != 0:
        raise CorruptStoreError(f"{counters.path}: seen_size is {state.seen} but the store has no fields yet")
    if fields is not None:
        check_reserve_covers(state.restore_from, state.restore_to, checkpoint, state.base, max_size, path)
        restored = restore_rows(data.storage, ckfile, checkpoint, state.restore_from, state.restore_to,
                                state.base, max_size)
        if state.from_checkpoint:
            data.ns[(state.seen // num_envs) % 2] = ckfile.read_ns(checkpoint.slot, num_envs)
            # A flush cut short may have summed rows that were just rolled back.
            ts, _ = reserve_indices(state.restore_from, state.restore_to, checkpoint, state.base, max_size)
            set_sums_for(data.sums, data.storage, ring.slot_of(ts, state.base, max_size), ts - max_size)
        if restored or state.from_checkpoint:
            data.sync_rows()
    jumps = committed_jumps(state, data, num_envs)
    stacks = committed_stacks(state, data)
    counters.commit_state(state.seen, state.base, state.draws, state.resets, jumps, stacks)
    counters.sync()
    note = None if state.reason is None else f"{path}: {state.reason}"
    return WriterRecovery(ring.RingState(state.seen, state.base, state.draws, state.resets), checkpoint, note, jumps,
                          state.from_checkpoint, stacks)


@dataclass(frozen=True)
class VirtualView:
    """What recovery would make of a dead writer's store, for a reader that may not write:
    the state, the transitions whose rows must be read from the undo reserve (``overlay``,
    ``(lo, hi]`` or None), the checkpoint they are in, and the ``ns_buffer`` to use."""

    state: ring.RingState
    overlay: tuple[int, int] | None
    checkpoint: Checkpoint | None
    ns_rows: np.ndarray | None
    jumps: int = 0  # committed records of the jump ring
    stacks: int = 0  # committed records of a frame-stack store's stack ring


def virtual_view(counters: Counters, data, num_envs: int, reserve_rows: int) -> VirtualView:
    """``data``: the store's opened ``layout.DataFiles`` (its checkpoint file and jump ring)."""
    ckfile = data.ckfile
    checkpoint = ckfile.newest()
    state = decide_state(counters, checkpoint, num_envs, reserve_rows, ckfile.both_valid)
    overlay = (state.restore_from, state.restore_to) if state.restore_to > state.restore_from else None
    ns = ckfile.read_ns(checkpoint.slot, num_envs) if state.from_checkpoint else None
    return VirtualView(ring.RingState(state.seen, state.base, state.draws, state.resets), overlay, checkpoint, ns,
                       committed_jumps(state, data, num_envs), committed_stacks(state, data))


__all__ = ["OpenState", "WriterRecovery", "VirtualView", "committed_jumps", "decide_state", "recover_for_writer", "virtual_view",
           "restore_rows", "reserve_indices", "check_reserve_covers"]
