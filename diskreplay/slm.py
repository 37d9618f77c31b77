"""A drop-in for SLM-Lab's ``Replay`` memory, backed by a diskreplay store.

Two SLM-Lab interfaces are supported, in one class that picks by what it is given:

- **v4** (SLM-Lab 4.0 to 4.2, the 2019 ``Replay`` this project calls the seed):
  ``DiskReplay(memory_spec, body)``, ``update(state, action, reward, next_state, done)``,
  ``add_experience(state, action, reward, next_state, done)``; the env is ``body.env``
  and the algorithm ``body.agent.algorithm``.
- **v5** (SLM-Lab 5.x): ``DiskReplay(memory_spec, agent)``,
  ``update(state, action, reward, next_state, done, terminated, truncated)`` and
  ``add_experience(*, state, ..., terminated, truncated)``; the env is ``agent.env`` and
  the algorithm ``agent.algorithm``. ``terminated`` and ``truncated`` are stored as the
  fields ``terminateds`` and ``truncateds``; CER follows v5's rule (``apply_cer``).

``DiskReplay(spec, x)`` is a :class:`DiskReplayV4` when ``x`` has an ``agent`` attribute
(a v4 body) and a :class:`DiskReplayV5` otherwise (a v5 agent, whose ``algorithm`` does
not exist yet while its memory is built); construct either class directly to choose.

    "memory": {"name": "DiskReplay", "batch_size": 32, "max_size": 1e6, "use_cer": false,
               "path": "runs/pong.replay", "backend": "memmap", "seed": 0,
               "fields": {"states": [[4, 84, 84], "uint8"], "rewards": [[], "float32"]}}

A ``path`` that holds a store is resumed (contents, counters, sampler); one that
disagrees with the spec is refused with :class:`StoreMismatchError`. SLM-Lab itself is not
imported: the body or agent only needs ``env.is_venv``, ``env.num_envs`` and an
algorithm with ``training_start_step``, ``training_frequency`` and ``to_train``. README.md,
"SLM-Lab drop-in", has the details and what differs from SLM-Lab's own ``Replay``.
"""
from __future__ import annotations

import numbers
import operator
import os
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from .errors import (InterfaceMismatchError, InvalidArgumentError, MemorySpecError, NotAStoreError,
                     PartialStepWarning, ReadOnlyViewError, SchemaMismatchError, SlotIndexError,
                     StoreMismatchError, StoreNotFoundError)
from .store import DiskReplay as _Store

__all__ = ["DiskReplay", "DiskReplayV4", "DiskReplayV5", "InterfaceMismatchError", "MemorySpecError",
           "PartialStepWarning", "ReadOnlyViewError", "SlotIndexError", "StoreMismatchError"]

_CORE = ("states", "actions", "rewards", "dones")
_NUMERIC = "biuf"
_CHUNK = 4096  # slots read per store.get when iterating over a whole view


def interface_for(owner) -> type:
    """The drop-in class for the object SLM-Lab passes to a memory: a v4 body (it has
    ``.agent``) or a v5 agent (it has ``.env`` and no ``.agent``)."""
    if hasattr(owner, "agent"):
        return DiskReplayV4
    if hasattr(owner, "env"):
        return DiskReplayV5
    raise InterfaceMismatchError(
        f"cannot tell the SLM-Lab version from a {type(owner).__name__}: pass SLM-Lab v4's body "
        "(with .env and .agent) or v5's agent (with .env); or construct DiskReplayV4 / DiskReplayV5")


