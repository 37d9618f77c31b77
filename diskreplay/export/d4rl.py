"""A store as one D4RL dataset file: the flat HDF5 layout D4RL's
``env.get_dataset(h5path=...)`` reads and ``qlearning_dataset`` and the loaders built on
its dict of arrays consume.

Datasets, one row per transition, N rows each:

- ``observations``, ``next_observations``: ``(N,) + state shape``, float32 when the
  store's states are floats, else their own integer (or bool) dtype, as D4RL-Atari keeps
  uint8 frames: D4RL's ``get_dataset`` checks only keys and shapes, and
  ``qlearning_dataset`` casts each observation to float32 itself (a float32 copy of
  uint8 frames would be four times the bytes to write and to read back). The next
  observations are the ones the store returns for each transition (``get``), never
  re-derived from the following row;
- ``actions``: float32 when the store's actions are floats, else their own (integer) dtype;
- ``rewards``: float32 ``(N,)``; ``terminals``: bool ``(N,)``, the store's ``dones``;
- ``timeouts``: bool ``(N,)``, set where an episode ends without terminating: the
  ``truncateds`` field (:data:`diskreplay.core.episodes.TRUNCATION_FIELD`) where the store has
  one, plus, when not terminal, the last transition before a next-state jump (an
  autoreset nobody marked), before rows a live writer overtook, and the last transition
  of each env's stream, so that loaders that cut trajectories at ``terminals | timeouts``
  never join two episodes. A store without a ``truncateds`` field thus has timeouts only
  at those cuts;
- ``infos/<name>``: each extra field, its own dtype and shape.

D4RL files hold one trajectory stream, so rows go per env (env 0's transitions oldest
first, then env 1's, ...): each env's episodes are contiguous, as offline-RL loaders
expect. One pass over the store writes each env's rows into its own region of the file;
memory stays one block of rows. Rows are written straight to their place in the file
(:class:`~diskreplay.export.placed.PlacedRows`) while the next block is read. The file's
attributes say where the rows came from and ``env_rows`` how many each env has.
"""
from __future__ import annotations

import os

import numpy as np

from ..core.episodes import TRUNCATION_FIELD
from ..errors import InvalidArgumentError
from .placed import PlacedRows, WriteBehind, create_placed

BASE_KEYS = ("states", "actions", "rewards", "next_states", "dones")
COPY_BYTES = 16 << 20
CHUNK_BYTES = 1 << 20
_TRUE = np.ones(1, bool)


def provenance(buf, reader) -> dict:
    """The attributes saying where an HDF5 export's rows came from."""
    snap = reader.snap
    return {"source": os.path.basename(os.path.abspath(buf.path)), "backend": buf.backend,
            "max_size": buf.max_size, "num_envs": buf.num_envs, "seen_size": snap.seen,
            "first_transition": snap.transition(reader.start + reader.skipped)}


def _row_bytes(x: np.ndarray) -> np.ndarray:
    """Each row's bytes, as 8-byte words where they divide evenly (compared 8x faster)."""
    x = np.ascontiguousarray(x)
    rows = x.reshape(len(x), -1).view(np.uint8).reshape(len(x), -1)
    return rows.view(np.uint64) if rows.shape[1] % 8 == 0 and rows.shape[1] else rows


def _flags(values) -> np.ndarray:
    values = np.asarray(values)
    return values.reshape(len(values), -1).any(axis=1)


def _layout(buf) -> dict:
    """``{dataset name: (row shape, dtype, store field)}`` of the file."""
    fields = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in buf.fields.items()}
    state_shape, _ = fields["states"]
    action_shape, action_dtype = fields["actions"]
    if np.issubdtype(action_dtype, np.floating):
        action_dtype = np.dtype(np.float32)
    f32 = np.dtype(np.float32)
    state_dtype = fields["states"][1] if fields["states"][1].kind in "biu" else f32  # integers: as D4RL-Atari
    layout = {"observations": (state_shape, state_dtype, "states"), "actions": (action_shape, action_dtype, "actions"),
              "rewards": ((), f32, "rewards"), "terminals": ((), np.dtype(bool), "dones"),
              "timeouts": ((), np.dtype(bool), None), "next_observations": (state_shape, state_dtype, "next_states")}
    for name, (shape, dtype) in fields.items():
        if name not in BASE_KEYS:
            layout[f"infos/{name}"] = (shape, dtype, name)
    return layout


class _EnvStream:
    """Where one env's rows go and what its last written row was."""

    def __init__(self, base: int):
        self.base = base
        self.written = 0
        self.last_t = None
        self.last_next = None
        self.last_ended = False  # terminal or timeout already set


