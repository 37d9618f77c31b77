"""Shared helpers of the crash-consistency tests: self-describing transitions and their checks.

Transition number ``t`` (1-based, in the order added) is stored as

* ``states``: ``STATE_SHAPE`` float32, every element ``t`` (a row mixing two transitions
  shows two values);
* ``actions`` int64 ``t``; ``rewards`` float32 ``t / 2``; ``dones`` ``t % 7 == 0``;
  ``tags`` (an extra field) int32 ``-t``;
* the ``next_state`` given to ``add``: every element ``t + num_envs + 0.25``.

So the next state the store returns for transition ``t`` is the state of transition
``t + num_envs`` (``t + num_envs``) while that one is in the store, and the given next
state (``t + num_envs + 0.25``) for the newest ``num_envs`` transitions.
"""
from __future__ import annotations

import numpy as np

STATE_SHAPE = (24,)  # 96-byte rows: several rows per 4 KiB page, so one torn page tears rows


def crash_fields(state_shape=STATE_SHAPE) -> dict:
    return {"states": (state_shape, "float32"), "actions": ((), "int64"),
            "rewards": ((), "float32"), "dones": ((), "bool"), "tags": ((), "int32")}


def step_args(first: int, num_envs: int, state_shape=STATE_SHAPE):
    """``(state, action, reward, next_state, done, extras)`` of the step whose first
    transition is number ``first``."""
    ts = np.arange(first, first + num_envs, dtype=np.int64)
    states = np.broadcast_to(ts.astype(np.float32)[:, None], (num_envs,) + tuple(state_shape)).copy()
    next_states = states + np.float32(num_envs + 0.25)
    actions = ts.copy()
    rewards = (ts / 2).astype(np.float32)
    dones = ts % 7 == 0
    tags = (-ts).astype(np.int32)
    if num_envs == 1:
        return states[0], int(actions[0]), float(rewards[0]), next_states[0], bool(dones[0]), {"tags": np.int32(tags[0])}
    return states, actions, rewards, next_states, dones, {"tags": tags}


def add_step(buf, first: int) -> None:
    s, a, r, ns, d, extra = step_args(first, buf.num_envs, buf.fields["states"][0])
    buf.add(s, a, r, ns, d, **extra)


def row_problems(batch: dict, ts: np.ndarray, num_envs: int, newest: int | None) -> list[str]:
    """Why the rows of ``batch`` are not whole transitions ``ts`` (empty list when they are).

    ``newest`` is the store's ``seen_size`` for an exact next-state check; None accepts
    either source of the next state (a reader racing the writer does not know it).
    """
    problems = []
    ts = np.asarray(ts, np.int64)
    states = batch["states"].reshape(len(ts), -1)
    nexts = batch["next_states"].reshape(len(ts), -1)
    for pos, t in enumerate(ts.tolist()):
        bad = []
        if not (states[pos] == np.float32(t)).all():
            bad.append(f"states {np.unique(states[pos])[:4]}")
        if int(batch["actions"][pos]) != t:
            bad.append(f"action {batch['actions'][pos]}")
        if float(batch["rewards"][pos]) != float(np.float32(t / 2)):
            bad.append(f"reward {batch['rewards'][pos]}")
        if bool(batch["dones"][pos]) != (t % 7 == 0):
            bad.append(f"done {batch['dones'][pos]}")
        if "tags" in batch and int(batch["tags"][pos]) != -t:
            bad.append(f"tag {batch['tags'][pos]}")
        in_ring = np.float32(t + num_envs)
        given = np.float32(t + num_envs + 0.25)
        if newest is None:
            ok_ns = (nexts[pos] == in_ring).all() or (nexts[pos] == given).all()
        else:
            want = given if t + num_envs > newest else in_ring
            ok_ns = (nexts[pos] == want).all()
        if not ok_ns:
            bad.append(f"next_state {np.unique(nexts[pos])[:4]}")
        if bad:
            problems.append(f"slot holding transition {t}: " + ", ".join(bad))
    return problems


def held_transitions(seen: int, max_size: int) -> np.ndarray:
    """Transition number held by each slot ``0..size-1`` of a never-reset store."""
    size = min(seen, max_size)
    if size == 0:
        return np.empty(0, np.int64)
    head = (seen - 1) % max_size
    slots = np.arange(size)
    return seen - (head - slots) % max_size


def store_problems(buf, *, min_seen: int, max_seen: int) -> list[str]:
    """Every invariant of a reopened never-reset store written with ``step_args``.

    ``seen_size`` must lie in ``[min_seen, max_seen]`` (a whole number of steps),
    ``size`` and ``head`` must follow from it, every slot must hold the whole
    transition its position implies (so every transition up to ``min_seen`` that the
    ring still holds is present), with the right next state, and ``ns_buffer`` must be
    the given next states of the newest step.
    """
    n, m = buf.num_envs, buf.max_size
    seen = buf.seen_size
    problems = []
    if not (min_seen <= seen <= max_seen):
        problems.append(f"seen_size {seen} outside [{min_seen}, {max_seen}]")
    if seen % n:
        problems.append(f"seen_size {seen} is not a whole number of {n}-env steps")
    size, head = buf.size, buf.head
    if size != min(seen, m) or len(buf) != size:
        problems.append(f"size {size} (len {len(buf)}) but seen_size {seen}, max_size {m}")
    if head != ((seen - 1) % m if seen else -1):
        problems.append(f"head {head} but seen_size {seen}, max_size {m}")
    if problems or seen == 0:
        return problems
    ts = held_transitions(seen, m)
    batch = buf.get(np.arange(len(ts)))
    problems += row_problems(batch, ts, n, seen)
    ns = np.asarray(buf.ns_buffer).reshape(n, -1)
    want = np.arange(seen - n + 1, seen + 1, dtype=np.float32) + np.float32(n + 0.25)
    if not (ns == want[:, None]).all():
        problems.append(f"ns_buffer holds {np.unique(ns)[:8]}, expected {want}")
    sample = buf.sample(8)
    idxs = np.asarray(buf.batch_idxs)
    if idxs.shape != (8,) or idxs.min() < 0 or idxs.max() >= size:
        problems.append(f"sample drew indices {idxs} outside [0, {size})")
    else:
        problems += row_problems(sample, ts[idxs], n, seen)
    return problems
