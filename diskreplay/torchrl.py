"""TorchRL: ``DiskReplayStorage``, a replay buffer ``Storage`` whose rows live in a store.

    from torchrl.data import ReplayBuffer, RandomSampler
    from diskreplay.torchrl import DiskReplayStorage
    rb = ReplayBuffer(storage=DiskReplayStorage("runs/rb.replay", 100_000), sampler=RandomSampler(),
                      batch_size=256)

Rows are the TensorDicts a collector produces, one transition each. ``observation`` is
the store's ``states``, ``action`` its ``actions``, ``("next", "reward")`` and
``("next", "done")`` its ``rewards`` and ``dones``; every other leaf is an extra field
named by its key joined with ``__`` (``("next", "truncated")`` is ``next__truncated``).
``("next", "observation")`` is not stored twice: it is the next row's observation, and
where it is not (episode ends, interleaved envs) the store's jump ring
(``parts/jumps.py``) keeps the true one, so ``get`` gives back exactly what was written.
A ``<path>.finals`` side store that earlier versions kept beside the store is ignored:
never opened, read nor removed (README.md, "Integrations"). The storage appends (a
round-robin writer's cursor is kept in step with the store); ``dumps``/``loads``,
``state_dict`` and pickling hold the store's path and position only (unpickling reopens
the store as its writer if nobody holds it, else read-only beside its writer). Importing this module imports
torchrl, tensordict and torch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection
from torchrl.data.replay_buffers.storages import StoreStorage

from .errors import InvalidArgumentError, SchemaMismatchError, StoreLockedError, StoreMismatchError, StoreNotFoundError
from .store import DiskReplay

STATE_FILE = "diskreplay_storage.json"  # what dumps() writes: the store's path and position
_SEP = "__"
# Keys whose plain name is taken by the store (its fields, add's arguments): stored as "done__" etc.,
# a name no key gives otherwise (no part of a key contains the separator).
_TAKEN = {"state", "action", "reward", "next_state", "done", "states", "actions", "rewards", "dones", "next_states"}


def _name_of(key) -> str:
    """The store's field name for a TensorDict key."""
    key = (key,) if isinstance(key, str) else tuple(key)
    if any(part.startswith("_") or _SEP in part or not part.isidentifier() for part in key):
        raise SchemaMismatchError(
            f"DiskReplayStorage cannot store the key {key!r}: each part must be a Python identifier "
            f"without '{_SEP}' that does not start with '_'; rename it (e.g. with a RenameTransform)")
    name = _SEP.join(key)
    return name + _SEP if name in _TAKEN else name


def _key_of(name: str):
    """The TensorDict key of a field name (the inverse of ``_name_of``)."""
    if name.endswith(_SEP):
        return name[: -len(_SEP)]
    parts = tuple(name.split(_SEP))
    return parts[0] if len(parts) == 1 else parts


