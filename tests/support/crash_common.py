"""Shared helpers of the crash-consistency tests: self-describing transitions and their checks.

Transition number ``t`` (1-based, in the order added) is stored as

* ``states``: ``STATE_SHAPE`` float32, every element ``t`` (a row mixing two transitions
  shows two values);
* ``actions`` int64 ``t``; ``rewards`` float32 ``t / 2``; ``dones`` ``t % 7 == 0``;
  ``tags`` (an extra field) int32 ``-t``;
* the ``next_state`` given to ``add``: every element ``t + num_envs`` (the state of the
  env's next transition), except for every third transition (``t % 3 == 0``), whose next
  state is ``t + num_envs + 0.25``: an autoreset jump, which the store keeps in its jump
  ring (so the kill -9 and power-cut suites cover the jump ring too).

The store must return the given next state for every transition (next states are exact).

A frame-stack store (``buf.frame_stack`` = k) gets stacks instead (``stack_step_args``):
each env runs episodes of 1, 4 and 6 steps (episodes shorter than k, as long as k and
longer); a state is the stack of its episode's k newest frames (the first frame repeated
before the episode's start, as ``FrameStackObservation`` pads), each frame naming its env,
its episode and its position, so a stack rebuilt from wrong frames shows.
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
    next_states = states + np.where(ts % 3 == 0, np.float32(num_envs + 0.25), np.float32(num_envs))[:, None]
    next_states = next_states.astype(np.float32)
    actions = ts.copy()
    rewards = (ts / 2).astype(np.float32)
    dones = ts % 7 == 0
    tags = (-ts).astype(np.int32)
    if num_envs == 1:
        return states[0], int(actions[0]), float(rewards[0]), next_states[0], bool(dones[0]), {"tags": np.int32(tags[0])}
    return states, actions, rewards, next_states, dones, {"tags": tags}


def add_step(buf, first: int) -> None:
    if buf.frame_stack:
        s, a, r, ns, d, extra = stack_step_args(first, buf.num_envs, buf.frame_stack)
    else:
        s, a, r, ns, d, extra = step_args(first, buf.num_envs, buf.fields["states"][0])
    buf.add(s, a, r, ns, d, **extra)


FRAME = (24,)


def episode_start(step: int, env: int) -> bool:
    """Whether env ``env`` starts an episode at step ``step`` (episodes of 6, 4 and 1 steps)."""
    return step == 0 or (step * 7 + env * 5) % 11 in (0, 4, 9)


def _frame(env: int, start: int, x: int) -> np.ndarray:
    x = max(x, 0)  # before the episode's first frame: that frame repeated
    out = np.full(FRAME, np.float32(start * 7 + x), np.float32)
    out[:3] = (env, start, x)
    return out


def stack_of(t: int, num_envs: int, k: int, next_state: bool = False) -> np.ndarray:
    """The state (or next state) of transition ``t``: its episode's k newest frames."""
    env, step = (t - 1) % num_envs, (t - 1) // num_envs
    start = step
    while not episode_start(start, env):
        start -= 1
    age = step - start + (1 if next_state else 0)  # the next state: the episode's next frame
    return np.stack([_frame(env, start, age - k + 1 + i) for i in range(k)])


def stack_step_args(first: int, num_envs: int, k: int):
    """As ``step_args``, for a frame-stack store of ``k`` frames of ``FRAME``."""
    ts = np.arange(first, first + num_envs, dtype=np.int64)
    states = np.stack([stack_of(t, num_envs, k) for t in ts.tolist()])
    next_states = np.stack([stack_of(t, num_envs, k, True) for t in ts.tolist()])
    dones = np.array([episode_start((t - 1) // num_envs + 1, (t - 1) % num_envs) for t in ts.tolist()])
    actions, rewards, tags = ts.copy(), (ts / 2).astype(np.float32), (-ts).astype(np.int32)
    if num_envs == 1:
        return states[0], int(actions[0]), float(rewards[0]), next_states[0], bool(dones[0]), {"tags": np.int32(tags[0])}
    return states, actions, rewards, next_states, dones, {"tags": tags}


def stack_row_problems(batch: dict, ts: np.ndarray, num_envs: int, k: int) -> list[str]:
    """``row_problems`` for a frame-stack store written with ``stack_step_args``."""
    problems = []
    for pos, t in enumerate(np.asarray(ts, np.int64).tolist()):
        bad = []
        if not np.array_equal(batch["states"][pos], stack_of(t, num_envs, k)):
            bad.append("states")
        if not np.array_equal(batch["next_states"][pos], stack_of(t, num_envs, k, True)):
            bad.append("next_states")
        if int(batch["actions"][pos]) != t or float(batch["rewards"][pos]) != float(np.float32(t / 2)):
            bad.append("action/reward")
        if bool(batch["dones"][pos]) != episode_start((t - 1) // num_envs + 1, (t - 1) % num_envs):
            bad.append(f"done {batch['dones'][pos]}")
        if "tags" in batch and int(batch["tags"][pos]) != -t:
            bad.append(f"tag {batch['tags'][pos]}")
        if bad:
            problems.append(f"slot holding transition {t}: " + ", ".join(bad))
    return problems


def row_problems(batch: dict, ts: np.ndarray, num_envs: int, newest: int | None) -> list[str]:
    """Why the rows of ``batch`` are not whole transitions ``ts`` (empty list when they are).

    ``newest`` is the store's ``seen_size`` (None for a reader racing the writer): next
    states are exact either way, so it only documents what the caller knows.
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
        given = np.float32(t + num_envs + (0.25 if t % 3 == 0 else 0))
        if not (nexts[pos] == given).all():
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
    k = buf.frame_stack
    rows = (lambda b, held: stack_row_problems(b, held, n, k)) if k else (lambda b, held: row_problems(b, held, n, seen))
    problems += rows(batch, ts)
    ns = np.asarray(buf.ns_buffer).reshape(n, -1)
    newest = np.arange(seen - n + 1, seen + 1)
    if k:
        want = np.stack([stack_of(t, n, k, True) for t in newest.tolist()]).reshape(n, -1)
        if not np.array_equal(ns, want):
            problems.append("ns_buffer does not hold the newest step's next stacks")
    else:
        want = (newest + n + np.where(newest % 3 == 0, 0.25, 0)).astype(np.float32)
        if not (ns == want[:, None]).all():
            problems.append(f"ns_buffer holds {np.unique(ns)[:8]}, expected {want}")
    sample = buf.sample(8)
    idxs = np.asarray(buf.batch_idxs)
    if idxs.shape != (8,) or idxs.min() < 0 or idxs.max() >= size:
        problems.append(f"sample drew indices {idxs} outside [0, {size})")
    else:
        problems += rows(sample, ts[idxs])
    return problems
