"""Episodes as data: a store read oldest first and cut into episodes, per env, in one pass.

Episodes end where :func:`diskreplay.core.episodes.episode_ends` says (``dones``, a
``truncateds`` field) or where a row's next state is not the state of its env's next
row (a jump: an autoreset nobody marked), found by comparing the bytes of the two.
Reading goes through :class:`~diskreplay.chrono.ChronoReader` in row blocks, so memory
stays bounded by the longest episode, whatever the store's size, and a live writer may
keep adding: rows it overwrites before they are read are skipped (``skipped``), and the
episodes they cut are not complete.

    from diskreplay import DiskReplay

    with DiskReplay.open("runs/pong.replay", mode="r") as buf:
        for ep in buf.episodes():
            print(ep["env"], len(ep["actions"]), ep["rewards"].sum(), ep["complete"])
"""
from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

import numpy as np

from .chrono import ChronoReader, block_rows
from .core.episodes import episode_ends
from .errors import InvalidArgumentError

# Keys of an episode's data besides its fields' rows (``states`` gets one row more).
_NOT_ROWS = ("next_states",)


class Episode(NamedTuple):
    """One episode of one env: transition numbers (1-based, as ``seen_size`` counts) of
    its first and last rows, ``complete`` (its first and last transitions are both held:
    it started among the rows read and it ended), ``ended`` (its last row ends it),
    ``length``, ``ret`` (the sum of its rewards) and, when read with data, the dict
    ``DiskReplay.episodes()`` yields."""

    env: int
    first: int
    last: int
    complete: bool
    ended: bool
    length: int
    ret: float
    data: dict | None


class _Open:
    """An episode of one env still being read."""

    def __init__(self, first: int, started: bool):
        self.first = first
        self.started = started
        self.length = 0
        self.ret = 0.0
        self.pieces: list[dict] = []
        self.last = first - 1
        self.last_next: np.ndarray | None = None
        self.last_end = False


def _row_bytes(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` as bytes, so that equal states compare equal (NaN included)."""
    x = np.ascontiguousarray(x)
    return x.reshape(len(x), -1).view(np.uint8).reshape(len(x), -1)


class EpisodeReader:
    """Iterates the :class:`Episode` s of the chronological positions ``[start, stop)``
    (as Python slices; default all) of ``buf``, optionally of one ``env`` only. For each
    env they come oldest first; an env's episode is yielded once the row after it is read
    (or at the end, then ``ended`` only if its last row ends it). With ``data=False``
    only the summary is kept (no rows held). ``progress(done, total)`` as in ChronoReader."""

    def __init__(self, buf, start: int | None = None, stop: int | None = None, *, env: int | None = None,
                 data: bool = True, rows: int | None = None, progress: Callable[[int, int], None] | None = None):
        if env is not None and (isinstance(env, bool) or not isinstance(env, (int, np.integer))
                                or not 0 <= env < buf.num_envs):
            raise InvalidArgumentError(f"env must be an integer in [0, {buf.num_envs}) (the store has "
                                       f"{buf.num_envs} envs), got {env!r}")
        if rows is None:
            rows = block_rows(buf, 2) if buf.fields is not None else 1
        self.reader = ChronoReader(buf, start, stop, rows=rows, progress=progress)
        self.env = None if env is None else int(env)
        self.data = data
        self.num_envs = buf.num_envs

    @property
    def skipped(self) -> int:
        """Rows the live writer overwrote before they were read (left out)."""
        return self.reader.skipped

    def __iter__(self) -> Iterator[Episode]:
        n = self.num_envs
        open_: dict[int, _Open] = {}
        for block in self.reader:
            batch = block.batch
            if "dones" not in batch:
                continue
            envs = self.reader.snap.env(block.positions)
            ends = episode_ends(batch)
            states, nexts = _row_bytes(batch["states"]), _row_bytes(batch["next_states"])
            rows = len(ends)
            # Row i (i >= n) starts an episode when its env's previous row, i - n, ended one
            # or handed on a next state that is not row i's state.
            starts = np.zeros(rows, bool)
            if rows > n:
                starts[n:] = ends[:-n] | (states[n:] != nexts[:-n]).any(axis=1)
            closed = []
            for i0 in range(min(n, rows)):
                env = int(envs[i0])
                if self.env is not None and env != self.env:
                    continue
                idx = np.arange(i0, rows, n)
                closed += self._fold_env(open_, env, idx, block, batch, ends, starts, states)
            closed.sort(key=lambda ep: ep.last)
            yield from closed
        for env in sorted(open_):
            op = open_[env]
            yield self._close(env, op, ended=op.last_end)

    def _fold_env(self, open_: dict, env: int, idx: np.ndarray, block, batch: dict, ends: np.ndarray,
                  starts: np.ndarray, states: np.ndarray) -> list[Episode]:
        """Fold the rows ``idx`` of ``env`` (in order, consecutive transitions of it) into its
        open episode; returns the episodes they close."""
        n = self.num_envs
        closed = []
        t0 = int(block.transitions[idx[0]])
        op = open_.pop(env, None)
        if op is not None and op.last != t0 - n:  # rows between were skipped: the episode is cut
            closed.append(self._close(env, op, ended=op.last_end))
            op = None
        flags = starts[idx]
        if op is None:
            flags[0] = True
            started0 = t0 <= n  # the env's very first transition is held
        else:
            flags[0] = op.last_end or bool((states[idx[0]] != op.last_next).any())
            started0 = True
        cuts = np.flatnonzero(flags).tolist() + [len(idx)]
        if cuts[0] > 0:
            self._extend(op, idx[: cuts[0]], block, batch)
        for a, b in zip(cuts[:-1], cuts[1:]):
            if op is not None:
                closed.append(self._close(env, op, ended=True))
            op = _Open(int(block.transitions[idx[a]]), started0 if a == 0 else True)
            self._extend(op, idx[a:b], block, batch)
        last = idx[-1]
        op.last_next = _row_bytes(batch["next_states"][last:last + 1])[0]
        op.last_end = bool(ends[last])
        open_[env] = op
        return closed

    def _extend(self, op: _Open, sel: np.ndarray, block, batch: dict) -> None:
        rewards = np.asarray(batch["rewards"][sel], np.float64)
        with np.errstate(all="ignore"):
            op.ret += float(rewards.sum())
        op.length += len(sel)
        op.last = int(block.transitions[sel[-1]])
        if self.data:
            piece = {key: value[sel] for key, value in batch.items() if key not in _NOT_ROWS}
            piece["slots"] = block.slots[sel]
            piece["next_states"] = batch["next_states"][sel[-1:]]
            op.pieces.append(piece)

    def _close(self, env: int, op: _Open, *, ended: bool) -> Episode:
        data = None
        if self.data:
            data = {"env": env}
            for key in op.pieces[0]:
                if key != "next_states":
                    data[key] = np.concatenate([p[key] for p in op.pieces])
            data["states"] = np.concatenate([data["states"], op.pieces[-1]["next_states"]])
            data["complete"] = bool(op.started and ended)
            op.pieces = []
        return Episode(env, op.first, op.last, bool(op.started and ended), ended, op.length, op.ret, data)


__all__ = ["Episode", "EpisodeReader"]