# StoreStorage (TorchRL's storage on an external store) is the base so that ReplayBuffer picks
# the identity collate, as for its own storages: get() already returns a batched TensorDict.
class DiskReplayStorage(StoreStorage):
    """A TorchRL ``Storage`` of ``max_size`` transitions in a diskreplay store at ``path``.

    An existing store at ``path`` resumes; otherwise it is created at the first write,
    with the fields of that TensorDict (``backend``, ``seed``, ``flush_every`` as in
    ``DiskReplay.create``). ``observation_key`` names the observation ("observation").
    """

    def __init__(self, path, max_size: int, *, observation_key: str = "observation", backend: str = "memmap",
                 seed: int | None = None, flush_every: int | None = None):
        self._setup(path, max_size, observation_key, {"backend": backend, "seed": seed, "flush_every": flush_every})
        try:
            self._attach_store(DiskReplay.open(self.path, mode="r+"))
        except StoreNotFoundError:
            pass

    def _setup(self, path, max_size: int, observation_key: str, options: dict) -> None:
        super(StoreStorage, self).__init__(max_size=max_size)  # StoreStorage's own __init__ needs redis
        self.path = os.fspath(path)
        self.observation_key = observation_key
        self._options = options
        self.names = {"states": _name_of(observation_key), "actions": _name_of("action"), "rewards": "next__reward",
                      "dones": "next__done"}
        self._next_obs = ("next", observation_key)
        self.store: DiskReplay | None = None

    def _attach_store(self, store: DiskReplay) -> None:
        if store.max_size != self.max_size or store.num_envs != 1:
            store.close()
            raise StoreMismatchError(
                f"the store at {self.path} has max_size {store.max_size} and num_envs {store.num_envs}; "
                f"DiskReplayStorage({self.max_size}) needs max_size {self.max_size} and num_envs 1")
        self.store = store

    @property
    def initialized(self) -> bool:
        return self.store is not None

    # ------------------------------------------------------------------ writing
    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Append ``data`` (one transition or a batch) at the store's next slots."""
        if not set_cursor:
            raise InvalidArgumentError("DiskReplayStorage appends only: rows cannot be overwritten in place "
                                       "(write_at, storage[i] = ...); extend the buffer instead")
        if not is_tensor_collection(data):
            raise SchemaMismatchError(f"DiskReplayStorage stores TensorDicts, got {type(data).__name__}")
        if data.batch_dims == 0:
            data = data.unsqueeze(0)
        if data.batch_dims != 1:
            raise SchemaMismatchError(f"DiskReplayStorage takes a batch of transitions with one batch dimension, "
                                      f"got batch size {tuple(data.batch_size)}; reshape(-1) it first")
        rows = self._rows(data)
        if self.store is None:
            self._create(rows)
        self._check(rows)
        # Each row's own next observation goes to add: where the next row does not start from
        # it, the store's jump ring keeps it.
        states, next_states = rows.pop("states"), rows.pop("next_states")
        store = self.store
        extras = [name for name in rows if name not in ("actions", "rewards", "dones")]
        for j in range(len(states)):
            store.add(states[j], rows["actions"][j], rows["rewards"][j], next_states[j], rows["dones"][j],
                      **{name: rows[name][j] for name in extras})
        self._bump_mutation_revision()
        self._sync_writers()

    def _rows(self, data) -> dict:
        """``{field name: numpy rows}`` of a batch, ``states`` and ``next_states`` included."""
        rows = {}
        for key, value in data.items(include_nested=True, leaves_only=True):
            if not isinstance(value, torch.Tensor):
                raise SchemaMismatchError(f"DiskReplayStorage stores tensors only; {key!r} holds {type(value).__name__}")
            rows[_name_of(key)] = value.detach().cpu().numpy()
        renamed = {}
        for field, name in list(self.names.items()) + [("next_states", _name_of(self._next_obs))]:
            if name not in rows:
                raise SchemaMismatchError(f"DiskReplayStorage needs the key {_key_of(name)!r} in every transition; "
                                          f"got the keys {sorted((_key_of(k) for k in rows), key=str)}")
            renamed[field] = rows.pop(name)
        renamed.update(rows)
        return renamed

    def _create(self, rows: dict) -> None:
        fields = {name: (arr.shape[1:], arr.dtype) for name, arr in rows.items() if name != "next_states"}
        options = dict(self._options)
        if options["seed"] is None:  # torch.manual_seed makes the store's stream reproducible too
            options["seed"] = int(torch.randint(0, 2**62, ()).item())
        self._attach_store(DiskReplay.create(self.path, self.max_size, fields=fields, **options))

    def _check(self, rows: dict) -> None:
        have = {n: (tuple(s), np.dtype(d)) for n, (s, d) in self.store.fields.items()}
        have["next_states"] = have["states"]
        got = {n: (tuple(a.shape[1:]), a.dtype) for n, a in rows.items()}
        if have != got:
            def show(fields):
                return ", ".join(f"{_key_of(self.names.get(n, n)) if n != 'next_states' else self._next_obs!r} "
                                 f"{s} {d}" for n, (s, d) in sorted(fields.items()))
            raise StoreMismatchError(f"the store at {self.path} holds {show(have)}; the data has {show(got)}")

    def _sync_writers(self) -> None:
        """Keep each attached buffer's round-robin cursor at the store's next slot (it starts
        at 0 in a new buffer over a resumed store, and loads() may restore an older one)."""
        cursor = (self.store.head + 1) % self.max_size
        for buffer in self._attached_entities:
            writer = getattr(buffer, "_writer", None)
            if writer is not None and hasattr(writer, "_cursor"):
                writer._cursor = cursor

    def attach(self, buffer) -> None:
        super().attach(buffer)
        if self.store is not None:
            writer = getattr(buffer, "_writer", None)
            if writer is not None and hasattr(writer, "_cursor"):
                writer._cursor = (self.store.head + 1) % self.max_size

    # ------------------------------------------------------------------ reading
    def get(self, index):
        """The transitions at ``index`` (an int, a slice, or a sequence or tensor of ints)."""
        if self.store is None:
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")
        scalar = isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0)
        if isinstance(index, slice):
            idxs = np.arange(len(self))[index]
        else:
            idxs = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index).reshape(-1)
        if idxs.dtype.kind == "i":
            idxs = np.where(idxs < 0, idxs + len(self), idxs)
        batch = self.store.get(idxs)
        out = TensorDict({}, batch_size=[len(idxs)])
        for name, arr in batch.items():
            key = self._next_obs if name == "next_states" else _key_of(self.names.get(name, name))
            out.set(key, torch.from_numpy(np.ascontiguousarray(arr)))
        return out[0] if scalar else out

    def __len__(self) -> int:
        return 0 if self.store is None else self.store.size

    def contains(self, item):
        size = len(self)
        if isinstance(item, int):
            return 0 <= (item + size if item < 0 else item) < size
        item = torch.as_tensor(item)
        return (item >= -size) & (item < size)

    def _empty(self) -> None:
        if self.store is not None:
            self.store.reset()
        self._bump_mutation_revision()

    # ------------------------------------------------------------------ checkpoints: a reference, not a copy
    def flush(self) -> None:
        """Make every transition written so far survive a power cut."""
        if self.store is not None:
            self.store.flush()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def state_dict(self) -> dict:
        self.flush()
        return {"path": os.path.abspath(self.path),
                "seen_size": None if self.store is None else self.store.seen_size}

    def load_state_dict(self, state_dict: dict) -> None:
        path = state_dict["path"]
        if self.store is None or os.path.realpath(path) != os.path.realpath(self.path):
            self.close()
            self.path, self.store = path, None
            if state_dict["seen_size"] is not None:
                self._attach_store(DiskReplay.open(path, mode="r+"))
        self._bump_mutation_revision()

    def dumps(self, path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / STATE_FILE).write_text(json.dumps(self.state_dict()))

    def loads(self, path) -> None:
        self.load_state_dict(json.loads((Path(path) / STATE_FILE).read_text()))

    # ------------------------------------------------------------------ pickling: by path
    def __getstate__(self) -> dict:
        """A reference, as TorchRL's storages pickle to cross process boundaries: the path
        and the options (the rows stay in the store, flushed first)."""
        if self.store is not None and not self.store.closed and self.store.mode == "r+":
            self.store.flush()
        return {"path": os.path.abspath(self.path), "max_size": self.max_size,
                "observation_key": self.observation_key, "options": dict(self._options)}

    def __setstate__(self, state: dict) -> None:
        """Reopen the store: as its writer when nobody holds it (the pickler closed it, or it
        was never created: then the first write creates it), else read-only beside the
        writer, which keeps it (reads work, writes raise ReadOnlyError)."""
        self._setup(state["path"], state["max_size"], state["observation_key"], dict(state["options"]))
        try:
            self._attach_store(DiskReplay.open(self.path, mode="r+"))
        except StoreNotFoundError:
            pass
        except StoreLockedError:  # the pickler (this process or another) still writes it: read beside it
            self._attach_store(DiskReplay.open(self.path, mode="r"))

    def __repr__(self) -> str:
        return f"DiskReplayStorage({self.path!r}, max_size={self.max_size}, size={len(self)})"


__all__ = ["DiskReplayStorage"]
