"""Forked children (issue 35): a writer inherited by a child of the process that opened it
never writes, flushes, marks or unlocks the parent's store. After a fork the child's copies
of this process's writers are marked not live, so that neither a held fast add nor the
general path writes from the child; every call there raises ``ForkedStoreError``."""
from __future__ import annotations

import os
import weakref

from ..errors import ForkedStoreError

# The open writers of this process (weakly: a dropped writer is forgotten).
_WRITERS: "weakref.WeakSet" = weakref.WeakSet()
# This process's id, kept current across forks: what the sessions compare the id of their
# opener with on every operation (os.getpid() is a system call each time).
PID = os.getpid()


def _after_fork_in_child() -> None:
    global PID
    PID = os.getpid()
    for writer in list(_WRITERS):
        writer.ws.live = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def watch(writer) -> None:
    """Mark ``writer`` not live in any child this process forks from now on."""
    _WRITERS.add(writer)


def forked(path, opener: int, what: str) -> ForkedStoreError:
    """The refusal of ``what`` on the store at ``path``, opened for writing by ``opener``."""
    return ForkedStoreError(
        f"cannot {what}: {path} was opened for writing by process {opener}, and this is its forked "
        f"child {os.getpid()}; only the parent writes or reads through it. In the child, open the store with "
        "mode='r' to read it (close() here releases only the child's copies)")
