"""``python -m diskreplay.demo``, the README's first command: it runs, says what it does at
each stage, and prints float32 values as float32 values (0.1, not 0.10000000149011612)."""
from __future__ import annotations

import re
import subprocess
import sys


def test_demo_prints_each_stage_with_short_floats(tmp_path):
    path = tmp_path / "demo.replay"
    p = subprocess.run([sys.executable, "-m", "diskreplay.demo", str(path)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for stage in ("creating", "added 500 steps", "sampled slots", "closed; reopening", "reopened:",
                  "newest transition:", f"diskreplay info {path}"):
        assert stage in out, (stage, out)
    assert not re.search(r"\d\.\d{7,}", out), out  # no float64 reprs of float32 values
    assert "0.1" in out
    assert (path / "store.json").exists()


def test_demo_transitions_start_where_the_previous_episode_was_reset(tmp_path):
    """After an episode end the next transition starts from the reset state (x 0, step 0),
    not from the final state; the final state is the ended transition's next state."""
    import numpy as np

    from diskreplay import DiskReplay
    from diskreplay.demo import run

    path = tmp_path / "demo.replay"
    run(str(path))
    with DiskReplay.open(path, mode="r") as buf:
        rows = buf.get(np.arange(buf.size))
    x, t = rows["states"][:, 0], rows["states"][:, 1]
    nx, nt = rows["next_states"][:, 0], rows["next_states"][:, 1]
    done = rows["dones"]
    assert (np.abs(x) < 5).all() and (t < 50).all()  # no state is an episode's final one
    assert ((np.abs(nx) >= 5) | (nt == 50))[done].all() and (nt == t + 1).all()