def write_d4rl(buf, reader, tmp: str) -> int:
    """Write the rows of ``reader`` (a ChronoReader) to the D4RL file ``tmp``; returns the row count."""
    import h5py

    if int(np.prod(buf.fields["rewards"][0], dtype=np.int64)) != 1:
        raise InvalidArgumentError(f"the d4rl format holds one reward per transition; this store's rewards "
                                   f"have shape {tuple(buf.fields['rewards'][0])}")
    layout = _layout(buf)
    total = reader.stop - reader.start
    n = buf.num_envs
    with h5py.File(tmp, "w") as f, WriteBehind.opening(tmp) as out:
        dsets, places = {}, {}
        for name, (shape, dtype, _) in layout.items():
            if total:
                dsets[name] = create_placed(f, name, total, shape, dtype, min(total, _chunks(shape, dtype)[0]))
                places[name] = PlacedRows(dsets[name], out)
            else:
                dsets[name] = f.create_dataset(name, shape=(0,) + shape, maxshape=(None,) + shape, dtype=dtype)
        streams = None
        for block in reader:
            if streams is None:  # the reader's snapshot is final once it yields
                streams = _streams(reader)
            envs = reader.snap.env(block.positions)
            states, nexts = _row_bytes(block.batch["states"]), _row_bytes(block.batch["next_states"])
            for i0 in range(min(n, len(block.positions))):
                idx = slice(i0, None, n)  # one env's rows: views, not copies
                _write_env_rows(places, layout, streams[int(envs[i0])], block, idx, states, nexts, n)
        written = 0
        for stream in (streams or {}).values():
            if stream.written and not stream.last_ended:  # the stream ends mid-episode
                places["timeouts"].write(stream.base + stream.written - 1, _TRUE)
            written += stream.written
        for place in places.values():
            place.flush()
        if written != total:
            row_bytes = sum(d.dtype.itemsize * int(np.prod(d.shape[1:], dtype=np.int64)) for d in dsets.values())
            _compact(dsets, sorted((streams or {}).values(), key=lambda s: s.base), max(1, COPY_BYTES // row_bytes))
        f.attrs.update(provenance(buf, reader))
        f.attrs["order"] = "per env (env 0 first), each env oldest first"
        f.attrs["env_rows"] = [streams[e].written if streams else 0 for e in range(n)]
    return written


def _chunks(shape: tuple, dtype: np.dtype) -> tuple:
    """Whole rows, about CHUNK_BYTES a chunk: each env's rows land in their own region as
    short runs of rows, each a few positioned writes into chunks allocated at creation."""
    row = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
    return (max(1, CHUNK_BYTES // max(1, row)),) + tuple(shape)


def _streams(reader) -> dict:
    """Each env's region: envs in order, each as long as its share of ``[start, stop)``."""
    n, total = reader.snap.num_envs, reader.stop - reader.start
    first_env = int(reader.snap.env(reader.start))  # envs take turns from there
    base, streams = 0, {}
    for e in range(n):
        streams[e] = _EnvStream(base)
        base += total // n + int((e - first_env) % n < total % n)
    return streams


def _write_env_rows(places, layout, stream: _EnvStream, block, idx, states, nexts, n: int) -> None:
    batch = block.batch
    states, nexts, transitions = states[idx], nexts[idx], block.transitions[idx]
    rows = len(transitions)
    terminals = _flags(batch["dones"][idx])
    timeouts = _flags(batch[TRUNCATION_FIELD][idx]) if TRUNCATION_FIELD in batch else np.zeros(rows, bool)
    # A next state that is not the env's next state starts a new episode: an end without termination.
    jumps = np.zeros(rows, bool)
    jumps[:-1] = (states[1:] != nexts[:-1]).any(axis=1)
    timeouts |= jumps & ~terminals
    t0 = int(transitions[0])
    if stream.last_t is not None and not stream.last_ended and (
            t0 != stream.last_t + n or (states[0] != stream.last_next).any()):
        places["timeouts"].write(stream.base + stream.written - 1, _TRUE)  # a jump or a gap at the block's edge
    lo = stream.base + stream.written
    for name, (_, dtype, field) in layout.items():
        if name == "terminals":
            values = terminals
        elif name == "timeouts":
            values = timeouts
        else:
            values = batch[field][idx]
            if name == "rewards":
                values = values.reshape(rows)
        places[name].write(lo, values)  # converted to the dataset's dtype as it is copied out
    stream.written += rows
    stream.last_t = int(transitions[-1])
    stream.last_next = nexts[-1].copy()
    stream.last_ended = bool(terminals[-1] or timeouts[-1])


def _compact(dsets: dict, streams: list, rows: int) -> None:
    """Close the gaps rows a live writer overtook left at the end of each env's region
    (copied down in blocks, memory bounded), then cut the datasets to the rows written."""
    dest = 0
    for stream in streams:
        for lo in range(0, stream.written, rows):
            hi = min(lo + rows, stream.written)
            if dest + lo != stream.base + lo:
                for dset in dsets.values():
                    dset[dest + lo:dest + hi] = dset[stream.base + lo:stream.base + hi]
        dest += stream.written
    for dset in dsets.values():
        dset.resize(dest, axis=0)


__all__ = ["provenance", "write_d4rl"]
