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

from ..backends import BACKENDS, Backend, RowStorage, get_backend
from ..core.roworder import frames_layout, states_order
from ..disk.fsutil import check_free_space
from ..disk.mapped import MappedFile
from ..disk.npyfile import create_npy, open_npy
from ..errors import InvalidArgumentError
from ..format.checkpoint import CHECKPOINT_FILE, CheckpointFile, CheckpointLayout, create_checkpoint_file
from ..format.counters import COUNTERS_FILE
from ..format.description import DESCRIPTION_FILE, version_of
from ..format.directory import FIXED_FILES, NS_FILE, _unlink
from ..format.rowsums import ROWSUMS_FILE
from ..parts import Geometry, part_names, parts_of
from ..parts.base import OpenPart
from ..parts.priorities.args import check_field_names

# The parts' files, for format.directory's test of which files are a store's own.
OWN_NAMES = part_names()
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


def geometry(backend: Backend, specs, max_size: int, num_envs: int, reserve: int, prioritized: bool = False,
             frame_stack: int | None = None, format_version: int | None = None) -> Geometry:
    return Geometry(backend, specs, max_size, num_envs, reserve, frame_stack, prioritized, format_version)


def data_file_names(backend: Backend, specs, prioritized: bool = False, frame_stack: int | None = None) -> list[str]:
    """Every file that holds rows or row-derived data, created once the fields are known."""
    g = geometry(backend, specs, 1, 1, 0, prioritized, frame_stack)
    return (backend.data_files(specs) + [NS_FILE, ROWSUMS_FILE, CHECKPOINT_FILE]
            + [name for part in parts_of(g) for name in part.files(g)])


def store_file_names() -> set[str]:
    """Every name a store's own files may take, whatever its kind: its fixed files and every part's."""
    return set(FIXED_FILES) | {DESCRIPTION_FILE, COUNTERS_FILE, NS_FILE, ROWSUMS_FILE, CHECKPOINT_FILE} | set(OWN_NAMES)


def check_file_names(specs) -> None:
    """Refuse fields whose data file, on any backend, would be one of the store's own files
    (a memmap field ``jumps`` is ``jumps.npy``, the jump ring's), before anything is written.
    Every backend is asked so that a store converts to any of them. The names come from the
    backends' file naming and the parts' declared files, never from a hand-kept list."""
    taken = store_file_names()
    for name in specs:
        for backend in BACKENDS:
            clash = sorted(set(get_backend(backend).data_files({name: specs[name]})) & taken)
            if clash:
                raise InvalidArgumentError(
                    f"field name {name!r} is reserved: its data file {clash[0]} ({backend} backend) would be "
                    "one of the store's own files; give the field another name")


def create_data_files(directory: str, backend: Backend, specs, max_size: int, num_envs: int,
                      reserve: int, initial_checkpoint, prioritized: bool = False,
                      frame_stack: int | None = None) -> None:
    """Create and preallocate the data files, ``ns_buffer.npy``, ``rowsums.npy``,
    ``checkpoint.bin`` and the files of every part the store has (``parts/``: the jump ring
    always; priorities, frame stacks); ``initial_checkpoint(ckfile)`` writes its first slot.
    The free-space check counts every byte these files can ever take, the parts'
    ``bytes_needed`` included (their sparse files at full size)."""
    check_file_names(specs)
    if prioritized:
        check_field_names(specs)
    g = geometry(backend, specs, max_size, num_envs, reserve, prioritized, frame_stack)
    parts = parts_of(g)
    states = g.states
    layout = CheckpointLayout(specs, num_envs, reserve, states)
    datasets = dict(specs)
    for part in parts:
        datasets.update(part.datasets(g))
    check_free_space(directory, backend.data_bytes(datasets, max_size) + layout.file_bytes
                     + 2 * num_envs * states.row_bytes + 4 * max_size + 16384
                     + sum(part.bytes_needed(g) for part in parts))
    backend.create(directory, datasets, max_size, version_of(frames_layout(frame_stack, max_size, num_envs)))
    create_npy(os.path.join(directory, NS_FILE), (2, num_envs) + states.shape, states.dtype)
    create_npy(os.path.join(directory, ROWSUMS_FILE), (max_size,), np.dtype(np.uint32))
    for part in parts:
        part.create(directory, g)
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
    open objects of the store's parts (``parts``, by part name, each an ``OpenPart``).
    ``jumps``, ``stacks`` and ``priorities`` name them: None where the store has no such
    part (a format 1 store has no jump ring, a uniform store no priorities)."""

    def __init__(self, directory: str, g: Geometry, writable: bool, frames_layout: str | None = None):
        self.storage: RowStorage | None = None
        self.ns_file: MappedFile | None = None
        self.sums_file: MappedFile | None = None
        self.ckfile: CheckpointFile | None = None
        self.parts: dict = {}
        self.counted: list = []
        self.stepping: list = []  # the parts that override a step hook (the general add calls them)
        try:
            self.storage = g.backend.open(directory, g.specs, g.max_size, writable)
            self.storage.orders["states"] = states_order(frames_layout, g.max_size, g.num_envs)
            states = g.states
            self.ns_file, self.ns, _ = open_npy(os.path.join(directory, NS_FILE),
                                                (2, g.num_envs) + states.shape, states.dtype, writable)
            self.sums_file, self.sums, _ = open_npy(os.path.join(directory, ROWSUMS_FILE),
                                                    (g.max_size,), np.dtype(np.uint32), writable)
            self.ckfile = CheckpointFile(directory, CheckpointLayout(g.specs, g.num_envs, g.reserve_rows, states),
                                         writable)
            for part in parts_of(g):
                opened = part.open(directory, g, writable, self.storage)
                if opened is not None:
                    opened.part = part
                    self.parts[part.name] = opened
            # the parts that count committed records in a counter word
            self.counted = [opened for opened in self.parts.values() if opened.part.word is not None]
            self.stepping = [opened for opened in self.parts.values() if takes_steps(opened)]
        except BaseException:
            self.close()
            raise

    @property
    def jumps(self):
        return self.parts.get("jumps")

    @property
    def stacks(self):
        return self.parts.get("stacks")

    @property
    def priorities(self):
        return self.parts.get("priorities")

    def sync_rows(self) -> None:
        """Make the rows, the ``ns_buffer``, the CRCs and the parts durable (not the checkpoint)."""
        self.storage.sync()
        self.ns_file.sync()
        self.sums_file.sync()
        for opened in self.parts.values():
            opened.sync()

    @property
    def mapped_files(self) -> list[MappedFile]:
        """Every memory-mapped file (for tools that drop a process's mapped pages)."""
        parts = [f for opened in self.parts.values() for f in opened.mapped_files]
        return [f for f in [*(self.storage.files if self.storage else []), self.ns_file, self.sums_file, *parts] if f]

    def close(self) -> None:
        self.ns = self.sums = None
        for res in (self.storage, self.ns_file, self.sums_file, self.ckfile, *self.parts.values()):
            if res is not None:
                res.close()
        self.storage = self.ns_file = self.sums_file = self.ckfile = None
        self.parts = {}
        self.counted = []
        self.stepping = []


_STEP_HOOKS = ("plan_step", "before_rows", "after_rows", "after_commit")


def takes_steps(opened) -> bool:
    """Whether an open part overrides any of ``OpenPart``'s step hooks."""
    return any(getattr(type(opened), hook) is not getattr(OpenPart, hook) for hook in _STEP_HOOKS)
