"""Soak test: the random-SIGKILL loop of ``tests/durability/test_crash.py``, for long runs outside CI.

    PYTHONPATH=tests/support python scripts/crash_soak.py --kills 5000
    PYTHONPATH=tests/support python scripts/crash_soak.py --minutes 30 --backend hdf5 --num-envs 4 --max-size 37

It reuses the harness of the test suite (``tests/support/crash_harness.py``), so
``tests/support`` must be on the import path, as pytest puts it there for the tests.
Starts ``tests/support/crash_child.py`` on one store again and again, kills it with SIGKILL at
random instants, reopens the store, checks every invariant (every acknowledged
transition still within the ring present and whole, next states, ns_buffer, counters)
and resumes writing. Without ``--backend``/``--num-envs`` it cycles through every
backend and num_envs 1 and 4. Prints a summary; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from diskreplay.backends import BACKENDS

try:
    from crash_harness import run_kill_loop
except ModuleNotFoundError as exc:
    if exc.name != "crash_harness":
        raise
    sys.exit("scripts/crash_soak.py: no module crash_harness; run it with PYTHONPATH=tests/support")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    limit = p.add_mutually_exclusive_group(required=True)
    limit.add_argument("--kills", type=int, help="total number of kills")
    limit.add_argument("--minutes", type=float, help="run for this long")
    p.add_argument("--backend", choices=BACKENDS, help="default: every backend")
    p.add_argument("--num-envs", type=int, help="default: 1 and 4")
    p.add_argument("--max-size", type=int, default=37)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    args = p.parse_args(argv)

    cases = [(b, n) for b in ([args.backend] if args.backend else BACKENDS)
             for n in ([args.num_envs] if args.num_envs else [1, 4])]
    total = {"kills": 0, "checks": 0, "verified": 0, "failures": []}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        round_no = 0
        while not total["failures"]:
            done = total["kills"] if args.kills else (time.monotonic() - start) / 60
            if done >= (args.kills or args.minutes):
                break
            backend, n = cases[round_no % len(cases)]
            chunk = min(100, args.kills - total["kills"]) if args.kills else None
            minutes = None if args.kills else min(1.0, args.minutes - done)
            case_dir = os.path.join(work, f"round{round_no}")
            os.mkdir(case_dir)
            s = run_kill_loop(case_dir, backend, n, kills=chunk, minutes=minutes, max_size=args.max_size,
                              seed=args.seed * 100003 + round_no)
            for k in ("kills", "checks", "verified"):
                total[k] += s[k]
            total["failures"] += [f"[{backend}, num_envs {n}] {f}" for f in s["failures"]]
            print(f"round {round_no} {backend} num_envs={n}: {s['kills']} kills, {s['verified']} transitions "
                  f"verified, seen_size {s['seen']}, failures {len(s['failures'])}", flush=True)
            round_no += 1
    elapsed = time.monotonic() - start
    print(f"kills: {total['kills']}, checks: {total['checks']}, transitions verified: {total['verified']}, "
          f"failures: {len(total['failures'])} ({elapsed:.0f} s)")
    for f in total["failures"][:20]:
        print("  " + f)
    return 1 if total["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
