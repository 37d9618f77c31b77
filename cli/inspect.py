"""Read-only views of a store for the CLI: info, rows, statistics, episodes.

Everything here goes through the public API of a store opened with ``mode="r"``.
A live writer may add transitions while we read; two rules keep what we show honest:

* counters are read as one snapshot (:func:`snapshot`), so ``size``, ``seen_size`` and
  ``head`` always agree with each other;
* after reading rows by slot we look at ``seen_size`` again: a slot holding transition
  ``t`` at the snapshot is overwritten by transition ``t + max_size``, so rows whose
  transition is that old may now hold something newer (:class:`ChronoReader`).
  ``get`` itself never returns a torn row.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from diskreplay import DiskReplay
from diskreplay.lock import writer_alive

BLOCK_BYTES = 16 << 20
_SNAPSHOT_TRIES = 1000


class OvertakenError(Exception):
    """The live writer overwrote rows we had not read yet."""


def disk_bytes(path: str) -> int:
    """Bytes the store's files occupy on disk (allocated blocks)."""
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat().st_blocks * 512
    return total


@dataclass(frozen=True)
class Snapshot:
    """Counters that belong together: the newest transition is number ``seen``."""

    seen: int
    size: int
    head: int
    max_size: int
    num_envs: int

    @property
    def oldest(self) -> int:
        """Slot of the oldest transition."""
        return (self.head - self.size + 1) % self.max_size

    def slot(self, pos):
        """Slot of the ``pos``-th oldest transition (works on arrays)."""
        return (self.oldest + pos) % self.max_size

    def position(self, slot):
        """Chronological position (0 = oldest) of the transition in ``slot``."""
        return (slot - self.oldest) % self.max_size

    def transition(self, pos):
        """1-based transition number of the ``pos``-th oldest transition."""
        return self.seen - self.size + 1 + pos

    def env(self, pos):
        """Environment that added the ``pos``-th oldest transition (env-major order)."""
        return (self.seen - self.size + pos) % self.num_envs


def snapshot(buf: DiskReplay) -> Snapshot:
    """``seen_size``, ``size`` and ``head`` of one committed state, beside a live writer too."""
    for _ in range(_SNAPSHOT_TRIES):
        seen = buf.seen_size
        size, head = buf.size, buf.head
        if buf.seen_size == seen:
            return Snapshot(seen, size, head, buf.max_size, buf.num_envs)
    return Snapshot(seen, size, head, buf.max_size, buf.num_envs)  # pragma: no cover


