"""The writer lock: an advisory flock on a dedicated file, gone with its process."""
from __future__ import annotations

import errno
import fcntl
import os

from ..errors import StoreLockedError
from ..disk.fsutil import close_fd, io_error

LOCK_FILE = "lock"


class WriterLock:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, LOCK_FILE)
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise io_error(f"opening the lock file {self.path}", exc) from exc
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = -1
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreLockedError(
                    exc.errno,
                    f"{os.path.dirname(self.path)} is open for writing by another process; "
                    "close it there, or open with mode='r' to read alongside it") from None
            raise io_error(f"locking {self.path}", exc) from exc

    def release(self) -> None:
        self.fd = close_fd(self.fd)  # closing the descriptor drops the flock


def writer_alive(directory: str) -> bool:
    """Whether some process holds the writer lock, without touching the lock.

    Reads /proc/locks (no race with a writer that is opening the store); elsewhere it
    falls back to a momentary shared-lock probe.
    """
    path = os.path.join(directory, LOCK_FILE)
    try:
        st = os.stat(path)
    except OSError:
        return False
    try:
        with open("/proc/locks") as f:
            entries = f.read().splitlines()
    except OSError:
        return _probe(path)
    suffix = f":{st.st_ino}"
    for line in entries:
        parts = line.split()
        if "FLOCK" in parts and any(p.endswith(suffix) and p.count(":") == 2 for p in parts):
            dev = next(p for p in parts if p.endswith(suffix)).split(":")
            if int(dev[0], 16) == os.major(st.st_dev) and int(dev[1], 16) == os.minor(st.st_dev):
                return True
    return False


def _probe(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
