"""A disk that another program fills mid-run (issue 35 item 3): on a real 24 MiB tmpfs
(tests/support/full_disk.py, in a mount namespace of its own), the add whose side file
(the jump ring's sparse ``jump_states.npy``) meets the full disk raises
``InsufficientSpaceError`` and changes nothing; the writer keeps refusing such steps with the
same error (never "an earlier sync failed"); once the space is freed the same writer object
goes on, and every acknowledged step is back after reopening."""
import json
import os
import subprocess
import sys

import pytest

import paths


def test_a_full_disk_refuses_the_add_and_the_writer_goes_on_once_space_is_freed(tmp_path, backend):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run([sys.executable, os.path.join(paths.SUPPORT, "full_disk.py"), str(mnt), backend],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["refused"] and "no space left on device" in out["refused"], out
    assert out["seen_after_refusal"] == out["acked_at_refusal"] > 0, out
    assert out["again"] and all(a == "added" or a.startswith("InsufficientSpaceError") for a in out["again"]), out
    assert not any("earlier sync" in a for a in out["again"]), out
    assert out["seen_after_freeing"] == out["seen_after_refusal"] + 2 * out["again"].count("added") + 100, out
    assert out["reopened_seen"] == out["seen_after_freeing"], out
    assert out["rows_right"] and out["next_states_right"] and out["damaged"] == [], out


@pytest.mark.parametrize("kind", ["plain", "stack4"])
def test_what_create_counts_holds_every_side_file_at_its_worst(tmp_path, backend, kind):
    """On a tmpfs of just the bytes create asks for (plus 64 KiB for the filesystem's own
    blocks), three laps in which every step ends every env's episode with a terminal state
    (the jump ring's states written each step; a frame-stack store's stack ring too): no
    ENOSPC after create."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run([sys.executable, os.path.join(paths.SUPPORT, "full_disk.py"), str(mnt), backend, "worst",
                           kind], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["refused"] is None and out["laps"] == 3.0, out
    assert out["tmpfs"] - out["needed"] == 64 * 1024, out
