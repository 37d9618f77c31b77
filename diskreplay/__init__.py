"""diskreplay: SLM-Lab's uniform replay memory on disk, crash-consistent and inspectable.

    from diskreplay import DiskReplay
    with DiskReplay.create("runs/cartpole.replay", 100_000, seed=0) as buf:
        buf.add(state, action, reward, next_state, done)
        batch = buf.sample()
"""
from .errors import (CorruptStoreError, DiskReplayError, EmptyStoreError, IncompleteStoreError,
                     IndexOutOfRangeError, InsufficientSpaceError, InvalidArgumentError, NotAStoreError,
                     ReadOnlyError, RecoveryWarning, SchemaMismatchError, StoreClosedError,
                     StoreExistsError, StoreIOError, StoreLockedError, StoreNotFoundError,
                     StorePermissionError, TornReadError, UnsupportedFormatError)
from .store import FORMAT_VERSION, DiskReplay

__version__ = "0.1.0"

__all__ = [
    "DiskReplay", "DiskReplayError", "FORMAT_VERSION", "CorruptStoreError", "EmptyStoreError",
    "IncompleteStoreError", "IndexOutOfRangeError", "InsufficientSpaceError", "InvalidArgumentError",
    "NotAStoreError", "ReadOnlyError", "RecoveryWarning", "SchemaMismatchError", "StoreClosedError",
    "StoreExistsError", "StoreIOError", "StoreLockedError", "StoreNotFoundError", "StorePermissionError",
    "TornReadError", "UnsupportedFormatError",
]
