"""Steps of the n-step tests, and their writer process.

Transition ``t`` (1-based) holds: ``states`` every element ``t``, ``actions`` ``t``,
``rewards`` ``t / 2`` (float32), ``dones`` ``t % 7 == 0``, ``tags`` ``-t``; the
``next_state`` given to ``add`` is ``t + num_envs``, the state of the env's next
transition. Next states thus follow the next-row rule exactly (no jumps), so the n-step
rows of a store follow from its ``seen_size`` alone, with or without a jump ring.

    python tests/support/nstep_writer.py STORE [--duration SECONDS] [--die-mid-add]

adds steps from the store's ``seen_size`` on, flushing now and then, until ``--duration``
has passed (then closes the store) or, with ``--die-mid-add``, writes the rows of one step
and is killed by SIGKILL where it would commit them.
"""
from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np

FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool"), "tags": ((), "int32")}
WRITER = os.path.abspath(__file__)


def step_args(first: int, num_envs: int) -> tuple:
    """``(state, action, reward, next_state, done, extras)`` of the step whose first
    transition is number ``first`` (env axis first when ``num_envs > 1``)."""
    ts = np.arange(first, first + num_envs, dtype=np.int64)
    states = np.repeat(ts.astype(np.float32)[:, None], 3, axis=1)
    values = [states, ts.copy(), (ts / 2).astype(np.float32), states + np.float32(num_envs), ts % 7 == 0,
              (-ts).astype(np.int32)]
    if num_envs == 1:
        values = [v[0] for v in values]
    return (*values[:5], {"tags": values[5]})


def add_steps(buf, steps: int) -> None:
    for _ in range(steps):
        s, a, r, ns, d, extra = step_args(buf.seen_size + 1, buf.num_envs)
        buf.add(s, a, r, ns, d, **extra)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--die-mid-add", action="store_true")
    args = p.parse_args()
    import diskreplay.session.writer as writer
    from diskreplay import DiskReplay

    buf = DiskReplay.open(args.store)
    if args.die_mid_add:
        writer.commit_step = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # rows written, never committed
        s, a, r, ns, d, extra = step_args(buf.seen_size + 1, buf.num_envs)
        buf._session.add(s, a, r, ns, d, extra)  # the general add, which commits through writer.commit_step
    rng = np.random.default_rng(0)
    stop = time.monotonic() + args.duration
    while time.monotonic() < stop:
        add_steps(buf, 1)
        if rng.random() < 0.02:
            buf.flush()
    buf.close()


if __name__ == "__main__":
    main()
