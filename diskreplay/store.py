"""The ``DiskReplay`` facade: SLM-Lab's uniform replay memory, stored on disk.

Write protocol of one ``add`` (one env step of ``num_envs`` transitions):

1. mark the step in flight (``intent``) in the live counters;
2. write its rows in place in the ring and its next states into the ``ns_buffer``
   area of its parity (the previous step's area stays intact);
3. commit by storing ``seen_size`` (and its check word).

A process crash between 1 and 3 leaves rows half-written in slots that held older
transitions; those are restored from the undo reserve of the last checkpoint,
which always covers them because an add that would overwrite a row without an undo
copy flushes first. ``flush()`` syncs every data file, then writes a new checkpoint
(counters, ``ns_buffer`` and undo copies of the rows the next adds will overwrite).
"""
from __future__ import annotations

import numbers
import os
import secrets
import shutil
import threading
import weakref
import time
import warnings
from typing import Callable

import numpy as np

from . import ring
from .backends import get_backend
from .checkpoint import CHECKPOINT_FILE, CheckpointFile, CheckpointLayout, create_checkpoint_file
from .counters import (COUNTERS_FILE, W_CHECK, W_CLEAN, W_DRAWS, W_FLUSH_NS, W_INTENT, W_KEY,
                       W_PID, W_RESETS, W_SEEN, Counters, create_counters, current_boot_id)
from .description import (DESCRIPTION_FILE, FORMAT_VERSION, MAX_SLOTS, new_description, read_description,
                          write_description)
from .errors import (CorruptStoreError, DiskReplayError, EmptyStoreError, IncompleteStoreError,
                     IndexOutOfRangeError, InvalidArgumentError, NotAStoreError, ReadOnlyError,
                     RecoveryWarning, SchemaMismatchError, StoreClosedError, StoreExistsError,
                     StoreIOError, StoreNotFoundError, TornReadError)
from .fsutil import check_free_space, fsync_dir, io_error
from .lock import LOCK_FILE, WriterLock, writer_alive
from .npyfile import create_npy, open_npy
from .recovery import check_reserve_covers, decide_state, reserve_indices, restore_rows
from .rowreader import RowReader, page_cached
from .rowsums import ROWSUMS_FILE, set_sums_for, torn_slots, update_sums
from .schema import CORE_FIELDS, FieldSpec, coerce, infer_fields, normalize_fields

CREATING_MARKER = "CREATING"
LARGE_ROW_BYTES = 16 << 10  # states rows from this size on may be read by hinted positioned reads
PROBE_ROWS = 2  # rows of a large-row batch checked for residency before choosing how to gather
WARM_STREAK = 256  # probes in a row that found their row in RAM before the mapping is trusted again
NS_FILE = "ns_buffer.npy"
DEFAULT_RESERVE_BYTES = 16 << 20
_RETRIES = 200
_ALIVE_TTL = 0.2
_READ_PATIENCE = 3.0  # seconds a reader retries rows a live writer keeps overwriting


def _check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif float(value).is_integer():
        value = int(value)  # accept 1e6, as SLM-Lab specs write it
    else:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def _store_files(backend_name: str, fields) -> list[str]:
    files = [DESCRIPTION_FILE, COUNTERS_FILE, LOCK_FILE, CREATING_MARKER, NS_FILE, CHECKPOINT_FILE]
    if fields:
        files += get_backend(backend_name).data_files(fields)
    return files


def _looks_like_store(directory: str) -> bool:
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


def _own_files(directory: str) -> bool:
    """Whether every entry of ``directory`` is a file diskreplay may have made."""
    allowed_suffixes = (".npy", ".h5")
    for name in os.listdir(directory):
        known = name in (DESCRIPTION_FILE, COUNTERS_FILE, LOCK_FILE, CREATING_MARKER, CHECKPOINT_FILE)
        if not (known or name.endswith(allowed_suffixes) or ".tmp-" in name):
            return False
    return True


def reserve_rows_for(fields, num_envs: int, max_size: int, flush_every: int | None) -> int:
    """Rows of undo reserve: enough for ``flush_every`` steps, else about 16 MiB, within bounds."""
    row_bytes = sum(spec.row_bytes for spec in fields.values())
    rows = DEFAULT_RESERVE_BYTES // max(row_bytes, 1)
    if flush_every is not None:
        rows = flush_every * num_envs
    # Never more than max_size: a reserve row stands for the slot's content at the flush,
    # and a slot written twice after a flush would need two different undo rows.
    return int(min(max(rows, num_envs), max_size))


