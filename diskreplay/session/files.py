"""A store's data files: which there are, creating them at ``create`` and opening them.

``format.directory`` decides whether a directory is a store and prepares it; this module
knows the files that hold rows or row-derived data (the backend's, ``ns_buffer.npy``,
``rowsums.npy``, ``checkpoint.bin`` and the parts' files), the undo reserve's size, the
free-space check of ``create``, and opens them all (``DataFiles``). FORMAT.md describes
each file.
"""
from __future__ import annotations

import os

import numpy as np

from ..backends import Backend, RowStorage, get_backend
from ..core.roworder import frames_layout, states_order
from ..core.schema import FieldSpec
from ..disk.fsutil import check_free_space
from ..disk.mapped import MappedFile
from ..disk.npyfile import create_npy, open_npy
from ..format.checkpoint import CHECKPOINT_FILE, CheckpointFile, CheckpointLayout, create_checkpoint_file
from ..format.description import version_of
from ..format.directory import NS_FILE, _unlink
from ..format.rowsums import ROWSUMS_FILE
from ..parts.jumps import JUMP_STATES_FILE, JUMPS_FILE, JumpRing, create_jump_files, jump_capacity
from ..parts.priorities.args import check_field_names
from ..parts.priorities.files import PRIORITY_FILE, create_priority_file, prioritized_bytes
from ..parts.priorities.files import SPEC as PRIORITIES_SPEC
from ..parts.priorities.files import data_files as priority_files
from ..parts.stacks.ring import STACK_FILES, FrameStacks, create_stack_files, stack_file_bytes, state_spec