class DiskReplay:
    """SLM-Lab's ``Replay`` memory over an on-disk store (see the module docstring).

    Public attributes as SLM-Lab's ``Replay`` has them: ``memory_spec``, ``body`` (v4) or
    ``agent`` (v5), ``batch_size`` (settable), ``max_size``, ``use_cer``, ``backend``,
    ``is_episodic``, ``ns_idx_offset``, ``data_keys``, ``batch_idxs``, ``size``,
    ``seen_size``, ``head``, ``ns_buffer`` and one read-only slot view per stored field
    (``states``, ``actions``, ``rewards``, ``dones``; v5 adds ``terminateds``,
    ``truncateds``); ``store`` is the underlying :class:`diskreplay.DiskReplay`.
    """

    slm_version = ""  # "v4" or "v5" on the concrete classes
    _arg_names: tuple = ()
    _extras: tuple = ()

    def __new__(cls, memory_spec=None, owner=None, *args, **kwargs):
        auto = cls is DiskReplay
        if auto:
            cls = interface_for(owner)
        memory = super().__new__(cls)
        memory._chosen = (("it was given a body (an object with .agent)" if cls is DiskReplayV4 else
                           "it was given an agent (an object with .env and no .agent)")
                          if auto else f"it is a {cls.__name__}")
        return memory

    def __init__(self, memory_spec, owner):
        self._set_owner(owner)
        env = getattr(owner, "env", None)
        if env is None:
            raise InterfaceMismatchError(
                f"the {self._owner_name} given to {type(self).__name__} has no .env; SLM-Lab {self.slm_version} "
                f"passes its {self._owner_name}, whose env has is_venv and num_envs")
        self.memory_spec = memory_spec
        self.is_venv = bool(getattr(env, "is_venv", False))
        self.ns_idx_offset = int(env.num_envs) if self.is_venv else 1
        self.is_episodic = False
        self.batch_idxs = None
        self._field_names = _CORE + self._extras
        self._value_names = ("states", "actions", "rewards", "next_states", "dones") + self._extras
        self.data_keys = list(self._value_names)
        spec = self._read_spec(memory_spec)
        self.batch_size = spec["batch_size"]
        self._pending: list[dict] = []  # transitions of a partial env step (add_experience, num_envs > 1)
        self._unstored = 0  # transitions a reset dropped from a partial step (seen, never stored)
        self._first_specs = None  # field specs resolved from the first transition, until the store has them
        self._known = None  # the store's fields once it has them
        self.store = self._open_store(spec)
        self._known = self.store.fields
        self._views = {name: SlotView(self, name) for name in self._field_names}
        self._ns_view = NextStateView(self)

    # ------------------------------------------------------------------ construction
    def _set_owner(self, owner) -> None:
        raise NotImplementedError

    def _algorithm(self):
        raise NotImplementedError

    def _read_spec(self, memory_spec) -> dict:
        if not isinstance(memory_spec, Mapping):
            raise MemorySpecError(f"memory_spec must be a dict (SLM-Lab's agent spec 'memory'), got "
                                  f"{type(memory_spec).__name__}")
        missing = [key for key in ("path", "max_size", "batch_size") if key not in memory_spec]
        if missing:
            raise MemorySpecError(
                f"the memory spec lacks {', '.join(map(repr, missing))}; a diskreplay memory needs "
                "'path' (the store's directory), 'max_size' and 'batch_size', e.g. "
                '{"name": "DiskReplay", "batch_size": 32, "max_size": 1e6, "path": "runs/pong.replay"}')
        spec = {"path": memory_spec["path"], "max_size": _spec_count(memory_spec, "max_size"),
                "batch_size": _spec_count(memory_spec, "batch_size")}
        try:
            spec["path"] = os.fspath(spec["path"])
        except TypeError:
            raise MemorySpecError(
                f"the memory spec's 'path' must be a path string, got {spec['path']!r}") from None
        if "use_cer" in memory_spec:
            use_cer = memory_spec["use_cer"]
            if not isinstance(use_cer, (bool, np.bool_)):
                raise MemorySpecError(f"the memory spec's 'use_cer' must be true or false, got {use_cer!r}")
            spec["use_cer"] = bool(use_cer)
        if "backend" in memory_spec:
            if not isinstance(memory_spec["backend"], str):
                raise MemorySpecError(f"the memory spec's 'backend' must be a name such as \"memmap\" or "
                                      f"\"hdf5\", got {memory_spec['backend']!r}")
            spec["backend"] = memory_spec["backend"]
        spec["seed"] = memory_spec.get("seed")
        self._declared = self._read_fields(memory_spec.get("fields"))
        return spec

    def _read_fields(self, fields) -> dict:
        """``{name: (shape, dtype)}`` declared by the spec's ``fields``, plus v5's bool defaults."""
        declared = {}
        if fields is not None:
            if not isinstance(fields, Mapping):
                raise MemorySpecError(
                    f"the memory spec's 'fields' must map a field name to [shape, dtype], got {fields!r}")
            for name, decl in fields.items():
                if name not in self._field_names:
                    raise MemorySpecError(
                        f"the memory spec's 'fields' names {name!r}; a {self.slm_version} memory stores "
                        f"{', '.join(self._field_names)} (next states are derived from states)")
                declared[name] = _parse_field(name, decl)
        for name in self._extras:  # terminated/truncated flags are bool unless declared otherwise
            declared.setdefault(name, ((), np.dtype(bool)))
        return declared

    def _open_store(self, spec) -> _Store:
        path = spec["path"]
        try:
            store = _Store.open(path, mode="r+")
        except (StoreNotFoundError, NotAStoreError):
            store = None  # nothing there yet (create says why if something is in the way)
        if store is not None:
            try:
                self._check_resumed(store, spec)
            except BaseException:
                store.close()
                raise
            return store
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        complete = all(name in self._declared for name in self._field_names)
        return _Store.create(path, spec["max_size"], num_envs=self.ns_idx_offset,
                             backend=spec.get("backend", "memmap"), batch_size=spec["batch_size"],
                             use_cer=spec.get("use_cer", False), seed=spec["seed"],
                             fields={n: self._declared[n] for n in self._field_names} if complete else None)

    def _check_resumed(self, store: _Store, spec: dict) -> None:
        """Refuse a store that disagrees with the spec; keys the spec leaves out take the store's."""
        problems = []
        if store.max_size != spec["max_size"]:
            problems.append(f"max_size: the store has {store.max_size}, the memory spec says {spec['max_size']}")
        if store.num_envs != self.ns_idx_offset:
            problems.append(f"num_envs: the store holds steps of {store.num_envs} envs, the "
                            f"{self._owner_name}'s env has {self.ns_idx_offset}")
        if "use_cer" in spec and bool(store.use_cer) != spec["use_cer"]:
            problems.append(
                f"use_cer: the store has {bool(store.use_cer)}, the memory spec says {spec['use_cer']}")
        if "backend" in spec and store.backend != spec["backend"]:
            problems.append(f"backend: the store is {store.backend!r}, the memory spec says {spec['backend']!r} "
                            "(DiskReplay.convert copies a store to the other backend)")
        fields = store.fields
        if fields is not None:
            if set(fields) != set(self._field_names):
                problems.append(
                    f"fields: the store has {', '.join(fields)}, a {self.slm_version} memory stores "
                    f"{', '.join(self._field_names)}")
            for name, (shape, dtype) in self._declared.items():
                if name in fields and (tuple(fields[name][0]), np.dtype(fields[name][1])) != (shape, dtype):
                    problems.append(f"fields[{name!r}]: the store has {_describe(*fields[name])}, the memory spec "
                                    f"says {_describe(shape, dtype)}")
        if problems:
            raise StoreMismatchError(
                f"{spec['path']} holds a store that disagrees with the memory spec: {'; '.join(problems)}. "
                "A store's max_size, num_envs, backend, use_cer and fields are fixed when it is created: "
                "make the spec agree with the store, or give another path")

    # ------------------------------------------------------------------ fixed attributes
    max_size = property(lambda self: self.store.max_size, doc="Slots of the ring (fixed at creation).")
    use_cer = property(lambda self: bool(self.store.use_cer), doc="Whether CER is applied (fixed at creation).")
    backend = property(lambda self: self.store.backend, doc="The store's backend, 'memmap' or 'hdf5'.")

    @max_size.setter
    def max_size(self, value):
        raise MemorySpecError(f"max_size is fixed when the store is created ({self.store.max_size} at "
                              f"{self.store.path}); create a store at another path for another size")

    @use_cer.setter
    def use_cer(self, value):
        raise MemorySpecError(f"use_cer is fixed when the store is created ({self.use_cer} at {self.store.path}); "
                              "create a store at another path to change it")

    # ------------------------------------------------------------------ counters, as SLM-Lab's Replay shows them
    @property
    def size(self) -> int:
        """Occupied slots, at most ``max_size`` (buffered transitions of a partial step included)."""
        k = len(self._pending)
        return self.store.size if not k else min(self.store.size + k, self.store.max_size)

    @property
    def head(self) -> int:
        """Slot of the newest transition, -1 when empty."""
        k = len(self._pending)
        return self.store.head if not k else (self.store.head + k) % self.store.max_size

    @property
    def seen_size(self) -> int:
        """Transitions ever added to this memory (``reset`` does not change it)."""
        return self.store.seen_size + self._unstored + len(self._pending)

    @property
    def ns_buffer(self) -> "NextStateView":
        """The next states of the newest ``ns_idx_offset`` transitions, oldest first (read-only)."""
        return self._ns_view

    # ------------------------------------------------------------------ adding
    def update(self, *args, **kwargs) -> None:
        """Add one env step (v4: ``state, action, reward, next_state, done``; v5 adds
        ``terminated, truncated``). For a vector env each argument has a leading env axis and
        the step adds ``num_envs`` transitions, env-major; ``to_train`` is updated after each."""
        values = self._bind("update", args, kwargs)
        n = self.ns_idx_offset
        if n == 1:
            self._add_transition(values)
        elif self._pending or self._known is None:
            for row in zip(*self._per_env(values)):
                self._add_transition(row)
        else:
            self._add_step(values)

    def add_experience(self, *args, **kwargs) -> None:
        """Add one transition (v4: ``state, action, reward, next_state, done``; v5 adds
        ``terminated, truncated``, by keyword as SLM-Lab v5 passes them, or by position).

        With ``num_envs > 1`` the store takes whole env steps: transitions are buffered in
        this process until ``num_envs`` of them form a step, which is then written as one.
        ``size``, ``seen_size``, ``head``, the views, ``ns_buffer`` and ``sample`` include
        the buffered ones; a crash loses them (README.md, "SLM-Lab drop-in")."""
        self._add_transition(self._bind("add_experience", args, kwargs))

    def _add_transition(self, values: tuple) -> None:
        if self.ns_idx_offset == 1:
            if self._known is None:
                converted = self._convert(values)
                values = tuple(converted[name] for name in self._value_names)
            self._store_add(values)
            if self._known is None:
                self._known = self.store.fields
        else:
            converted = self._convert(values, copy=True)
            pending = self._pending
            pending.append(converted)
            if len(pending) == self.ns_idx_offset:
                try:
                    self._store_add(tuple(np.stack([t[name] for t in pending]) for name in self._value_names))
                except BaseException:
                    pending.pop()  # as if this transition had not been given
                    raise
                pending.clear()
                if self._known is None:
                    self._known = self.store.fields
                    self._first_specs = None
        self._train_check()

    def _add_step(self, values: tuple) -> None:
        """A whole vector-env step with nothing buffered: one store add, then the seed's
        ``to_train`` rule after each of its transitions."""
        seen, head, m = self.seen_size, self.store.head, self.store.max_size
        self._store_add(values)
        algorithm = self._algorithm()
        for e in range(1, self.ns_idx_offset + 1):
            if algorithm.to_train:
                break  # ``to_train or ...`` keeps it as it is
            algorithm.to_train = (seen + e > algorithm.training_start_step
                                  and (head + e) % m % algorithm.training_frequency == 0)

    def _store_add(self, values: tuple) -> None:
        if self._extras:
            self.store.add(*values[:5], **dict(zip(self._extras, values[5:])))
        else:
            self.store.add(*values)

    def _train_check(self) -> None:
        """SLM-Lab's rule, after each transition: ``to_train = to_train or (seen_size >
        training_start_step and head % training_frequency == 0)`` (a set flag is left as it is)."""
        algorithm = self._algorithm()
        if not algorithm.to_train:
            algorithm.to_train = (self.seen_size > algorithm.training_start_step
                                  and self.head % algorithm.training_frequency == 0)

    def _bind(self, method: str, args: tuple, kwargs: dict) -> tuple:
        """The values of ``args`` and ``kwargs`` in the interface's argument order, or a clear error."""
        names = self._arg_names
        if not kwargs and len(args) == len(names):
            return args
        if not args and len(kwargs) == len(names):
            try:
                return tuple(kwargs[name] for name in names)
            except KeyError:
                pass
        given = len(args) + len(kwargs)
        rest = dict(kwargs)
        values = list(args[: len(names)])
        missing = []
        for name in names[len(values):]:
            if name in rest:
                values.append(rest.pop(name))
            else:
                missing.append(name)
        duplicated = [name for name in names[: len(args)] if name in rest]
        problems = []
        if len(args) > len(names):
            problems.append(f"{len(args) - len(names)} argument(s) too many")
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if duplicated:
            problems.append(f"{', '.join(duplicated)} given twice")
        unknown = [name for name in rest if name not in duplicated]
        if unknown:
            problems.append(f"unexpected {', '.join(unknown)}")
        if not problems:
            return tuple(values)
        other = "v5" if self.slm_version == "v4" else "v4"
        raise InterfaceMismatchError(
            f"{method}() got {given} argument(s) ({'; '.join(problems)}); this memory follows SLM-Lab "
            f"{self.slm_version}'s interface, {method}({', '.join(names)}), because {self._chosen}. "
            f"SLM-Lab v4 passes a body and calls update(state, action, reward, next_state, done); v5 passes "
            f"the agent and adds terminated, truncated. For {other}'s interface construct "
            f"DiskReplay{other.upper()} or pass what {other} passes")

    def _per_env(self, values: tuple) -> tuple:
        n = self.ns_idx_offset
        for name, value in zip(self._value_names, values):
            if len(np.shape(value)) == 0 or np.shape(value)[0] != n:
                raise SchemaMismatchError(
                    f"{name}: got shape {np.shape(value)}; a step of a vector env of {n} envs has a leading "
                    f"env axis of {n} (use add_experience for one transition)")
        return values

    def _specs(self):
        """``{name: (shape, dtype)}`` the values must have: the store's, or those resolved from the
        first transition while the store has none, or None before any transition."""
        return self._known if self._known is not None else self._first_specs

    def _convert(self, values: tuple, copy: bool = False) -> dict:
        """One transition checked and converted to the field dtypes (declared, stored, or
        inferred as the store infers them: numpy data keeps its dtype, Python bool, int and
        float become bool, int64 and float32), with the store's rules for what it refuses."""
        given = dict(zip(self._value_names, values))
        specs = self._specs()
        resolved = specs is None
        if resolved:
            specs = {}
            for name in self._field_names:
                specs[name] = self._declared[name] if name in self._declared else (
                    tuple(np.shape(given[name])), _inferred_dtype(name, given[name]))
        out = {}
        for name in self._value_names:
            shape, dtype = specs["states" if name == "next_states" else name]
            out[name] = _as_field(name, given[name], tuple(shape), np.dtype(dtype), copy)
        if resolved:
            self._first_specs = specs
        return out

    # ------------------------------------------------------------------ reset, flush, close
    def reset(self) -> None:
        """Empty the memory as SLM-Lab's ``reset`` does: ``size`` 0, ``head`` -1, every slot
        view reads None, ``ns_buffer`` empty; ``seen_size`` keeps counting. The rows stay
        in the files until overwritten; the reset itself is durable at once. A partial step
        being buffered is dropped (it is counted in ``seen_size``, as SLM-Lab counts it)."""
        self._unstored += len(self._pending)
        self._pending.clear()
        self.store.reset()
        if self._known is None:
            self._first_specs = None

    def flush(self) -> None:
        """Make every whole step added so far survive a power cut (a buffered partial step is not in the store)."""
        self.store.flush()

    def close(self) -> None:
        """Flush and close the store; a buffered partial step is dropped, with a warning."""
        if self._pending and not self.store.closed:
            k = len(self._pending)
            self._pending.clear()
            warnings.warn(PartialStepWarning(
                f"{self.store.path}: close() dropped {k} transition(s) of a partial step of "
                f"{self.ns_idx_offset} envs given by add_experience; only whole steps reach the store"),
                stacklevel=2)
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.store.closed:
            return f"<{type(self).__name__} {self.store.path!r} closed>"
        return (f"<{type(self).__name__} {self.store.path!r} size={self.size}/{self.max_size} "
                f"seen_size={self.seen_size} head={self.head}>")

    # ------------------------------------------------------------------ sampling
    def sample(self) -> dict:
        """``batch_size`` transitions drawn uniformly from ``[0, size)``, as a dict of arrays
        keyed by ``data_keys`` (next states included), in the order of ``batch_idxs``."""
        self.batch_idxs, batch = self._draw(self.batch_size)
        return batch

    def sample_idxs(self, batch_size) -> np.ndarray:
        """Indices as ``sample`` draws them (from the same stream; it reads their rows too)."""
        return self._draw(batch_size)[0]

    def _draw(self, batch_size) -> tuple:
        batch_size = _batch_count(batch_size)
        if self._pending:
            # The store's seeded sampler covers whole steps only: with a partial step buffered,
            # indices come from numpy's global generator, as SLM-Lab's Replay draws them.
            idxs = np.random.randint(self.size, size=batch_size).astype(np.int64)
            idxs = self._cer(idxs)
            return idxs, self._rows(idxs)
        batch = self.store.sample(batch_size)
        return self.store.batch_idxs.copy(), {key: batch[key] for key in self.data_keys}

    def _cer(self, idxs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _rows(self, idxs: np.ndarray) -> dict:
        """The transitions at slots ``idxs`` (each in ``[0, size)``), as ``sample`` returns them,
        a buffered partial step included."""
        k = len(self._pending)
        if not k:
            batch = self.store.get(idxs)
            return {key: batch[key] for key in self.data_keys}
        m, n, committed_head = self.store.max_size, self.ns_idx_offset, self.store.head
        where = (idxs - committed_head - 1) % m  # position in the buffered step, for its slots
        buffered = where < k
        stored = ~buffered
        got = self.store.get(idxs[stored]) if stored.any() else None
        specs = self._specs()
        batch = {}
        for key in self.data_keys:
            shape, dtype = specs["states" if key == "next_states" else key]
            out = np.empty((len(idxs),) + tuple(shape), dtype)
            if got is not None:
                out[stored] = got[key]
            for pos in np.flatnonzero(buffered):
                out[pos] = self._pending[where[pos]][key]
            batch[key] = out
        if got is not None:
            # A stored transition whose next state is the state of a buffered one (n later).
            follower = (idxs[stored] + n - committed_head - 1) % m
            for pos, j in zip(np.flatnonzero(stored)[follower < k], follower[follower < k]):
                batch["next_states"][pos] = self._pending[j]["states"]
        return batch

    def _slot_values(self, name: str, slots: np.ndarray) -> list:
        """The values of field ``name`` at ``slots`` (each in ``[0, max_size)``); None past ``size``."""
        filled = slots < self.size
        values = [None] * len(slots)
        if filled.any():
            column = self._rows(slots[filled])[name]
            for pos, row in zip(np.flatnonzero(filled), column):
                values[pos] = row
        return values

    def _next_state_rows(self) -> list:
        """The newest ``ns_idx_offset`` next states, oldest first."""
        k = len(self._pending)
        rows = []
        if self.store.size:
            stored = self.store.ns_buffer
            rows = [stored[i] for i in range(k, self.ns_idx_offset)]
        return rows + [t["next_states"] for t in self._pending]


class DiskReplayV4(DiskReplay):
    """The drop-in with SLM-Lab v4's interface (the 2019 ``Replay``): ``(memory_spec, body)``,
    ``update(state, action, reward, next_state, done)``; CER makes the last index ``head``."""

    slm_version = "v4"
    _arg_names = ("state", "action", "reward", "next_state", "done")
    _owner_name = "body"

    def __init__(self, memory_spec, body):
        super().__init__(memory_spec, body)

    def _set_owner(self, owner) -> None:
        self.body = owner

    def _algorithm(self):
        return self.body.agent.algorithm

    def _cer(self, idxs: np.ndarray) -> np.ndarray:
        if self.use_cer:
            idxs[-1] = self.head
        return idxs


class DiskReplayV5(DiskReplay):
    """The drop-in with SLM-Lab v5's interface: ``(memory_spec, agent)``,
    ``update(state, action, reward, next_state, done, terminated, truncated)``; CER replaces
    the last indices by the transitions added since the last sample (``apply_cer``)."""

    slm_version = "v5"
    _arg_names = ("state", "action", "reward", "next_state", "done", "terminated", "truncated")
    _extras = ("terminateds", "truncateds")
    _owner_name = "agent"

    def __init__(self, memory_spec, agent):
        super().__init__(memory_spec, agent)
        # v5's CER cursor (moved only by CER). It lives in this process only: with CER, a
        # reopened store starts it at the head, as if every stored transition had been
        # sampled once (README.md).
        self.last_sample_head = self.head if self.use_cer else -1

    def _set_owner(self, owner) -> None:
        self.agent = owner

    def _algorithm(self):
        return self.agent.algorithm

    def reset(self) -> None:
        super().reset()
        self.last_sample_head = -1

    def apply_cer(self, batch_idxs) -> np.ndarray:
        """v5's CER: replace the last indices by the transitions added since the last sample
        (at most ``len(batch_idxs)`` and ``size``), oldest first; advances ``last_sample_head``."""
        return self._apply_cer(np.asarray(batch_idxs, dtype=np.int64))[0]

    def _apply_cer(self, idxs: np.ndarray) -> tuple:
        m = self.store.max_size
        num_new = min((self.head - self.last_sample_head) % m, len(idxs), self.size)
        if num_new <= 0:
            return idxs, 0
        new = (self.last_sample_head + 1 + np.arange(num_new, dtype=np.int64)) % m
        self.last_sample_head = (self.last_sample_head + num_new) % m
        return np.concatenate([idxs[: len(idxs) - num_new], new]), num_new

    def _cer(self, idxs: np.ndarray) -> np.ndarray:
        return self._apply_cer(idxs)[0] if self.use_cer else idxs

    def _draw(self, batch_size) -> tuple:
        if self._pending or not self.use_cer:
            return super()._draw(batch_size)
        # One index more than needed from the store's stream (the store puts the head last,
        # its own CER); the first batch_size are uniform, as v5's CER expects them.
        batch = self.store.sample(_batch_count(batch_size) + 1)
        uniform = self.store.batch_idxs[:-1].copy()
        idxs, num_new = self._apply_cer(uniform)
        batch = {key: batch[key][: len(uniform) - num_new] for key in self.data_keys}
        if num_new:
            newest = self.store.get(idxs[-num_new:])
            batch = {key: np.concatenate([batch[key], newest[key]]) for key in self.data_keys}
        return idxs, batch


def _field_view(name: str) -> property:
    def get(self):
        return self._views[name]

    def refuse(self, value):
        raise ReadOnlyViewError(
            f"memory.{name} is a read-only view of the store at {self.store.path}; transitions are added "
            "with memory.update(...) (one env step) or memory.add_experience(...) (one transition)")

    return property(get, refuse, doc=f"Read-only view of the {name} slots (``len`` is ``max_size``).")


for _name in _CORE:
    setattr(DiskReplay, _name, _field_view(_name))
for _name in DiskReplayV5._extras:
    setattr(DiskReplayV5, _name, _field_view(_name))
del _name


# ---------------------------------------------------------------------- views
class SlotView(Sequence):
    """One field's slots, read like SLM-Lab's ``[None] * max_size`` list: ``len`` is
    ``max_size``; ``view[i]`` is slot ``i``'s value (numpy, the stored dtype) for
    ``0 <= i < size`` and None from ``size`` on; negative indices count from ``max_size``;
    a slice gives a list; an integer array gives an array (of objects if it reaches a
    slot past ``size``). Read-only: assignment raises :class:`ReadOnlyViewError`."""

    __slots__ = ("_memory", "_name")

    def __init__(self, memory: DiskReplay, name: str):
        self._memory = memory
        self._name = name

    def __len__(self) -> int:
        return self._memory.max_size

    def __getitem__(self, key):
        memory, name = self._memory, self._name
        slots, form = _slots(key, memory.max_size, f"memory.{name}", "slot")
        values = memory._slot_values(name, slots)
        if form is None:
            return values[0]
        if form == "list":
            return values
        specs = memory._specs()
        return _stack(values, form, specs[name] if specs else None)

    def __iter__(self):
        memory, m = self._memory, self._memory.max_size
        for start in range(0, m, _CHUNK):
            yield from memory._slot_values(self._name, np.arange(start, min(start + _CHUNK, m), dtype=np.int64))

    def __setitem__(self, key, value):
        raise ReadOnlyViewError(
            f"memory.{self._name} is read-only (a view of the store at {self._memory.store.path}); add "
            "transitions with memory.update(...) (one env step) or memory.add_experience(...) (one transition)")

    def __delitem__(self, key):
        self.__setitem__(key, None)

    def __repr__(self) -> str:
        return f"<read-only view of {self._name!r}: {self._memory.size} of {len(self)} slots filled>"


class NextStateView(Sequence):
    """SLM-Lab's ``ns_buffer``, read-only: the next states of the newest ``ns_idx_offset``
    transitions, oldest first (fewer right after a reset)."""

    __slots__ = ("_memory",)

    def __init__(self, memory: DiskReplay):
        self._memory = memory

    def __len__(self) -> int:
        return len(self._memory._next_state_rows())

    def __getitem__(self, key):
        rows = self._memory._next_state_rows()
        idxs, form = _slots(key, len(rows), "memory.ns_buffer", "entry")
        values = [rows[i] for i in idxs]
        if form is None:
            return values[0]
        if form == "list":
            return values
        specs = self._memory._specs()
        return _stack(values, form, specs["states"] if specs else None)

    def __iter__(self):
        return iter(self._memory._next_state_rows())

    def _refuse(self, *args, **kwargs):
        raise ReadOnlyViewError(
            "memory.ns_buffer is read-only (it follows the store); next states are given to "
            "memory.update(...) or memory.add_experience(...)")

    __setitem__ = __delitem__ = append = appendleft = extend = clear = pop = _refuse

    def __repr__(self) -> str:
        return f"<read-only ns_buffer: {len(self)} of {self._memory.ns_idx_offset} next states>"


# ---------------------------------------------------------------------- helpers
def _slots(key, length: int, what: str, unit: str):
    """``(indices in [0, length), form)``: form None for one index, "list" for a slice,
    else the shape of the index array."""
    if isinstance(key, slice):
        return np.arange(*key.indices(length), dtype=np.int64), "list"
    if isinstance(key, (np.ndarray, list, tuple)):
        arr = np.asarray(key)
        if arr.ndim == 0:
            key = arr.item()
        else:
            if arr.size == 0:
                arr = arr.astype(np.int64)
            if arr.dtype.kind not in "iu":
                raise InvalidArgumentError(
                    f"{what}: an index array must hold integers, got {arr.dtype} "
                    "(boolean masks are not supported)")
            flat = arr.astype(np.int64).reshape(-1)
            _check_range(flat, length, what, unit)
            return flat % length if length else flat, arr.shape
    try:
        i = operator.index(key)
    except TypeError:
        raise InvalidArgumentError(
            f"{what}: indices must be integers, slices or integer arrays, not {type(key).__name__}") from None
    flat = np.array([i], dtype=np.int64)
    _check_range(flat, length, what, unit)
    return flat % length, None


def _check_range(idxs: np.ndarray, length: int, what: str, unit: str) -> None:
    bad = idxs[(idxs < -length) | (idxs >= length)]
    if bad.size:
        extra = (" (slots from size on read as None)" if unit == "slot" else "")
        raise SlotIndexError(
            f"{what}: {unit} index {bad[0]} is out of range; it has {length} {unit}s, so use an index in "
            f"[-{length}, {length}){extra}")


def _stack(values: list, shape: tuple, spec):
    """Values of an index-array read as one array: of the field's dtype if every slot is
    filled, else of objects (None where a slot is past ``size``)."""
    if all(v is not None for v in values):
        if values:
            return np.stack(values).reshape(shape + np.shape(values[0]))
        if spec is not None:
            return np.empty(shape + tuple(spec[0]), spec[1])
        return np.empty(shape)
    out = np.empty(len(values), dtype=object)
    for pos, value in enumerate(values):
        out[pos] = value
    return out.reshape(shape)


def _batch_count(batch_size) -> int:
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)


