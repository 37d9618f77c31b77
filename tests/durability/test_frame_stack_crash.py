"""Frame-stack stores under kill -9 and power cuts (the behaviour: tests/features/test_frame_stack.py):
a stacking writer SIGKILLed at random instants loses nothing it acknowledged, and every
power-cut image of a stacking store reopens to a state the writer acknowledged."""
from __future__ import annotations

import random

import pytest

import test_power_loss as power
from crash_harness import run_kill_loop
from diskreplay.backends import BACKENDS


@pytest.mark.parametrize("num_envs, max_size", [(1, 29), (3, 29), (3, 30)])  # 30: frames env-major
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_of_a_stacking_writer_loses_nothing_acknowledged(tmp_path, backend, num_envs, max_size):
    summary = run_kill_loop(str(tmp_path), backend, num_envs, kills=16, max_size=max_size,
                            seed=77 + num_envs + max_size + (backend == "hdf5"), frame_stack=4)
    assert summary["failures"] == []
    assert summary["kills"] == 16
    assert summary["seen"] > 5 * max_size  # the ring wrapped
    assert summary["verified"] > 0


@pytest.mark.parametrize("num_envs, flush_every, max_size", [(1, None, 37), (3, 2, 37), (3, 2, 36)])  # 36: env-major
@pytest.mark.parametrize("backend", BACKENDS)
def test_power_cut_images_of_a_stacking_store(tmp_path, monkeypatch, backend, num_envs, flush_every, max_size):
    monkeypatch.setattr(power, "CRASH_POINTS", 20)
    rng = random.Random(5 + num_envs + max_size + 100 * (backend == "hdf5"))
    rec = power.run_workload(str(tmp_path / "src.replay"), backend, num_envs, rng, monkeypatch,
                             flush_every=flush_every, frame_stack=4, max_size=max_size)
    assert rec.flushed > max_size  # flushes happened while the ring wrapped
    images, violations = power.check_images(rec, tmp_path, rng, monkeypatch)
    assert images >= 20 * power.IMAGES_PER_CRASH
    assert violations == [], violations[:10]
