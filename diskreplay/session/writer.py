"""The writer session (mode ``r+``): creating a store, recovering it at open, adding,
flushing and resetting. One writer at a time, held by the ``lock`` file.

Write protocol of one ``add`` (one env step of ``num_envs`` transitions), as FORMAT.md
gives it and ``counters.begin_step`` / ``counters.commit_step`` perform it:

1. mark the step in flight (``intent``) in the live counters;
2. write its rows in place in the ring and its next states into the ``ns_buffer``
   area of its parity (the previous step's area stays intact);
3. commit by storing ``seen_size`` (and its check word).

A process crash between 1 and 3 leaves rows half-written in slots that held older
transitions; those are restored from the undo reserve of the last checkpoint, which
always covers them because an add that would overwrite a row without an undo copy
flushes first. ``flush()`` syncs every data file, then writes a new checkpoint
(counters, ``ns_buffer`` and undo copies of the rows the next adds will overwrite).

The fast adds (``fastadd.py``, chosen by ``bind_add``; its docstring tables them) perform
the same three steps inline, because a call per step would cost a measurable share of an
add; ``tests/features/test_commit_paths.py`` proves each byte-identical to the general path.
Flushing and checkpoint writing are the writer's ``Flusher`` (``flushing.py``), a collaborator;
what an add reads on every call is one ``WriteState`` (``writestate.py``), shared with the
flusher and the fast adds.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import sys

import numpy as np

from ..core import ring
from ..backends import BACKENDS, get_backend
from ..format.counters import (W_CHECK, W_CLEAN, W_DRAWS, W_INTENT, W_KEY, W_PID, W_SEEN, Counters, begin_step,
                               commit_step, create_counters)
from ..format.description import JUMPS_VERSION, new_description, read_description, write_description
from ..errors import (DiskReplayError, InsufficientSpaceError, ReadOnlyError, ReentrantCallError,
                     SchemaMismatchError, StoreClosedError, StoreIOError)
from . import forks
from .fastadd import fast_add, fast_stack_add, fast_stack_vector_add, fast_vector_add
from .flushing import Flusher, initial_checkpoint
from ..parts.stacks.ring import frame_spec
from ..disk.fsutil import io_error
from ..parts.base import Step
from ..parts import PARTS, Geometry
from ..format.directory import (finish_creating, lock_exists, mark_creating, prepare_directory, remove_store_files,
                                undo_create)
from ..parts.stacks.ring import state_spec
from .files import OWN_NAMES, check_file_names, create_data_files, remove_data_files, reserve_rows_for
from ..format.lock import WriterLock
from ..parts.priorities.args import is_prioritized
from ..format.recovery import recover_for_writer, restore_rows
from ..core.schema import CORE_FIELDS, FieldSpec, check_row_sizes, coerce, infer_fields
from .base import Session
from .writestate import WriteState, delegated


@delegated
class Writer(Session):
    """The writable session. ``live`` is False once closed or after a failed sync: the
    fast adds check it on every call, so a reference someone kept never writes then.
    ``seen``, ``base``, ``live``, ``busy``, ``overlap``, ``due`` and ``flush_before`` are
    its ``WriteState``'s (``ws``)."""

    mode = "r+"
    writable = True

    def __init__(self, path: str, *, lock=None):
        self.ws = WriteState()
        self.flusher = Flusher(self)
        super().__init__(path, lock=lock)

    # ------------------------------------------------------------------ create and open
    @classmethod
    def create(cls, path: str, *, max_size: int, num_envs: int, backend: str, batch_size: int,
               use_cer: bool, entropy: int, specs: dict | None, overwrite: bool,
               flush_every: int | None, priority_keys: dict | None = None,
               frame_stack: int | None = None) -> "Writer":
        """Make the store's files (arguments already checked; with ``frame_stack``, ``specs``
        holds one frame as ``states``) and open it for writing."""
        backend_impl = get_backend(backend)
        if specs is not None:  # before anything is touched: overwrite must not erase a store for a bad name
            check_file_names(specs)
        directory = os.path.abspath(path)
        made_dir = prepare_directory(directory, overwrite, OWN_NAMES)
        lock_existed = lock_exists(directory)
        try:
            lock = WriterLock(directory)
        except BaseException:
            undo_create(directory, made_dir, lock_existed=True)
            raise
        try:
            mark_creating(directory)
            remove_store_files(directory, keep_marker=True, extra=OWN_NAMES)
            reserve = None
            if specs is not None:
                reserve = reserve_rows_for(specs, num_envs, max_size, flush_every)
                create_data_files(directory, backend_impl, specs, max_size, num_envs, reserve,
                                  initial_checkpoint(specs, num_envs, state_spec(specs, frame_stack)),
                                  bool(priority_keys), frame_stack)
            create_counters(directory)
            write_description(directory, {**new_description(
                backend=backend, max_size=max_size, num_envs=num_envs, batch_size=batch_size,
                use_cer=use_cer, fields=specs, entropy=entropy, reserve_rows=reserve,
                flush_every=flush_every, frame_stack=frame_stack), **(priority_keys or {})})
            finish_creating(directory)
        except BaseException as exc:
            remove_store_files(directory, extra=OWN_NAMES)
            lock.release()
            undo_create(directory, made_dir, lock_existed)
            if isinstance(exc, OSError) and not isinstance(exc, DiskReplayError):
                raise io_error(f"creating the store at {directory}", exc) from exc
            raise
        return cls(path, lock=lock)

    def _open_state(self) -> None:
        self.live = False
        self.failed: BaseException | None = None
        if self.lock is None:
            if not os.access(self.directory, os.W_OK):
                raise ReadOnlyError(
                    f"{self.path} cannot be opened for writing: no write permission on the directory "
                    "(or a read-only filesystem); open it with mode='r' to read it")
            self.lock = WriterLock(self.directory)
        self.counters = Counters(self.directory, True)
        self.views = {}  # views the fast adds hold (made read-only with the arrays at close)
        if self.desc["format_version"] < JUMPS_VERSION:
            self._upgrade()
        if self.fields is not None:
            self._map_data()
        result = recover_for_writer(self.path, self.counters, self.data, self.fields, self.num_envs,
                                    self.max_size, self.reserve_rows)
        s = result.state
        self.seen, self.base, self.draws, self.resets = s.seen, s.base, s.draws, s.resets
        for part in self.counted:  # the committed records recovery found, by checkpoint field name
            part.count = getattr(result, part.part.header)
        self.overlap = None  # frame stacks: which envs' last step advanced by one frame (None: unknown)
        self.checkpoint = result.checkpoint
        self.recovery_note = result.note
        for part in self.parts:
            part.recover(self.seen, self.base, self.checkpoint.generation, result.from_checkpoint)
        self._new_sampler(self.draws)
        self.counters.claim(os.getpid(), secrets.randbits(62))
        self.counters.sync()
        self.words = self.counters.words
        self.key = int(self.words[W_KEY])
        self.flusher.set_flush_limit()
        self.live = True
        forks.watch(self)

    def _upgrade(self) -> None:
        """A format 1 store becomes format 2: the files of each part that format brought
        (``Part.since``: the jump ring) are made, then ``store.json`` says 2 (the commit point;
        a crash before it makes them again). Transitions added before have the next states
        format 1 gave them."""
        if self.fields is not None:
            old = Geometry.of(self.desc, is_prioritized(self.desc))
            new = dataclasses.replace(old, format_version=JUMPS_VERSION)
            for part in PARTS:
                if part.since is not None and part.wanted(new) and not part.wanted(old):
                    part.create(self.directory, new)
        desc = dict(self.desc)
        desc["format_version"] = JUMPS_VERSION
        desc["fields"] = None if self.fields is None else {n: f.to_json() for n, f in self.fields.items()}
        desc["seed_entropy"] = str(desc["seed_entropy"])
        write_description(self.directory, desc)
        self._read_description()

    def state(self) -> ring.RingState:
        if self.pid != forks.PID:  # its counters are the parent's, moving on without it
            raise self._forked("read")
        return ring.RingState(self.seen, self.base, self.sampler.draws, self.resets)

    # ------------------------------------------------------------------ adding
    def add(self, state, action, reward, next_state, done, extra: dict) -> None:
        """The general add: any input the schema accepts, materialising the fields first
        on a store created without them. Every value is checked and converted before the
        first row is written; an exception at any point settles the step (``settle``)."""
        with self.mutex:
            self._enter("add")
            try:
                self.busy = sys._getframe()
                if self.fields is None:
                    self._materialize(state, action, reward, next_state, done, extra)
                self._write_step(self._coerced_values(state, action, reward, next_state, done, extra))
            except BaseException:
                self.settle()
                raise
            finally:
                self.busy = None

    def _enter(self, what: str) -> None:
        """Start a writing operation: refuse it in a closed or failed writer, or nested in
        another one of this thread (a signal handler); then settle any step left in flight."""
        if self._nested():
            raise ReentrantCallError(
                f"cannot {what}: an add, flush or reset of {self.path} is running in this thread "
                "(this call comes from a signal handler?); only close() may be called there")
        if not self.live:
            raise self.refusal(what)
        self.settle()

    def _nested(self) -> bool:
        """Whether this call runs inside an add, flush or reset of this thread (the mutex
        keeps other threads out), i.e. in a signal handler. ``busy`` is that operation's
        frame; one left set by an exception at the line that clears it is stale."""
        owner = self.busy
        if owner is None:
            return False
        frame = sys._getframe(2)
        while frame is not None:
            if frame is owner:
                return True
            frame = frame.f_back
        self.busy = None
        return False

    def _enter_read(self) -> None:
        if self._nested():
            raise ReentrantCallError(
                f"cannot read {self.path} while one of its adds, flushes or resets is running in this "
                "thread (a call from a signal handler?): the rows are half-written; only close() may be called there")
        self._check_open()
        self.settle()

    def _write_step(self, values: list) -> None:
        """Write one validated step (values in field order, next states last) and commit it.
        Each part sees the step through its step hooks (``OpenPart.plan_step`` and on, in
        ``PARTS`` order): the jump ring records the previous transitions' true next states
        where this step's states differ from them, the stack ring its bases."""
        n = self.num_envs
        seen = self.seen
        t_end = seen + n
        previous = self.data.ns[(seen // n) & 1]  # the other parity's area: this step leaves it intact
        step = Step(values, seen, self.base, n, previous, self.arrays, self.ws)
        parts = self.data.stepping
        over = False
        for part in parts:  # every part plans (the later ones read the earlier ones' results)
            over |= part.count + part.plan_step(step) > part.limit
        flusher = self.flusher
        if t_end > self.flush_before or over:
            self._flush_now()
        elif t_end > flusher.early_at:
            flusher.work_early()
        if self.closed:  # a signal handler closed the store during the flush or early work, and returned
            raise self.refusal("add")
        words = self.words
        begin_step(words, t_end)
        for part in parts:
            part.before_rows(step)
        start, fit = ring.step_slots(seen, self.base, self.max_size, n)
        storage = self.data.storage
        values = step.values
        for name, arr, value in zip(self.fields, self.arrays, values):
            order = storage.order(name)  # a frame-stack store's frames may lie env-major (roworder.py)
            arr[order.span(start, fit)] = value[:fit]
            if fit < n:  # the step wraps around the ring end
                arr[order.span(0, n - fit)] = value[fit:]
        try:
            counts = [part.after_rows(step, words) for part in parts]
        except DiskReplayError as exc:  # EIO: as after a failed sync, refuse writes until reopened; a full
            self.settle()               # disk (another program) only undoes the step: the writer goes on
            if not isinstance(exc, InsufficientSpaceError):  # once space is freed, nothing acknowledged lost
                self._fail(exc)
            raise
        self.data.ns[(t_end // n) & 1] = values[-1]
        commit_step(words, t_end, self.key)
        for part, count in zip(parts, counts):  # before seen: settle() takes an in-memory seen behind intent as stale
            part.count = count
        self.seen = t_end
        for part in parts:
            part.after_commit(step)

    def settle(self) -> None:
        """Finish a step an exception left in flight (``intent`` ahead of ``seen``): keep it
        if its commit completed (the check word vouches for it), else put back the rows it
        was overwriting from the undo reserve (the add then never happened). Idempotent;
        every operation calls it first, so a torn row is never read, flushed or closed over. After
        a signal handler's close() under it, its error on the closed files is StoreClosedError."""
        exc = sys.exc_info()[1] if self.closed else None
        if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit, StoreClosedError)):
            raise StoreClosedError(f"{self.path} was closed while this call ran (a signal handler's close()?); "
                                   "whether its step was added, reopening tells (seen_size)") from exc
        words = getattr(self, "words", None)
        if words is None or self.data is None:
            return
        intent = int(words[W_INTENT])
        if intent == self.seen:
            return
        self.overlap = None  # the next step starts its stacks afresh (bases)
        if int(words[W_CHECK]) ^ self.key == intent:
            for part in self.counted:  # committed; only the in-memory counts were behind
                part.count = int(words[part.part.word])
            self.seen = intent
            return
        restore_rows(self.data.storage, self.data.ckfile, self.checkpoint, self.seen, intent,
                     self.base, self.max_size)
        for part in self.counted:  # back to the state before the step, as recovery would make it
            part.record(words, part.count)
        words[W_SEEN] = self.seen
        words[W_INTENT] = self.seen

    def _coerced_values(self, state, action, reward, next_state, done, extra) -> list:
        missing = [name for name in self.extra_names if name not in extra]
        unknown = sorted(set(extra) - set(self.extra_names))
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing extra field(s) {', '.join(missing)}")
            if unknown:
                parts.append(f"unknown field(s) {', '.join(unknown)}")
            raise SchemaMismatchError(
                f"add: {'; '.join(parts)}; the store's fields are {', '.join(self.fields)}")
        given = {"states": state, "actions": action, "rewards": reward, "dones": done, **extra}
        n = self.num_envs
        specs = {**self.fields, "states": self.state_spec}
        values = [coerce(spec, given[name], n) for name, spec in specs.items()]
        values.append(coerce(_next_states_spec(specs), next_state, n))
        if n == 1:
            values = [v[np.newaxis] for v in values]
        return values

    def _materialize(self, state, action, reward, next_state, done, extra) -> None:
        """First add of a store created without ``fields``: infer them and create the data files."""
        given = {"states": state, "actions": action, "rewards": reward, "dones": done, **extra}
        specs = infer_fields(given, self.num_envs)
        check_row_sizes(specs)
        coerce(_next_states_spec(specs), next_state, self.num_envs)  # refuse a bad next state first
        k = self.frame_stack
        if k:  # stored as one frame per row (framestack.py)
            specs = {**specs, "states": frame_spec(specs["states"], k, SchemaMismatchError)}
        reserve = reserve_rows_for(specs, self.num_envs, self.max_size, self.desc["flush_every"])
        backend = get_backend(self.desc["backend"])
        check_file_names(specs)  # before remove_data_files could name another file
        try:
            create_data_files(self.directory, backend, specs, self.max_size, self.num_envs, reserve,
                              initial_checkpoint(specs, self.num_envs, state_spec(specs, k)), is_prioritized(self.desc),
                              k)
            desc = dict(self.desc)
            desc["fields"] = {n: s.to_json() for n, s in specs.items()}
            desc["reserve_rows"] = reserve
            desc["seed_entropy"] = str(desc["seed_entropy"])
            write_description(self.directory, desc)  # the commit point: the store now has fields
        except BaseException as exc:
            if read_description(self.directory, BACKENDS)["fields"] is None:
                remove_data_files(self.directory, backend, specs, is_prioritized(self.desc), k)
            else:  # interrupted after the commit point: the files are the store's now
                self._fail(exc)
            if isinstance(exc, OSError) and not isinstance(exc, DiskReplayError):
                raise io_error(f"creating the data files of {self.path}", exc) from exc
            raise
        try:
            self._read_description()
            self._map_data()
            self.checkpoint = self.data.ckfile.newest()
            for part in self.parts:
                part.recover(self.seen, self.base, self.checkpoint.generation, False)
            self.flusher.set_flush_limit()
        except BaseException as exc:
            self._fail(exc)  # half-opened: refuse writes; reopening opens the store as written
            raise

    def _map_data(self) -> None:
        super()._map_data()
        self.arrays = [self.data.storage.arrays[name] for name in self.fields]
        self.extra_names = tuple(name for name in self.fields if name not in CORE_FIELDS)

    # ------------------------------------------------------------------ the fast adds
    def bind_add(self):
        """The fastest safe ``add`` for the store as it is now, or None for the general one:
        a closure over locals is the cheapest Python can do per call."""
        if not self.live or self.fields is None:
            return None
        if self.frame_stack:
            return fast_stack_add(self) if self.num_envs == 1 else fast_stack_vector_add(self)
        return fast_add(self) if self.num_envs == 1 else fast_vector_add(self)

    # ------------------------------------------------------------------ reset and adopt
    def reset(self) -> None:
        """Empty the ring (``seen_size`` keeps counting), durably. An exception part-way
        leaves the ring as it was before the call (or, once the reset is flushed, empty)."""
        with self.mutex:
            self._enter("reset")
            try:
                self.busy = sys._getframe()
                self._reset()
            finally:
                self.busy = None

    def _reset(self) -> None:
        if self.fields is not None:
            self._flush_now()
        old_base, old_resets = self.base, self.resets
        try:
            self.counters.commit_state(self.seen, self.seen, self.sampler.draws, old_resets + 1)
            self.base, self.resets = self.seen, old_resets + 1
            if self.fields is not None:
                self._flush_now()
            else:
                self.counters.sync()
        except BaseException:
            if self.live and (self.checkpoint is None or self.checkpoint.base != self.seen):
                # not durable yet: undo it, so memory, counters and checkpoint agree
                self.counters.commit_state(self.seen, old_base, self.sampler.draws, old_resets)
                self.base, self.resets = old_base, old_resets
                for part in self.parts:  # with fields, its flush ran: a checkpoint exists
                    part.undo_reset(self.checkpoint.generation)
                self.flusher.set_flush_limit()
            raise

    def adopt(self, state: ring.RingState, ns_rows: np.ndarray | None, counts: dict | None = None) -> None:
        """Take over the counters, sampler position and ``ns_buffer`` of another store whose
        rows were copied into this one slot for slot (``convert``), and the records each
        counting part holds now (``counts``, by part name: what its ``copy_into`` wrote),
        then flush."""
        counts = counts or {}
        if ns_rows is not None:
            self.data.ns[(state.seen // self.num_envs) % 2] = ns_rows
        self.counters.commit_state(state.seen, state.base, state.draws, state.resets,
                                   **{part.part.header: counts.get(part.part.name) or 0 for part in self.counted})
        self.seen, self.base, self.resets = state.seen, state.base, state.resets
        for part in self.counted:
            part.count = counts.get(part.part.name) or 0
        self._new_sampler(state.draws)
        self.flusher.set_flush_limit()
        self.flush()

    def _drew(self) -> None:
        self.words[W_DRAWS] = self.sampler.draws

    # ------------------------------------------------------------------ flushing
    def flush(self) -> None:
        """Sync every data file, then write a new checkpoint; a failure leaves the writer failed."""
        with self.mutex:
            self._enter("flush")
            try:
                self.busy = sys._getframe()
                self._flush_now()
            finally:
                self.busy = None

    def _flush_now(self) -> None:
        try:
            self.flusher.flush()
        except DiskReplayError as exc:
            self._fail(exc)
            raise
        except OSError as exc:
            self._fail(exc)
            raise io_error(f"flushing {self.path}", exc) from exc

    def _fail(self, exc: BaseException) -> None:
        """After a failed sync nothing more is written: the disk may not hold what we think."""
        self.failed = exc
        self.live = False
        self.flusher.stop_early_work()

    # ------------------------------------------------------------------ closing
    def refusal(self, what: str) -> DiskReplayError:
        if self.closed:
            return StoreClosedError(f"cannot {what}: {self.path} is closed")
        if self.pid != os.getpid():
            return self._forked(what)
        return StoreIOError(f"cannot {what}: an earlier sync of {self.path} failed ({self.failed}); "
                            "the store refuses writes until it is reopened")

    def _forked(self, what: str) -> DiskReplayError:
        return forks.forked(self.path, self.pid, what)

    def _in_child(self) -> None:
        raise self._forked("read")

    def _before_close(self) -> None:
        if self.live:
            self.settle()
            self._flush_now()
            self.words[W_CLEAN] = 1
            self.words[W_PID] = 0
            self.counters.sync()

    def _release(self) -> None:
        self.live = False  # held references to the fast add must not store into the files
        if self.pid == os.getpid():
            self.flusher.stop()  # no early work job touches the files once they close
        # (a forked child has no early work thread: its copy of the flusher is dropped)
        # An add interrupted by a signal handler that closed the store resumes after the
        # handler returns: read-only views make its remaining stores raise, not write.
        held = list(getattr(self, "arrays", [])) + list(getattr(self, "views", {}).values())
        for arr in held + [getattr(self.data, "ns", None), getattr(self, "words", None)]:
            if arr is not None:
                arr.flags.writeable = False
        self.arrays = []
        self.words = None
        super()._release()


def _next_states_spec(specs: dict) -> FieldSpec:
    return FieldSpec("next_states", specs["states"].shape, specs["states"].dtype)
