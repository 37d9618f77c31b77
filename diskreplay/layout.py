"""The store directory: the one module that knows which files a store consists of.

Every file name lives with the module that owns the file (``store.json`` in description,
``meta.bin`` in counters, ``checkpoint.bin`` in checkpoint, ``rowsums.npy`` in rowsums,
``lock`` in lock, the data files in the backend); this module gathers them, decides
whether a directory is a store, prepares a directory for ``create``, creates the data
files and opens them. FORMAT.md describes each file.
"""
from __future__ import annotations

import os
import shutil

import numpy as np

from .backends import Backend, RowStorage, get_backend
from .checkpoint import CHECKPOINT_FILE, CheckpointFile, CheckpointLayout, create_checkpoint_file
from .counters import COUNTERS_FILE
from .description import DESCRIPTION_FILE, version_of
from .errors import (IncompleteStoreError, InvalidArgumentError, NotAStoreError, StoreExistsError,
                     StoreNotFoundError)
from .framestack import STACK_FILES, FrameStacks, create_stack_files, stack_file_bytes, stack_spec
from .fsutil import check_free_space, fsync_dir, io_error
from .jumps import JUMP_STATES_FILE, JUMPS_FILE, JumpRing, create_jump_files, jump_capacity
from .lock import LOCK_FILE
from .mapped import MappedFile
from .npyfile import create_npy, open_npy
from .prioritized import PRIORITY_FILE, create_priority_file, prioritized_bytes
from .priorityargs import check_field_names
from .prioritized import SPEC as PRIORITIES_SPEC
from .prioritized import data_files as priority_files
from .roworder import frames_layout, states_order
from .rowsums import ROWSUMS_FILE
from .schema import FieldSpec

CREATING_MARKER = "CREATING"  # present from the first step of create until its last
NS_FILE = "ns_buffer.npy"
# Files every store (or half-created store) may hold besides its data files.
FIXED_FILES = (DESCRIPTION_FILE, COUNTERS_FILE, LOCK_FILE, CREATING_MARKER, CHECKPOINT_FILE, PRIORITY_FILE)
DATA_SUFFIXES = (".npy", ".h5")
DEFAULT_RESERVE_BYTES = 16 << 20
# At least this many steps between the flushes that the reserve forces: a flush fsyncs twice
# (milliseconds), so with a flush every 74 steps (W3's 16 MiB) 1.35% of adds waited for one
# and p99 was a flush; 200 leaves room under 1% for the adds slowed otherwise. Within
# MAX_RESERVE_BYTES: the flush at the limit of a disk-bound writer waits for what the disk has
# not yet taken of twice the reserve (the rows and their undo copies): W3lat's max latency.
MIN_RESERVE_STEPS = 200
MAX_RESERVE_BYTES = 48 << 20
INCOMPLETE_HINT = ("was never completely created (its creator stopped half-way); "
                   "recreate it with DiskReplay.create(..., overwrite=True)")


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


# ---------------------------------------------------------------------- is it a store
def looks_like_store(directory: str) -> bool:
    """Whether ``directory`` holds a diskreplay store (or a half-created one), by its own marks:
    the CREATING marker, a store.json saying so, or a meta.bin with its magic number."""
    names = set(os.listdir(directory))
    if CREATING_MARKER in names:
        return True
    try:
        with open(os.path.join(directory, COUNTERS_FILE), "rb") as f:
            head = f.read(8)
            if head == b"DRMETA01" or len(head) < 8:  # ours, or cut short while being created
                return True
    except OSError:
        pass
    try:
        with open(os.path.join(directory, DESCRIPTION_FILE), "rb") as f:
            return b'"format": "diskreplay"' in f.read(1 << 16)
    except OSError:
        return False


