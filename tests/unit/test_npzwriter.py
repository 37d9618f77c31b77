"""diskreplay.export.npz: an uncompressed .npz written by all members at once reads back as
``np.savez`` would have written it, CRCs and ZIP64 records included, also when fewer rows
came than announced."""
from __future__ import annotations

import shutil
import subprocess
import zipfile

import numpy as np
import pytest

from diskreplay.export.npz import NpzWriter

SPECS = {"states": ((2, 3), np.float32), "actions": ((), np.int64), "dones": ((), np.bool_),
         "wide": ((40,), np.float16)}


def arrays(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"states": rng.normal(size=(rows, 2, 3)).astype(np.float32), "actions": rng.integers(-9, 9, rows),
            "dones": rng.random(rows) < 0.3, "wide": rng.normal(size=(rows, 40)).astype(np.float16)}


def write(path, data: dict, capacity: int, block: int = 7) -> None:
    rows = len(data["actions"])
    with NpzWriter(str(path), SPECS, capacity) as npz:
        for lo in range(0, rows, block):
            for key in reversed(SPECS):  # members filled in any order, a block at a time
                npz.append(key, data[key][lo:lo + block])
        npz.finish()


@pytest.mark.parametrize("rows, capacity", [(50, 50), (0, 0), (37, 1000), (0, 12), (1, 1)])
def test_npz_reads_back(tmp_path, rows, capacity):
    data = arrays(rows)
    path = tmp_path / "out.npz"
    write(path, data, capacity)
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every member's CRC-32 checks
        assert archive.namelist() == [f"{key}.npy" for key in SPECS]
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())
    with np.load(path) as npz:
        assert list(npz.keys()) == list(SPECS)
        for key, (shape, dtype) in SPECS.items():
            assert npz[key].dtype == np.dtype(dtype) and npz[key].shape == (rows,) + shape
            np.testing.assert_array_equal(npz[key], data[key])
    if capacity > rows:  # moved over the gaps: no bigger than np.savez's file
        ref = tmp_path / "ref.npz"
        np.savez(ref, **data)
        assert path.stat().st_size <= ref.stat().st_size + 200 * len(SPECS)


@pytest.mark.skipif(shutil.which("unzip") is None, reason="no unzip here to cross-check")
def test_unzip_agrees(tmp_path):
    path = tmp_path / "out.npz"
    write(path, arrays(20), 30)
    assert subprocess.run(["unzip", "-tq", str(path)], capture_output=True).returncode == 0


def test_bad_appends_are_refused(tmp_path):
    with NpzWriter(str(tmp_path / "bad.npz"), SPECS, 3) as npz:
        with pytest.raises(ValueError, match="states"):
            npz.append("states", np.zeros((2, 3, 2), np.float32))
        npz.append("actions", np.arange(3))
        with pytest.raises(ValueError, match="actions"):
            npz.append("actions", np.arange(1))  # beyond the room announced
        with pytest.raises(ValueError, match="different row counts"):
            npz.finish()
