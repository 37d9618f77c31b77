"""The store directory: whether a directory is a store, and preparing one for ``create``.

Every file name lives with the module that owns the file (``store.json`` in description,
``meta.bin`` in counters, ``checkpoint.bin`` in checkpoint, ``lock`` in lock, the data
files in the backend, each part's files in its module under ``parts/``); this module
decides whether a directory is a store, checks paths given for stores and outputs, and
creates and removes a store's files as a whole. FORMAT.md describes each file.
"""
from __future__ import annotations

import os
import shutil

from ..disk.fsutil import TEMP_NAME, fsync_dir, io_error
from ..errors import IncompleteStoreError, InvalidArgumentError, NotAStoreError, StoreExistsError, StoreNotFoundError
from .checkpoint import CHECKPOINT_FILE
from .counters import COUNTERS_FILE
from .description import DESCRIPTION_FILE
from .lock import LOCK_FILE

CREATING_MARKER = "CREATING"  # present from the first step of create until its last
NS_FILE = "ns_buffer.npy"
# Files every store (or half-created store) may hold besides its data files; the parts' files
# that do not end in a data suffix are given by the caller (``session.files.OWN_NAMES``).
FIXED_FILES = (DESCRIPTION_FILE, COUNTERS_FILE, LOCK_FILE, CREATING_MARKER, CHECKPOINT_FILE)
DATA_SUFFIXES = (".npy", ".h5")
INCOMPLETE_HINT = ("was never completely created (its creator stopped half-way); "
                   "recreate it with DiskReplay.create(..., overwrite=True)")

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


def _is_own_file(name: str, extra: tuple = ()) -> bool:
    return (name in FIXED_FILES or name in extra or name.endswith(DATA_SUFFIXES) or ".tmp-" in name  # (older temps)
            or TEMP_NAME.match(name) is not None)


def own_files(directory: str, extra: tuple = ()) -> bool:
    """Whether every entry of ``directory`` is a file diskreplay may have made (``extra``:
    the parts' file names that :data:`FIXED_FILES` and the data suffixes do not cover)."""
    return all(_is_own_file(name, extra) for name in os.listdir(directory))


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


# ---------------------------------------------------------------------- create and remove
def prepare_directory(directory: str, overwrite: bool, extra: tuple = ()) -> bool:
    """Check the target of ``create``; returns whether the directory was made here (``extra``
    as for :func:`own_files`)."""
    if check_create_target(directory, overwrite, extra) != "missing":
        return False
    try:
        os.mkdir(directory)
    except OSError as exc:
        raise io_error(f"creating {directory}", exc) from exc
    return True


def check_create_target(directory: str, overwrite: bool, extra: tuple = (),
                        hint: str = ", or DiskReplay.open() to resume it") -> str:
    """Refuse a path a new store may not be made at (``create``, ``convert``'s dst); returns
    ``"missing"``, ``"empty"`` (nothing, or the lock of a create killed right after locking)
    or ``"store"`` (a store that ``overwrite`` allows to replace)."""
    parent = os.path.dirname(directory)
    if not os.path.isdir(parent):
        raise StoreNotFoundError(f"cannot create a store at {directory}: the parent directory {parent} does not exist")
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise NotAStoreError(f"cannot create a store at {directory}: a file is in the way")
    if not os.path.exists(directory):
        return "missing"
    if set(os.listdir(directory)) <= {LOCK_FILE}:
        return "empty"
    if not looks_like_store(directory) or not own_files(directory, extra):
        raise StoreExistsError(
            f"cannot create a store at {directory}: the directory holds files that are not a diskreplay "
            "store; choose another path (overwrite=True only replaces an existing store)")
    if not overwrite:
        raise StoreExistsError(f"a store already exists at {directory}; pass overwrite=True to replace it{hint}")
    return "store"


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


def remove_store_files(directory: str, keep_marker: bool = False, extra: tuple = ()) -> None:
    """Remove what a store (or a half-created one) consists of, nothing else (never the lock);
    ``extra`` as for :func:`own_files`."""
    for name in os.listdir(directory):
        if name == LOCK_FILE or (keep_marker and name == CREATING_MARKER):
            continue
        if _is_own_file(name, extra):
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


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
