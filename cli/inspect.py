"""Read-only views of a store for the CLI: info, rows, statistics, episodes."""
from __future__ import annotations

import os
import time

import numpy as np

from diskreplay import DiskReplay
from diskreplay.lock import writer_alive


def disk_bytes(path: str) -> int:
    """Bytes the store's files occupy on disk (allocated blocks)."""
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat().st_blocks * 512
    return total


def store_info(buf: DiskReplay) -> dict:
    fields = buf.fields or {}
    flush_ns = buf.last_flush_ns
    return {
        "path": os.path.abspath(buf.path),
        "backend": buf.backend,
        "format_version": buf.format_version,
        "max_size": buf.max_size,
        "size": buf.size,
        "seen_size": buf.seen_size,
        "head": buf.head,
        "num_envs": buf.num_envs,
        "batch_size": buf.batch_size,
        "use_cer": buf.use_cer,
        "fields": {name: {"shape": list(shape), "dtype": np.dtype(dtype).name}
                   for name, (shape, dtype) in fields.items()},
        "disk_bytes": disk_bytes(buf.path),
        "writer_alive": writer_alive(buf.path),
        "last_flush": (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(flush_ns / 1e9))
                       if flush_ns else None),
    }
