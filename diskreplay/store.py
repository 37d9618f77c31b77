"""The ``DiskReplay`` facade: SLM-Lab's uniform replay memory, stored on disk.

A ``DiskReplay`` binds to one open session: a ``Writer`` (``writer.py``, mode ``r+``) or
a ``Reader`` (``reader.py``, mode ``r``); the facade checks arguments, delegates, and is
the one place that sets ``add`` (``_bind_add``). FORMAT.md describes the files.
"""
from __future__ import annotations

import numbers
import warnings
import weakref
from typing import Callable, Iterator

import numpy as np

from .core import ring
from .session.convert import convert_store
from .format.description import FORMAT_VERSION, MAX_SLOTS
from .episodereader import EpisodeReader
from .errors import InvalidArgumentError, NotPrioritizedError, RecoveryWarning, StoreClosedError
from .parts.stacks.ring import check_frame_stack, frame_spec
from .core.prefetch import Prefetcher
from .parts.priorities.args import check_beta, check_field_names, is_prioritized, settings_keys
from .format.directory import check_path
from .core.nstep import check_n_step
from .session.reader import Reader
from .core.schema import check_count, check_row_sizes, normalize_fields
from .session.base import Session
from .session.writer import Writer


class _DefaultBeta(float):
    """The type of ``sample``'s default ``beta`` (0.4): told apart by identity from a
    ``beta`` the caller passed, which a uniform store refuses."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "0.4"


DEFAULT_BETA = _DefaultBeta(0.4)


class DiskReplay:
    """A replay memory of ``max_size`` transitions in a store directory on disk.

    Create one with :meth:`create`, reopen it with :meth:`open`. Semantics are those of
    SLM-Lab's ``Replay`` with the wrap-around bug fixed, dtypes kept and a persisted
    sampler (README.md, "Semantics").
    """

    # ------------------------------------------------------------------ creation and opening
    @classmethod
    def create(cls, path, max_size, *, num_envs: int = 1, backend: str = "memmap", batch_size: int = 32,
               use_cer: bool = False, seed: int | None = None, fields: dict | None = None,
               overwrite: bool = False, flush_every: int | None = None, prioritized: bool = False,
               alpha: float = 0.6, epsilon: float = 1e-6, frame_stack: int | None = None) -> "DiskReplay":
        """Create an empty store at ``path`` (a directory) and open it for writing.

        ``fields`` declares ``{name: (shape, dtype)}`` for ``states``, ``actions``,
        ``rewards``, ``dones`` and any extras; without it, shapes and dtypes come from
        the first ``add`` (numpy data keeps its dtype; Python bool, int and float become
        bool, int64 and float32). ``flush_every`` flushes automatically every that many
        adds (default: only when the undo reserve requires it, on ``flush()`` and ``close()``).
        ``prioritized=True`` makes a prioritized store (``sample`` draws by priority and adds
        ``weights``; ``update_priorities`` stores ``(priority + epsilon) ** alpha``).
        ``frame_stack=k`` (at least 2): states are stacks of ``k`` frames, ``(k, *frame)``,
        newest last (Gymnasium's ``FrameStackObservation``); the store keeps one frame per
        transition where a state continues its env's previous one and whole states where it
        does not, and returns every state and next state exactly as given.
        """
        path = check_path(path, "path")
        max_size = check_count("max_size", max_size)
        if max_size > MAX_SLOTS:
            raise InvalidArgumentError(f"max_size must be at most {MAX_SLOTS}, got {max_size}")
        num_envs = check_count("num_envs", num_envs)
        batch_size = _check_batch_size(batch_size)
        if num_envs > max_size:
            raise InvalidArgumentError(f"num_envs ({num_envs}) must not exceed max_size ({max_size})")
        if flush_every is not None:
            flush_every = check_count("flush_every", flush_every)
        if not isinstance(use_cer, (bool, np.bool_)):
            raise InvalidArgumentError(f"use_cer must be True or False, got {use_cer!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise InvalidArgumentError(f"seed must be a non-negative integer or None, got {seed!r}")
        priority_keys = settings_keys(prioritized, alpha, epsilon)
        frame_stack = check_frame_stack(frame_stack)
        specs = normalize_fields(fields) if fields is not None else None
        if specs is not None:
            check_row_sizes(specs)
            if priority_keys:
                check_field_names(specs)
            if frame_stack:  # stored as one frame per row
                specs = {**specs, "states": frame_spec(specs["states"], frame_stack)}
        return cls(Writer.create(path, max_size=max_size, num_envs=num_envs, backend=backend,
                                 batch_size=batch_size, use_cer=bool(use_cer), entropy=ring.new_entropy(seed),
                                 specs=specs, overwrite=overwrite, flush_every=flush_every,
                                 priority_keys=priority_keys, frame_stack=frame_stack))

    @classmethod
    def open(cls, path, mode: str = "r+") -> "DiskReplay":
        """Open an existing store: ``mode="r+"`` to resume writing (one writer at a time),
        ``mode="r"`` to read only, alongside a live writer if there is one. A store whose
        last writer did not close it is recovered, with a ``RecoveryWarning`` saying how."""
        if mode not in ("r", "r+"):
            raise InvalidArgumentError(f"mode must be 'r' or 'r+', got {mode!r}")
        buf = cls((Writer if mode == "r+" else Reader)(check_path(path, "path")))
        if buf.recovery_note is not None:
            warnings.warn(buf.recovery_note, RecoveryWarning, stacklevel=2)
        return buf

    def __init__(self, session: Session):
        """Bind to an open session (use :meth:`create` or :meth:`open`)."""
        self._session = session
        desc = session.desc
        self.path = session.path
        self.mode = session.mode
        self.backend: str = desc["backend"]
        self.max_size: int = desc["max_size"]
        self.num_envs: int = desc["num_envs"]
        self.batch_size: int = desc["batch_size"]
        self.use_cer: bool = desc["use_cer"]
        self.format_version: int = desc["format_version"]
        self.flush_every: int | None = desc["flush_every"]
        self.prioritized: bool = is_prioritized(desc)
        self.alpha: float | None = desc.get("alpha") if self.prioritized else None
        self.epsilon: float | None = desc.get("epsilon") if self.prioritized else None
        self.frame_stack: int | None = desc.get("frame_stack")
        self.recovery_note: str | None = session.recovery_note
        self.batch_idxs: np.ndarray | None = None
        self._prefetchers = weakref.WeakSet()  # live batches() iterators, closed with the store
        self._bind_add()

    # ------------------------------------------------------------------ attributes
    def _state(self) -> ring.RingState:
        self._check_open()
        return self._session.state()

    @property
    def fields(self) -> dict | None:
        """``{name: (shape, dtype)}`` of the stored fields, None before the first add of an undeclared store."""
        specs = self._session.fields
        if specs is None:
            return None
        states = self._session.state_spec  # whole states, also in a frame-stack store
        return {n: (states.shape, states.dtype) if n == "states" else (s.shape, s.dtype) for n, s in specs.items()}

    @property
    def seen_size(self) -> int:
        """Transitions ever added (not reset by ``reset()``)."""
        return self._state().seen

    @property
    def generation(self) -> int:
        """Changes whenever the store is reset (``reset()``) or created anew over itself
        (``create(overwrite=True)``), never otherwise: a chronological read (``views``,
        ``stats``, ``episodes()``, ``export``) checks it after every block and stops with
        ``StoreResetError`` when it moved, so rows are never labelled with the transition
        numbers of another generation."""
        resets = self._state().resets
        return ((self._session.key & 0xFFFFFFFF) << 32) | resets

    @property
    def size(self) -> int:
        """Occupied slots, at most ``max_size``."""
        s = self._state()
        return ring.ring_size(s.seen, s.base, self.max_size)

    @property
    def head(self) -> int:
        """Slot of the newest transition, -1 when empty."""
        s = self._state()
        return ring.ring_head(s.seen, s.base, self.max_size)

    @property
    def ns_buffer(self) -> np.ndarray:
        """Next states of the newest ``num_envs`` transitions (a copy; empty when the store is)."""
        self._state()
        return self._session.ns_buffer()

    @property
    def last_flush_ns(self) -> int:
        """Time of the last completed flush (ns since the epoch), 0 if never flushed."""
        self._state()
        return self._session.last_flush_ns

    @property
    def closed(self) -> bool:
        return self._session.closed

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        if self.closed:
            return f"<DiskReplay {self.path!r} closed>"
        return (f"<DiskReplay {self.path!r} mode={self.mode!r} backend={self.backend!r} "
                f"size={self.size}/{self.max_size} seen_size={self.seen_size}>")

    # ------------------------------------------------------------------ writing
    def _bind_add(self) -> None:
        """The only place that sets ``add`` on the instance: the writer's fast add for the
        store as it is now (an instance attribute shadows the general method; a closure is
        the cheapest call Python has). Every add path takes the session's mutex itself, so a
        reference to ``buf.add`` taken at any time is as thread-safe as the method."""
        self.__dict__.pop("add", None)
        fast = self._session.bind_add()
        if fast is not None:
            fast.__doc__ = DiskReplay.add.__doc__
            self.add = fast

    def add(self, state, action, reward, next_state, done, **extra) -> None:
        """Add one environment step: ``num_envs`` transitions, env-major (leading env axis if num_envs > 1).

        When this returns, the step survives a crash of this process; it survives a power
        cut once ``flush()`` has returned. Bad input raises ``SchemaMismatchError`` and
        leaves the store as it was.
        """
        self._general_add(state, action, reward, next_state, done, **extra)

    def _general_add(self, state, action, reward, next_state, done, **extra) -> None:
        session = self._session
        had_fields = session.fields is not None
        try:
            session.add(state, action, reward, next_state, done, extra)
        finally:
            if not had_fields and session.fields is not None or not session.live:
                self._bind_add()  # fields just materialised, or the writer failed or closed

    def flush(self) -> None:
        """Make everything added so far survive a power cut (until later adds evict it).

        Syncs every data file and the ``ns_buffer`` first, then writes a new checkpoint
        (counters, sampler position, ``ns_buffer`` and undo copies of the rows the next
        adds will overwrite) and syncs it. A failed sync raises ``StoreIOError`` and the
        store refuses writes until it is reopened.
        """
        try:
            self._session.flush()
        finally:
            if not self._session.live:
                self._bind_add()

    def reset(self) -> None:
        """Empty the ring (``size`` 0, ``head`` -1, ``ns_buffer`` cleared) as the seed's
        ``reset`` does; ``seen_size`` keeps counting. Durable at once."""
        self._session.reset()

    # ------------------------------------------------------------------ reading
    def sample(self, batch_size: int | None = None, *, beta: float = DEFAULT_BETA, n_step: int = 1,
               gamma: float = 0.99) -> dict:
        """A batch of uniformly sampled transitions: a dict of arrays with keys
        ``states, actions, rewards, next_states, dones`` (and extras), in the order of
        ``self.batch_idxs``. With ``use_cer`` the last index is the newest transition.

        With ``n_step`` k > 1, each row is an n-step transition: ``rewards`` is the
        discounted sum over up to k transitions of the same env and episode (stopping
        after the first that ends it, or at the newest added), ``next_states``, ``dones``
        and extras are those of the last transition included, and ``discounts`` (float32)
        is ``gamma ** m``, m the number included. Float rewards keep their dtype, integer
        and bool rewards give float32 sums (``diskreplay/nstep.py``). Bad ``n_step`` or
        ``gamma`` raise ``InvalidArgumentError`` (``NStepTooLargeError`` when the ring
        cannot hold k transitions of one env) before the sampler advances.

        On a prioritized store slot ``i`` is drawn with probability ``p_i / sum_j p_j`` and
        the batch has ``weights`` (float32): ``(size * P(i)) ** -beta`` divided by the
        largest weight any slot could get, ``(p_i / min_j p_j) ** -beta``. ``beta`` must be
        in [0, 1]; passing it to a uniform store raises ``NotPrioritizedError``."""
        self._check_open()
        if beta is not DEFAULT_BETA:
            beta = self._checked_beta(beta)
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        # The defaults skip the checks (a W1 batch of 32 takes about 10 us); anything else,
        # arrays included, is checked before the sampler moves.
        if n_step.__class__ is not int or gamma.__class__ is not float or n_step != 1 or gamma != 0.99:
            n_step, gamma = check_n_step(n_step, gamma, self.max_size, self.num_envs)
        self.batch_idxs, batch = self._session.sample(batch_size, self.use_cer, n_step, gamma, beta)
        return batch

    def _checked_beta(self, beta) -> float:
        if not self.prioritized:
            raise NotPrioritizedError(f"beta applies to prioritized stores only; {self.path} was created "
                                      "without prioritized=True")
        return check_beta(beta)

    def update_priorities(self, idxs, priorities) -> None:
        """Set the priority of slots ``idxs`` from raw non-negative ``priorities`` (e.g. |TD
        error| of the last batch, ``batch_idxs``): slot ``i`` then holds ``p_i = (priority +
        epsilon) ** alpha``; of duplicate indices the last wins. Transitions added later get
        the largest ``p`` held so far (1.0 in an empty store). When this returns the new
        priorities survive a crash of this process; they survive a power cut once ``flush()``
        returned. Bad input (``InvalidPriorityError``, ``IndexOutOfRangeError``,
        ``NotPrioritizedError`` on a uniform store) leaves the store as it was."""
        self._check_open()
        if not self.prioritized:
            raise NotPrioritizedError(f"update_priorities needs a prioritized store; {self.path} was created "
                                      "without prioritized=True")
        self._session.update_priorities(idxs, priorities)

    def get(self, idxs, *, n_step: int = 1, gamma: float = 0.99, fields=None) -> dict:
        """The transitions at the given slot indices, as ``sample`` returns them (n-step
        rows when ``n_step > 1``, as ``sample`` describes); on a prioritized store with
        ``priorities``, each slot's stored ``p_i`` (float64). ``fields`` (names of fields,
        ``"next_states"`` and ``"priorities"`` among them if wanted) reads only those keys,
        in that order, for plain rows: a scan that does not use next states does not read
        them. The name ``"jumps"``
        adds a bool per row, True where the transition's next state is not its env's next
        state (an autoreset that ``dones`` may not mark), from the jump ring alone."""
        self._check_open()
        if fields is not None:
            return self._session.get_fields(idxs, self._checked_keys(fields, n_step))
        if n_step.__class__ is not int or gamma.__class__ is not float or n_step != 1 or gamma != 0.99:
            n_step, gamma = check_n_step(n_step, gamma, self.max_size, self.num_envs)
        return self._session.get(idxs, n_step, gamma)

    def _checked_keys(self, fields, n_step) -> tuple:
        if n_step != 1:
            raise InvalidArgumentError("fields= reads plain rows; it does not combine with n_step")
        names = (fields,) if isinstance(fields, str) else tuple(fields)
        known = list(self._session.fields or {}) + ["next_states", "jumps"] + (["priorities"] * self.prioritized)
        unknown = [name for name in names if not isinstance(name, str) or name not in known]
        if unknown or not names:
            raise InvalidArgumentError(f"fields must name some of {', '.join(known)}; got {list(names)!r}")
        return tuple(dict.fromkeys(names))

    def batches(self, batch_size: int | None = None, *, prefetch: int = 2, count: int | None = None,
                n_step: int = 1, gamma: float = 0.99, beta: float = DEFAULT_BETA):
        """An iterator of ``sample(batch_size, n_step=n_step, gamma=gamma, beta=beta)``
        batches prepared ``prefetch`` ahead in a background thread (``count`` batches, or
        until closed). Deterministic for a seeded store; use it as a context manager or call
        ``close()``. The thread takes the store's mutex for each batch, as every operation
        does, so a batch never mixes rows with a concurrent add. Batches prepared but not
        taken still advanced the sampler. On a prioritized store each batch also has
        ``idxs``, its slots: ``batch_idxs`` is the newest prepared batch's, not the one in
        hand, so pass ``batch["idxs"]`` to ``update_priorities``. When batches come from
        the disk (frames not in RAM), each also starts the reads of the next one, so the
        disk never idles between them; the indices drawn are the same as without it."""
        self._check_open()
        # Every argument is checked here, not in the thread, where an error would wait for next().
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        n_step, gamma = check_n_step(n_step, gamma, self.max_size, self.num_envs)
        if beta is not DEFAULT_BETA:
            beta = self._checked_beta(beta)

        def sample() -> dict:
            self._check_open()
            # The slots from the session itself: batch_idxs may already be another call's.
            idxs, batch = self._session.sample(batch_size, self.use_cer, n_step, gamma, beta, ahead=True)
            self.batch_idxs = idxs
            if self.prioritized:
                batch["idxs"] = idxs
            return batch
        prefetcher = Prefetcher(sample, prefetch=prefetch, count=count)
        self._prefetchers.add(prefetcher)
        return prefetcher

    def episodes(self, *, env: int | None = None) -> Iterator[dict]:
        """Every episode held in the ring (of ``env`` only, if given), for each env oldest
        first, streamed (memory bounded by the longest episode; safe beside a live writer).

        Each is a dict: ``env``, ``states`` (T+1 rows: its T states and the final next
        state), ``actions``, ``rewards``, ``dones`` and every extra field (T rows each),
        ``slots`` (T) and ``complete`` (False when the ring already overwrote its start,
        when a live writer overtook the read inside it, or when it has not ended yet).
        Episodes end as :func:`diskreplay.core.episodes.episode_ends` says, and where a next
        state is not the state of the env's next row."""
        self._check_open()
        return (ep.data for ep in EpisodeReader(self, env=env))

    def verify_rows(self, progress: Callable[[int], None] | None = None) -> tuple[int, list[int]]:
        """Check every row that was durable at the last flush against its CRC.

        Returns ``(rows checked, slots whose row is torn or damaged)``; rows added since
        the last flush have no CRC yet and are not counted. Reads each row once.
        """
        self._check_open()
        return self._session.verify_rows(progress)

    def _check_open(self) -> None:
        if self._session.closed:
            raise StoreClosedError(f"{self.path} is closed")

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Flush (writer), release the lock and unmap everything. Idempotent."""
        if self.closed:
            return
        try:
            # No background sample() while flushing and unmapping. From a signal handler in
            # any operation of this thread (an add, update_priorities, a sample) the prefetch
            # thread may be waiting for the mutex this thread holds: stop it without waiting
            # (it then finds the store closed). RLock._is_owned: the lock's own answer.
            wait = not self._session.mutex._is_owned()
            for prefetcher in list(self._prefetchers):
                prefetcher.close(wait=wait)
        finally:
            self.__dict__.pop("add", None)
            self._session.close()  # releases everything even when its flush fails

    def __enter__(self) -> "DiskReplay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ conversion
    @staticmethod
    def convert(src, dst, *, backend: str, progress: Callable[[int, int], None] | None = None,
                overwrite: bool = False, block_rows: int | None = None) -> None:
        """Copy the store at ``src`` to a new store at ``dst`` with another backend, with its
        counters, ``ns_buffer`` and sampler state, in row blocks (bounded memory).
        ``progress(done_rows, total_rows)`` is called after each block. ``src`` is only read
        (a store whose writer was killed as recovery would leave it); ``dst`` appears whole
        or not at all (built under a temporary name, renamed into place; a symlink refused)."""
        convert_store(src, dst, backend=backend, progress=progress, overwrite=overwrite,
                      block_rows=block_rows)


def _check_batch_size(batch_size) -> int:
    if batch_size.__class__ is int and 0 < batch_size <= MAX_SLOTS:  # the common case, without the ABC checks
        return batch_size
    batch_size = check_count("batch_size", batch_size)
    if batch_size > MAX_SLOTS:
        raise InvalidArgumentError(f"batch_size must be at most {MAX_SLOTS}, got {batch_size}")
    return batch_size


__all__ = ["DiskReplay", "FORMAT_VERSION"]
