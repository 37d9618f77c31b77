"""Stores for the interruption tests (tests/durability/test_interrupts.py, tests/support/sigterm_child.py):
one per add path, deterministic steps whose next states chain (the next state of transition
``t`` is the state of ``t + num_envs``, as an env gives them), and a check that every
transition a store holds is whole and equal to the one that was added."""
import numpy as np

from diskreplay import DiskReplay
from diskreplay.testing import ring_state

STATE_SHAPE = (3,)

# name: (create kwargs, whether steps carry the extra field, how values are passed)
PATHS = {
    "fast-single": (dict(num_envs=1, max_size=7), False, "python"),
    "fast-vector": (dict(num_envs=3, max_size=12), False, "arrays"),
    "fast-extras": (dict(num_envs=2, max_size=9), True, "arrays"),
    "general-extras": (dict(num_envs=2, max_size=9), True, "lists"),
    "wrapping": (dict(num_envs=3, max_size=10), False, "arrays"),
    "flush-due": (dict(num_envs=2, max_size=8, flush_every=1), False, "arrays"),
}


def fields_for(extras: bool) -> dict:
    fields = {"states": (STATE_SHAPE, "float32"), "actions": ((), "int64"),
              "rewards": ((), "float32"), "dones": ((), "bool")}
    if extras:
        fields["costs"] = ((), "float64")
    return fields


def create(path, name: str, backend: str) -> DiskReplay:
    kwargs, extras, _ = PATHS[name]
    return DiskReplay.create(path, kwargs["max_size"], num_envs=kwargs["num_envs"], backend=backend,
                             seed=1, fields=fields_for(extras), flush_every=kwargs.get("flush_every"))


def step(name: str, t: int):
    """``(args, extra)`` of the env step whose first transition is number ``t`` (1-based)."""
    kwargs, extras, style = PATHS[name]
    n = kwargs["num_envs"]
    ts = np.arange(t, t + n)
    states = np.repeat(ts.astype(np.float32)[:, None], STATE_SHAPE[0], axis=1)
    next_states = states + n
    actions, rewards, dones = ts.astype(np.int64), (ts / 4).astype(np.float32), ts % 5 == 0
    extra = {"costs": ts * 1.5} if extras else {}
    if style == "lists":  # values to convert: the general path, whatever the fast one takes
        return (states, actions.tolist(), rewards, next_states, dones), {"costs": extra["costs"].tolist()}
    if n == 1:
        if style == "python":
            return (states[0], int(actions[0]), float(rewards[0]), next_states[0], bool(dones[0])), extra
        return (states[0], actions[0], rewards[0], next_states[0], dones[0]), {k: v[0] for k, v in extra.items()}
    return (states, actions, rewards, next_states, dones), extra


def add_step(buf: DiskReplay, name: str) -> int:
    """Add the next step of the chain (from ``seen_size``); returns its last transition number."""
    t = buf.seen_size + 1
    args, extra = step(name, t)
    buf.add(*args, **extra)
    return t + buf.num_envs - 1


def check_whole(buf: DiskReplay, name: str) -> None:
    """Every slot holds the transition its position says, whole, next state included."""
    kwargs, extras, _ = PATHS[name]
    state = ring_state(buf)
    seen, base, size, m = state.seen, state.base, buf.size, buf.max_size
    if size == 0:
        return
    batch = buf.get(np.arange(size))
    for t in range(seen - size + 1, seen + 1):
        slot = (t - base - 1) % m
        expect = t
        got = {k: batch[k][slot] for k in batch}
        assert np.all(got["states"] == expect), (name, t, got)
        assert got["actions"] == expect, (name, t, got)
        assert got["rewards"] == np.float32(expect / 4), (name, t, got)
        assert got["dones"] == (expect % 5 == 0), (name, t, got)
        assert np.all(got["next_states"] == expect + kwargs["num_envs"]), (name, t, got)
        if extras:
            assert got["costs"] == expect * 1.5, (name, t, got)

