"""diskreplay: SLM-Lab's uniform replay memory on disk, crash-consistent and inspectable.

    from diskreplay import DiskReplay
    with DiskReplay.create("runs/cartpole.replay", 100_000, seed=0) as buf:
        buf.add(state, action, reward, next_state, done)
        batch = buf.sample()

Module map (ARCHITECTURE.md has the rules): ``store`` is the ``DiskReplay`` facade over a
``writer`` or ``reader`` session (``session`` holds what they share); ``layout`` knows the
store directory; the files are owned by ``description`` (store.json), ``counters``
(meta.bin, the commit protocol), ``checkpoint`` (checkpoint.bin), ``rowsums``
(rowsums.npy), ``lock`` and the ``backends`` (data); ``recovery`` decides what state a
store is in; ``ring`` is the slot arithmetic and sampler; ``schema`` the fields;
``gather`` and ``rowreader`` read batches; ``fastadd`` the specialised adds; ``convert``
and ``verify`` work below the facade; ``views``, ``stats`` and ``export`` read stores
for any Python user (and the CLI); ``prioritized`` (with ``sumtree`` and
``priorityargs``) holds a prioritized store's priorities; ``slm`` is the SLM-Lab drop-in.
"""
from .errors import (CorruptStoreError, DiskReplayError, EmptyStoreError, EnvProtocolError, IncompleteStoreError,
                     IndexOutOfRangeError, InsufficientSpaceError, InterfaceMismatchError,
                     InvalidArgumentError, InvalidPriorityError, MemorySpecError, MissingDependencyError,
                     NotAStoreError, NotPrioritizedError, NStepTooLargeError, OutputExistsError, OvertakenError,
                     PartialStepWarning, ReadOnlyError, ReadOnlyViewError, RecoveryWarning,
                     ReentrantCallError,
                     SchemaMismatchError, SlotIndexError, StoreClosedError, StoreExistsError, StoreIOError,
                     StoreLockedError, StoreMismatchError, StoreNotFoundError, StorePermissionError,
                     TornReadError, UnsupportedFormatError)
from .store import FORMAT_VERSION, DiskReplay

__version__ = "0.1.0"

__all__ = ["DiskReplay", "FORMAT_VERSION", "CorruptStoreError", "DiskReplayError", "EmptyStoreError", "EnvProtocolError",
    "IncompleteStoreError", "IndexOutOfRangeError", "InsufficientSpaceError", "InterfaceMismatchError",
    "InvalidArgumentError", "InvalidPriorityError", "MemorySpecError", "MissingDependencyError", "NotAStoreError",
    "NotPrioritizedError",
    "NStepTooLargeError", "OutputExistsError", "OvertakenError", "PartialStepWarning",
    "ReadOnlyError", "ReadOnlyViewError", "RecoveryWarning", "ReentrantCallError", "SchemaMismatchError", "SlotIndexError",
    "StoreClosedError", "StoreExistsError", "StoreIOError", "StoreLockedError", "StoreMismatchError",
    "StoreNotFoundError", "StorePermissionError", "TornReadError", "UnsupportedFormatError"]
