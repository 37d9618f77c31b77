"""Statistics of a store's contents: per-field moments, episode returns, histograms.

Each pass reads the store once, oldest first, in row blocks (:class:`~diskreplay.views.ChronoReader`),
so memory stays bounded for any store size and a live writer may keep adding meanwhile.

    from diskreplay import DiskReplay
    from diskreplay.stats import compute_stats

    with DiskReplay.open("runs/pong.replay", mode="r") as buf:
        print(compute_stats(buf)["episodes"]["return_mean"])
"""
from __future__ import annotations

import math
import os
from typing import Callable

import numpy as np

from . import smallints
from .store import DiskReplay
from .chrono import require_fields
from .core.episodes import TRUNCATION_FIELD, episode_ends
from .errors import StoreResetError
from .views import ChronoReader, block_rows, snapshot

BINS = 50


SMALL_INT_BYTES = smallints.MAX_BYTES  # integer and bool data of at most this many bytes an element: exact sums


class RunningStats:
    """min, max, mean, std (population) over all elements, merged block by block (Chan et al.).

    NaN and infinities of float data are counted in ``nonfinite`` and left out of the rest.
    Integer and bool elements of one or two bytes (frames, flags) are summed exactly as
    integers (count, sum, sum of squares) instead of converted to float64, several times
    faster; with ``tally=True`` they are also counted per value (``values()``), which lets
    a histogram of them be drawn without reading them again (about twice the cost)."""

    def __init__(self, tally: bool = False):
        self.want_tally = tally
        self.tally: np.ndarray | None = None  # counts per value, indexed by the raw bits
        self.tally_dtype: np.dtype | None = None
        self.ints = [0, 0, 0, None, None]  # exact count, sum, sum of squares, min, max of small ints
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.nonfinite = 0
        self.is_float = False

    def update(self, block) -> None:
        with np.errstate(all="ignore"):  # overflow of huge values shows as inf, never as a warning
            self.merge(np.asarray(block))

    def merge(self, x: np.ndarray) -> None:
        """Fold the elements of ``x`` in (what ``update`` does, without its error state)."""
        if x.size == 0:
            return
        if x.dtype.kind in "biu" and x.dtype.itemsize <= SMALL_INT_BYTES:
            self.add_small_ints(x)
            return
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

    def add_small_ints(self, x: np.ndarray) -> None:
        """Exact integer sums of one- and two-byte integers and bools (or their tally)."""
        flat = np.ascontiguousarray(x).reshape(-1)
        if self.want_tally:
            if self.tally is None:
                self.tally, self.tally_dtype = np.zeros(1 << (8 * x.dtype.itemsize), np.int64), x.dtype
            smallints.tally(flat, self.tally)
            return
        lo, hi, total, squares = smallints.moments(flat)
        ints = self.ints
        ints[0] += flat.size
        ints[1] += total
        ints[2] += squares
        ints[3] = lo if ints[3] is None else min(ints[3], lo)
        ints[4] = hi if ints[4] is None else max(ints[4], hi)

    def values(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(values, counts)`` of the tallied elements (values that occur, ascending), or None."""
        if self.tally is None:
            return None
        bits = np.flatnonzero(self.tally)
        raw = bits.astype(np.uint8 if self.tally_dtype.itemsize == 1 else np.uint16)
        values = raw.view(self.tally_dtype).astype(np.float64)
        order = np.argsort(values, kind="stable")
        return values[order], self.tally[bits][order]

    def merged(self) -> "RunningStats":
        """These stats with the exact integer sums (and the tally) folded into the moments."""
        n, total, squares, lo, hi = self.ints
        held = self.values()
        if held is not None:
            values, counts = held
            ivalues = values.astype(np.int64)
            n += int(counts.sum())
            total += int((ivalues * counts).sum())
            squares += sum(int(v) * int(v) * int(c) for v, c in zip(ivalues.tolist(), counts.tolist()))
            if len(values):
                lo = int(ivalues[0]) if lo is None else min(lo, int(ivalues[0]))
                hi = int(ivalues[-1]) if hi is None else max(hi, int(ivalues[-1]))
        out = RunningStats()
        if n:
            out.count, out.mean = n, total / n  # Python ints: correctly rounded
            out.m2 = (squares * n - total * total) / n
            out.min, out.max = float(lo), float(hi)
        if self.count:
            count = out.count + self.count
            delta = self.mean - out.mean
            out.m2 += self.m2 + delta * delta * out.count * self.count / count
            out.mean += delta * self.count / count
            out.count = count
            out.min, out.max = min(out.min, self.min), max(out.max, self.max)
        out.nonfinite = self.nonfinite
        return out

    def as_dict(self) -> dict:
        """``count, min, max, mean, std`` of the finite elements (None while there are none) and
        ``nonfinite``, the NaN and infinite elements left out (always 0 for integer data)."""
        if self.tally is not None or self.ints[0]:
            return self.merged().as_dict()
        if self.count == 0:
            out = {"count": 0, "min": None, "max": None, "mean": None, "std": None}
        else:
            out = {"count": self.count, "min": self.min, "max": self.max, "mean": self.mean,
                   "std": math.sqrt(self.m2 / self.count)}
        out["nonfinite"] = self.nonfinite
        return out


class Episodes:
    """Episode returns per env, reconstructed from env-major order and ``dones``.

    An episode is complete when its first transition is in the range read: it follows
    a done of the same env there, or the range starts at the env's very first transition
    (``starts_complete``). Transitions must come in order; where their numbers jump (rows a
    live writer overtook were skipped), every episode in progress becomes incomplete.
    """

    def __init__(self, num_envs: int, starts_complete: bool):
        self.num_envs = num_envs
        self.running = np.zeros(num_envs, np.float64)
        self.started = np.full(num_envs, starts_complete)
        self.dones = np.zeros(num_envs, np.int64)
        self.returns: list[tuple[int, int, float]] = []  # (end transition, env, return)
        self.next_transition: int | None = None

    def update(self, transitions: np.ndarray, envs: np.ndarray, rewards, ends) -> None:
        """Fold in transitions (in order) with their rewards and episode ends
        (:func:`diskreplay.core.episodes.episode_ends`)."""
        if len(transitions) == 0:
            return
        if self.next_transition is not None and int(transitions[0]) != self.next_transition:
            self.started[:] = False
            self.running[:] = 0.0
        self.next_transition = int(transitions[-1]) + 1
        with np.errstate(all="ignore"):
            rewards = np.asarray(rewards, np.float64).reshape(len(transitions), -1).sum(axis=1)
        ends = np.asarray(ends).reshape(len(transitions), -1).any(axis=1)
        for t, env, r, d in zip(transitions.tolist(), envs.tolist(), rewards.tolist(), ends.tolist()):
            self.running[env] = float(self.running[env]) + r  # Python floats: inf - inf is nan, unwarned
            if d:
                self.dones[env] += 1
                if self.started[env]:
                    self.returns.append((t, env, float(self.running[env])))
                self.started[env] = True
                self.running[env] = 0.0

    def as_dict(self) -> dict:
        """Counts of dones and complete episodes (per env too) and ``return_mean, return_min,
        return_max`` over the complete episodes whose return is finite (None when none is);
        ``nonfinite_returns`` counts the complete episodes whose return is NaN or infinite."""
        rets = [r for _, _, r in self.returns if math.isfinite(r)]
        per_env = [sum(1 for _, e, _ in self.returns if e == env) for env in range(self.num_envs)]
        return {
            "dones_per_env": self.dones.tolist(),
            "complete_episodes": len(self.returns),
            "complete_episodes_per_env": per_env,
            "finite_returns": len(rets),
            "nonfinite_returns": len(self.returns) - len(rets),
            "return_mean": math.fsum(rets) / len(rets) if rets else None,
            "return_min": min(rets) if rets else None,
            "return_max": max(rets) if rets else None,
        }


def compute_stats(buf: DiskReplay, progress: Callable[[int, int], None] | None = None, *,
                  keep_returns: bool = False, start: int | None = None, stop: int | None = None,
                  keep_tallies: bool = False) -> dict:
    """Per-field statistics and episode returns over the chronological positions
    ``[start, stop)`` (default: the whole store; as Python slices), in one pass.

    Returns ``{"path", "size", "seen_size", "skipped_overwritten", "fields": {name:
    RunningStats.as_dict()}, "dones", "episodes": Episodes.as_dict()}``; with
    ``keep_returns``, ``episodes`` also has ``"returns"``: ``(end transition, env, return)``
    of every complete episode, oldest first. Rows a live writer overwrote before they were
    read are left out (``skipped_overwritten``), and an episode they cut is not complete.
    ``progress(done_rows, total_rows)`` is called after each block. With ``keep_tallies``,
    ``"tallies"`` holds ``{field: (values, counts)}`` of the tallied fields (one- and two-byte
    integers and bools, :class:`RunningStats`), for :func:`histograms` to bin without a
    second read. Next states are never read: they would double the bytes of a scan and
    add nothing to these numbers.
    """
    fields = buf.fields or {}
    # A store whose fields the first add has not declared yet is as empty as a declared one.
    reader = ChronoReader(buf, start, stop, rows=block_rows(buf, 2, keys=list(fields)) if fields else 1,
                          progress=progress, fields=list(fields) + ["jumps"] if fields else None, ahead=True)
    stats = {name: RunningStats(tally=keep_tallies) for name in fields}
    episodes = Episodes(buf.num_envs, starts_complete=False)
    done_count = 0
    first = True
    for block in reader:
        snap = reader.snap
        if first:
            # Every env's first transition is read (none evicted, no reset, none skipped).
            episodes.started[:] = int(block.transitions[0]) == 1
            first = False
        batch = block.batch
        for name, s in stats.items():
            s.update(batch[name])
        if "dones" in batch:
            done_count += int(np.count_nonzero(batch["dones"]))
            episodes.update(block.transitions, snap.env(block.positions), batch["rewards"], episode_ends(batch, batch["jumps"]))
    out = {
        "path": os.path.abspath(buf.path),
        "size": reader.stop - reader.start - reader.skipped,
        "start": reader.start,
        "stop": reader.stop,
        "seen_size": reader.snap.seen,
        "skipped_overwritten": reader.skipped,
        "fields": {name: s.as_dict() for name, s in stats.items()},
        "dones": done_count,
        "episodes": episodes.as_dict(),
    }
    if keep_returns:
        out["episodes"]["returns"] = list(episodes.returns)
    if keep_tallies:
        out["tallies"] = {name: s.values() for name, s in stats.items() if s.tally is not None}
    return out


class RecentReturns:
    """The returns of the episodes that ended lately, followed poll by poll beside a live
    writer (``diskreplay watch``).

    Each :meth:`poll` reads only the rewards and episode ends (``dones``, ``truncateds``)
    of the transitions added since the previous one, at most the newest ``window`` (the
    first poll reads the newest ``window``), so following a store costs little whatever
    its size. An episode counts once its start was read as well; rows the writer overtook,
    or added beyond ``window`` between two polls, cut the episodes running through them."""

    def __init__(self, buf: DiskReplay, keep: int = 100, window: int = 100_000):
        self.buf = buf
        self.keep = keep
        self.window = window
        self.episodes = Episodes(buf.num_envs, starts_complete=False)
        self.read_up_to = 0  # the newest transition read so far
        self.ended = 0  # episodes that ended (complete ones) since the first poll
        self.rows_read = 0

    def poll(self) -> list[tuple[int, int, float]]:
        """Read what was added since the last poll; returns the ``(end transition, env,
        return)`` of the episodes that ended in it, oldest first."""
        fields = self.buf.fields
        snap = snapshot(self.buf)
        new = min(snap.seen - self.read_up_to, snap.size, self.window)
        if not fields or new <= 0:
            self.read_up_to = max(self.read_up_to, snap.seen)
            return []
        if self.read_up_to == 0 and snap.first == 1:
            self.episodes.started[:] = new == snap.size  # every env's first transition is read
        keys = ["rewards", "dones", "jumps"] + ([TRUNCATION_FIELD] if TRUNCATION_FIELD in fields else [])
        before = len(self.episodes.returns)
        reader = ChronoReader(self.buf, snap.size - new, snap.size, snap=snap, fields=keys)
        try:
            for block in reader:
                self.episodes.update(block.transitions, reader.snap.env(block.positions), block.batch["rewards"],
                                     episode_ends(block.batch, block.batch["jumps"]))
        except StoreResetError:  # reset during this poll: follow the new generation from its start
            self.episodes = Episodes(self.buf.num_envs, starts_complete=False)
            self.read_up_to = 0
            return []
        self.read_up_to = reader.snap.first + reader.stop - 1
        self.rows_read += reader.stop - reader.start - reader.skipped
        found = self.episodes.returns[before:]
        self.ended += len(found)
        del self.episodes.returns[:-self.keep or len(self.episodes.returns)]
        return found

    @property
    def returns(self) -> list[tuple[int, int, float]]:
        """``(end transition, env, return)`` of the last ``keep`` episodes that ended."""
        return list(self.episodes.returns)

    def summary(self) -> dict:
        """``count``, ``finite``, ``mean``, ``min``, ``max`` (over the finite ones; None when
        none) and ``last`` of the last ``keep`` returns; ``ended``, the episodes that ended in
        the ``rows_read`` rows read since the first poll."""
        rets = [r for _, _, r in self.episodes.returns]
        finite = [r for r in rets if math.isfinite(r)]
        return {"count": len(rets), "finite": len(finite), "ended": self.ended, "rows_read": self.rows_read,
                "mean": math.fsum(finite) / len(finite) if finite else None,
                "min": min(finite) if finite else None, "max": max(finite) if finite else None,
                "last": rets[-1] if rets else None}


def histograms(buf: DiskReplay, ranges: dict, bins: int = BINS, *, start: int | None = None,
               stop: int | None = None, tallies: dict | None = None) -> dict:
    """``{field: (counts, edges)}`` over all finite elements of the positions ``[start, stop)``
    in ``ranges``' fields, from each field's ``(lo, hi)`` (e.g. ``min`` and ``max`` of
    :func:`compute_stats`); fields whose ``lo`` is None are left out.

    Float fields get ``bins`` equal bins; integer and bool fields get bins of a whole
    number of values centred on the integers (one bin per value when the range has at most
    ``bins`` values), so no bin catches one more value than its neighbour. Fields with
    ``tallies`` (``compute_stats(keep_tallies=True)``) are binned from them, unread; the
    others are read in one pass."""
    tallies = tallies or {}
    fields = require_fields(buf)
    hists = {}
    for name, (lo, hi) in ranges.items():
        if lo is None:
            continue
        hists[name] = (None, bin_edges(lo, hi, np.dtype(fields[name][1]).kind in "iub", bins))
    hists = {name: (np.zeros(len(edges) - 1, np.int64), edges) for name, (_, edges) in hists.items()}
    for name, (values, counts) in tallies.items():
        if name in hists:
            hists[name][0][:] = np.histogram(values, bins=hists[name][1], weights=counts)[0]
    to_read = [name for name in hists if name not in tallies]
    if not to_read:
        return hists
    with np.errstate(all="ignore"):
        for block in ChronoReader(buf, start, stop, rows=block_rows(buf, 4, keys=to_read), fields=to_read,
                                  ahead=True):
            for name in to_read:
                counts, edges = hists[name]
                x = np.asarray(block.batch[name], np.float64).reshape(-1)
                counts += np.histogram(x[np.isfinite(x)], bins=edges)[0]
    return hists


def bin_edges(lo: float, hi: float, integer: bool, bins: int = BINS) -> np.ndarray:
    """Edges of histogram bins over ``[lo, hi]``: ``bins`` equal ones, or for integer data
    bins ``width`` whole values wide with edges at half-integers. The width divides the
    number of values where one gives between ``bins / 2`` and ``2 * bins`` bins (uint8
    0..255: 64 bins of 4), so the last bin is not short of values (a dip that is no data's)."""
    if not integer:
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        return np.linspace(lo, hi, bins + 1)
    lo, hi = math.floor(lo), math.ceil(hi)
    values = hi - lo + 1
    width = max(1, math.ceil(values / bins))
    whole = [n for n in range(max(1, bins // 2), 2 * bins + 1) if n <= values and values % n == 0]
    if whole:
        width = values // min(whole, key=lambda n: abs(math.log(n / bins)))
    n = math.ceil(values / width)
    return lo - 0.5 + width * np.arange(n + 1, dtype=np.float64)


__all__ = ["Episodes", "RecentReturns", "RunningStats", "bin_edges", "compute_stats", "histograms"]
