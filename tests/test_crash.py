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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from crash_harness import run_kill_loop  # noqa: E402

KILLS_PER_CASE = 52


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("backend", ["memmap", "hdf5"])
def test_random_sigkill_loses_nothing_acknowledged(tmp_path, backend, num_envs):
    seed = 1000 * num_envs + (backend == "hdf5")
    summary = run_kill_loop(str(tmp_path), backend, num_envs, kills=KILLS_PER_CASE, max_size=37, seed=seed)
    assert summary["failures"] == []
    assert summary["kills"] == KILLS_PER_CASE
    # The ring wrapped many times and the checks saw real data.
    assert summary["seen"] > 20 * 37
    assert summary["checks"] >= KILLS_PER_CASE // 2
    assert summary["verified"] > 0


@pytest.mark.parametrize("backend", ["memmap", "hdf5"])
def test_create_killed_right_after_locking_can_be_redone(tmp_path, backend):
    from crash_common import crash_fields

    from diskreplay import DiskReplay

    store = tmp_path / "s.replay"
    store.mkdir()
    (store / "lock").touch()  # what create has made when killed between the lock and the marker
    with DiskReplay.create(str(store), 37, backend=backend, fields=crash_fields(), overwrite=True) as buf:
        assert buf.seen_size == 0
