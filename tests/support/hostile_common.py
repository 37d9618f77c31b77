"""Shared by the hostile-input tests and their child process: a small wrapped store,
snapshots of what a user can read from it, and whole-directory byte copies."""
from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np

from diskreplay import DiskReplay

FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool"), "log_probs": ((), "float32")}
MAX_SIZE = 7
NUM_ENVS = 2
STEPS = 6  # 12 transitions into 7 slots: the ring has wrapped


def step_args(step: int, num_envs: int = NUM_ENVS):
    ts = np.arange(step * num_envs + 1, (step + 1) * num_envs + 1)
    states = np.stack([np.full(3, t, np.float32) for t in ts])
    return (states, ts.astype(np.int64), (ts / 4).astype(np.float32), states + np.float32(0.5),
            ts % 3 == 0), {"log_probs": (-ts / 8).astype(np.float32)}


def build_store(path, backend: str) -> None:
    """A closed store with every kind of file in it, its ring wrapped and its sampler moved."""
    with DiskReplay.create(path, MAX_SIZE, num_envs=NUM_ENVS, backend=backend, fields=FIELDS,
                           seed=3, batch_size=4) as buf:
        for step in range(STEPS):
            args, extra = step_args(step)
            buf.add(*args, **extra)
            if step == 2:
                buf.flush()
        buf.sample(3)
        buf.sample(2)


def snapshot(buf, sample: bool = True) -> dict:
    """Everything a user can read from an open store, as plain numbers and arrays.
    With ``sample``, also 4 sampled indices (which moves the persisted sampler of a writer)."""
    size = buf.size
    out = {"size": size, "seen_size": buf.seen_size, "head": buf.head, "max_size": buf.max_size,
           "num_envs": buf.num_envs}
    if size:
        batch = buf.get(np.arange(size))
        out["rows"] = {k: np.asarray(v) for k, v in sorted(batch.items())}
        out["ns_buffer"] = np.asarray(buf.ns_buffer)
        if sample:
            buf.sample(4)
            out["sample_idxs"] = np.asarray(buf.batch_idxs)
    return out


def digest(snap: dict) -> str:
    """A hash of a snapshot, equal for stores with the same readable contents."""
    h = hashlib.sha256()
    for key in ("size", "seen_size", "head", "max_size", "num_envs"):
        h.update(f"{key}={snap[key]};".encode())
    for name, arr in sorted(snap.get("rows", {}).items()):
        h.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    for key in ("ns_buffer", "sample_idxs"):
        if key in snap:
            arr = snap[key]
            h.update(f"{key}:{arr.dtype.str}:{arr.shape};".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def read_digest(path, sample: bool = True) -> str:
    """The digest of a store as a reader sees it."""
    with DiskReplay.open(path, mode="r") as buf:
        return digest(snapshot(buf, sample))


def file_bytes(directory) -> dict:
    """{name: bytes} of every regular file directly in ``directory``."""
    out = {}
    for name in sorted(os.listdir(directory)):
        p = os.path.join(directory, name)
        if os.path.isfile(p) and not os.path.islink(p):
            with open(p, "rb") as f:
                out[name] = f.read()
    return out


def tree_state(directory) -> dict:
    """{relative path: bytes, or None for a directory} of everything under ``directory``."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), directory)] = None
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, directory)] = f.read()
    return out


def put_file(path, data: bytes) -> None:
    """Make ``path`` a regular file holding ``data``, whatever is there now."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)
