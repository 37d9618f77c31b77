"""Fork safety (issue 35 item 1): a writer inherited by a forked child never writes,
flushes, marks or unlocks the parent's store; the parent, killed afterwards, loses no
acknowledged add."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from diskreplay import DiskReplay
from paths import SUPPORT

CHILD = os.path.join(SUPPORT, "fork_child.py")


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("how", ["_exit", "exit", "drop"])
def test_a_forked_child_never_touches_the_parents_store(tmp_path, backend, prioritized, how):
    store = str(tmp_path / "s")
    proc = subprocess.Popen([sys.executable, CHILD, store, backend, str(int(prioritized)), how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SUPPORT})
    acked, child = [], None
    try:
        for line in proc.stdout:  # no timing: the parent says when it is done
            word, _, rest = line.strip().partition(" ")
            if word == "ack":
                acked.append(int(rest))
            elif word == "child":
                child = rest.split()
                with DiskReplay.open(store, mode="r") as reader:  # a reader beside the parent, after the child
                    assert reader.seen_size == 20
                    np.testing.assert_array_equal(reader.get([19])["actions"], [19])
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif word == "done":
                break
        else:
            pytest.fail(f"the writer ended early (exit {proc.wait()})")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    calls = ["add", "flush", "reset", "sample", "get"] + ["update_priorities"] * prioritized
    assert child == [f"{name}:forked" for name in calls] + ["closed:True"]
    assert acked == list(range(70))
    with DiskReplay.open(store, mode="r+") as buf:  # recovery after the kill: every acknowledged add
        assert buf.seen_size == 70
        got = buf.get(np.arange(64))  # slot s holds the transition t of 6..69 with t = s mod 64
        held = (np.arange(64) - 6) % 64 + 6
        np.testing.assert_array_equal(got["actions"], held)
        np.testing.assert_array_equal(got["next_states"][:, 0], held + 1)
        if prioritized:
            assert np.isfinite(got["priorities"]).all()
