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
