"""Readers see resets (issue 35 item 6): a writer resetting while reader processes scan
(raw chronological blocks, ``episodes()``, ``export``, ``diskreplay stats``): every row a
scan yields is the row its transition number says, of one generation, or the scan stops with
``StoreResetError`` (the CLI with exit status 1 and that message)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from diskreplay import DiskReplay, StoreResetError
from diskreplay.views import ChronoReader
from cli_run import invoke
import paths

READER = os.path.join(paths.SUPPORT, "reset_reader.py")
FIELDS = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


def add(buf, generation: int) -> None:
    t = buf.seen_size + 1
    ts = np.arange(t, t + buf.num_envs)
    states = np.repeat(ts[:, None], 2, axis=1).astype(np.float32)
    buf.add(states, ts, np.full(buf.num_envs, generation, np.float32), states + buf.num_envs, ts % 9 == 0)


def test_a_reset_under_a_scan_stops_it_with_a_clear_error(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 16, num_envs=2, backend=backend, fields=FIELDS, seed=0) as buf:
        for _ in range(12):
            add(buf, 0)
        generation = buf.generation
        reader = iter(ChronoReader(buf, rows=2))
        first = next(reader)
        assert first.batch["actions"].tolist() == first.transitions.tolist()
        buf.reset()
        assert buf.generation != generation
        add(buf, 1)
        with pytest.raises(StoreResetError, match="was reset while it was being read"):
            next(reader)
        r = invoke("stats", tmp_path / "s")  # a fresh scan reads the new generation
        assert r.code == 0, r


def test_the_cli_exits_1_with_the_reset_message(tmp_path, backend, monkeypatch):
    from diskreplay import chrono
    with DiskReplay.create(tmp_path / "s", 16, num_envs=2, backend=backend, fields=FIELDS, seed=0) as buf:
        for _ in range(12):
            add(buf, 0)
    real = chrono.check_generation

    def reset_under_it(reader_buf, snap):  # the writer resets right after the scan's first read
        with DiskReplay.open(tmp_path / "s") as writer:
            writer.reset()
        monkeypatch.setattr(chrono, "check_generation", real)
        real(reader_buf, snap)
    monkeypatch.setattr(chrono, "check_generation", reset_under_it)
    r = invoke("stats", tmp_path / "s")
    assert r.code == 1 and "was reset while it was being read" in r.err, r


def test_readers_in_other_processes_never_mislabel_rows_across_resets(tmp_path, backend):
    store = tmp_path / "s"
    buf = DiskReplay.create(store, 64, num_envs=2, backend=backend, fields=FIELDS, seed=0)
    generation = 0
    for _ in range(40):
        add(buf, generation)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([paths.SUPPORT, os.environ.get("PYTHONPATH", "")]))
    readers = [subprocess.Popen([sys.executable, READER, str(store), str(tmp_path), "4"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        steps = 0
        while any(r.poll() is None for r in readers):
            add(buf, generation)
            steps += 1
            if steps % 37 == 0:
                buf.reset()
                generation += 1
    finally:
        buf.close()
    for r in readers:
        out, err = r.communicate(timeout=300)
        assert r.returncode == 0, err[-3000:]
        counts = json.loads(out.strip().splitlines()[-1])
        assert counts["raw"]["reset"] >= 3, counts  # scans did meet resets
        assert all(c["ok"] > 0 for c in counts.values()), counts
    assert generation > 3