class DiskReplay:
    """A replay memory of ``max_size`` transitions in a store directory on disk.

    Create one with :meth:`create`, reopen it with :meth:`open`. Semantics are those
    of SLM-Lab's ``Replay`` (see ``DESIGN.md``) with the wrap-around bug fixed, dtypes
    kept and a persisted sampler.
    """

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(cls, path, max_size, *, num_envs: int = 1, backend: str = "memmap", batch_size: int = 32,
               use_cer: bool = False, seed: int | None = None, fields: dict | None = None,
               overwrite: bool = False, flush_every: int | None = None) -> "DiskReplay":
        """Create an empty store at ``path`` (a directory) and open it for writing.

        ``fields`` declares ``{name: (shape, dtype)}`` for ``states``, ``actions``,
        ``rewards``, ``dones`` and any extras; without it, shapes and dtypes come from
        the first ``add`` (numpy data keeps its dtype; Python bool, int and float become
        bool, int64 and float32). ``flush_every`` flushes automatically every that many
        adds (default: only when the undo reserve requires it, on ``flush()`` and ``close()``).
        """
        max_size = _check_count("max_size", max_size)
        if max_size > MAX_SLOTS:
            raise InvalidArgumentError(f"max_size must be at most {MAX_SLOTS}, got {max_size}")
        num_envs = _check_count("num_envs", num_envs)
        batch_size = _check_count("batch_size", batch_size)
        if num_envs > max_size:
            raise InvalidArgumentError(f"num_envs ({num_envs}) must not exceed max_size ({max_size})")
        if flush_every is not None:
            flush_every = _check_count("flush_every", flush_every)
        backend_impl = get_backend(backend)
        if not isinstance(use_cer, (bool, np.bool_)):
            raise InvalidArgumentError(f"use_cer must be True or False, got {use_cer!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise InvalidArgumentError(f"seed must be a non-negative integer or None, got {seed!r}")
        specs = normalize_fields(fields) if fields is not None else None
        if specs is not None:
            _check_row_sizes(specs)
        path = os.fspath(path)
        directory = os.path.abspath(path)
        made_dir = _prepare_directory(directory, overwrite)
        lock_existed = os.path.exists(os.path.join(directory, LOCK_FILE))
        try:
            lock = WriterLock(directory)
        except BaseException:
            if made_dir:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        try:
            _touch(os.path.join(directory, CREATING_MARKER))  # first: a kill from here on leaves it marked
            _remove_store_files(directory, keep_marker=True)
            reserve = None
            if specs is not None:
                reserve = reserve_rows_for(specs, num_envs, max_size, flush_every)
                _create_data(directory, backend_impl, specs, max_size, num_envs, reserve)
            create_counters(directory)
            write_description(directory, new_description(
                backend=backend, max_size=max_size, num_envs=num_envs, batch_size=batch_size,
                use_cer=bool(use_cer), fields=specs, entropy=ring.new_entropy(seed),
                reserve_rows=reserve, flush_every=flush_every))
            os.unlink(os.path.join(directory, CREATING_MARKER))
            fsync_dir(directory)
        except BaseException as exc:
            _remove_store_files(directory)
            lock.release()
            if made_dir:
                shutil.rmtree(directory, ignore_errors=True)
            elif not lock_existed:
                _unlink(os.path.join(directory, LOCK_FILE))
            if isinstance(exc, OSError) and not isinstance(exc, DiskReplayError):
                raise io_error(f"creating the store at {directory}", exc) from exc
            raise
        return cls(path, "r+", _lock=lock)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path, mode: str = "r+") -> "DiskReplay":
        """Open an existing store: ``mode="r+"`` to resume writing (one writer at a time),
        ``mode="r"`` to read only, alongside a live writer if there is one."""
        if mode not in ("r", "r+"):
            raise InvalidArgumentError(f"mode must be 'r' or 'r+', got {mode!r}")
        return cls(os.fspath(path), mode)

    def __init__(self, path: str, mode: str, *, _lock: WriterLock | None = None):
        self.path = path
        self.mode = mode
        self._dir = os.path.abspath(path)
        self._closed = True
        self._lock = _lock
        self._failed: BaseException | None = None
        self._storage = None
        self._counters = None
        self._ckfile = None
        self._ns_file = None
        self._sums_file = None
        self.batch_idxs = None
        self.recovery_note: str | None = None
        self._ns_override = None
        self._alive, self._alive_at = False, -1.0
        self._dead_view = None  # (record, view) of a dead writer's store, see _dead_writer_view
        self._hot = False  # the specialised add may write (see _bind_hot_path)
        self._prefetchers = weakref.WeakSet()  # live batches() iterators, closed with the store
        self._row_reader = None
        self._probe_streak = WARM_STREAK  # a fresh store is taken as in RAM until a probe says otherwise
        try:
            self._open()
        except BaseException:
            self._release_all()
            raise
        self._closed = False

    def _open(self) -> None:
        _check_is_store(self._dir)
        desc = read_description(self._dir)
        self._desc = desc
        self.backend = desc["backend"]
        self.max_size = desc["max_size"]
        self.num_envs = desc["num_envs"]
        self.batch_size = desc["batch_size"]
        self.use_cer = desc["use_cer"]
        self.format_version = desc["format_version"]
        self.flush_every = desc["flush_every"]
        self._fields: dict[str, FieldSpec] | None = desc["fields"]
        self._reserve_rows = desc["reserve_rows"]
        writable = self.mode == "r+"
        if writable and self._lock is None:
            if not os.access(self._dir, os.W_OK):
                raise ReadOnlyError(
                    f"{self.path} cannot be opened for writing: no write permission on the directory "
                    "(or a read-only filesystem); open it with mode='r' to read it")
            self._lock = WriterLock(self._dir)
        self._counters = Counters(self._dir, writable)
        if self._fields is not None:
            self._map_data(writable)
        if writable:
            self._recover()
            self._counters.claim(current_boot_id(), os.getpid(), secrets.randbits(62))
            self._counters.sync()
        else:
            self._reader_state = None
            self._refresh_reader()
            self._check_clean_record()
            self._sampler = ring.Sampler(desc["seed_entropy"], self._draws)
        self._bind_hot_path()

    def _map_data(self, writable: bool) -> None:
        fields = self._fields
        self._storage = get_backend(self.backend).open(self._dir, fields, self.max_size, writable)
        states = fields["states"]
        self._ns_file, self._ns, _ = open_npy(os.path.join(self._dir, NS_FILE),
                                              (2, self.num_envs) + states.shape, states.dtype, writable)
        self._sums_file, self._sums, _ = open_npy(os.path.join(self._dir, ROWSUMS_FILE),
                                                  (self.max_size,), np.dtype(np.uint32), writable)
        self._layout = CheckpointLayout(fields, self.num_envs, self._reserve_rows)
        self._ckfile = CheckpointFile(self._dir, self._layout, writable)

    # ------------------------------------------------------------------ recovery (writer)
    def _recover(self) -> None:
        checkpoint = self._ckfile.newest() if self._ckfile else None
        if self._fields is not None and checkpoint is None:
            raise CorruptStoreError(
                f"{os.path.join(self._dir, CHECKPOINT_FILE)}: neither checkpoint slot is valid")
        state = decide_state(self._counters, checkpoint, self.num_envs, self._reserve_rows or 0,
                             self._ckfile.both_valid if self._ckfile else True)
        if self._fields is None and state.seen != 0:
            raise CorruptStoreError(
                f"{self._counters.path}: seen_size is {state.seen} but the store has no fields yet")
        if self._fields is not None:
            check_reserve_covers(state.restore_from, state.restore_to, checkpoint, state.base,
                                 self.max_size, self.path)
            restored = restore_rows(self._storage.arrays, self._ckfile, checkpoint, state.restore_from,
                                    state.restore_to, state.base, self.max_size)
            if state.from_checkpoint:
                self._ns[(state.seen // self.num_envs) % 2] = self._ckfile.read_ns(checkpoint.slot, self.num_envs)
                # A flush cut short may have summed rows that were just rolled back.
                ts, _ = reserve_indices(state.restore_from, state.restore_to, checkpoint, state.base,
                                        self.max_size)
                set_sums_for(self._sums, self._storage.arrays, (ts - state.base - 1) % self.max_size,
                             ts - self.max_size)
            if restored or state.from_checkpoint:
                self._storage.sync()
                self._ns_file.sync()
                self._sums_file.sync()
        self._counters.commit_state(state.seen, state.base, state.draws, state.resets)
        self._counters.sync()
        self._seen, self._base, self._draws, self._resets = state.seen, state.base, state.draws, state.resets
        self._checkpoint = checkpoint
        self._sampler = ring.Sampler(self._desc["seed_entropy"], state.draws)
        self._set_flush_limit()
        if state.reason is not None:
            self.recovery_note = f"{self.path}: {state.reason}"
            warnings.warn(self.recovery_note, RecoveryWarning, stacklevel=4)

    def _set_flush_limit(self) -> None:
        """The newest transition an add may write before a flush is due (see ``add``)."""
        if self._fields is None:
            self._flush_before = 1 << 62
            return
        c = self._checkpoint
        limit = max(c.seen + self._reserve_rows, self._base + self.max_size) if c else self._base + self.max_size
        if c is not None and c.base != self._base:
            limit = self._base + self.max_size
        if self.flush_every is not None:
            limit = min(limit, self._seen + self.flush_every * self.num_envs)
        self._flush_before = limit

    # ------------------------------------------------------------------ reader snapshots
    def _refresh_reader(self) -> None:
        """Read the last committed counters (for ``mode="r"``), retrying a concurrent commit."""
        for _ in range(_RETRIES):
            problem = self._counters.problem(self.num_envs)
            if problem is None:
                break
            time.sleep(0.0005)
        else:
            raise CorruptStoreError(f"{self._counters.path}: {problem}; open the store with mode='r+' "
                                    "to recover it from the last flush")
        words = self._counters.words
        key = int(words[W_KEY])
        seen, intent, base, draws, resets = self._counters.snapshot()
        overlay = None
        checkpoint = None
        ns_override = None
        if self._fields is not None and int(words[W_CLEAN]) != 1:
            now = time.monotonic()
            if now - self._alive_at > _ALIVE_TTL:  # /proc/locks is not free: ask at most every 0.2 s
                self._alive, self._alive_at = writer_alive(self._dir), now
            if not self._alive:
                # A checkpoint rewritten since (a flush by a writer that died after it) changes
                # its header, which is written last: part of the record too.
                record = (key, seen, intent, base, draws, resets, self._ckfile.header_bytes())
                if self._dead_view is None or self._dead_view[0] != record:
                    self._dead_view = (record, self._dead_writer_view())
                seen, base, draws, resets, overlay, checkpoint, ns_override = self._dead_view[1]
        self._seen, self._base, self._draws, self._resets = seen, base, draws, resets
        self._ns_override = ns_override
        self._reader_state = (key, overlay, checkpoint)
        if self._fields is None and seen:
            raise CorruptStoreError(f"{self._counters.path}: seen_size is {seen} but the store has no fields")

    def _dead_writer_view(self) -> tuple:
        """What recovery would make of a dead writer's record, applied virtually: counters,
        the rows to patch from the undo reserve, and the ns_buffer. Reading and checking
        the checkpoint is costly, so ``_refresh_reader`` reuses this while the record stays
        as it is, checkpoint headers included (only a new writer changes either)."""
        checkpoint = self._ckfile.newest()
        state = decide_state(self._counters, checkpoint, self.num_envs, self._reserve_rows,
                             self._ckfile.both_valid)
        overlay = (state.restore_from, state.restore_to) if state.restore_to > state.restore_from else None
        ns = self._ckfile.read_ns(checkpoint.slot, self.num_envs) if state.from_checkpoint else None
        return state.seen, state.base, state.draws, state.resets, overlay, checkpoint, ns

    def _check_clean_record(self) -> None:
        """A record marked clean must agree with the checkpoint close() wrote (readers check once)."""
        if self._fields is None:
            return
        for _ in range(3):
            if int(self._counters.words[W_CLEAN]) != 1:
                return
            checkpoint = self._ckfile.newest()
            if checkpoint is None or not self._ckfile.both_valid or \
                    (checkpoint.seen, checkpoint.base) == (self._seen, self._base):
                return
            self._refresh_reader()  # a writer may have opened meanwhile
        raise CorruptStoreError(
            f"{self._counters.path}: marked clean at seen_size {self._seen}, but the last flush recorded "
            f"seen_size {checkpoint.seen}; open the store with mode='r+' to recover from the last flush")

    # ------------------------------------------------------------------ attributes
    @property
    def fields(self) -> dict | None:
        """``{name: (shape, dtype)}`` of the stored fields, None before the first add of an undeclared store."""
        if self._fields is None:
            return None
        return {n: (s.shape, s.dtype) for n, s in self._fields.items()}

    @property
    def seen_size(self) -> int:
        """Transitions ever added (not reset by ``reset()``)."""
        self._check_open()
        if self.mode == "r":
            self._refresh_reader()
        return self._seen - 0

    @property
    def size(self) -> int:
        """Occupied slots, at most ``max_size``."""
        self._check_open()
        if self.mode == "r":
            self._refresh_reader()
        return ring.ring_size(self._seen, self._base, self.max_size)

    @property
    def head(self) -> int:
        """Slot of the newest transition, -1 when empty."""
        self._check_open()
        if self.mode == "r":
            self._refresh_reader()
        return ring.ring_head(self._seen, self._base, self.max_size)

    @property
    def ns_buffer(self) -> np.ndarray:
        """Next states of the newest ``num_envs`` transitions (a copy; empty when the store is)."""
        self._check_open()
        if self._fields is None or self._seen == self._base:
            return np.empty((0,), np.float32)
        return self._current_ns().copy()

    @property
    def last_flush_ns(self) -> int:
        """Time of the last completed flush (ns since the epoch), 0 if never flushed."""
        self._check_open()
        return int(self._counters.words[W_FLUSH_NS])

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        if self._closed:
            return f"<DiskReplay {self.path!r} closed>"
        return (f"<DiskReplay {self.path!r} mode={self.mode!r} backend={self.backend!r} "
                f"size={self.size}/{self.max_size} seen_size={self._seen}>")

    # ------------------------------------------------------------------ adding
    def _bind_hot_path(self) -> None:
        """Cache what ``add`` and ``sample`` need, and install the specialised ``add``."""
        self.__dict__.pop("add", None)
        self._writable = self.mode == "r+"
        if self._fields is None:
            return
        arrays = self._storage.arrays
        self._large_rows = self._fields["states"].row_bytes >= LARGE_ROW_BYTES
        self._arr = [arrays[name] for name in self._fields]
        self._extra_names = tuple(name for name in self._fields if name not in CORE_FIELDS)
        self._extra_set = frozenset(self._extra_names)
        self._words = self._counters.words
        self._key = int(self._words[W_KEY])
        self._hot = self._writable
        if self._writable and not self._extra_names:
            # An instance attribute shadows the general method: a closure over locals is
            # the cheapest Python can do per call (see DESIGN.md, "Hot-path habits").
            self.add = _fast_add(self) if self.num_envs == 1 else _fast_vector_add(self)
            self.add.__doc__ = DiskReplay.add.__doc__

    def add(self, state, action, reward, next_state, done, **extra) -> None:
        """Add one environment step: ``num_envs`` transitions, env-major (leading env axis if num_envs > 1).

        When this returns, the step survives a crash of this process; it survives a power
        cut once ``flush()`` has returned. Bad input raises ``SchemaMismatchError`` and
        leaves the store as it was.
        """
        if not self._writable or self._failed is not None:
            raise self._write_refusal("add")
        if self._fields is None:
            self._materialize(state, action, reward, next_state, done, extra)
            if "add" in self.__dict__:
                return self.add(state, action, reward, next_state, done, **extra)
        values = self._coerced_values(state, action, reward, next_state, done, extra)
        self._write_step(values)

    def _write_step(self, values: list) -> None:
        """Write one validated step (values in field order, next states last) and commit it."""
        n = self.num_envs
        seen = self._seen
        t_end = seen + n
        if t_end > self._flush_before:
            self.flush()
        words = self._words
        words[W_INTENT] = t_end
        start = (seen - self._base) % self.max_size
        stop = start + n
        if stop <= self.max_size:
            for arr, value in zip(self._arr, values):
                arr[start:stop] = value
        else:
            cut = self.max_size - start
            for arr, value in zip(self._arr, values):
                arr[start:] = value[:cut]
                arr[: n - cut] = value[cut:]
        self._ns[(t_end // n) & 1] = values[-1]
        words[W_SEEN] = t_end
        words[W_CHECK] = t_end ^ self._key
        self._seen = t_end

    def _coerced_values(self, state, action, reward, next_state, done, extra) -> list:
        missing = [name for name in self._extra_names if name not in extra]
        unknown = sorted(set(extra) - self._extra_set)
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing extra field(s) {', '.join(missing)}")
            if unknown:
                parts.append(f"unknown field(s) {', '.join(unknown)}")
            raise SchemaMismatchError(
                f"add: {'; '.join(parts)}; the store's fields are {', '.join(self._fields)}")
        given = {"states": state, "actions": action, "rewards": reward, "dones": done, **extra}
        n = self.num_envs
        values = [coerce(spec, given[name], n) for name, spec in self._fields.items()]
        values.append(coerce(FieldSpec("next_states", self._fields["states"].shape,
                                       self._fields["states"].dtype), next_state, n))
        if n == 1:
            values = [v[np.newaxis] for v in values]
        return values

    def _materialize(self, state, action, reward, next_state, done, extra) -> None:
        """First add of a store created without ``fields``: infer them and create the data files."""
        given = {"states": state, "actions": action, "rewards": reward, "dones": done, **extra}
        specs = infer_fields(given, self.num_envs)
        _check_row_sizes(specs)
        ns = coerce(FieldSpec("next_states", specs["states"].shape, specs["states"].dtype),
                    next_state, self.num_envs)
        del ns
        reserve = reserve_rows_for(specs, self.num_envs, self.max_size, self.flush_every)
        backend = get_backend(self.backend)
        try:
            _create_data(self._dir, backend, specs, self.max_size, self.num_envs, reserve)
            desc = dict(self._desc)
            desc["fields"] = {n: s.to_json() for n, s in specs.items()}
            desc["reserve_rows"] = reserve
            desc["seed_entropy"] = str(desc["seed_entropy"])
            write_description(self._dir, desc)
        except BaseException as exc:
            for name in backend.data_files(specs) + [NS_FILE, ROWSUMS_FILE, CHECKPOINT_FILE]:
                _unlink(os.path.join(self._dir, name))
            if isinstance(exc, OSError) and not isinstance(exc, DiskReplayError):
                raise io_error(f"creating the data files of {self.path}", exc) from exc
            raise
        self._desc = read_description(self._dir)
        self._fields = self._desc["fields"]
        self._reserve_rows = reserve
        self._map_data(True)
        self._checkpoint = self._ckfile.newest()
        self._set_flush_limit()
        self._bind_hot_path()

    # ------------------------------------------------------------------ flushing
    def flush(self) -> None:
        """Make everything added so far survive a power cut (until later adds evict it).

        Syncs every data file and the ``ns_buffer`` first, then writes a new checkpoint
        (counters, sampler position, ``ns_buffer`` and undo copies of the rows the next
        adds will overwrite) and syncs it. A failed sync raises ``StoreIOError`` and the
        store refuses writes until it is reopened.
        """
        if not self._writable or self._failed is not None:
            raise self._write_refusal("flush")
        try:
            self._flush()
        except DiskReplayError as exc:
            self._fail(exc)
            raise
        except OSError as exc:
            self._fail(exc)
            raise io_error(f"flushing {self.path}", exc) from exc

    def _fail(self, exc: BaseException) -> None:
        """After a failed sync nothing more is written: the disk may not hold what we think."""
        self._failed = exc
        self._hot = False  # a reference to the fast add someone kept now takes the general path
        self.__dict__.pop("add", None)

    def _flush(self) -> None:
        words = self._words if self._fields is not None else self._counters.words
        words[W_DRAWS] = self._sampler.draws
        if self._fields is None:
            self._counters.sync()
            return
        summed = self._checkpoint.seen if self._checkpoint is not None else 0
        update_sums(self._sums, self._storage.arrays, summed, self._seen, self._base, self.max_size)
        self._storage.sync()
        self._ns_file.sync()
        self._sums_file.sync()
        words[W_FLUSH_NS] = time.time_ns()
        self._counters.sync()
        self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        seen, base, m = self._seen, self._base, self.max_size
        generation = (self._checkpoint.generation + 1) if self._checkpoint else 1
        slot = generation % 2
        reserve_first = seen + 1
        parts = {}
        first_overwrite = max(seen + 1, base + m + 1)
        last = seen + self._reserve_rows
        count = max(0, last - first_overwrite + 1)
        reserve_first = first_overwrite if count else seen + 1
        for name, arr in self._storage.arrays.items():
            blocks = []
            if count:
                start = (first_overwrite - base - 1) % m
                end = min(start + count, m)
                blocks.append(arr[start:end])
                if end - start < count:
                    blocks.append(arr[: count - (end - start)])
            parts[name] = blocks
        ns_rows = self._current_ns() if seen > base else np.zeros_like(self._ns[0])
        self._ckfile.write(slot, generation, seen, base, self._sampler.draws, self._resets,
                           ns_rows, reserve_first, parts)
        self._checkpoint = self._ckfile.read_header(slot)
        if self._checkpoint is None:
            raise StoreIOError(f"{self._ckfile.path}: the checkpoint just written does not read back")
        self._set_flush_limit()

    def _current_ns(self) -> np.ndarray:
        if self._ns_override is not None:
            return self._ns_override
        return self._ns[(self._seen // self.num_envs) % 2]

    # ------------------------------------------------------------------ reset (SLM-Lab)
    def reset(self) -> None:
        """Empty the ring (``size`` 0, ``head`` -1, ``ns_buffer`` cleared) as the seed's
        ``reset`` does; ``seen_size`` keeps counting. Durable at once."""
        if not self._writable or self._failed is not None:
            raise self._write_refusal("reset")
        if self._fields is not None:
            self.flush()
        self._base = self._seen
        self._resets += 1
        self._counters.commit_state(self._seen, self._base, self._sampler.draws, self._resets)
        if self._fields is not None:
            self.flush()
        else:
            self._counters.sync()

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int | None = None) -> dict:
        """A batch of uniformly sampled transitions: a dict of arrays with keys
        ``states, actions, rewards, next_states, dones`` (and extras), in the order of
        ``self.batch_idxs``. With ``use_cer`` the last index is the newest transition."""
        self._check_open()
        if batch_size is None:
            batch_size = self.batch_size
        elif isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if self.mode == "r":
            self._refresh_reader()
        size = ring.ring_size(self._seen, self._base, self.max_size)
        if size == 0:
            raise EmptyStoreError(f"cannot sample from {self.path}: the store is empty; add transitions first")
        head = ring.ring_head(self._seen, self._base, self.max_size)
        idxs = self._sampler.sample_idxs(size, int(batch_size), self.use_cer, head)
        if self._writable:
            self._words[W_DRAWS] = self._sampler.draws
        self.batch_idxs = idxs
        if self.mode == "r":
            return self._gather_consistent(idxs)
        return self._gather(idxs, head, self._current_ns())

    def batches(self, batch_size: int | None = None, *, prefetch: int = 2, count: int | None = None):
        """An iterator of ``sample(batch_size)`` batches prepared ``prefetch`` ahead in a
        background thread (``count`` batches, or until closed). Deterministic for a seeded
        store; use it as a context manager or call ``close()``. While it runs, ``add`` and
        sampling take a lock, so a batch never mixes rows with a concurrent add. Batches
        prepared but not taken still advanced the sampler."""
        from .prefetch import Prefetcher

        self._check_open()
        lock = threading.Lock()
        plain_add = self.add

        def locked_add(*args, **kwargs):
            with lock:
                return plain_add(*args, **kwargs)

        def locked_sample():
            with lock:
                return self.sample(batch_size)

        had_fast_add = "add" in self.__dict__
        self.add = locked_add
        prefetcher = Prefetcher(locked_sample, prefetch=prefetch, count=count)
        stop_thread = prefetcher.close

        def close():
            stop_thread()
            if self.__dict__.get("add") is locked_add:
                if had_fast_add:
                    self.add = plain_add
                else:
                    del self.add  # the class's method again

        prefetcher.close = close
        self._prefetchers.add(prefetcher)
        return prefetcher

    def get(self, idxs) -> dict:
        """The transitions at the given slot indices, as ``sample`` returns them."""
        self._check_open()
        if self.mode == "r":
            self._refresh_reader()
        idxs = self._checked_idxs(idxs)
        if self._fields is None:
            return {}  # no fields yet, and _checked_idxs allowed only an empty selection
        if self.mode == "r":
            return self._gather_consistent(idxs)
        return self._gather(idxs, ring.ring_head(self._seen, self._base, self.max_size), self._current_ns())

    def _checked_idxs(self, idxs) -> np.ndarray:
        arr = np.asarray(idxs)
        if arr.dtype == object or arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
            raise InvalidArgumentError(f"idxs must be integers, got {arr.dtype} data")
        arr = arr.astype(np.int64, copy=False).reshape(-1)
        size = ring.ring_size(self._seen, self._base, self.max_size)
        if arr.size and (arr.min() < 0 or arr.max() >= size):
            bad = arr[(arr < 0) | (arr >= size)][0]
            raise IndexOutOfRangeError(f"index {bad} is outside [0, {size}) (the store holds {size} transitions)")
        return arr

    def _gather(self, idxs: np.ndarray, head: int, ns_rows: np.ndarray) -> dict:
        """Rows at ``idxs`` plus their next states; reads only those rows.

        Large rows (frames) whose first rows are not in the page cache are read by
        positioned reads behind read-ahead hints for the whole batch (``_gather_large``);
        everything else is copied from the gather mapping, the cheapest way in RAM."""
        ns_slots, in_buffer, buffer_idx = ring.next_state_sources(idxs, head, self.max_size, self.num_envs)
        if self._large_rows and not self._rows_cached(idxs[:PROBE_ROWS]):
            return self._gather_large(idxs, ns_slots, in_buffer, buffer_idx, ns_rows)
        return self._gather_mapped(idxs, ns_slots, in_buffer, buffer_idx, ns_rows)

    def _rows_cached(self, idxs) -> bool:
        """Whether to copy a large-row batch from the gather mapping: the first page of each
        of these rows is in the page cache (a one-byte ``RWF_NOWAIT`` read each, a
        microsecond, no waiting for the disk) and so were the last ``WARM_STREAK`` probed.

        Through the mapping a row not in RAM costs a page fault per page, one after the
        other (hundreds of microseconds a frame), while positioned reads copy cached rows
        for a few microseconds more and overlap the misses; so the mapping is used only
        while misses are rarer than about one row in a few hundred. Where the probe is
        unavailable, rows are taken as cached."""
        fd, offset, row_bytes = self._storage.locations["states"]
        for i in idxs.tolist():
            if page_cached(fd, offset + i * row_bytes) is False:
                self._probe_streak = 0
                return False
            self._probe_streak += 1
        return self._probe_streak >= WARM_STREAK

    def _gather_mapped(self, idxs, ns_slots, in_buffer, buffer_idx, ns_rows) -> dict:
        """Gather through the gather mapping (``take`` copies only the rows asked for)."""
        arrays = self._storage.gather_arrays
        states = arrays["states"]
        next_states = states.take(ns_slots, axis=0)
        if in_buffer.any():
            next_states[in_buffer] = ns_rows.take(buffer_idx[in_buffer], axis=0)
        batch = {"states": states.take(idxs, axis=0), "actions": arrays["actions"].take(idxs, axis=0),
                 "rewards": arrays["rewards"].take(idxs, axis=0), "next_states": next_states,
                 "dones": arrays["dones"].take(idxs, axis=0)}
        for name in self._extra_names:
            batch[name] = arrays[name].take(idxs, axis=0)
        return batch

    def _gather_large(self, idxs, ns_slots, in_buffer, buffer_idx, ns_rows) -> dict:
        """Large rows (frames) not in RAM: every field's rows (states, next states, small
        fields) by one ``RowReader.gather_many``, which announces all of the batch's reads to
        the kernel before copying any, so the disk serves them many at a time."""
        if self._row_reader is None:
            self._row_reader = RowReader()
        reader = self._row_reader
        locations = self._storage.locations
        spec = self._fields["states"]
        rows = np.empty((2 * len(idxs),) + spec.shape, spec.dtype)
        fd, offset, row_bytes = locations["states"]
        requests = [(fd, offset, row_bytes, np.concatenate([idxs, ns_slots]), rows)]
        got = {}
        for name, field in self._fields.items():
            if name != "states":  # small fields by positioned reads too, all in flight together
                got[name] = np.empty((len(idxs),) + field.shape, field.dtype)
                requests.append(locations[name] + (idxs, got[name]))
        reader.gather_many(requests)
        next_states = rows[len(idxs):]
        if in_buffer.any():
            next_states[in_buffer] = ns_rows.take(buffer_idx[in_buffer], axis=0)
        batch = {"states": rows[: len(idxs)], "actions": got["actions"], "rewards": got["rewards"],
                 "next_states": next_states, "dones": got["dones"]}
        for name in self._extra_names:
            batch[name] = got[name]
        return batch

    def _gather_consistent(self, idxs: np.ndarray) -> dict:
        """``_gather`` for a reader beside a live writer: retry rows the writer touched meanwhile."""
        deadline = time.monotonic() + _READ_PATIENCE
        while time.monotonic() < deadline:
            key, overlay, _ = self._reader_state
            seen, base, m, n = self._seen, self._base, self.max_size, self.num_envs
            head = ring.ring_head(seen, base, m)
            ns_copy = self._current_ns().copy()
            batch = self._gather(idxs, head, ns_copy)
            if overlay is not None:
                self._apply_overlay(batch, idxs, head, overlay, ns_copy)
                return batch
            words = self._counters.words
            intent = int(words[W_INTENT])
            if int(words[W_KEY]) == key and int(words[W_RESETS]) == self._resets and \
                    not self._touched(idxs, head, intent, ns_touched=intent >= seen + 2 * n):
                return batch
            time.sleep(0.0002)
            self._refresh_reader()
        raise TornReadError(f"{self.path}: the writer kept overwriting the requested rows; try again")

    def _touched(self, idxs, head, intent, ns_touched) -> bool:
        """Whether the writer may have rewritten any of these slots (or their next-state
        slots) since the snapshot: a slot is rewritten by the transition ``max_size`` after
        the one it holds, and transitions up to ``intent`` may have been written."""
        if ns_touched:
            return True
        seen, m, n = self._seen, self.max_size, self.num_envs
        if intent <= seen:
            return False
        slots = np.concatenate([idxs, (idxs + n) % m])
        held = seen - (head - slots) % m  # transition number each slot held at the snapshot
        return bool((held + m <= intent).any())

    def _apply_overlay(self, batch, idxs, head, overlay, ns_rows) -> None:
        """Patch rows whose slots were left half-written by a dead writer with their undo copies."""
        lo, hi = overlay
        checkpoint = self._reader_state[2] or self._ckfile.newest()
        if checkpoint is None:
            raise CorruptStoreError(f"{self.path}: rows need restoring but no valid checkpoint exists")
        ts, ks = reserve_indices(lo, hi, checkpoint, self._base, self.max_size)
        if len(ts) == 0:
            return
        slot_to_k = dict(zip(((ts - self._base - 1) % self.max_size).tolist(), ks.tolist()))
        for pos, slot in enumerate(idxs.tolist()):
            k = slot_to_k.get(slot)
            if k is not None:
                for name in self._fields:
                    batch[name][pos] = self._ckfile.read_reserve_rows(checkpoint.slot, name, [k])[0]
        ns_slots, in_buffer, _ = ring.next_state_sources(idxs, head, self.max_size, self.num_envs)
        for pos, slot in enumerate(ns_slots.tolist()):
            k = slot_to_k.get(slot)
            if k is not None and not in_buffer[pos]:
                batch["next_states"][pos] = self._ckfile.read_reserve_rows(checkpoint.slot, "states", [k])[0]

    # ------------------------------------------------------------------ integrity
    def verify_rows(self, progress: Callable[[int], None] | None = None) -> tuple[int, list[int]]:
        """Check every row that was durable at the last flush against its CRC.

        Returns ``(rows checked, slots whose row is torn or damaged)``; rows added since
        the last flush have no CRC yet and are not counted. Reads each row once.
        """
        self._check_open()
        if self._fields is None:
            return 0, []
        if self.mode == "r":
            self._refresh_reader()
        checkpoint = self._ckfile.newest()
        if checkpoint is None:
            raise CorruptStoreError(f"{self._ckfile.path}: neither checkpoint slot is valid")
        upto = min(checkpoint.seen, self._seen)
        first = max(self._base, self._seen - self.max_size, 0)
        bad = torn_slots(self._sums, self._storage.arrays, first, upto, self._base, self.max_size, progress)
        if self.mode == "r" and bad:
            # Rows a live writer overwrote during the pass no longer match their old CRC.
            intent = int(self._counters.words[W_INTENT])
            head = ring.ring_head(self._seen, self._base, self.max_size)
            held = self._seen - (head - np.asarray(bad)) % self.max_size
            bad = [slot for slot, t in zip(bad, held.tolist()) if t + self.max_size > intent]
        return max(0, upto - first), bad

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Flush (writer), release the lock and unmap everything. Idempotent."""
        if self._closed:
            return
        try:
            for prefetcher in list(self._prefetchers):
                prefetcher.close()  # no background sample() while flushing and unmapping
            if self._writable and self._failed is None:
                self.flush()
                self._counters.words[W_CLEAN] = 1
                self._counters.words[W_PID] = 0
                self._counters.sync()
        finally:
            self._closed = True
            self._release_all()

    def _release_all(self) -> None:
        self._writable = False
        self._hot = False  # held references to the fast add must not store into unmapped memory
        if self._row_reader is not None:
            self._row_reader.close()
            self._row_reader = None
        self.__dict__.pop("add", None)
        self._arr = []
        self._words = None
        self._sums = None
        for res in (self._storage, self._counters, self._ckfile, self._ns_file, self._sums_file):
            if res is not None:
                res.close()
        self._ns = None
        self._storage = self._counters = self._ckfile = self._ns_file = self._sums_file = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "DiskReplay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path} is closed")

    def _write_refusal(self, what: str) -> DiskReplayError:
        if self._closed:
            return StoreClosedError(f"cannot {what}: {self.path} is closed")
        if self.mode == "r":
            return ReadOnlyError(f"cannot {what}: {self.path} is open read-only (mode='r'); "
                                 "open it with mode='r+' to write")
        return StoreIOError(f"cannot {what}: an earlier sync of {self.path} failed ({self._failed}); "
                            "the store refuses writes until it is reopened")

    # ------------------------------------------------------------------ conversion
    @staticmethod
    def convert(src, dst, *, backend: str, progress: Callable[[int, int], None] | None = None,
                overwrite: bool = False, block_rows: int | None = None) -> None:
        """Copy the store at ``src`` to a new store at ``dst`` with another backend, with its
        counters, ``ns_buffer`` and sampler state, in row blocks (bounded memory).
        ``progress(done_rows, total_rows)`` is called after each block."""
        from .convert import convert_store

        convert_store(src, dst, backend=backend, progress=progress, overwrite=overwrite,
                      block_rows=block_rows)


def _fast_add(buf: DiskReplay):
    """``add`` for one env and the four core fields: cheap checks, four row stores, one commit."""
    specs = buf._fields
    shape, dtype = specs["states"].shape, specs["states"].dtype
    (a_types, a_bounds), (r_types, r_bounds), (d_types, d_bounds) = (
        _fast_scalar_types(specs[name]) for name in ("actions", "rewards", "dones"))
    a_lo, a_hi = a_bounds or (1, 0)
    states, actions, rewards, dones = buf._arr
    ns_rows = buf._ns[:, 0]
    words = buf._words
    key = buf._key
    max_size = buf.max_size
    ndarray = np.ndarray
    general = DiskReplay.add

    def add(state, action, reward, next_state, done, **extra):
        if (not buf._hot or extra or type(state) is not ndarray or state.shape != shape or state.dtype != dtype
                or type(next_state) is not ndarray or next_state.shape != shape or next_state.dtype != dtype
                or type(reward) not in r_types or type(done) not in d_types):
            return general(buf, state, action, reward, next_state, done, **extra)
        ta = type(action)
        if ta not in a_types and not (ta is int and a_lo <= action <= a_hi):
            return general(buf, state, action, reward, next_state, done, **extra)
        seen = buf._seen
        t = seen + 1
        if t > buf._flush_before:
            buf.flush()
        words[W_INTENT] = t
        slot = (seen - buf._base) % max_size
        states[slot] = state
        actions[slot] = action
        rewards[slot] = reward
        dones[slot] = done
        ns_rows[t & 1] = next_state
        words[W_SEEN] = t
        words[W_CHECK] = t ^ key
        buf._seen = t

    return add


def _fast_vector_add(buf: DiskReplay):
    """``add`` for a vector env: exact-dtype arrays go straight to one slice write per field.

    The checks are chained ``is`` tests on cached shapes and dtypes (an equal dtype that is
    not the same object falls back to ``==``); a step that wraps around the ring end or
    is due for a flush goes through ``_write_step``."""
    n = buf.num_envs
    specs = buf._fields
    (s_shape, s_dt), (a_shape, a_dt), (r_shape, r_dt), (d_shape, d_dt) = (
        ((n,) + specs[name].shape, specs[name].dtype) for name in ("states", "actions", "rewards", "dones"))
    states, actions, rewards, dones = buf._arr
    ns = buf._ns
    words = buf._words
    key = buf._key
    max_size = buf.max_size
    ndarray = np.ndarray
    general = DiskReplay.add
    write = buf._write_step

    def add(state, action, reward, next_state, done, **extra):
        if (not buf._hot or extra or type(state) is not ndarray or type(next_state) is not ndarray
                or type(action) is not ndarray or type(reward) is not ndarray or type(done) is not ndarray
                or state.shape != s_shape or next_state.shape != s_shape or action.shape != a_shape
                or reward.shape != r_shape or done.shape != d_shape
                or not (state.dtype is s_dt or state.dtype == s_dt)
                or not (next_state.dtype is s_dt or next_state.dtype == s_dt)
                or not (action.dtype is a_dt or action.dtype == a_dt)
                or not (reward.dtype is r_dt or reward.dtype == r_dt)
                or not (done.dtype is d_dt or done.dtype == d_dt)):
            return general(buf, state, action, reward, next_state, done, **extra)
        seen = buf._seen
        t_end = seen + n
        start = (seen - buf._base) % max_size
        stop = start + n
        if stop > max_size or t_end > buf._flush_before:
            return write([state, action, reward, done, next_state])
        words[W_INTENT] = t_end
        states[start:stop] = state
        actions[start:stop] = action
        rewards[start:stop] = reward
        dones[start:stop] = done
        ns[(t_end // n) & 1] = next_state
        words[W_SEEN] = t_end
        words[W_CHECK] = t_end ^ key
        buf._seen = t_end

    return add


def _fast_scalar_types(spec: FieldSpec):
    """Types whose values a scalar field stores without loss (Python int needs a range check)."""
    if spec.shape != ():
        return (frozenset(), None)
    dt = spec.dtype
    if dt.kind == "f":
        return (frozenset({float, int, bool, np.float64, np.float32, np.float16, dt.type}), None)
    if dt.kind == "b":
        return (frozenset({bool, np.bool_}), None)
    info = np.iinfo(dt)
    return (frozenset({dt.type}), (int(info.min), int(info.max)))


def _check_row_sizes(specs) -> None:
    for name, spec in specs.items():
        if spec.row_bytes == 0:
            raise InvalidArgumentError(f"field {name!r} has shape {spec.shape}: rows of zero bytes are not supported")


def _touch(path: str) -> None:
    with open(path, "wb") as f:
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(path))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _remove_store_files(directory: str, keep_marker: bool = False) -> None:
    """Remove what a store (or a half-created one) consists of, nothing else."""
    for name in os.listdir(directory):
        if name == LOCK_FILE or (keep_marker and name == CREATING_MARKER):
            continue
        if name in (DESCRIPTION_FILE, COUNTERS_FILE, CREATING_MARKER, CHECKPOINT_FILE) or \
                name.endswith((".npy", ".h5")) or ".tmp-" in name:
            _unlink(os.path.join(directory, name))


def _prepare_directory(directory: str, overwrite: bool) -> bool:
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
    if not _looks_like_store(directory) or not _own_files(directory):
        raise StoreExistsError(
            f"cannot create a store at {directory}: the directory holds files that are not a diskreplay "
            "store; choose another path (overwrite=True only replaces an existing store)")
    if not overwrite:
        raise StoreExistsError(
            f"a store already exists at {directory}; pass overwrite=True to replace it, "
            "or DiskReplay.open() to resume it")
    return False


def _create_data(directory, backend, specs, max_size, num_envs, reserve) -> None:
    layout = CheckpointLayout(specs, num_envs, reserve)
    states = specs["states"]
    ns_bytes = 2 * num_envs * states.row_bytes
    check_free_space(directory, backend.data_bytes(specs, max_size) + layout.file_bytes + ns_bytes
                     + 4 * max_size + 12288)
    backend.create(directory, specs, max_size, FORMAT_VERSION)
    create_npy(os.path.join(directory, NS_FILE), (2, num_envs) + states.shape, states.dtype)
    create_npy(os.path.join(directory, ROWSUMS_FILE), (max_size,), np.dtype(np.uint32))
    create_checkpoint_file(directory, layout)
    # An initial checkpoint at seen_size 0: recovery always has one to fall back on.
    ck = CheckpointFile(directory, layout, True)
    try:
        ck.write(1, 1, 0, 0, 0, 0, np.zeros((num_envs,) + states.shape, states.dtype), 1,
                 {name: [] for name in specs})
    finally:
        ck.close()


def _check_is_store(directory: str) -> None:
    if not os.path.lexists(directory):
        raise StoreNotFoundError(f"no store at {directory}: the path does not exist")
    if not os.path.isdir(directory):
        raise NotAStoreError(f"{directory} is a file, not a diskreplay store (a store is a directory)")
    try:
        names = set(os.listdir(directory))
    except OSError as exc:
        raise io_error(f"listing {directory}", exc) from exc
    if DESCRIPTION_FILE in names:
        if CREATING_MARKER in names:
            raise IncompleteStoreError(
                f"{directory} was never completely created (its creator stopped half-way); "
                "recreate it with DiskReplay.create(..., overwrite=True)")
        return
    if CREATING_MARKER in names or COUNTERS_FILE in names or names == {LOCK_FILE}:
        raise IncompleteStoreError(
            f"{directory} was never completely created (its creator stopped half-way); "
            "recreate it with DiskReplay.create(..., overwrite=True)")
    raise NotAStoreError(f"{directory} is not a diskreplay store: it has no {DESCRIPTION_FILE}")


__all__ = ["DiskReplay", "FORMAT_VERSION"]
