"""Files mapped whole into memory: plain ndarray views for writing and scanning, a second
``MADV_RANDOM`` mapping and a ``POSIX_FADV_RANDOM`` descriptor for random gathers.

Below the backends and the durability modules alike: every file of a store that is
memory-mapped (data, ``meta.bin``, ``ns_buffer.npy``, ``rowsums.npy``) goes through here,
and so do the byte ranges a cold gather keeps in RAM (``PinnedRange``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import resource

import numpy as np

from ..errors import CorruptStoreError
from .fsutil import close_fd, io_error


def why_unmappable(exc: OSError, size: int) -> str:
    """Why a file could not be mapped, in the user's terms: an address-space limit (``ulimit
    -v``, which counts mappings, not memory used) or a file that cannot be mapped."""
    if exc.errno == errno.ENOMEM:
        return f"its {size} bytes do not fit in the address space the limit leaves: ulimit -v"
    return "is it a regular file on a local filesystem?"


class MappedFile:
    """One file mapped whole, shared, read-only or read-write."""

    def __init__(self, path: str, writable: bool):
        self.path = path
        self.writable = writable
        self.rmm, self.read_fd = None, -1
        try:
            self.fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError as exc:
            raise CorruptStoreError(f"{path} is missing") from exc
        except OSError as exc:
            raise io_error(f"opening {path}", exc) from exc
        try:
            st = os.fstat(self.fd)
            self.size, self.identity = st.st_size, (st.st_dev, st.st_ino)
            if self.size == 0:
                raise CorruptStoreError(f"{path} is empty")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            try:
                self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, prot)
            except OSError as exc:
                raise io_error(f"memory-mapping {path} ({why_unmappable(exc, self.size)})", exc) from exc
        except BaseException:
            os.close(self.fd)
            raise

    def changed(self) -> str | None:
        """How the file at ``path`` no longer is the one mapped (replaced, truncated), or
        None. Touching a page of a mapping past a truncated end raises SIGBUS, so readers
        ask before every read; a truncation after this check can still do so."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "was deleted"
        except OSError as exc:
            return f"cannot be checked ({exc})"
        if (st.st_dev, st.st_ino) != self.identity:
            return "was replaced by another file"
        if st.st_size < self.size:
            return f"was truncated to {st.st_size} bytes (it was {self.size})"
        return None

    def array(self, offset: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A plain ndarray view (not np.memmap: that subclass costs microseconds per operation)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if offset + nbytes > self.size:
            raise CorruptStoreError(
                f"{self.path} is {self.size} bytes, expected at least {offset + nbytes}")
        arr = exported_view(self.mm, offset, shape, dtype)
        if not self.writable:
            arr.flags.writeable = False
        return arr

    def open_for_gathers(self) -> None:
        """A second, read-only view of the file for random row gathers (``gather_array``).

        The main mapping keeps the kernel's default advice: pages written through it, and
        sequential scans, come in large folios with read-ahead, so ring writes and verify
        run at memory speed. Random gathers go through a mapping advised ``MADV_RANDOM``
        (a page fault on a row not in RAM reads that page, not megabytes around it) and
        positioned reads through a descriptor advised ``POSIX_FADV_RANDOM`` (``read_fd``):
        advice is per mapping and per open file, so the two uses do not disturb each other.
        """
        if self.rmm is not None:
            return
        try:
            self.read_fd = os.open(self.path, os.O_RDONLY)
            os.posix_fadvise(self.read_fd, 0, 0, os.POSIX_FADV_RANDOM)
            self.rmm = mmap.mmap(self.read_fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as exc:
            self._close_gather_view()
            raise io_error(f"mapping {self.path} for reading ({why_unmappable(exc, self.size)})", exc) from exc
        if hasattr(mmap, "MADV_RANDOM"):
            self.rmm.madvise(mmap.MADV_RANDOM)

    def gather_array(self, offset: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A read-only ndarray view of the gather mapping (``open_for_gathers`` first)."""
        arr = exported_view(self.rmm, offset, shape, dtype)
        arr.flags.writeable = False
        return arr

    @property
    def maps(self) -> list:
        """Every mapping of this file (for tools that drop a process's mapped pages)."""
        return [m for m in (self.mm, self.rmm) if m is not None]

    def sync(self) -> None:
        """Write dirty pages of the mapping to disk (msync, then fsync for the metadata)."""
        try:
            self.mm.flush()
            os.fsync(self.fd)
        except OSError as exc:
            raise io_error(f"syncing {self.path}", exc) from exc

    def close(self) -> None:
        self._close_gather_view()
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # a memoryview still exports it; the mapping goes when that does
            self.mm = None
        self.fd = close_fd(self.fd)

    def _close_gather_view(self) -> None:
        if self.rmm is not None:
            try:
                self.rmm.close()
            except BufferError:
                pass
            self.rmm = None
        self.read_fd = close_fd(self.read_fd)


def exported_view(mm: mmap.mmap, offset: int, shape: tuple, dtype) -> np.ndarray:
    """An ndarray of ``mm``'s bytes from ``offset`` that holds a buffer export of the
    mapping (``np.frombuffer``): while any such array (or a view of one) lives, ``close()``
    of the mapping leaves it mapped (``BufferError``), and it is unmapped when the last
    array goes. ``np.ndarray(buffer=mm)`` would not: a close from a signal handler in the
    middle of an operation would leave that operation's arrays over unmapped memory, and
    its next access would be a segfault."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return np.frombuffer(mm, np.uint8, nbytes, offset).view(dtype).reshape(shape)


class PinnedRange:
    """Bytes ``[offset, offset + length)`` of an open file kept in RAM: read in with one
    read-ahead hint, mapped shared and read-only, and locked (``mlock``) where the limits
    allow, so neither reclaim nor a dropped page cache (``POSIX_FADV_DONTNEED`` leaves
    mapped pages) makes a later read wait for the disk. The page cache stays the one copy:
    rows a live writer adds show at once. Not in any ``MappedFile.maps``: ``MADV_DONTNEED``
    fails on locked pages, and these are kept in RAM on purpose.

    ``locked`` is None when locked, else why not (the pages then stay mapped, unlocked).
    """

    def __init__(self, fd: int, offset: int, length: int):
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        self.base, size = offset - start, offset - start + length
        os.posix_fadvise(fd, start, size, os.POSIX_FADV_WILLNEED)  # big reads, not a fault a page
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ,
                            offset=start)
        self.nbytes, self.span = size, (start, start + size)  # the file's bytes mapped
        self.locked = _mlock(np.frombuffer(self.mm, np.uint8).ctypes.data, size)

    def array(self, offset: int, shape: tuple, dtype) -> np.ndarray:
        """A read-only ndarray view of the range from ``offset`` bytes into it."""
        arr = exported_view(self.mm, self.base + offset, shape, dtype)
        arr.flags.writeable = False
        return arr

    def close(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()  # munmap also unlocks
            except BufferError:
                pass  # a view is still alive; the mapping goes with it
            self.mm = None


CAP_IPC_LOCK = 14  # the capability that lifts RLIMIT_MEMLOCK


def lock_refused(nbytes: int) -> str | None:
    """Why ``mlock`` of ``nbytes`` more would fail in this process (None: it would not, as
    far as the limits tell; memory the process has locked already is not counted)."""
    try:
        with open("/proc/self/status") as f:
            caps = next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), 0)
    except (OSError, ValueError):
        caps = 0
    limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if caps >> CAP_IPC_LOCK & 1 or limit == resource.RLIM_INFINITY or limit >= nbytes:
        return None
    return f"RLIMIT_MEMLOCK {limit >> 10} KiB"


def _mlock(address: int, length: int) -> str | None:
    """``mlock`` through libc: None when the pages are locked, else why not."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).mlock
    except (OSError, AttributeError):
        return "no mlock here"
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t), ctypes.c_int
    if fn(address, length) == 0:
        return None
    code = ctypes.get_errno()
    hint = " (RLIMIT_MEMLOCK)" if code in (errno.ENOMEM, errno.EPERM) else ""
    return f"mlock failed: {os.strerror(code)}{hint}"
