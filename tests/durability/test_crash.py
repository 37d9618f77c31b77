"""Random SIGKILL of a writer process: nothing acknowledged is lost, nothing is torn.

A child process (``crash_child.py``) writes self-describing transitions into a small
ring that wraps many times and acknowledges every ``add`` that returned in a file; the
test kills it with SIGKILL at random instants (during start-up and recovery too),
reopens the store, checks every invariant (``crash_common.store_problems``) and resumes
writing. 4 parameter sets x 52 kills = 208 kills per run.
"""
from __future__ import annotations

import os
import sys

import pytest

import crash_common
from crash_harness import run_kill_loop
from diskreplay.backends import BACKENDS

SUPPORT = os.path.dirname(os.path.abspath(crash_common.__file__))

KILLS_PER_CASE = 52


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_sigkill_loses_nothing_acknowledged(tmp_path, backend, num_envs):
    seed = 1000 * num_envs + (backend == "hdf5")
    summary = run_kill_loop(str(tmp_path), backend, num_envs, kills=KILLS_PER_CASE, max_size=37, seed=seed)
    assert summary["failures"] == []
    assert summary["kills"] == KILLS_PER_CASE
    # The ring wrapped many times and the checks saw real data.
    assert summary["seen"] > 20 * 37
    assert summary["checks"] >= KILLS_PER_CASE // 2
    assert summary["verified"] > 0


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_sigkill_while_undo_rows_are_copied_ahead(tmp_path, backend, num_envs):
    """The same kills where every add's early work copies the next checkpoint's undo rows
    ahead (``undocopy.py``): a reserve of 5 steps in a ring of 45 slots, early work every step."""
    seed = 7000 * num_envs + (backend == "hdf5")
    summary = run_kill_loop(str(tmp_path), backend, num_envs, kills=KILLS_PER_CASE // 2, max_size=45, seed=seed,
                            flush_every=5, early_bytes=1)
    assert summary["failures"] == []
    assert summary["kills"] == KILLS_PER_CASE // 2
    assert summary["seen"] > 10 * 45 and summary["checks"] >= KILLS_PER_CASE // 4 and summary["verified"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_killed_right_after_locking_can_be_redone(tmp_path, backend):
    from crash_common import crash_fields

    from diskreplay import DiskReplay

    store = tmp_path / "s.replay"
    store.mkdir()
    (store / "lock").touch()  # what create has made when killed between the lock and the marker
    with DiskReplay.create(str(store), 37, backend=backend, fields=crash_fields(), overwrite=True) as buf:
        assert buf.seen_size == 0


KILLED_BETWEEN_COMMIT_STORES = r"""
import os, signal
from crash_common import add_step, crash_fields
from diskreplay import DiskReplay
from diskreplay.format.counters import W_INTENT, W_SEEN
buf = DiskReplay.open({store!r})
n = buf.num_envs
for t in range(buf.seen_size + 1, buf.seen_size + 1 + 20 * n, n):
    add_step(buf, t)
# One more step, done by hand the way add() does it, up to the seen store: intent, rows
# (garbage here), the ns area, seen; then the process dies before the check word.
writer = buf._session
words, seen = writer.words, buf.seen_size
if seen + n > writer.flush_before:
    buf.flush()  # as add() does before overwriting rows the undo reserve does not hold
slot = (seen - writer.base) % buf.max_size
words[W_INTENT] = seen + n
for arr in writer.storage.arrays.values():
    arr[slot:slot + n] = 77
writer.data.ns[((seen + n) // n) & 1] = 77
words[W_SEEN] = seen + n
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_between_the_two_commit_stores_keeps_every_acknowledged_step(tmp_path, backend, num_envs):
    """seen_size is stored before its check word: a writer killed between the two leaves
    them one step apart. That step's add had not returned, so it counts as in flight (its
    slots restored from the undo reserve); nothing before it is rolled back."""
    import subprocess
    import warnings

    import numpy as np

    from crash_common import add_step, crash_fields, store_problems
    from diskreplay import DiskReplay

    store = str(tmp_path / "s.replay")
    with DiskReplay.create(store, 12, num_envs=num_envs, backend=backend, fields=crash_fields()) as buf:
        for t in range(1, 1 + 5 * num_envs, num_envs):
            add_step(buf, t)  # flushed by close(): the checkpoint is at 5 steps
    code = KILLED_BETWEEN_COMMIT_STORES.format(store=store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == -9, proc.stderr
    acknowledged = 25 * num_envs  # the ring (12 slots) wrapped: the in-flight step overwrote a row
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf = DiskReplay.open(store)
    try:
        assert buf.seen_size == acknowledged
        assert "stopped during an add" in (buf.recovery_note or ""), buf.recovery_note
        assert caught and "rolled back" not in str(caught[0].message)
        assert store_problems(buf, min_seen=acknowledged, max_seen=acknowledged) == []
        batch = buf.get(np.arange(buf.size))
        assert not (batch["states"] == 77).all(axis=tuple(range(1, batch["states"].ndim))).any()
    finally:
        buf.close()
