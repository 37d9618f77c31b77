"""The writer lock: an advisory flock on a dedicated file, gone with its process."""
from __future__ import annotations

import errno
import fcntl
import os

from ..errors import StoreLockedError
from ..disk.fsutil import close_fd, io_error

LOCK_FILE = "lock"


# The lock files this process holds, by (device, inode), with the pid that took each: a
# second writer of the same store in this process is refused as one in another process
# would be (the flock of a second descriptor fails too; this names the holder).
_HELD: dict[tuple[int, int], int] = {}


class WriterLock:
    """The store's one writer: an exclusive flock on ``lock``, per process and per object
    (a second ``mode="r+"`` open of the same store in this process is refused too)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, LOCK_FILE)
        self.key = None
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            st = os.fstat(self.fd)
        except OSError as exc:
            raise io_error(f"opening the lock file {self.path}", exc) from exc
        key = (st.st_dev, st.st_ino)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = -1
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                if _HELD.get(key) == os.getpid():
                    err = StoreLockedError(
                        exc.errno,
                        f"{os.path.dirname(self.path)} is already open for writing in this process (by another "
                        "DiskReplay object, e.g. another buffer or storage with the same path); close that one "
                        "first, use it instead, or open with mode='r' to read alongside it")
                    err.in_this_process = True  # adapters say which of their objects to close
                    raise err from None
                raise StoreLockedError(
                    exc.errno,
                    f"{os.path.dirname(self.path)} is open for writing by another process; "
                    "close it there, or open with mode='r' to read alongside it") from None
            raise io_error(f"locking {self.path}", exc) from exc
        self.key, self.pid = key, os.getpid()
        _HELD[key] = self.pid

    def release(self) -> None:
        """Drop the lock: closing the descriptor drops the flock (in a forked child, which
        shares the parent's, closing its copy leaves the parent's lock held)."""
        if self.key is not None and _HELD.get(self.key) == self.pid == os.getpid():
            del _HELD[self.key]
        self.key = None
        self.fd = close_fd(self.fd)


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