def _spec_count(spec: Mapping, key: str) -> int:
    value = spec[key]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or \
            not float(value).is_integer() or value < 1:
        raise MemorySpecError(
            f"the memory spec's {key!r} must be a whole number >= 1 (1e6 is fine), got {value!r}")
    return int(value)


def _parse_field(name: str, decl):
    if isinstance(decl, Mapping):
        shape, dtype = decl.get("shape"), decl.get("dtype")
    else:
        try:
            shape, dtype = decl
        except (TypeError, ValueError):
            raise MemorySpecError(
                f"the memory spec's fields[{name!r}] must be [shape, dtype], e.g. [[4], \"float32\"] or "
                f"[[], \"int64\"], got {decl!r}") from None
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise MemorySpecError(
            f"the memory spec's fields[{name!r}] has shape {shape!r}; a shape is a list of sizes, [] for a scalar")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        dt = None
    if dt is None or dt.kind not in _NUMERIC or dt.fields is not None or dt.subdtype is not None:
        raise MemorySpecError(
            f"the memory spec's fields[{name!r}] has dtype {dtype!r}; use a bool, integer or float dtype "
            "such as \"bool\", \"int64\", \"uint8\" or \"float32\"")
    return tuple(int(d) for d in shape), dt


def _inferred_dtype(name: str, value) -> np.dtype:
    """The store's inference: numpy data keeps its dtype; Python bool/int/float become bool/int64/float32."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype
    try:
        kind = np.asarray(value).dtype.kind
    except (TypeError, ValueError):
        kind = "O"
    if kind == "b":
        return np.dtype(bool)
    if kind in "iu":
        return np.dtype(np.int64)
    if kind == "f":
        return np.dtype(np.float32)
    raise SchemaMismatchError(
        f"{name}: got non-numeric data ({type(value).__name__}); fields must be bool, int or float")


def _as_field(name: str, value, shape: tuple, dtype: np.dtype, copy: bool) -> np.ndarray:
    """``value`` as an array of ``shape`` and ``dtype``, refusing what would change the data
    (floats into integer or bool fields, integers out of range, wrong shapes): the rules the
    store applies to ``add``, applied here to transitions the drop-in handles itself."""
    where = f"{name}: the memory stores {_describe(shape, dtype)}"
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise SchemaMismatchError(f"cannot read {type(value).__name__} as an array; {where}") from None
    if arr.dtype.kind not in _NUMERIC:
        raise SchemaMismatchError(f"got non-numeric data ({arr.dtype}); {where}")
    if arr.shape != shape:
        raise SchemaMismatchError(f"got shape {arr.shape}; {where}")
    if arr.dtype != dtype:
        if dtype.kind != "f":
            if arr.dtype.kind == "f":
                raise SchemaMismatchError(f"got float data ({arr.dtype}) for an integer or bool field; {where}")
            if dtype.kind == "b":
                if arr.size and not np.isin(arr, (0, 1)).all():
                    raise SchemaMismatchError(f"got values other than 0/1 for a bool field; {where}")
            elif arr.size:
                info = np.iinfo(dtype)
                if arr.min() < info.min or arr.max() > info.max:
                    raise SchemaMismatchError(f"values [{arr.min()}, {arr.max()}] do not fit {dtype}; {where}")
        return arr.astype(dtype)
    return arr.copy() if copy and arr is value else arr


def _describe(shape, dtype) -> str:
    return f"shape {tuple(shape)} {np.dtype(dtype)}"
