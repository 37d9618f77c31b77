"""Reader process of the concurrency test: samples and gets from a live store, checks rows.

    python tests/support/crash_reader.py STORE --duration SECONDS [--seed N]

Opens STORE with ``mode="r"`` beside a live writer, alternates ``sample()`` and
``get()`` of random slots, checks every returned row is one whole transition of
``crash_common.step_args`` whose number fits its slot, and prints one JSON line:
``{"rows", "batches", "torn_retries", "max_seen", "bad": [...]}``. A ``TornReadError``
(the library reporting a row it could not read consistently) is counted, not accepted.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from crash_common import row_problems

from diskreplay import DiskReplay
from diskreplay.errors import TornReadError


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    report = {"rows": 0, "batches": 0, "torn_retries": 0, "max_seen": 0, "bad": []}
    with DiskReplay.open(args.store, mode="r") as buf:
        n, m = buf.num_envs, buf.max_size
        stop = time.monotonic() + args.duration
        while time.monotonic() < stop and len(report["bad"]) < 20:
            try:
                if report["batches"] % 2:
                    batch = buf.sample(16)
                    idxs = np.asarray(buf.batch_idxs)
                else:
                    idxs = rng.integers(0, buf.size, 16)
                    batch = buf.get(idxs)
            except TornReadError:
                report["torn_retries"] += 1
                continue
            ts = np.asarray(batch["actions"], np.int64)
            problems = row_problems(batch, ts, n, None)
            wrong_slot = [(int(i), int(t)) for i, t in zip(idxs, ts) if t < 1 or (t - 1) % m != i]
            if wrong_slot:
                problems.append(f"slots hold transitions of other slots: {wrong_slot[:4]}")
            report["bad"] += problems
            report["rows"] += len(ts)
            report["batches"] += 1
            report["max_seen"] = max(report["max_seen"], int(ts.max()))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
