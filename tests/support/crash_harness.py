"""The SIGKILL loop shared by ``tests/durability/test_crash.py`` and ``scripts/crash_soak.py``.

Each round starts ``crash_child.py`` on the same store, lets it write (or, now and
then, kills it while it is still starting up or recovering), sends it SIGKILL at a
random instant, and then (most rounds) reopens the store, first sometimes read-only
(a reader beside a dead writer) and then for writing, checks every invariant of
``crash_common.store_problems`` against the acknowledged adds, writes a few steps
itself and closes. Rounds that skip the check leave the recovery to the next child.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import warnings

from crash_common import add_step, store_problems

from diskreplay import DiskReplay, DiskReplayError
from diskreplay.errors import IncompleteStoreError, RecoveryWarning, StoreNotFoundError

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_child.py")


class Acks:
    """Complete lines a child appended to the acknowledgement file."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode().splitlines()

    def reset(self) -> None:
        """Forget the file (a partial last line of a killed child included)."""
        with open(self.path, "wb"):
            pass
        self.offset = 0


def _complete_store(path: str) -> bool:
    try:
        DiskReplay.open(path, mode="r").close()
        return True
    except (StoreNotFoundError, IncompleteStoreError):
        return False


def run_kill_loop(workdir: str, backend: str, num_envs: int, *, kills: int | None = None,
                  minutes: float | None = None, max_size: int = 37, seed: int = 0,
                  check_prob: float = 0.75, progress=None, frame_stack: int | None = None,
                  flush_every: int | None = None, early_bytes: int | None = None) -> dict:
    """Run rounds until ``kills`` kills or ``minutes`` elapsed; returns a summary dict
    with ``kills``, ``checks``, ``verified`` (transitions checked), ``failures`` (list)."""
    store = os.path.join(workdir, f"store-{backend}-{num_envs}.replay")
    acks = Acks(os.path.join(workdir, f"acks-{backend}-{num_envs}.txt"))
    acks.reset()
    errlog = os.path.join(workdir, f"child-{backend}-{num_envs}.err")
    rng = random.Random(seed)
    n = num_envs
    acked = 0  # seen_size every later open must reach (acknowledged adds and recoveries)
    summary = {"kills": 0, "checks": 0, "verified": 0, "failures": [], "seen": 0, "in_flight_committed": 0}
    failures = summary["failures"]
    deadline = None if minutes is None else time.monotonic() + 60 * minutes

    def take(lines) -> None:
        nonlocal acked
        for line in lines:
            if line.startswith("ready "):
                s = int(line.split()[1])
                if not acked <= s <= acked + n:
                    failures.append(f"child reopened at seen_size {s}, last acknowledged {acked}")
                acked = s
            elif line.strip():
                s = int(line)
                if s != acked + n:
                    failures.append(f"acknowledgement {s} does not follow {acked}")
                acked = s

    while not failures:
        if kills is not None and summary["kills"] >= kills:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        cmd = [sys.executable, CHILD, store, "--acks", acks.path, "--create", "--backend", backend,
               "--num-envs", str(n), "--max-size", str(max_size), "--seed", str(rng.randrange(1 << 30)),
               "--flush-prob", str(rng.choice([0.0, 0.005, 0.03, 0.2]))]
        if frame_stack:
            cmd += ["--frame-stack", str(frame_stack)]
        if flush_every:
            cmd += ["--flush-every", str(flush_every)]
        if early_bytes is not None:
            cmd += ["--early-bytes", str(early_bytes)]
        with open(errlog, "wb") as err:
            child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        try:
            if rng.random() < 0.15:
                time.sleep(rng.uniform(0.0, 0.3))  # startup, recovery or the first adds
            else:
                # The kill instant: a random time after the child's first acknowledgement, but
                # never before ``floor`` more adds landed, so that the loop progresses as far
                # on a slow or busy machine as on a fast one (the tests assert the ring
                # wrapped); the floor is drawn from the seeded rng, not from the clock.
                floor = rng.randrange(0, 2 * max_size)
                t0 = time.monotonic()
                ready, landed, slept = False, 0, False
                while True:
                    lines = acks.new_lines()
                    take(lines)
                    ready = ready or any(line.startswith("ready ") for line in lines)
                    landed += sum(1 for line in lines if line.strip() and not line.startswith("ready "))
                    if ready and not slept:
                        time.sleep(rng.uniform(0.0, 0.08))
                        slept = True
                        continue
                    if ready and landed >= floor:
                        break
                    if child.poll() is not None or time.monotonic() - t0 > 120:
                        break
                    time.sleep(0.002)
                time.sleep(rng.uniform(0.0, 0.005))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        summary["kills"] += 1
        take(acks.new_lines())
        acks.reset()
        if child.returncode != -signal.SIGKILL:
            with open(errlog, "rb") as f:
                failures.append(f"child exited with {child.returncode} before the kill: "
                                f"{f.read().decode(errors='replace')[-3000:]}")
            break
        last = kills is not None and summary["kills"] >= kills
        if not last and rng.random() >= check_prob:
            continue  # the next child recovers the store itself
        if acked == 0 and not _complete_store(store):
            continue  # killed before create finished: nothing was acknowledged, the next child creates it
        summary["checks"] += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RecoveryWarning)
                if rng.random() < 0.3:
                    with DiskReplay.open(store, mode="r") as reader:
                        found = store_problems(reader, min_seen=acked, max_seen=acked + n)
                    failures += [f"reader after kill {summary['kills']}: {p}" for p in found]
                buf = DiskReplay.open(store, mode="r+")
                try:
                    seen = buf.seen_size
                    found = store_problems(buf, min_seen=acked, max_seen=acked + n)
                    failures += [f"writer after kill {summary['kills']} (acknowledged {acked}): {p}"
                                 for p in found]
                    if seen > acked:
                        summary["in_flight_committed"] += 1
                    summary["verified"] += buf.size
                    acked = seen
                    for _ in range(rng.randrange(3)):
                        add_step(buf, acked + 1)
                        acked += n
                finally:
                    buf.close()
        except DiskReplayError as exc:
            failures.append(f"reopening after kill {summary['kills']} failed: {type(exc).__name__}: {exc}")
        if progress is not None:
            progress(summary)
    summary["seen"] = acked
    return summary