def store_info(buf: DiskReplay) -> dict:
    fields = buf.fields or {}
    snap = snapshot(buf)
    flush_ns = buf.last_flush_ns
    return {
        "path": os.path.abspath(buf.path),
        "backend": buf.backend,
        "format_version": buf.format_version,
        "max_size": buf.max_size,
        "size": snap.size,
        "seen_size": snap.seen,
        "head": snap.head,
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


def batch_keys(buf: DiskReplay) -> list[str]:
    """Keys of a batch in a stable order: the core keys, then the extras."""
    fields = buf.fields or {}
    core = ["states", "actions", "rewards", "next_states", "dones"]
    return core + [name for name in fields if name not in core]


def block_rows(buf: DiskReplay, factor: int = 1) -> int:
    """Rows per block so that a block of a batch (times ``factor``) stays near BLOCK_BYTES."""
    fields = buf.fields or {}
    row = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for shape, dt in fields.values())
    row += int(np.prod(fields["states"][0], dtype=np.int64)) * np.dtype(fields["states"][1]).itemsize \
        if "states" in fields else 0
    return max(1, BLOCK_BYTES // max(1, row * factor))


class ChronoReader:
    """Reads chronological positions ``[start, stop)`` of a snapshot in row blocks.

    When the live writer overwrote rows before we read them and nothing has been
    yielded yet, the read starts over from a fresh snapshot (``self.snap``; the same
    positions, counted from the oldest transition then), up to ``restarts`` times;
    after that the overwritten rows are dropped (``skipped`` counts them). Once rows
    were yielded, an overwritten row raises :class:`OvertakenError`.
    """

    def __init__(self, buf: DiskReplay, snap: Snapshot, start: int, stop: int, rows: int, restarts: int = 20):
        self.buf, self.snap = buf, snap
        self.start, self.stop, self.rows = start, stop, max(1, rows)
        self.restarts = restarts
        self.skipped = 0

    def __iter__(self):
        buf = self.buf
        pos = self.start
        emitted = False
        while pos < self.stop:
            snap = self.snap
            end = min(pos + self.rows, self.stop)
            positions = np.arange(pos, end, dtype=np.int64)
            batch = buf.get(snap.slot(positions))
            seen_now = buf.seen_size
            # Transition t lives in its slot until transition t + max_size is written.
            fresh = snap.transition(positions) + snap.max_size > seen_now
            if not fresh.all():
                if emitted:
                    raise OvertakenError(
                        f"the live writer overwrote transition {int(snap.transition(positions[~fresh][0]))} "
                        "before it was read")
                if self.restarts > 0:
                    self.restarts -= 1
                    self.snap = snapshot(buf)
                    continue
                # fresh is monotone in the position: drop the stale prefix and read on.
                n_stale = int((~fresh).sum())
                self.skipped += n_stale
                pos += n_stale
                continue
            emitted = True
            yield positions, batch
            pos = end


# ---------------------------------------------------------------- statistics
class RunningStats:
    """min, max, mean, std (population) over all elements, merged block by block (Chan et al.)."""

    def __init__(self):
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.nonfinite = 0
        self.is_float = False

    def update(self, block: np.ndarray) -> None:
        if block.size == 0:
            return
        x = np.asarray(block)
        if x.dtype.kind == "f":
            self.is_float = True
            finite = np.isfinite(x)
            if not finite.all():
                self.nonfinite += int(x.size - finite.sum())
                x = x[finite]
                if x.size == 0:
                    return
        x = x.astype(np.float64, copy=False).reshape(-1)
        n = x.size
        bmean = float(x.mean())
        bm2 = float(((x - bmean) ** 2).sum())
        total = self.count + n
        delta = bmean - self.mean
        self.mean += delta * n / total
        self.m2 += bm2 + delta * delta * self.count * n / total
        self.count = total
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))

    def as_dict(self) -> dict:
        if self.count == 0:
            out = {"count": 0, "min": None, "max": None, "mean": None, "std": None}
        else:
            out = {"count": self.count, "min": self.min, "max": self.max, "mean": self.mean,
                   "std": math.sqrt(self.m2 / self.count)}
        if self.is_float:
            out["nonfinite"] = self.nonfinite
        return out


class Episodes:
    """Episode returns per env, reconstructed from env-major order and ``dones``.

    An episode is complete when its first transition is in the range read: it follows
    a done of the same env there, or the range starts at the env's very first transition.
    """

    def __init__(self, num_envs: int, starts_complete: bool):
        self.num_envs = num_envs
        self.running = np.zeros(num_envs, np.float64)
        self.started = np.full(num_envs, starts_complete)
        self.dones = np.zeros(num_envs, np.int64)
        self.returns: list[tuple[int, int, float]] = []  # (end transition, env, return)

    def update(self, transitions: np.ndarray, envs: np.ndarray, rewards, dones) -> None:
        rewards = np.asarray(rewards, np.float64).reshape(len(transitions), -1).sum(axis=1)
        dones = np.asarray(dones).reshape(len(transitions), -1).any(axis=1)
        for t, env, r, d in zip(transitions.tolist(), envs.tolist(), rewards.tolist(), dones.tolist()):
            self.running[env] += r
            if d:
                self.dones[env] += 1
                if self.started[env]:
                    self.returns.append((t, env, float(self.running[env])))
                self.started[env] = True
                self.running[env] = 0.0

    def as_dict(self) -> dict:
        rets = [r for _, _, r in self.returns]
        per_env = [sum(1 for _, e, _ in self.returns if e == env) for env in range(self.num_envs)]
        return {
            "dones_per_env": self.dones.tolist(),
            "complete_episodes": len(rets),
            "complete_episodes_per_env": per_env,
            "return_mean": float(np.mean(rets)) if rets else None,
            "return_min": float(np.min(rets)) if rets else None,
            "return_max": float(np.max(rets)) if rets else None,
        }


