"""The memory spec of the SLM-Lab drop-in (SLM-Lab's agent spec ``memory``): ``MemorySpec``
checks its keys and declared fields, and opens the store at its ``path``: a store already
there is resumed once it agrees with the spec, else one is created."""
from __future__ import annotations

import numbers
import os
from collections.abc import Mapping

import numpy as np

from ..errors import MemorySpecError, NotAStoreError, StoreMismatchError, StoreNotFoundError
from ..store import DiskReplay as Store
from .fields import describe, parse_field


class MemorySpec:
    """A memory spec read for one SLM-Lab interface.

    ``settings`` holds ``path``, ``max_size``, ``batch_size`` and ``seed``, and ``use_cer``
    and ``backend`` only when the spec gives them (the store's values count otherwise);
    ``declared`` is ``{name: (shape, dtype)}`` from the spec's ``fields``, with the bool
    default of the interface's extra flags (v5's ``terminateds``, ``truncateds``)."""

    def __init__(self, memory_spec, field_names: tuple, extras: tuple, slm_version: str):
        self.field_names = field_names
        self.slm_version = slm_version
        self.settings = _read_settings(memory_spec)
        self.declared = self._read_fields(memory_spec.get("fields"), extras)

    def _read_fields(self, fields, extras: tuple) -> dict:
        """``{name: (shape, dtype)}`` declared by the spec's ``fields``, plus v5's bool defaults."""
        declared = {}
        if fields is not None:
            if not isinstance(fields, Mapping):
                raise MemorySpecError(
                    f"the memory spec's 'fields' must map a field name to [shape, dtype], got {fields!r}")
            for name, decl in fields.items():
                if name not in self.field_names:
                    raise MemorySpecError(
                        f"the memory spec's 'fields' names {name!r}; a {self.slm_version} memory stores "
                        f"{', '.join(self.field_names)} (next states are derived from states)")
                declared[name] = parse_field(name, decl)
        for name in extras:  # terminated/truncated flags are bool unless declared otherwise
            declared.setdefault(name, ((), np.dtype(bool)))
        return declared

    def open_store(self, num_envs: int, owner_name: str) -> Store:
        """The store at ``path`` for steps of ``num_envs`` envs: resumed if one is there (and
        agrees with the spec), else created, preallocated when every field is declared."""
        spec = self.settings
        path = spec["path"]
        try:
            store = Store.open(path, mode="r+")
        except (StoreNotFoundError, NotAStoreError):
            store = None  # nothing there yet (create says why if something is in the way)
        if store is not None:
            try:
                self._check_resumed(store, num_envs, owner_name)
            except BaseException:
                store.close()
                raise
            return store
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        complete = all(name in self.declared for name in self.field_names)
        return Store.create(path, spec["max_size"], num_envs=num_envs,
                            backend=spec.get("backend", "memmap"), batch_size=spec["batch_size"],
                            use_cer=spec.get("use_cer", False), seed=spec["seed"],
                            fields={n: self.declared[n] for n in self.field_names} if complete else None,
                            **self.create_options())

    def create_options(self) -> dict:
        """More keyword arguments of ``DiskReplay.create`` (the prioritized drop-in's)."""
        return {}

    def _check_resumed(self, store: Store, num_envs: int, owner_name: str) -> None:
        """Refuse a store that disagrees with the spec; keys the spec leaves out take the store's."""
        spec = self.settings
        problems = []
        if store.max_size != spec["max_size"]:
            problems.append(f"max_size: the store has {store.max_size}, the memory spec says {spec['max_size']}")
        if store.num_envs != num_envs:
            problems.append(f"num_envs: the store holds steps of {store.num_envs} envs, the "
                            f"{owner_name}'s env has {num_envs}")
        if "use_cer" in spec and bool(store.use_cer) != spec["use_cer"]:
            problems.append(
                f"use_cer: the store has {bool(store.use_cer)}, the memory spec says {spec['use_cer']}")
        if "backend" in spec and store.backend != spec["backend"]:
            problems.append(f"backend: the store is {store.backend!r}, the memory spec says {spec['backend']!r} "
                            "(DiskReplay.convert copies a store to the other backend)")
        fields = store.fields
        if fields is not None:
            if set(fields) != set(self.field_names):
                problems.append(
                    f"fields: the store has {', '.join(fields)}, a {self.slm_version} memory stores "
                    f"{', '.join(self.field_names)}")
            for name, (shape, dtype) in self.declared.items():
                if name in fields and (tuple(fields[name][0]), np.dtype(fields[name][1])) != (shape, dtype):
                    problems.append(f"fields[{name!r}]: the store has {describe(*fields[name])}, the memory spec "
                                    f"says {describe(shape, dtype)}")
        if problems:
            raise StoreMismatchError(
                f"{spec['path']} holds a store that disagrees with the memory spec: {'; '.join(problems)}. "
                "A store's max_size, num_envs, backend, use_cer and fields are fixed when it is created: "
                "make the spec agree with the store, or give another path")


def _read_settings(memory_spec) -> dict:
    """The spec's keys other than ``fields``, checked (``MemorySpec.settings``)."""
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
    return spec


def _spec_count(spec: Mapping, key: str) -> int:
    value = spec[key]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or \
            not float(value).is_integer() or value < 1:
        raise MemorySpecError(
            f"the memory spec's {key!r} must be a whole number >= 1 (1e6 is fine), got {value!r}")
    return int(value)