def enclosing_store(path, *, include_self: bool = True) -> str | None:
    """The store directory ``path`` lies in (``path`` itself too, with ``include_self``),
    or None: outputs (exports, plots, a converted store) must never land inside a store,
    where they would replace one of its files or block a later ``create(overwrite=True)``."""
    p = os.path.realpath(os.path.abspath(os.fspath(path)))
    d = p if include_self else os.path.dirname(p)
    while True:
        try:
            if os.path.isdir(d) and looks_like_store(d):
                return d
        except OSError:
            pass
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def check_path(path, what: str) -> str:
    """``path`` as a ``str`` (``os.PathLike`` accepted), or ``InvalidArgumentError`` before
    anything is created: bytes paths and paths with NUL characters are refused."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be a path (str or os.PathLike), got {type(path).__name__}") from None
    if isinstance(path, bytes):
        raise InvalidArgumentError(f"{what} must be a str path, got bytes {path!r}; decode it with os.fsdecode()")
    if "\0" in path:
        raise InvalidArgumentError(f"{what} {path!r} contains a NUL character")
    if not path:
        raise InvalidArgumentError(f"{what} is an empty path")
    return path


def _is_own_file(name: str) -> bool:
    return name in FIXED_FILES or name.endswith(DATA_SUFFIXES) or ".tmp-" in name


def own_files(directory: str) -> bool:
    """Whether every entry of ``directory`` is a file diskreplay may have made."""
    return all(_is_own_file(name) for name in os.listdir(directory))


def check_is_store(directory: str, *, allow_incomplete: bool = False) -> None:
    """Raise the right error unless ``directory`` is a completely created store (or, with
    ``allow_incomplete``, at least a half-created one, for ``verify`` to report on)."""
    if not os.path.lexists(directory):
        raise StoreNotFoundError(f"no store at {directory}: the path does not exist")
    if not os.path.isdir(directory):
        raise NotAStoreError(f"{directory} is a file, not a diskreplay store (a store is a directory)")
    try:
        names = set(os.listdir(directory))
    except OSError as exc:
        raise io_error(f"listing {directory}", exc) from exc
    if DESCRIPTION_FILE in names:
        if CREATING_MARKER in names and not allow_incomplete:
            raise IncompleteStoreError(f"{directory} {INCOMPLETE_HINT}")
        return
    if CREATING_MARKER in names or COUNTERS_FILE in names or names == {LOCK_FILE}:
        if allow_incomplete and names != {LOCK_FILE}:
            return
        raise IncompleteStoreError(f"{directory} {INCOMPLETE_HINT}")
    raise NotAStoreError(f"{directory} is not a diskreplay store: it has no {DESCRIPTION_FILE}")


def is_incomplete(directory: str) -> bool:
    """Whether the store at ``directory`` is marked as half-created."""
    return os.path.exists(os.path.join(directory, CREATING_MARKER))


# ---------------------------------------------------------------------- create and remove
def prepare_directory(directory: str, overwrite: bool) -> bool:
    """Check the target of ``create``; returns whether the directory was made here."""
    parent = os.path.dirname(directory)
    if not os.path.isdir(parent):
        raise StoreNotFoundError(f"cannot create a store at {directory}: the parent directory {parent} does not exist")
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise NotAStoreError(f"cannot create a store at {directory}: a file is in the way")
    if not os.path.exists(directory):
        try:
            os.mkdir(directory)
        except OSError as exc:
            raise io_error(f"creating {directory}", exc) from exc
        return True
    if set(os.listdir(directory)) <= {LOCK_FILE}:  # empty, or a create killed right after locking
        return False
    if not looks_like_store(directory) or not own_files(directory):
        raise StoreExistsError(
            f"cannot create a store at {directory}: the directory holds files that are not a diskreplay "
            "store; choose another path (overwrite=True only replaces an existing store)")
    if not overwrite:
        raise StoreExistsError(
            f"a store already exists at {directory}; pass overwrite=True to replace it, "
            "or DiskReplay.open() to resume it")
    return False


def mark_creating(directory: str) -> None:
    """First step of create: from here on a kill leaves the directory marked half-created."""
    path = os.path.join(directory, CREATING_MARKER)
    with open(path, "wb") as f:
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)


def finish_creating(directory: str) -> None:
    """Last step of create: the store is whole."""
    os.unlink(os.path.join(directory, CREATING_MARKER))
    fsync_dir(directory)


def remove_store_files(directory: str, keep_marker: bool = False) -> None:
    """Remove what a store (or a half-created one) consists of, nothing else (never the lock)."""
    for name in os.listdir(directory):
        if name == LOCK_FILE or (keep_marker and name == CREATING_MARKER):
            continue
        if _is_own_file(name):
            _unlink(os.path.join(directory, name))


def undo_create(directory: str, made_dir: bool, lock_existed: bool) -> None:
    """After a failed create (its files removed, its lock released): a directory made for
    the store goes, and so does a lock file the create made."""
    if made_dir:
        shutil.rmtree(directory, ignore_errors=True)
    elif not lock_existed:
        _unlink(os.path.join(directory, LOCK_FILE))


def lock_exists(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, LOCK_FILE))


def data_file_names(backend: Backend, specs, prioritized: bool = False, frame_stack: int | None = None) -> list[str]:
    """Every file that holds rows or row-derived data, created once the fields are known."""
    extra = priority_files(backend) if prioritized else []
    stacks = list(STACK_FILES) if frame_stack else []
    return (backend.data_files(specs) + [NS_FILE, ROWSUMS_FILE, CHECKPOINT_FILE, JUMPS_FILE, JUMP_STATES_FILE]
            + extra + stacks)


def state_spec(specs, frame_stack: int | None) -> FieldSpec:
    """The spec of one whole state: the ``states`` rows, or ``frame_stack`` of them."""
    return stack_spec(specs["states"], frame_stack) if frame_stack else specs["states"]


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


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
