"""The jump ring: the exact next states that the ``i + num_envs`` rule gets wrong.

States are stored once: the next state of transition ``t`` is the state of ``t + num_envs``
(the same env's next transition). That is wrong where an episode ended and the env was
reset (Gymnasium's autoreset): the next step starts from a fresh state, not from the next
state given to ``add``. ``add`` sees it happen: the states a step gives for env ``e``
differ (byte for byte) from the next states the previous step gave for ``e``, which are
still in the ``ns_buffer``. That previous transition ``t`` is then a *jump*: its true next
state is copied from the ``ns_buffer`` into this ring, and every read takes it from here.

Two files, owned here (FORMAT.md, "jumps.npy and jump_states.npy"):

* ``jumps.npy``: ``capacity`` int64 records; record ``k`` (the ``k``-th jump ever
  recorded, from 0) is at ``k % capacity`` and holds the transition number ``t``. Record
  numbers and transition numbers grow together, so the records of a window are sorted.
* ``jump_states.npy``: ``capacity`` state rows, row ``k % capacity`` the true next state
  of record ``k``. Sparse: written with ``pwrite`` (a full disk is an error of that add,
  never a ``SIGBUS``), so it takes disk space only for the rows written.

``count`` (the number of records, word ``W_JUMPS`` of ``meta.bin`` and the checkpoint's
``jumps``) is committed with the step that wrote them. Lookups search the newest
``max_size`` records (one per transition at most, and only the ``max_size`` newest
transitions are in the ring). ``capacity = max_size + reserve_rows``: the writer flushes
before the records written since the last checkpoint would exceed ``reserve_rows``, so
after a power cut the checkpoint's window is intact (no undo copies needed), and a reader
whose snapshot saw ``count`` may trust its window while fewer than ``room`` records were
written since.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ..errors import CorruptStoreError
from ..disk.fsutil import close_fd, io_error, pwrite_all
from ..disk.rowreader import will_need
from ..disk.npyfile import create_npy, expected_npy_bytes, open_npy, read_npy_header, write_npy_header
from ..core.schema import FieldSpec
from ..format.counters import W_JUMPS
from ..format.description import JUMPS_VERSION
from .base import Checks, Geometry, OpenPart, Part, Step, npy_bytes

JUMPS_FILE = "jumps.npy"
JUMP_STATES_FILE = "jump_states.npy"
SMALL_BYTES = 4096  # up to this many bytes a step's states are compared as bytes objects
COPY_BYTES = 8 << 20  # records copied per block by ``convert``

try:  # memcmp compares a frame stack in microseconds; without it, numpy compares (slower)
    memcmp = ctypes.CDLL(None).memcmp
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
except (OSError, AttributeError):
    memcmp = None


def jump_capacity(max_size: int, reserve_rows: int) -> int:
    return max_size + reserve_rows


def create_jump_files(directory: str, states: FieldSpec, capacity: int,
                      names: tuple = (JUMPS_FILE, JUMP_STATES_FILE)) -> None:
    """``jumps.npy`` preallocated; ``jump_states.npy`` a sparse file of the full size.
    ``names``: the two files' names (``framestack.py`` keeps a second ring of this kind)."""
    create_npy(os.path.join(directory, names[0]), (capacity,), np.dtype(np.int64))
    path = os.path.join(directory, names[1])
    shape = (capacity,) + states.shape
    try:
        with open(path, "wb") as f:
            write_npy_header(f, shape, states.dtype)
            f.truncate(expected_npy_bytes(shape, states.dtype))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise io_error(f"creating {path}", exc) from exc


def same_bytes(pair, nbytes: int):
    """``same(a, parity)``: whether the array ``a`` holds, byte for byte, what
    ``pair[parity]`` (one of the two ``ns_buffer`` areas, ``nbytes`` each) holds; NaNs
    compare by their bytes. Small areas as ``bytes``; large ones by ``memcmp`` at the
    areas' fixed addresses (a frame stack in microseconds)."""
    if nbytes <= SMALL_BYTES or memcmp is None:
        return lambda a, parity: a.tobytes() == pair[parity].tobytes()
    addresses = tuple(area.ctypes.data for area in pair)  # the mapping stays while ``pair`` holds it

    def same(a, parity):
        if a.nbytes == nbytes and a.flags.c_contiguous:
            return memcmp(a.ctypes.data, addresses[parity], nbytes) == 0
        return a.tobytes() == pair[parity].tobytes()
    return same


