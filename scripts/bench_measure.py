"""What scripts/bench.py measures a process by, beside its clock (the method in bench.py's docstring).

The process's anonymous memory (RssAnon, and ``Peak``, its maximum over the phases), the bytes
and read calls of /proc/self/io, the pages of a file still in the page cache (mincore on a fresh
mapping, libc through ctypes), and the drop of a store from the page cache that every cold
measurement starts from: our own mappings' pages (madvise), then every file's
(posix_fadvise). Systems whose mapping objects are out of reach have theirs found in
/proc/self/maps.
"""
from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def read_bytes() -> int:
    return io_counts()[0]


def io_counts() -> tuple[int, int]:
    """``(read_bytes, syscr)`` of this process (/proc/self/io): bytes the disk read for it,
    and its read system calls."""
    found = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            found[key] = int(value)
    return found.get("read_bytes", 0), found.get("syscr", 0)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(path: str, skip=()) -> int:
    """Pages of ``path`` in the page cache: mincore on a fresh read-only shared mapping;
    pages of the byte ranges ``skip`` (``(start, end)``) not counted."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = np.zeros((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE, np.uint8)
            if _libc.mincore(addr, size, vec.ctypes.data) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            for start, end in skip:
                vec[start // mmap.PAGESIZE:-(-end // mmap.PAGESIZE)] = 0
            return int(np.count_nonzero(vec & 1))
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cache(files, mappings) -> None:
    """Drop our own mappings' pages, then the page cache of every file of the store."""
    for mm in mappings:
        mm.madvise(mmap.MADV_DONTNEED)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def store_files(path):
    if os.path.isfile(path):
        return [path]
    return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names)


class ProcMapping:
    """One mapping of this process, found in /proc/self/maps (for systems whose mapping
    objects are out of reach): ``madvise`` as mmap.mmap offers it."""

    def __init__(self, start, length):
        self.start, self.length = start, length

    def madvise(self, advice):
        if _libc.madvise(ctypes.c_void_p(self.start), ctypes.c_size_t(self.length), advice) != 0:
            raise OSError(ctypes.get_errno(), "madvise failed")


def proc_mappings(files):
    real = {os.path.realpath(p) for p in files}
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and os.path.realpath(parts[5].strip()) in real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                found.append(ProcMapping(lo, hi - lo))
    return found


class Peak:
    """The largest RssAnon seen: at creation, then at every call."""

    def __init__(self):
        self.value = rss_anon_bytes()

    def __call__(self):
        self.value = max(self.value, rss_anon_bytes())

