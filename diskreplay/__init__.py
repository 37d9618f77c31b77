"""diskreplay: SLM-Lab's uniform replay memory on disk, crash-consistent and inspectable.

    from diskreplay import DiskReplay
    with DiskReplay.create("runs/cartpole.replay", 100_000, seed=0) as buf:
        buf.add(state, action, reward, next_state, done)
        batch = buf.sample()

Module map (ARCHITECTURE.md has the rules and a row per module). The top level holds the
public modules, whose import paths are API: ``store`` (the ``DiskReplay`` facade),
``errors``, ``views``, ``stats``, ``verify``, ``chrono`` and ``episodereader`` (reading
stores for any Python user and the CLI), ``export`` (npz, HDF5, D4RL, Minari) and the
drop-ins ``slm``, ``sb3``, ``torchrl``, ``gym`` and ``ray``. Below them, one kind of thing
per folder, each importing only the floors beneath it:

- ``core/``: the replay semantics without files (ring, schema, episodes, n-step);
- ``disk/``: bytes on disk (durable writes, mapped files, ``.npy`` headers);
- ``backends/``: where a field's rows live (memmap, HDF5) and batch gathers;
- ``format/``: one module per store file (description, counters, checkpoint, ...);
- ``parts/``: side data beside the rows (jump ring, frame stacks, priorities);
- ``session/``: an open store (writer, flushes, fast adds, reader, convert);
- ``native/``: the C kernels, the one ``DISKREPLAY_PURE=1`` switch.
"""
from .errors import (CorruptStoreError, DiskReplayError, EmptyStoreError, EnvProtocolError, ForkedStoreError,
                     IncompleteStoreError,
                     IndexOutOfRangeError, InsufficientSpaceError, InterfaceMismatchError,
                     InvalidArgumentError, InvalidPriorityError, MemorySpecError, MissingDependencyError,
                     NotAStoreError, NotPrioritizedError, NStepTooLargeError, OutputExistsError, OvertakenError,
                     PartialStepWarning, ReadOnlyError, ReadOnlyViewError, RecoveryWarning,
                     ReentrantCallError,
                     SchemaMismatchError, SlotIndexError, StoreClosedError, StoreExistsError, StoreIOError, StoreResetError,
                     StoreLockedError, StoreMismatchError, StoreNotFoundError, StorePermissionError,
                     TornReadError, UnsupportedFormatError)
from .store import FORMAT_VERSION, DiskReplay

__version__ = "0.1.0"

__all__ = ["DiskReplay", "FORMAT_VERSION", "CorruptStoreError", "DiskReplayError", "EmptyStoreError", "EnvProtocolError",
    "ForkedStoreError",
    "IncompleteStoreError", "IndexOutOfRangeError", "InsufficientSpaceError", "InterfaceMismatchError",
    "InvalidArgumentError", "InvalidPriorityError", "MemorySpecError", "MissingDependencyError", "NotAStoreError",
    "NotPrioritizedError",
    "NStepTooLargeError", "OutputExistsError", "OvertakenError", "StoreResetError", "PartialStepWarning",
    "ReadOnlyError", "ReadOnlyViewError", "RecoveryWarning", "ReentrantCallError", "SchemaMismatchError", "SlotIndexError",
    "StoreClosedError", "StoreExistsError", "StoreIOError", "StoreLockedError", "StoreMismatchError",
    "StoreNotFoundError", "StorePermissionError", "TornReadError", "UnsupportedFormatError"]
