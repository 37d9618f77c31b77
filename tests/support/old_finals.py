"""A stale ``<path>.finals`` side store, as the SB3 and TorchRL integrations wrote it up to
commit 497696e (``diskreplay/finals.py``, deleted since; ``git show 497696e:diskreplay/finals.py``).

That code kept the true next state of episode ends in a second, ordinary store beside the
main one: the main path with ``.finals`` appended, ``num_envs`` 1, the main store's
``max_size`` and backend, seed 0, fields ``states`` (the main store's spec), ``actions``
(int64: the transition's number, the main store's ``seen_size`` once it was added),
``rewards`` (float32) and ``dones`` (bool), each row added as
``add(state, number, 0.0, state, True)``. The integrations now ignore it; the tests write
one with wrong states so that a read of it would show.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from diskreplay import DiskReplay

SUFFIX = ".finals"


def write_old_finals(store_path, rows) -> str:
    """Write ``<store_path>.finals`` for the (closed) store at ``store_path`` with
    ``rows``, ``(transition number, final state)`` pairs; returns its path."""
    with DiskReplay.open(store_path, mode="r") as main:
        max_size, backend = main.max_size, main.backend
        states_shape, states_dtype = main.fields["states"]
    path = os.fspath(store_path).rstrip(os.sep) + SUFFIX
    fields = {"states": (states_shape, states_dtype), "actions": ((), np.int64),
              "rewards": ((), np.float32), "dones": ((), bool)}
    with DiskReplay.create(path, max_size, backend=backend, seed=0, fields=fields) as side:
        for number, state in rows:
            state = np.asarray(state, states_dtype).reshape(states_shape)
            side.add(state, np.int64(number), np.float32(0.0), state, True)
    return path


def contents(path) -> dict:
    """``{relative file name: (size, mtime_ns, sha256)}`` of every file under ``path``, to
    show that nothing there was written, touched or removed."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            st = os.stat(full)
            out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns, digest)
    return out
