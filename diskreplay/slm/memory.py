"""The drop-in memory classes: ``DiskReplay`` (SLM-Lab's ``Replay`` surface, picking its
interface by what it is given), ``DiskReplayV4``, ``DiskReplayV5`` and ``interface_for``."""
from __future__ import annotations

import warnings

import numpy as np

from ..errors import InterfaceMismatchError, MemorySpecError, PartialStepWarning
from .arguments import batch_count, bind, check_env_axis
from .fields import FieldTypes
from .partialstep import PartialStep
from .slotviews import NextStateView, SlotView, field_view
from .spec import MemorySpec

CORE_FIELDS = ("states", "actions", "rewards", "dones")


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
    """SLM-Lab's ``Replay`` memory over an on-disk store (see the package docstring).

    Public attributes as SLM-Lab's ``Replay`` has them: ``memory_spec``, ``body`` (v4) or
    ``agent`` (v5), ``batch_size`` (settable), ``max_size``, ``use_cer``, ``backend``,
    ``is_episodic``, ``ns_idx_offset``, ``data_keys``, ``batch_idxs``, ``size``,
    ``seen_size``, ``head``, ``ns_buffer`` and one read-only slot view per stored field
    (``states``, ``actions``, ``rewards``, ``dones``; v5 adds ``terminateds``,
    ``truncateds``); ``store`` is the underlying :class:`diskreplay.DiskReplay`.
    """

    slm_version = ""  # "v4" or "v5" on the concrete classes
    _spec_type = MemorySpec  # the prioritized drop-in reads two more keys
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
        self._field_names = CORE_FIELDS + self._extras
        self._value_names = ("states", "actions", "rewards", "next_states", "dones") + self._extras
        self.data_keys = list(self._value_names)
        spec = self._spec_type(memory_spec, self._field_names, self._extras, self.slm_version)
        self.batch_size = spec.settings["batch_size"]
        self._types = FieldTypes(spec.declared, self._field_names, self._value_names)
        self.store = spec.open_store(self.ns_idx_offset, self._owner_name)
        self._types.known = self.store.fields
        # transitions of a partial env step (add_experience, num_envs > 1)
        self._partial = PartialStep(self.store, self.ns_idx_offset, self._value_names)
        self._views = {name: SlotView(self, name) for name in self._field_names}
        self._ns_view = NextStateView(self)

    def _set_owner(self, owner) -> None:
        raise NotImplementedError

    def _algorithm(self):
        raise NotImplementedError

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
    size = property(lambda self: self._partial.size,
                    doc="Occupied slots, at most ``max_size`` (buffered transitions of a partial step included).")
    head = property(lambda self: self._partial.head, doc="Slot of the newest transition, -1 when empty.")
    seen_size = property(lambda self: self._partial.seen_size,
                         doc="Transitions ever added to this memory (``reset`` does not change it).")
    ns_buffer = property(lambda self: self._ns_view, doc="The next states of the newest ``ns_idx_offset`` "
                         "transitions, oldest first (read-only).")

    # ------------------------------------------------------------------ adding
    def update(self, *args, **kwargs) -> None:
        """Add one env step (v4: ``state, action, reward, next_state, done``; v5 adds
        ``terminated, truncated``). For a vector env each argument has a leading env axis and
        the step adds ``num_envs`` transitions, env-major; ``to_train`` is updated after each."""
        values = self._bind("update", args, kwargs)
        n = self.ns_idx_offset
        if n == 1:
            self._add_transition(values)
        elif self._partial or self._types.known is None:
            for row in zip(*check_env_axis(values, self._value_names, n)):
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

    def _bind(self, method: str, args: tuple, kwargs: dict) -> tuple:
        return bind(method, args, kwargs, self._arg_names, self.slm_version, self._chosen)

    def _add_transition(self, values: tuple) -> None:
        types = self._types
        if self.ns_idx_offset == 1:
            if types.known is None:
                converted = types.convert(values)
                values = tuple(converted[name] for name in self._value_names)
            self._store_add(values)
            if types.known is None:
                types.known = self.store.fields
        elif self._partial.push(types.convert(values, copy=True), self._store_add) and types.known is None:
            types.known = self.store.fields
            types.first = None
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

    # ------------------------------------------------------------------ reset, flush, close
    def reset(self) -> None:
        """Empty the memory as SLM-Lab's ``reset`` does: ``size`` 0, ``head`` -1, every slot
        view reads None, ``ns_buffer`` empty; ``seen_size`` keeps counting. The rows stay
        in the files until overwritten; the reset itself is durable at once. A partial step
        being buffered is dropped (it is counted in ``seen_size``, as SLM-Lab counts it)."""
        self._partial.drop(seen=True)
        self.store.reset()
        if self._types.known is None:
            self._types.first = None

    def flush(self) -> None:
        """Make every whole step added so far survive a power cut (a buffered partial step is not in the store)."""
        self.store.flush()

    def close(self) -> None:
        """Flush and close the store; a buffered partial step is dropped, with a warning."""
        if self._partial and not self.store.closed:
            k = self._partial.drop(seen=False)
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

    # ------------------------------------------------------------------ sampling and reading
    def sample(self) -> dict:
        """``batch_size`` transitions drawn uniformly from ``[0, size)``, as a dict of arrays
        keyed by ``data_keys`` (next states included), in the order of ``batch_idxs``."""
        self.batch_idxs, batch = self._draw(self.batch_size)
        return batch

    def sample_idxs(self, batch_size) -> np.ndarray:
        """Indices as ``sample`` draws them (from the same stream; it reads their rows too)."""
        return self._draw(batch_size)[0]

    def _draw(self, batch_size) -> tuple:
        batch_size = batch_count(batch_size)
        if self._partial:
            # The store's seeded sampler covers whole steps only: with a partial step buffered,
            # indices come from numpy's global generator, as SLM-Lab's Replay draws them.
            idxs = np.random.randint(self.size, size=batch_size).astype(np.int64)
            idxs = self._cer(idxs)
            return idxs, self._rows(idxs)
        batch = self.store.sample(batch_size)
        return self.store.batch_idxs.copy(), {key: batch[key] for key in self._value_names}

    def _cer(self, idxs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _specs(self):
        """``{name: (shape, dtype)}`` the values must have: the store's, or those resolved from the
        first transition while the store has none, or None before any transition."""
        return self._types.current()

    def _rows(self, idxs: np.ndarray) -> dict:
        """The transitions at slots ``idxs`` (each in ``[0, size)``), as ``sample`` returns them,
        a buffered partial step included."""
        return self._partial.rows(idxs, self._value_names, self._specs())

    def _next_state_rows(self) -> list:
        """The newest ``ns_idx_offset`` next states, oldest first."""
        return self._partial.next_state_rows()


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
        if self._partial or not self.use_cer:
            return super()._draw(batch_size)
        # One index more than needed from the store's stream (the store puts the head last,
        # its own CER); the first batch_size are uniform, as v5's CER expects them.
        batch = self.store.sample(batch_count(batch_size) + 1)
        uniform = self.store.batch_idxs[:-1].copy()
        idxs, num_new = self._apply_cer(uniform)
        batch = {key: batch[key][: len(uniform) - num_new] for key in self._value_names}
        if num_new:
            newest = self.store.get(idxs[-num_new:])
            batch = {key: np.concatenate([batch[key], newest[key]]) for key in self._value_names}
        return idxs, batch


for _name in CORE_FIELDS:
    setattr(DiskReplay, _name, field_view(_name))
for _name in DiskReplayV5._extras:
    setattr(DiskReplayV5, _name, field_view(_name))
del _name
