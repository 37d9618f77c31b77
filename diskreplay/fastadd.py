"""The fast adds: ``add`` specialised for a store with the four core fields, built by
``Writer.bind_add`` as closures over the writer's arrays and counter words.

Each call does cheap checks on cached shapes, dtypes and types, then the commit protocol
of ``counters.begin_step`` / ``commit_step`` written inline (a call per step would cost
a measurable share of an add). Anything the checks do not accept, a step that wraps the
ring end, and a writer that is no longer ``live`` (closed, or failed a sync) go through
the general path. ``tests/test_commit_paths.py`` proves both paths byte-identical.
"""
from __future__ import annotations

import numpy as np

from .counters import W_CHECK, W_INTENT, W_SEEN
from .schema import FieldSpec


def fast_add(w):
    """``add`` for one env and the four core fields: cheap checks, four row stores, one
    commit (``counters.begin_step`` and ``commit_step`` written inline)."""
    specs = w.fields
    shape, dtype = specs["states"].shape, specs["states"].dtype
    (a_types, a_bounds), (r_types, r_bounds), (d_types, d_bounds) = (
        _fast_scalar_types(specs[name]) for name in ("actions", "rewards", "dones"))
    a_lo, a_hi = a_bounds or (1, 0)
    states, actions, rewards, dones = w.arrays
    ns_rows = w.data.ns[:, 0]
    words = w.words
    key = w.key
    max_size = w.max_size
    ndarray = np.ndarray
    general = w.add

    def add(state, action, reward, next_state, done, **extra):
        if (not w.live or extra or type(state) is not ndarray or state.shape != shape or state.dtype != dtype
                or type(next_state) is not ndarray or next_state.shape != shape or next_state.dtype != dtype
                or type(reward) not in r_types or type(done) not in d_types):
            return general(state, action, reward, next_state, done, extra)
        ta = type(action)
        if ta not in a_types and not (ta is int and a_lo <= action <= a_hi):
            return general(state, action, reward, next_state, done, extra)
        seen = w.seen
        t = seen + 1
        if t > w.flush_before:
            w.flush()
        words[W_INTENT] = t
        slot = (seen - w.base) % max_size
        states[slot] = state
        actions[slot] = action
        rewards[slot] = reward
        dones[slot] = done
        ns_rows[t & 1] = next_state
        words[W_SEEN] = t
        words[W_CHECK] = t ^ key
        w.seen = t

    return add


def fast_vector_add(w):
    """``add`` for a vector env: exact-dtype arrays go straight to one slice write per field.

    The checks are chained ``is`` tests on cached shapes and dtypes (an equal dtype that is
    not the same object falls back to ``==``); a step that wraps around the ring end or
    is due for a flush goes through ``write_step``."""
    n = w.num_envs
    specs = w.fields
    (s_shape, s_dt), (a_shape, a_dt), (r_shape, r_dt), (d_shape, d_dt) = (
        ((n,) + specs[name].shape, specs[name].dtype) for name in ("states", "actions", "rewards", "dones"))
    states, actions, rewards, dones = w.arrays
    ns = w.data.ns
    words = w.words
    key = w.key
    max_size = w.max_size
    ndarray = np.ndarray
    general = w.add
    write = w.write_step

    def add(state, action, reward, next_state, done, **extra):
        if (not w.live or extra or type(state) is not ndarray or type(next_state) is not ndarray
                or type(action) is not ndarray or type(reward) is not ndarray or type(done) is not ndarray
                or state.shape != s_shape or next_state.shape != s_shape or action.shape != a_shape
                or reward.shape != r_shape or done.shape != d_shape
                or not (state.dtype is s_dt or state.dtype == s_dt)
                or not (next_state.dtype is s_dt or next_state.dtype == s_dt)
                or not (action.dtype is a_dt or action.dtype == a_dt)
                or not (reward.dtype is r_dt or reward.dtype == r_dt)
                or not (done.dtype is d_dt or done.dtype == d_dt)):
            return general(state, action, reward, next_state, done, extra)
        seen = w.seen
        t_end = seen + n
        start = (seen - w.base) % max_size
        stop = start + n
        if stop > max_size or t_end > w.flush_before:
            return write([state, action, reward, done, next_state])
        words[W_INTENT] = t_end
        states[start:stop] = state
        actions[start:stop] = action
        rewards[start:stop] = reward
        dones[start:stop] = done
        ns[(t_end // n) & 1] = next_state
        words[W_SEEN] = t_end
        words[W_CHECK] = t_end ^ key
        w.seen = t_end

    return add


def _fast_scalar_types(spec: FieldSpec):
    """Types whose values a scalar field stores without loss (Python int needs a range check)."""
    if spec.shape != ():
        return (frozenset(), None)
    dt = spec.dtype
    if dt.kind == "f":
        return (frozenset({float, int, bool, np.float64, np.float32, np.float16, dt.type}), None)
    if dt.kind == "b":
        return (frozenset({bool, np.bool_}), None)
    info = np.iinfo(dt)
    return (frozenset({dt.type}), (int(info.min), int(info.max)))