def rows_differ(states: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """A bool per env: whether its row of ``states`` differs in any byte from ``previous``."""
    a = np.ascontiguousarray(states).reshape(len(states), -1).view(np.uint8)
    b = np.ascontiguousarray(previous).reshape(len(previous), -1).view(np.uint8)
    return (a != b).any(axis=1)


class JumpRing(OpenPart):
    """The opened jump files of a store (see the module docstring)."""

    def __init__(self, directory: str, states: FieldSpec, max_size: int, reserve_rows: int, writable: bool,
                 names: tuple = (JUMPS_FILE, JUMP_STATES_FILE), window: int | None = None):
        """``window``: how many of the newest records lookups search (``max_size`` unless
        given); the capacity is ``window + reserve_rows``."""
        self.window = max_size if window is None else window
        self.capacity = self.window + reserve_rows
        self.room = reserve_rows
        self.spec = states
        self.row_bytes = states.row_bytes
        self.item_bytes = states.row_bytes // states.shape[0] if states.shape else 0  # one item of the first axis
        self.fd = -1
        # The transition numbers of records [cache_lo, cache_lo + len(cache_ts)), copied from
        # the ring as lookups need them: a lookup then searches RAM, not the mapped file
        # (whose pages a cold batch would fault in one binary-search step at a time).
        self.cache_lo, self.cache_ts = 0, np.empty(0, np.int64)
        self.file, self.records, _ = open_npy(os.path.join(directory, names[0]), (self.capacity,),
                                              np.dtype(np.int64), writable)
        try:
            self.path = os.path.join(directory, names[1])
            shape = (self.capacity,) + states.shape
            found_shape, found_dtype, self.offset = read_npy_header(self.path)
            size = os.stat(self.path).st_size
            expected = expected_npy_bytes(shape, states.dtype)
            if found_shape != shape or found_dtype != states.dtype or size != expected:
                raise CorruptStoreError(f"{self.path} holds {found_shape} {found_dtype} in {size} bytes, "
                                        f"expected {shape} {states.dtype} in {expected} bytes")
            self.fd = os.open(self.path, os.O_RDWR if writable else os.O_RDONLY)
        except OSError as exc:
            self.close()
            raise io_error(f"opening {self.path}", exc) from exc
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ reading
    def committed(self, count: int, seen: int, num_envs: int, newest: int | None = None) -> int:
        """``count`` less the records of a step that was not committed: every committed
        record is of a transition whose successor in its env was added (``t <= seen -
        num_envs``, or ``t <= newest`` when given); a writer killed after storing the count
        but before its commit leaves records of newer transitions, which recovery and
        readers leave out."""
        stop = max(0, count - num_envs)
        newest = seen - num_envs if newest is None else newest
        while count > stop and int(self.records[(count - 1) % self.capacity]) > newest:
            count -= 1
        return count

    def find(self, ts: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(found, k)``: for each transition number in ``ts``, whether one of the newest
        ``window`` of the first ``count`` records is of it, and that record's number (``k``
        is meaningful only where found)."""
        ts = np.asarray(ts, np.int64)
        lo = max(0, count - self.window)
        if count <= lo or not len(ts):
            return np.zeros(len(ts), bool), np.zeros(len(ts), np.int64)
        window = self._window(lo, count)
        pos = window.searchsorted(ts)  # records of a window are sorted
        np.minimum(pos, len(window) - 1, out=pos)
        return window.take(pos) == ts, pos + lo

    def _window(self, lo: int, count: int) -> np.ndarray:
        """The transition numbers of records ``[lo, count)``, from the copy in RAM, which
        takes only the records added since (a committed record does not change while it is
        in the window; a count below the copy's end drops the rest, which may not be committed)."""
        c_lo, c_hi = self.cache_lo, self.cache_lo + len(self.cache_ts)
        if count < c_hi:
            self.cache_ts = self.cache_ts[:max(0, count - c_lo)]
            c_hi = self.cache_lo + len(self.cache_ts)
        if not c_lo <= lo <= c_hi:
            self.cache_lo, self.cache_ts, c_lo, c_hi = lo, np.empty(0, np.int64), lo, lo
        if count > c_hi:
            new = np.asarray(self.records[np.arange(c_hi, count, dtype=np.int64) % self.capacity], np.int64)
            keep = self.cache_ts[lo - c_lo:]
            self.cache_ts, self.cache_lo = np.concatenate([keep, new]), lo
        elif lo > c_lo:
            self.cache_ts, self.cache_lo = self.cache_ts[lo - c_lo:], lo
        return self.cache_ts[:count - self.cache_lo]

    def will_need(self, ks) -> None:
        """Announce the rows of records ``ks`` to the kernel (their reads start now)."""
        for k in np.asarray(ks).tolist():
            will_need(self.fd, self.offset + (k % self.capacity) * self.spec.row_bytes, self.spec.row_bytes)

    def states(self, ks: np.ndarray) -> np.ndarray:
        """The true next states of records ``ks``."""
        spec = self.spec
        out = np.empty((len(ks),) + spec.shape, spec.dtype)
        for i, k in enumerate(np.asarray(ks).tolist()):
            self.read_into(k, out[i])
        return out

    def read_into(self, k: int, out: np.ndarray, first: int = 0) -> None:
        """Copy items ``first, first + 1, ...`` (along the first axis) of record ``k``'s
        state into ``out`` (C-contiguous, as many items as it holds) by one positioned read."""
        at = self.offset + (k % self.capacity) * self.row_bytes + first * self.item_bytes
        into = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        try:
            got = os.preadv(self.fd, [into.reshape(-1).view(np.uint8)], at)
        except OSError as exc:
            raise io_error(f"reading {self.path}", exc) from exc
        if got != into.nbytes:
            raise CorruptStoreError(f"{self.path} is shorter than its header says")
        if into is not out:
            out[...] = into

    def window_records(self, count: int, first_t: int, last_t: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ts, ks)`` of the records in the window with ``first_t <= t <= last_t``, oldest first."""
        lo = max(0, count - self.window)
        ks = np.arange(lo, count, dtype=np.int64)
        ts = np.asarray(self.records[ks % self.capacity], np.int64)
        keep = (ts >= first_t) & (ts <= last_t)
        return ts[keep], ks[keep]

    # ------------------------------------------------------------------ writing
    def append(self, count: int, ts, rows: np.ndarray) -> int:
        """Write records ``count, count + 1, ...`` for transitions ``ts`` with true next
        states ``rows`` (the states first, then the record); returns the new count. Not
        committed until the count is (``counters.record_jumps``)."""
        flat = np.ascontiguousarray(rows).reshape(len(rows), -1).view(np.uint8)
        for i, t in enumerate(np.asarray(ts).tolist()):
            k = (count + i) % self.capacity
            try:
                pwrite_all(self.fd, memoryview(flat[i]), self.offset + k * self.spec.row_bytes)
            except OSError as exc:
                raise io_error(f"writing {self.path}", exc) from exc
            self.records[k] = t
        return count + len(rows)

    def plan_step(self, step: Step) -> int:
        """The envs whose states differ from the next states the previous step gave for
        them (``step.jumped``): that previous transition's true next state is recorded."""
        if step.seen > step.base:
            step.jumped = rows_differ(step.values[0], step.previous)
        else:  # the first step after a reset has no previous step
            step.jumped = np.zeros(step.num_envs, bool)
        return int(np.count_nonzero(step.jumped))

    def after_rows(self, step: Step, words) -> int:
        jumped = step.jumped
        if not jumped.any():
            return self.count
        count = self.append(self.count, step.seen - step.num_envs + 1 + np.flatnonzero(jumped),
                            step.previous[jumped])
        self.record(words, count)
        return count

    def snapshot(self, words, seen: int, num_envs: int, view) -> int:
        """Read after ``seen``: the writer stores the count before it commits a step."""
        if view is not None:
            return view.jumps
        return self.committed(int(words[W_JUMPS]), seen, num_envs)

    def kept(self, words, seen: int, intent: int, num_envs: int, count: int) -> bool:
        """Records written since the snapshot (one step more may be in flight) must not have
        reached the window of records a read searched."""
        return int(words[W_JUMPS]) + num_envs - count <= self.room

    def copy_into(self, other: "JumpRing", count: int, seen: int, base: int, num_envs: int) -> int:
        """The records of the transitions the ring holds (all but the newest step, whose next
        states are the ``ns_buffer``'s), in blocks of ``COPY_BYTES``."""
        first = max(base, seen - self.window) + 1  # the jump ring's window is max_size
        ts, ks = self.window_records(count, first, seen - num_envs)
        return self.copy_records(other, ts, ks)

    def copy_records(self, other: "JumpRing", ts: np.ndarray, ks: np.ndarray) -> int:
        """Append the records ``ks`` (of transitions ``ts``) to ``other``, from its start; returns how many."""
        step = max(1, COPY_BYTES // max(1, self.spec.row_bytes))
        copied = 0
        for lo in range(0, len(ts), step):
            copied = other.append(copied, ts[lo:lo + step], self.states(ks[lo:lo + step]))
        return copied

    @property
    def mapped_files(self) -> list:
        return [self.file] if self.file is not None else []

    def sync(self) -> None:
        self.file.sync()
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise io_error(f"syncing {self.path}", exc) from exc

    def close(self) -> None:
        self.records = None
        if getattr(self, "file", None) is not None:
            self.file.close()
            self.file = None
        self.fd = close_fd(self.fd)


class Jumps(Part):
    """The jump ring as a part: every store of format 2 on has it."""
    name = "jumps"
    names = (JUMPS_FILE, JUMP_STATES_FILE)
    word = W_JUMPS
    header = "jumps"
    since = JUMPS_VERSION
    gives = ": its next states are exact"

    @classmethod
    def wanted(cls, g: Geometry) -> bool:
        return g.format_version is None or g.format_version >= JUMPS_VERSION

    @classmethod
    def files(cls, g: Geometry) -> list[str]:
        return list(cls.names)

    @classmethod
    def npy_files(cls, g: Geometry) -> dict:
        capacity = jump_capacity(g.max_size, g.reserve_rows)
        return {JUMPS_FILE: ((capacity,), np.dtype(np.int64)),
                JUMP_STATES_FILE: ((capacity,) + g.states.shape, g.states.dtype)}

    @classmethod
    def bytes_needed(cls, g: Geometry) -> int:
        # jump_states.npy is sparse, but a run that jumps often writes every row of it
        return sum(npy_bytes(shape, dtype) for shape, dtype in cls.npy_files(g).values())

    @classmethod
    def create(cls, directory: str, g: Geometry) -> None:
        create_jump_files(directory, g.states, jump_capacity(g.max_size, g.reserve_rows))

    @classmethod
    def open(cls, directory: str, g: Geometry, writable: bool, storage=None) -> JumpRing:
        return JumpRing(directory, g.states, g.max_size, g.reserve_rows, writable)

    @classmethod
    def check(cls, c: Checks) -> None:
        """Its files, and the records lookups search: transitions in increasing order that
        were added (an unsorted window would hide exact next states). Leaves them in
        ``c.found["jumped"]`` when they are sound."""
        offset = c.npy_files(cls)[JUMPS_FILE]
        if offset is None or c.seen is None:
            return
        jumps, max_size = int(c.words[W_JUMPS]), c.g.max_size
        capacity = jump_capacity(max_size, c.g.reserve_rows)
        records = os.path.join(c.directory, JUMPS_FILE)
        ks = np.arange(max(0, jumps - max_size), jumps, dtype=np.int64)
        with open(records, "rb") as f:
            ring = np.fromfile(f, "<i8", count=capacity, offset=offset)
        ts = ring[ks % capacity]
        c.report.checked["jump_records"] = len(ts)
        # A live writer stores the count before it commits a step: records up to one step ahead.
        ahead = c.seen + c.g.num_envs
        if len(ts) and ((np.diff(ts) <= 0).any() or ts[0] < 1 or ts[-1] > ahead):
            if c.word_now(W_JUMPS) != jumps:  # a live writer recorded jumps meanwhile, over the oldest read
                c.report.notes.append(f"{JUMPS_FILE}: not checked, a live writer kept recording jumps")
                return
            c.report.problem(f"{records}: the newest {len(ts)} records are not transitions in increasing order "
                             f"up to seen_size {c.seen}; exact next states of autoreset jumps may be wrong")
            return
        c.found["jumped"] = ts


__all__ = ["Jumps", "JUMPS_FILE", "JUMP_STATES_FILE", "JumpRing", "memcmp", "same_bytes", "create_jump_files", "jump_capacity",
           "rows_differ"]
