"""The stores in ``tests/data/format497/``: written by diskreplay at commit 497696e (the last
commit before the house move of issue 34) with this script, together with what that code
read back from them (``expected.json``), so that ``tests/features/test_format497.py`` checks
the current code against stores and answers of the old code, not imitations of them:

    PYTHONPATH=<a checkout of 497696e> python tests/support/make_format497.py tests/data/format497

For each backend: ``plain`` (one env, the ring wrapped), ``vector`` (3 envs, wrapped),
``jumps`` (2 envs whose next states jump at every third transition: the jump ring),
``stacks`` (``frame_stack=4``, 2 envs, episodes of random length), ``prioritized``
(priorities updated) and ``killed`` (a writer SIGKILLed while adding: left as the kill left
it, so that opening it runs the current code's recovery). The answers of the killed store
are those of the old code after its recovery, taken on a copy.

Only the public API, which both versions share, is used; this file must stay runnable
against 497696e (it imports nothing else of the project).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

FIELDS = {"states": ((4,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool")}
STACK_FIELDS = {"states": ((4, 6, 6), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
                "dones": ((), "bool")}
KINDS = ("plain", "vector", "jumps", "stacks", "prioritized", "killed")
EXTRA_STEPS = 5  # steps each check adds after reopening


def options(kind: str) -> dict:
    """``DiskReplay.create``'s arguments (less path and backend) of a store of ``kind``."""
    base = {"max_size": 16, "num_envs": 1, "fields": FIELDS, "seed": 11, "batch_size": 6}
    return {
        "plain": base,
        "vector": {**base, "max_size": 15, "num_envs": 3},
        "jumps": {**base, "num_envs": 2},
        "stacks": {**base, "max_size": 20, "num_envs": 2, "fields": STACK_FIELDS, "frame_stack": 4},
        "prioritized": {**base, "prioritized": True},
        "killed": {**base, "max_size": 24, "num_envs": 2},
    }[kind]


def step_values(kind: str, t: int, num_envs: int):
    """``(state, action, reward, next_state, done)`` of the step whose first transition is ``t``."""
    ts = np.arange(t, t + num_envs)
    if kind == "stacks":
        frame = lambda u: np.full((1, 6, 6), u % 251, np.uint8)  # noqa: E731
        states = np.stack([np.concatenate([frame(u - 3), frame(u - 2), frame(u - 1), frame(u)]) for u in ts])
        next_states = np.stack([np.concatenate([s[1:], frame(u + 1)]) for s, u in zip(states, ts)])
        dones = (ts % 7 == 0)
    else:
        states = np.repeat(ts.astype(np.float32)[:, None], 4, axis=1)
        jump = (ts % 3 == 0) if kind in ("jumps", "killed") else np.zeros(num_envs, bool)
        next_states = states + np.where(jump, np.float32(num_envs + 0.5), np.float32(num_envs))[:, None]
        dones = (ts % 5 == 0)
    actions, rewards = ts.astype(np.int64), (ts / 2).astype(np.float32)
    if num_envs == 1:
        return states[0], int(actions[0]), float(rewards[0]), next_states[0], bool(dones[0])
    return states, actions, rewards, next_states.astype(states.dtype), dones


def fill(buf, kind: str, steps: int, start: int = 1) -> int:
    n = buf.num_envs
    for _ in range(steps):
        buf.add(*step_values(kind, start, n))
        start += n
    if kind == "prioritized" and buf.size:
        slots = np.arange(0, buf.size, 3)
        buf.update_priorities(slots, (slots % 5 + 0.25).astype(np.float64))
    return start


def digest(batch: dict) -> dict:
    """A sha256 per key of what a read returned (dtype, shape and bytes)."""
    out = {}
    for key in sorted(batch):
        a = np.ascontiguousarray(batch[key])
        h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
        out[key] = h.hexdigest()
    return out


def answers(path: str, kind: str) -> dict:
    """What the code that runs this reads back from the store at ``path`` (changed: run it
    on a copy): counters, every row, a reader's and a writer's first sample, verify, and
    the same after ``EXTRA_STEPS`` more steps."""
    from diskreplay import DiskReplay
    from diskreplay.verify import verify_store

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with DiskReplay.open(path, mode="r") as ro:
            out["reader"] = {"counters": [ro.seen_size, ro.size, ro.head], "rows": digest(ro.get(np.arange(ro.size)))}
            batch = ro.sample()
            out["reader"]["sample"] = {"idxs": np.asarray(ro.batch_idxs).tolist(), "batch": digest(batch)}
        with DiskReplay.open(path) as buf:  # recovery, for the killed store
            out["writer"] = {"counters": [buf.seen_size, buf.size, buf.head],
                             "rows": digest(buf.get(np.arange(buf.size)))}
            batch = buf.sample()
            out["writer"]["sample"] = {"idxs": np.asarray(buf.batch_idxs).tolist(), "batch": digest(batch)}
            start = fill(buf, kind, EXTRA_STEPS, buf.seen_size + 1)
            out["after_adds"] = {"counters": [buf.seen_size, buf.size, buf.head],
                                 "rows": digest(buf.get(np.arange(buf.size))), "next": start}
        report = verify_store(path)
        out["verify"] = {"ok": report.ok, "problems": list(report.problems)}
    return out


KILLED_CHILD = r"""
import sys
sys.path.insert(0, {here!r})
from make_format497 import fill, options
import diskreplay
from diskreplay import DiskReplay
print(diskreplay.__file__, flush=True)
opts = dict(options("killed"))
max_size = opts.pop("max_size")
buf = DiskReplay.create({path!r}, max_size, backend={backend!r}, **opts)
start = 1
while True:
    start = fill(buf, "killed", 1, start)
    print(buf.seen_size, flush=True)
"""


def make_killed(path: str, backend: str) -> int:
    """A child adds until it acknowledged 60 transitions and a little more, then SIGKILL."""
    code = KILLED_CHILD.format(here=os.path.dirname(os.path.abspath(__file__)), path=path, backend=backend)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    acked = 0
    try:
        module = child.stdout.readline().strip()
        if module != package_file():
            raise RuntimeError(f"the child imported {module}, not {package_file()}: run from another directory")
        while acked < 60:
            line = child.stdout.readline()
            if not line:
                raise RuntimeError("the child stopped before it was killed")
            acked = int(line)
        time.sleep(0.003)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return acked


def package_file() -> str:
    import diskreplay
    return diskreplay.__file__


def main(root: str) -> None:
    from diskreplay import DiskReplay

    print("writing with", package_file(), file=sys.stderr)

    os.makedirs(root, exist_ok=True)
    expected = {"commit": "497696e", "extra_steps": EXTRA_STEPS, "stores": {}}
    for backend in ("memmap", "hdf5"):
        for kind in KINDS:
            name = f"{kind}-{backend}"
            path = os.path.join(root, name)
            shutil.rmtree(path, ignore_errors=True)
            opts = dict(options(kind))
            max_size = opts.pop("max_size")
            record = {"kind": kind, "backend": backend, "options": {k: v for k, v in opts.items() if k != "fields"}}
            if kind == "killed":
                record["acknowledged"] = make_killed(path, backend)
            else:
                with DiskReplay.create(path, max_size, backend=backend, **opts) as buf:
                    fill(buf, kind, int(2.5 * max_size / buf.num_envs))
            with tempfile.TemporaryDirectory() as tmp:
                copy = os.path.join(tmp, name)
                shutil.copytree(path, copy)
                record.update(answers(copy, kind))
            record["max_size"] = max_size
            expected["stores"][name] = record
            print(name, record["writer"]["counters"], "verify", record["verify"]["ok"])
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
