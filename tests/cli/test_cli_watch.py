"""``diskreplay watch``: a refreshing view of a store beside a live writer process, through
the installed entry point (as a user runs it): counters, add rate, recent returns, whether
the writer is alive; Ctrl-C quits cleanly; the store is never written."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from diskreplay import DiskReplay
from diskreplay.backends import BACKENDS
from diskreplay.stats import RecentReturns
from diskreplay.cli.watch import render

ENTRY = Path(sys.executable).with_name("diskreplay")
EPISODE = 5  # every env's episodes last 5 steps and earn 1 a step (2 on env 1): returns 5 and 10

# A trainer: 2 envs, a ring of 200 slots lapped many times, one step every millisecond.
WRITER = textwrap.dedent(f"""
    import sys, time
    import numpy as np
    from diskreplay import DiskReplay

    fields = {{"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
               "dones": ((), "bool")}}
    with DiskReplay.create(sys.argv[1], 200, num_envs=2, backend=sys.argv[2], fields=fields) as buf:
        step = 0
        while True:
            s = np.full((2, 3), step, np.float32)
            buf.add(s, np.array([step, step]), np.array([1.0, 2.0], np.float32), s + 1,
                    np.full(2, step % {EPISODE} == {EPISODE} - 1))
            step += 1
            if step == 300:
                print("ready", flush=True)
            time.sleep(0.001)
""")


def watch(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([str(ENTRY), "watch", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def digest(path: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(path.iterdir()) if p.name != "lock"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_watch_follows_a_live_writer(tmp_path, backend):
    path = tmp_path / "live.replay"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), backend], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        p = watch(path, "--interval", 0.3, "-n", 4, "--json")
        assert p.returncode == 0, p.stderr
        assert p.stderr == ""
        states = [json.loads(line) for line in p.stdout.splitlines()]
        assert len(states) == 4
        seen = [s["seen_size"] for s in states]
        assert seen == sorted(seen) and seen[-1] > seen[0] >= 600
        assert all(s["writer_alive"] and s["size"] == 200 for s in states)
        # a flush may stall the writer for a refresh or two on a busy disk, never for all three
        rates = [s["adds_per_s"] for s in states[1:]]
        assert states[0]["adds_per_s"] is None and min(rates) >= 0 and max(rates) > 0
        for s in states:
            r = s["returns"]
            assert r["count"] > 0 and r["finite"] == r["count"]
            assert set(s["recent_returns"]) <= {5.0, 10.0} and (r["min"], r["max"]) == (5.0, 10.0)
        assert states[-1]["returns"]["ended"] > states[0]["returns"]["ended"]
        text = watch(path, "--interval", 0.2, "-n", 2)  # not a terminal: one view below the other
        assert text.returncode == 0, text.stderr
        views = text.stdout.split("\n\n")
        assert len(views) == 2 and all("writer      live" in v and "transitions/s" in views[1] for v in views)
        assert "returns     last " in views[1] and "min 5, max 10" in views[1]
    finally:
        writer.kill()
        writer.wait()
    p = watch(path, "-n", 1, "--json")  # the writer died: said so, and the store still reads
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["writer_alive"] is False


def test_watch_quits_cleanly_on_ctrl_c_and_never_writes(tmp_path):
    path = tmp_path / "still.replay"
    with DiskReplay.create(path, 50, num_envs=2) as buf:
        for t in range(30):
            buf.add(np.zeros((2, 2), np.float32), np.array([0, 1]), np.ones(2, np.float32),
                    np.ones((2, 2), np.float32), np.array([t % 3 == 2, False]))
    before = digest(path)
    proc = subprocess.Popen([str(ENTRY), "watch", str(path), "--interval", "0.1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # the first view is out; a long path lost its start, not its end
        shown = first.split("  every 0.1 s, Ctrl-C quits  ")[0]
        assert "Ctrl-C quits" in first and str(path).endswith(shown.lstrip("…")) and len(shown) > 12, first
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Aborted" not in err
    assert "seen_size   60" in out and "ended in the 50 rows read" in out
    assert digest(path) == before


def test_a_long_path_keeps_the_store_name_in_the_title(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    state = {"writer_alive": False, "last_flush": None, "seen_size": 0, "size": 0, "max_size": 5, "head": 0,
             "adds_per_s": None, "returns": {"count": 0, "finite": 0, "ended": 0, "rows_read": 0},
             "recent_returns": []}
    path = "/" + "d" * 100 + "/pong.replay"
    title = render(path, state, 2.0)[0]
    assert len(title) == 80 and title.startswith("…") and "/pong.replay  every 2 s, Ctrl-C quits" in title
    assert render("/s.replay", state, 2.0)[0].startswith("/s.replay  every 2 s")


def test_watch_refuses_what_is_not_a_store(tmp_path):
    p = watch(tmp_path / "nothing", "-n", 1)
    assert p.returncode == 1 and p.stderr.startswith("Error: ") and "Traceback" not in p.stderr
    p = watch(tmp_path, "--interval", 0)
    assert p.returncode == 2 and "--interval" in p.stderr


def test_recent_returns_reads_each_row_once(tmp_path, backend):
    """Polls read only new rows, and an episode whose start was not read is not counted."""
    path = tmp_path / "r.replay"
    fields = {"states": ((1,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool"), "truncateds": ((), "bool")}
    with DiskReplay.create(path, 20, num_envs=1, backend=backend, fields=fields) as buf:
        def add(reward, done=False, truncated=False):
            buf.add(np.zeros(1, np.float32), 0, reward, np.zeros(1, np.float32), done, truncateds=truncated)

        for r in (1.0, 2.0, 3.0):
            add(r)
        add(4.0, done=True)  # the store's first episode: 10
        with DiskReplay.open(path, mode="r") as reader:
            recent = RecentReturns(reader, keep=2, window=20)
            assert recent.poll() == [(4, 0, 10.0)]
            assert recent.poll() == []
            add(5.0)
            add(np.nan, truncated=True)  # a truncation ends an episode too: its return is NaN
            add(7.0, done=True)
            (t, env, nan), last = recent.poll()
            assert (t, env, last) == (6, 0, (7, 0, 7.0)) and np.isnan(nan)
            assert [t for t, _, _ in recent.returns] == [6, 7]  # keep=2
            s = recent.summary()
            assert (s["count"], s["finite"], s["ended"], s["rows_read"], s["mean"]) == (2, 1, 3, 7, 7.0)
            for _ in range(30):  # more than the ring between two polls: the running episode is cut
                add(1.0)
            add(1.0, done=True)
            assert recent.poll() == []
            add(2.0, done=True)
            assert recent.poll() == [(39, 0, 2.0)]
