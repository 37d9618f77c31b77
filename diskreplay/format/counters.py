"""``meta.bin``: the live counters of a store, one memory-mapped page of int64 words.

The writer commits an add by storing ``seen`` and then its check word (``seen ^ key``); a
process crash cannot tear an aligned 8-byte store, and a power cut is handled by ignoring
this file in favour of the last checkpoint (the boot id tells the two apart). A writer
killed between those two stores leaves ``seen`` one step ahead of the check word: the
committed ``seen_size`` is the one the check word vouches for, and that step counts as in
flight (its ``add`` had not returned).

The stores here are plain numpy stores: a live reader relies on x86-64's TSO to see them
in program order (FORMAT.md, "Memory ordering"). On a weakly ordered CPU ``commit_step``
(and its inline copies in ``session/fastadd.py``) is where a release fence would go, with
one after ``begin_step``; ``_rows.c``'s step has them.
"""
from __future__ import annotations

import os
import uuid

import numpy as np

from ..disk.mapped import MappedFile
from ..errors import CorruptStoreError
from ..disk.fsutil import io_error

COUNTERS_FILE = "meta.bin"
COUNTERS_BYTES = 4096
MAGIC = int.from_bytes(b"DRMETA01", "little", signed=True)

# Word indices of the record.
W_MAGIC, W_VERSION, W_SEEN, W_CHECK, W_INTENT, W_BASE, W_DRAWS, W_KEY = range(8)
W_BOOT, W_PID, W_CLEAN, W_FLUSH_NS, W_RESETS, W_CHECKPOINT, W_JUMPS, W_STACKS = range(8, 16)
NWORDS = 16
COMMIT_RETRIES = 200  # re-reads (0.5 ms apart) of a record caught between two stores of a commit


def current_boot_id() -> int:
    """This boot's id as an int64; changes after every reboot, power cut or OS crash."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return int.from_bytes(uuid.UUID(f.read().strip()).bytes[:8], "little", signed=True)
    except (OSError, ValueError):
        return 0  # unknown: recovery then trusts only the last checkpoint after a crash


def create_counters(directory: str) -> None:
    words = np.zeros(COUNTERS_BYTES // 8, np.int64)
    words[W_MAGIC] = MAGIC
    words[W_VERSION] = 1
    words[W_CLEAN] = 1
    path = os.path.join(directory, COUNTERS_FILE)
    try:
        with open(path, "wb") as f:
            f.write(words.tobytes())
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise io_error(f"creating {path}", exc) from exc


def begin_step(words: np.ndarray, t_end: int) -> None:
    """Step 1 of an add: mark the transitions up to ``t_end`` in flight."""
    words[W_INTENT] = t_end


def record_jumps(words: np.ndarray, count: int) -> None:
    """Between steps 2 and 3 of an add that recorded jumps (``jumps.py``): the new number
    of records, stored before the commit so that a reader who sees the step sees them. A
    writer killed before the commit leaves records of uncommitted transitions, which
    ``JumpRing.committed`` leaves out."""
    words[W_JUMPS] = count


def record_stacks(words: np.ndarray, count: int) -> None:
    """As ``record_jumps``, for the stack ring of a frame-stack store (``framestack.py``)."""
    words[W_STACKS] = count


def commit_step(words: np.ndarray, t_end: int, key: int) -> None:
    """Step 3 of an add, after its rows and next states are written: commit ``seen_size``,
    then the check word that vouches for it (see the module docstring). Relies on x86-64
    TSO to make the rows visible before ``seen`` (no fence: the module docstring)."""
    words[W_SEEN] = t_end
    words[W_CHECK] = t_end ^ key


class Counters:
    """The mapped record. ``words`` is a plain int64 ndarray over the page."""

    def __init__(self, directory: str, writable: bool):
        self.path = os.path.join(directory, COUNTERS_FILE)
        self.file = MappedFile(self.path, writable)
        if self.file.size != COUNTERS_BYTES:
            size = self.file.size
            self.file.close()
            raise CorruptStoreError(f"{self.path} is {size} bytes, expected {COUNTERS_BYTES}")
        self.words = self.file.array(0, (COUNTERS_BYTES // 8,), np.int64)

    def problem(self, num_envs: int) -> str | None:
        """Why the record cannot be trusted, or None when it is self-consistent."""
        w = [int(x) for x in self.words[:NWORDS]]
        if w[W_MAGIC] != MAGIC:
            return "bad magic number"
        if w[W_VERSION] != 1:
            return f"unknown record version {w[W_VERSION]}"
        seen, base = w[W_CHECK] ^ w[W_KEY], w[W_BASE]
        stored = w[W_SEEN]
        if stored != seen and not (stored == seen + num_envs and w[W_INTENT] == stored):
            return "seen_size and its check word disagree"
        if not (0 <= base <= seen) or seen % num_envs or base % num_envs:
            return f"seen_size {seen} / reset base {base} are not valid for {num_envs} envs"
        if w[W_DRAWS] < 0 or w[W_RESETS] < 0 or w[W_JUMPS] < 0 or w[W_STACKS] < 0:
            return "negative sampler draws, reset count, jump count or stack count"
        if w[W_INTENT] not in (seen, seen + num_envs):
            return f"in-flight marker {w[W_INTENT]} does not follow seen_size {seen}"
        return None

    def snapshot(self) -> tuple:
        """(seen, intent, base, draws, resets) read in an order safe against a live writer;
        ``seen`` is the one the check word vouches for (see the module docstring)."""
        w = self.words
        resets = int(w[W_RESETS])
        seen = int(w[W_CHECK]) ^ int(w[W_KEY])
        return seen, int(w[W_INTENT]), int(w[W_BASE]), int(w[W_DRAWS]), resets

    def commit_state(self, seen: int, base: int, draws: int, resets: int, jumps: int | None = None,
                     stacks: int | None = None) -> None:
        """Overwrite the whole state (used at open and reset, never on the hot path);
        ``jumps`` (the jump ring's record count) and ``stacks`` (the stack ring's) are kept
        as they are when None."""
        w = self.words
        if jumps is not None:
            w[W_JUMPS] = jumps
        if stacks is not None:
            w[W_STACKS] = stacks
        w[W_MAGIC] = MAGIC  # recovery may be rewriting a damaged record
        w[W_VERSION] = 1
        w[W_INTENT] = seen
        w[W_BASE] = base
        w[W_RESETS] = resets
        w[W_DRAWS] = draws
        w[W_SEEN] = seen
        w[W_CHECK] = seen ^ int(w[W_KEY])

    def claim(self, pid: int, key: int) -> None:
        """Mark the record as held by a live writer of this boot (after recovery committed
        a whole state, so ``seen`` and its check word agree)."""
        w = self.words
        seen = int(w[W_SEEN])
        w[W_KEY] = key
        w[W_CHECK] = seen ^ key
        w[W_BOOT] = current_boot_id()
        w[W_PID] = pid
        w[W_CLEAN] = 0

    def sync(self) -> None:
        self.file.sync()

    def close(self) -> None:
        self.words = None
        self.file.close()
