"""``DISKREPLAY_PURE=1`` changes nothing a user can see but speed: the same seeded run
(``support/pure_child.py``: uniform, prioritized and frame-stack stores on each backend,
filled past a wrap with jumps and flushes, sampled, reopened) leaves the same bytes in
every file and draws the same indices with the C kernels and with their twins, each run in
its own process (the switch is read at import). Bytes a run may not repeat are left out:
the creation time in ``store.json``, the per-writer words of ``meta.bin`` (key, check word,
pid, boot id, flush time) and the flush time of each checkpoint header (and the header's
CRC over it); HDF5's own structure records times, so ``data.h5`` is compared dataset by
dataset."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from diskreplay.format.checkpoint import HEADER_BYTES
from diskreplay.format.counters import NWORDS, W_BOOT, W_CHECK, W_FLUSH_NS, W_KEY, W_PID
import paths

CHILD = os.path.join(paths.SUPPORT, "pure_child.py")
PER_WRITER_WORDS = {W_KEY, W_CHECK, W_PID, W_BOOT, W_FLUSH_NS}
FLUSH_NS_AT = 72  # checkpoint header: magic 8s, version I, slot I, then Q generation .. flush_time_ns (8th Q)


def run_child(out, pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DISKREPLAY_PURE"}
    if pure:
        env["DISKREPLAY_PURE"] = "1"
    out.mkdir()
    p = subprocess.run([sys.executable, CHILD, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    with open(out / "run.json") as f:
        return json.load(f)


def comparable(path) -> object:
    """What of a store file a repeated run must repeat (the module docstring)."""
    name = os.path.basename(path)
    if name == "store.json":
        with open(path) as f:
            desc = json.load(f)
        desc.pop("created")
        return desc
    if name == "data.h5":
        import h5py

        with h5py.File(path, "r") as f:
            return {key: (f[key][()].tobytes(), {k: np.asarray(v).tolist() for k, v in f[key].attrs.items()})
                    for key in f}
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    if name == "meta.bin":
        words = np.frombuffer(bytes(raw), np.int64).copy()
        words[sorted(PER_WRITER_WORDS)] = 0
        assert len(words) > NWORDS
        return words.tobytes()
    if name == "checkpoint.bin":
        slot = len(raw) // 2
        for at in (0, slot):
            version = struct.unpack_from("<I", raw, at + 8)[0]
            size = 16 + 8 * (8 + version) + 8  # its header: the Q words of its version, body_len I, two CRCs
            if version in (1, 2, 3):
                raw[at + FLUSH_NS_AT:at + FLUSH_NS_AT + 8] = bytes(8)
                raw[at + size - 4:at + size] = bytes(4)  # the header CRC covers the flush time
            assert size <= HEADER_BYTES
    return bytes(raw)


def test_pure_twins_leave_the_same_bytes_and_draw_the_same_indices(tmp_path):
    c_run = run_child(tmp_path / "c", pure=False)
    pure_run = run_child(tmp_path / "pure", pure=True)
    assert "C" not in pure_run["implementations"].values(), pure_run["implementations"]
    if "C" not in c_run["implementations"].values():
        pytest.skip("no C kernel is built here: both runs are the pure one")
    assert pure_run["batches"] == c_run["batches"]
    for run in (c_run, pure_run):
        for stats in run["stats"].values():
            stats.pop("path")
    assert pure_run["stats"] == c_run["stats"]
    stores = sorted(p for p in os.listdir(tmp_path / "c") if p != "run.json")
    assert len(stores) == 6 and stores == sorted(p for p in os.listdir(tmp_path / "pure") if p != "run.json")
    for store in stores:
        names = sorted(os.listdir(tmp_path / "c" / store))
        assert names == sorted(os.listdir(tmp_path / "pure" / store)), store
        for name in names:
            a, b = (comparable(tmp_path / run / store / name) for run in ("c", "pure"))
            assert a == b, f"{store}/{name} differs between the C kernels and DISKREPLAY_PURE=1"