# The parts' files that format.directory's fixed names and data suffixes do not cover.
OWN_NAMES = (PRIORITY_FILE,)
DEFAULT_RESERVE_BYTES = 16 << 20
# At least this many steps between the flushes that the reserve forces: a flush fsyncs twice
# (milliseconds), so with a flush every 74 steps (W3's 16 MiB) 1.35% of adds waited for one
# and p99 was a flush; 200 leaves room under 1% for the adds slowed otherwise. Within
# MAX_RESERVE_BYTES: the flush at the limit of a disk-bound writer waits for what the disk has
# not yet taken of twice the reserve (the rows and their undo copies): W3lat's max latency.
MIN_RESERVE_STEPS = 200
MAX_RESERVE_BYTES = 48 << 20
def reserve_rows_for(fields, num_envs: int, max_size: int, flush_every: int | None) -> int:
    """Rows of undo reserve: enough for ``flush_every`` steps, else about 16 MiB but at least
    ``MIN_RESERVE_STEPS`` steps up to ``MAX_RESERVE_BYTES``, within bounds."""
    row_bytes = max(1, sum(spec.row_bytes for spec in fields.values()))
    rows = max(DEFAULT_RESERVE_BYTES // row_bytes, min(MIN_RESERVE_STEPS * num_envs, MAX_RESERVE_BYTES // row_bytes))
    if flush_every is not None:
        rows = flush_every * num_envs
    # Never more than max_size: a reserve row stands for the slot's content at the flush,
    # and a slot written twice after a flush would need two different undo rows.
    return int(min(max(rows, num_envs), max_size))


def data_file_names(backend: Backend, specs, prioritized: bool = False, frame_stack: int | None = None) -> list[str]:
    """Every file that holds rows or row-derived data, created once the fields are known."""
    extra = priority_files(backend) if prioritized else []
    stacks = list(STACK_FILES) if frame_stack else []
    return (backend.data_files(specs) + [NS_FILE, ROWSUMS_FILE, CHECKPOINT_FILE, JUMPS_FILE, JUMP_STATES_FILE]
            + extra + stacks)


def create_data_files(directory: str, backend: Backend, specs, max_size: int, num_envs: int,
                      reserve: int, initial_checkpoint, prioritized: bool = False,
                      frame_stack: int | None = None) -> None:
    """Create and preallocate the data files, ``ns_buffer.npy``, ``rowsums.npy``,
    ``checkpoint.bin`` and the jump ring's files (``jump_states.npy`` sparse: see jumps.py);
    ``initial_checkpoint(ckfile)`` writes its first slot. A prioritized store also gets its
    ``priorities`` dataset and ``priorities.bin`` (``prioritized.py``); a frame-stack store
    (``specs["states"]`` is then one frame) its stack files (``framestack.py``)."""
    states = state_spec(specs, frame_stack)
    layout = CheckpointLayout(specs, num_envs, reserve, states)
    ns_bytes = 2 * num_envs * states.row_bytes
    if frame_stack:
        ns_bytes += stack_file_bytes(specs["states"], frame_stack, max_size, num_envs, reserve)
    capacity = jump_capacity(max_size, reserve)
    datasets = dict(specs)
    if prioritized:
        check_field_names(specs)
        datasets["priorities"] = PRIORITIES_SPEC
    check_free_space(directory, backend.data_bytes(datasets, max_size) + layout.file_bytes + ns_bytes
                     + 4 * max_size + 8 * capacity + 16384 + (prioritized_bytes(max_size) if prioritized else 0))
    backend.create(directory, datasets, max_size, version_of(frames_layout(frame_stack, max_size, num_envs)))
    if prioritized:
        create_priority_file(directory, max_size)
    create_npy(os.path.join(directory, NS_FILE), (2, num_envs) + states.shape, states.dtype)
    create_npy(os.path.join(directory, ROWSUMS_FILE), (max_size,), np.dtype(np.uint32))
    create_jump_files(directory, states, capacity)
    if frame_stack:
        create_stack_files(directory, specs["states"], frame_stack, max_size, num_envs, reserve)
    create_checkpoint_file(directory, layout)
    ck = CheckpointFile(directory, layout, True)
    try:
        initial_checkpoint(ck)
    finally:
        ck.close()


def remove_data_files(directory: str, backend: Backend, specs, prioritized: bool = False,
                      frame_stack: int | None = None) -> None:
    for name in data_file_names(backend, specs, prioritized, frame_stack):
        _unlink(os.path.join(directory, name))


# ---------------------------------------------------------------------- open
class DataFiles:
    """The opened row data of a store: the backend's rows, the ``ns_buffer`` (two areas of
    ``num_envs`` rows, one per step parity), the per-row CRCs, the checkpoint file and the
    jump ring (``jumps``: None in a format 1 store, which has none), and a frame-stack
    store's stack files (``stacks``, else None)."""

    def __init__(self, directory: str, backend_name: str, fields: dict[str, FieldSpec], max_size: int,
                 num_envs: int, reserve_rows: int, writable: bool, with_jumps: bool = True,
                 frame_stack: int | None = None, frames_layout: str | None = None):
        self.storage: RowStorage | None = None
        self.ns_file: MappedFile | None = None
        self.sums_file: MappedFile | None = None
        self.ckfile: CheckpointFile | None = None
        self.jumps: JumpRing | None = None
        self.stacks: FrameStacks | None = None
        try:
            self.storage = get_backend(backend_name).open(directory, fields, max_size, writable)
            self.storage.orders["states"] = states_order(frames_layout, max_size, num_envs)
            states = state_spec(fields, frame_stack)
            self.ns_file, self.ns, _ = open_npy(os.path.join(directory, NS_FILE),
                                                (2, num_envs) + states.shape, states.dtype, writable)
            self.sums_file, self.sums, _ = open_npy(os.path.join(directory, ROWSUMS_FILE),
                                                    (max_size,), np.dtype(np.uint32), writable)
            self.ckfile = CheckpointFile(directory, CheckpointLayout(fields, num_envs, reserve_rows, states), writable)
            if with_jumps:
                self.jumps = JumpRing(directory, states, max_size, reserve_rows, writable)
            if frame_stack:
                self.stacks = FrameStacks(directory, fields["states"], frame_stack, max_size, num_envs,
                                          reserve_rows, writable, self.storage.order("states"))
        except BaseException:
            self.close()
            raise

    def sync_rows(self) -> None:
        """Make the rows, the ``ns_buffer``, the CRCs and the jump ring durable (not the checkpoint)."""
        self.storage.sync()
        self.ns_file.sync()
        self.sums_file.sync()
        if self.jumps is not None:
            self.jumps.sync()
        if self.stacks is not None:
            self.stacks.sync()

    @property
    def mapped_files(self) -> list[MappedFile]:
        """Every memory-mapped file (for tools that drop a process's mapped pages)."""
        jumps = [self.jumps.file] if self.jumps is not None else []
        stacks = self.stacks.mapped_files if self.stacks is not None else []
        return [f for f in [*(self.storage.files if self.storage else []), self.ns_file, self.sums_file, *jumps,
                            *stacks] if f]

    def close(self) -> None:
        self.ns = self.sums = None
        for res in (self.storage, self.ns_file, self.sums_file, self.ckfile, self.jumps, self.stacks):
            if res is not None:
                res.close()
        self.storage = self.ns_file = self.sums_file = self.ckfile = self.jumps = self.stacks = None