def compute_stats(buf: DiskReplay, progress=None, keep_returns: bool = False) -> dict:
    """Per-field statistics and episode returns over the whole store, in row blocks."""
    snap = snapshot(buf)
    fields = buf.fields or {}
    stats = {name: RunningStats() for name in fields}
    episodes = Episodes(buf.num_envs, starts_complete=False)
    reader = ChronoReader(buf, snap, 0, snap.size, block_rows(buf, 8))
    done_count = 0
    first = True
    for positions, batch in reader:
        if first:
            # Nothing evicted: every env's first transition is in the ring (a reset is ignored).
            episodes.started[:] = reader.snap.seen == reader.snap.size and not reader.skipped
            first = False
        snap = reader.snap
        for name in fields:
            stats[name].update(batch[name])
        if "dones" in batch:
            done_count += int(np.count_nonzero(batch["dones"]))
            episodes.update(snap.transition(positions), snap.env(positions), batch["rewards"], batch["dones"])
        if progress is not None:
            progress(len(positions))
    out = {
        "path": os.path.abspath(buf.path),
        "size": reader.snap.size - reader.skipped,
        "seen_size": reader.snap.seen,
        "skipped_overwritten": reader.skipped,
        "fields": {name: s.as_dict() for name, s in stats.items()},
        "dones": done_count,
        "episodes": episodes.as_dict(),
    }
    if keep_returns:
        out["_returns"] = episodes.returns
    return out


# ---------------------------------------------------------------- JSON and tables
def jsonable(value):
    """Numpy values as JSON-ready Python values; NaN and infinities become None."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return [jsonable(v) for v in value] if value.ndim else jsonable(value.item())
        return value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def fmt_number(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "True" if x else "False"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isfinite(x) and x == int(x) and abs(x) < 1e15:
        return f"{int(x)}" if abs(x) >= 1e6 else f"{x:g}"
    return f"{x:.6g}"


def fmt_value(value, small: int = 4) -> str:
    """A cell: scalars as they are, small arrays in full, large ones summarized."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        return fmt_number(arr.item())
    if arr.size <= small:
        return "[" + " ".join(fmt_number(v) for v in arr.reshape(-1).tolist()) + "]"
    shape = "x".join(map(str, arr.shape))
    if arr.dtype.kind == "b":
        return f"{shape} {int(arr.sum())} true"
    a = arr.astype(np.float64)
    return f"{shape} {fmt_number(a.min())}..{fmt_number(a.max())} ~{fmt_number(round(float(a.mean()), 4))}"


def table(header: list[str], rows: list[list[str]], width: int = 80, right: set | None = None) -> list[str]:
    """Aligned lines no wider than ``width``; the widest columns are cut (with '~') to fit."""
    right = right or set()
    ncol = len(header)
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(ncol)]
    budget = width - 2 * (ncol - 1)
    while sum(widths) > budget:
        i = max(range(ncol), key=lambda j: widths[j])
        floor = max(len(header[i]), 4)
        if widths[i] <= floor:
            break
        widths[i] -= 1

    def cell(text: str, i: int) -> str:
        if len(text) > widths[i]:
            text = text[: widths[i] - 1] + "~"
        return text.rjust(widths[i]) if i in right else text.ljust(widths[i])

    lines = ["  ".join(cell(h, i) for i, h in enumerate(header)).rstrip()]
    lines += ["  ".join(cell(c, i) for i, c in enumerate(r)).rstrip() for r in rows]
    return lines


def kv_lines(pairs: list[tuple[str, object]], width: int = 80) -> list[str]:
    """``key  value`` lines, keys aligned; long values wrap onto indented lines."""
    keyw = max(len(k) for k, _ in pairs)
    room = max(20, width - keyw - 2)
    lines = []
    for key, value in pairs:
        text = str(value)
        chunks = [text[i:i + room] for i in range(0, len(text), room)] or [""]
        lines.append(f"{key:<{keyw}}  {chunks[0]}")
        lines += [" " * (keyw + 2) + c for c in chunks[1:]]
    return lines
