"""The exceptions diskreplay raises on purpose.

Every error derives from :class:`DiskReplayError`; where a builtin exception
fits, the subclass inherits it too, so ``except FileNotFoundError`` keeps
working for code that does not know diskreplay.
"""


class DiskReplayError(Exception):
    """Base class of every error diskreplay raises on purpose."""


class InvalidArgumentError(DiskReplayError, ValueError):
    """An argument to a diskreplay function is out of range or of the wrong kind."""


class NStepTooLargeError(InvalidArgumentError):
    """``n_step`` asks for longer chains of one env's transitions than the store's ring can hold."""


class SchemaMismatchError(DiskReplayError, ValueError):
    """Data passed to ``add`` does not match the store's field shapes or dtypes."""


class StoreNotFoundError(DiskReplayError, FileNotFoundError):
    """No store exists at the given path."""


class StoreExistsError(DiskReplayError, FileExistsError):
    """A store (or other content) already exists where one would be created."""


class NotAStoreError(DiskReplayError):
    """The path exists but is not a diskreplay store."""


class IncompleteStoreError(DiskReplayError):
    """The store was never completely created (its creator died half-way)."""


class CorruptStoreError(DiskReplayError):
    """A file of the store is damaged, truncated or does not match the description."""


class UnsupportedFormatError(DiskReplayError):
    """The store was written by a format version this diskreplay does not read."""


class StoreLockedError(DiskReplayError, BlockingIOError):
    """Another live process holds the store open for writing (or another object of this
    process does: then ``in_this_process`` is True)."""

    in_this_process = False


class ReadOnlyError(DiskReplayError, PermissionError):
    """A write was attempted on a store opened read-only (or that cannot be written)."""


class StorePermissionError(DiskReplayError, PermissionError):
    """The operating system refused access to a file of the store."""


class EmptyStoreError(DiskReplayError, LookupError):
    """The operation needs transitions but the store holds none."""


class IndexOutOfRangeError(DiskReplayError, IndexError):
    """A slot index lies outside ``[0, size)``."""


class InsufficientSpaceError(DiskReplayError, OSError):
    """The filesystem has not enough free space for the store."""


class StoreIOError(DiskReplayError, OSError):
    """An I/O operation of the store failed; a writer refuses further writes until reopened."""


class StoreClosedError(DiskReplayError):
    """The store was used after ``close()``."""


class ForkedStoreError(DiskReplayError, RuntimeError):
    """A store opened for writing was used in a forked child process: only the process that
    opened it writes or reads through it. The child may ``close()`` it (which releases
    only the child's copies) and open the store with ``mode="r"`` to read it."""


class ReentrantCallError(DiskReplayError, RuntimeError):
    """A store method was called while an ``add``, ``flush`` or ``reset`` of the same store
    was running in the same thread (from a signal handler): only ``close()`` may be."""


class TornReadError(DiskReplayError):
    """A reader kept racing the writer on the same rows and gave up."""


class OvertakenError(TornReadError):
    """A live writer overwrote rows of a chronological read before they were read."""


class StoreResetError(DiskReplayError, RuntimeError):
    """The store was reset (or re-created) while a chronological read was under way: its
    rows belong to another generation than the read's snapshot; read again."""


class RecoveryWarning(UserWarning):
    """Opening the store needed recovery (journal replay or rollback to the last flush)."""


# ---------------------------------------------------------------- the SLM-Lab drop-in (slm.py)
class MemorySpecError(InvalidArgumentError):
    """An SLM-Lab memory spec given to the drop-in lacks a required key or has a bad value."""


class StoreMismatchError(InvalidArgumentError):
    """The store found at a path disagrees with what the caller asked for (its max_size,
    num_envs, backend, use_cer or fields, which are fixed when a store is created)."""


class InterfaceMismatchError(DiskReplayError, TypeError):
    """A call does not match the SLM-Lab interface in use (e.g. ``update`` with v4's five
    arguments on a memory that follows v5's seven)."""


class ReadOnlyViewError(DiskReplayError, TypeError):
    """Assignment into a read-only view of a store (e.g. ``memory.states[0] = x``)."""


class SlotIndexError(IndexOutOfRangeError):
    """An index into a view lies outside ``[-len(view), len(view))``."""


class PartialStepWarning(UserWarning):
    """Transitions buffered until every env had one for a whole store step were dropped by
    ``close()`` and never reached the store: a partial env step of the SLM-Lab drop-in
    (``add_experience`` with num_envs > 1), or the waiting transitions of
    ``diskreplay.gym.RecordVectorTransitions`` under a next-step autoreset."""


class DuplicateShardError(InvalidArgumentError):
    """Two shards of a ``diskreplay.ray.ShardedReplay`` were given the same store (path on the same node)."""


class ShardMismatchError(SchemaMismatchError):
    """The shards of a ``ShardedReplay`` disagree on their fields or ``num_envs``, so their rows
    cannot be sampled into one batch."""


class UnknownNodeError(InvalidArgumentError):
    """A Ray node id given for a shard is not a live node of the cluster."""


class ShardUnavailableError(DiskReplayError, RuntimeError):
    """No shard of a ``ShardedReplay`` answered (all dead or restarting), or the one asked for is down."""


class ShardUnavailableWarning(UserWarning):
    """A shard stopped answering and is left out of sampling until Ray restarts it."""


class OutputExistsError(DiskReplayError, FileExistsError):
    """An export's output (a file, or a Minari dataset) exists and replacing it was not asked for."""


class MissingDependencyError(DiskReplayError, ImportError):
    """A feature needs an optional package that is not installed; the message says which extra to install."""


class NotPrioritizedError(InvalidArgumentError):
    """``update_priorities`` or ``beta`` on a store created without ``prioritized=True``."""


class InvalidPriorityError(InvalidArgumentError):
    """Priorities that are negative, NaN or infinite, or not one per index."""


class EnvProtocolError(InvalidArgumentError):
    """An environment an integration records (``sb3``, ``gym``) does not fit what it can
    store: a space a store cannot hold (Dict, Tuple, Text, ...), an autoreset mode it does not
    support, or a step that breaks the Gymnasium protocol (a step before ``reset()``, a
    same-step autoreset without its final observation in ``infos``)."""
