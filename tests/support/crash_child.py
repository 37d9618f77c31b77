"""Child process of the crash tests: writes self-describing transitions until killed.

    python tests/support/crash_child.py STORE --acks FILE [--create --backend memmap --num-envs 1
        --max-size 37] [--flush-prob 0.02] [--seed 0] [--duration SECONDS] [--hold] [--frame-stack K]
        [--flush-every N] [--early-bytes B]

Opens (or with ``--create`` creates, when absent or left incomplete by a killed creator) the store at STORE for writing, then
appends ``ready <seen_size>`` to FILE and, after every ``add`` that returned, a line
``<seen_size>``. The acknowledgement is written with one ``os.write`` on an ``O_APPEND``
descriptor, so a kill leaves at most one partial last line, which readers ignore.
Transitions follow ``crash_common.step_args`` (``stack_step_args`` with ``--frame-stack``); the child continues from the store's
``seen_size``, flushes with probability ``--flush-prob`` after an add and now and then
samples (to move the sampler). ``--duration`` stops after that many seconds and closes
the store cleanly (``done <seen_size>``); ``--hold`` only holds the writer lock.
``--flush-every`` is the created store's; ``--early-bytes`` sets the writer's early work
(``flushing.EARLY_BYTES``) so that small stores copy undo rows ahead (``undocopy.py``).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

from crash_common import FRAME, add_step, crash_fields

from diskreplay import DiskReplay

from diskreplay.session import flushing
from diskreplay.errors import IncompleteStoreError, StoreNotFoundError


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("--acks", required=True)
    p.add_argument("--create", action="store_true")
    p.add_argument("--backend", default="memmap")
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--max-size", type=int, default=37)
    p.add_argument("--flush-prob", type=float, default=0.02)
    p.add_argument("--sample-prob", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--hold", action="store_true")
    p.add_argument("--frame-stack", type=int, default=None)
    p.add_argument("--flush-every", type=int, default=None)
    p.add_argument("--early-bytes", type=int, default=None)
    args = p.parse_args(argv)
    if args.early_bytes is not None:
        flushing.EARLY_BYTES = args.early_bytes

    try:
        buf = DiskReplay.open(args.store, mode="r+")
    except (StoreNotFoundError, IncompleteStoreError):
        if not args.create:
            raise
        # Absent, or an earlier child was killed while creating it (nothing acknowledged yet).
        buf = DiskReplay.create(args.store, args.max_size, num_envs=args.num_envs, backend=args.backend,
                                batch_size=4, seed=args.seed, overwrite=True, frame_stack=args.frame_stack,
                                flush_every=args.flush_every,
                                fields=crash_fields((args.frame_stack,) + FRAME) if args.frame_stack else crash_fields())
    fd = os.open(args.acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seen = buf.seen_size
    os.write(fd, b"ready %d\n" % seen)
    if args.hold:
        while True:
            time.sleep(1)
    rng = random.Random(args.seed)
    n = buf.num_envs
    stop_at = None if args.duration is None else time.monotonic() + args.duration
    while stop_at is None or time.monotonic() < stop_at:
        add_step(buf, seen + 1)
        seen += n
        os.write(fd, b"%d\n" % seen)
        x = rng.random()
        if x < args.flush_prob:
            buf.flush()
        elif x < args.flush_prob + args.sample_prob and buf.size:
            buf.sample()
    buf.close()
    os.write(fd, b"done %d\n" % seen)
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
