"""The hostile suite, issue 13's cases: reserved field names, outputs inside a store, files
changed under a reader, HDF5's own lock, and the small argument cases. Each gets a
specific DiskReplayError and leaves nothing behind."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from diskreplay import DiskReplay
from diskreplay.cli.main import main as cli
from diskreplay.errors import (CorruptStoreError, IndexOutOfRangeError, InvalidArgumentError,
                               StoreLockedError)
from diskreplay.export import export_store
from diskreplay.core.schema import RESERVED_NAMES
from diskreplay.verify import verify_store

FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool")}


def _filled(path, backend, n=20, **kwargs):
    buf = DiskReplay.create(path, 16, backend=backend, fields=FIELDS, seed=0, **kwargs)
    for i in range(n):
        buf.add(np.full(3, i, np.float32), i, i / 2, np.full(3, i + 1, np.float32), i % 4 == 0)
    return buf


def _tree(path):
    return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                  for d, _, fs in os.walk(path) for f in fs)


# ---------------------------------------------------------------- reserved names
@pytest.mark.parametrize("name", sorted(RESERVED_NAMES))
def test_every_reserved_name_is_refused_at_create_and_at_the_first_add(tmp_path, backend, name):
    fields = dict(FIELDS, **{name: ((), "float32")})
    with pytest.raises(InvalidArgumentError, match=f"'{name}' is reserved"):
        DiskReplay.create(tmp_path / "declared", 10, backend=backend, fields=fields)
    assert not os.path.exists(tmp_path / "declared")
    with DiskReplay.create(tmp_path / "inferred", 10, backend=backend) as buf:
        with pytest.raises(InvalidArgumentError, match=f"'{name}' is reserved"):
            buf.add(np.zeros(3, np.float32), 1, 1.0, np.zeros(3, np.float32), False, **{name: 1.0})
        assert buf.fields is None and buf.seen_size == 0
        buf.add(np.zeros(3, np.float32), 1, 1.0, np.zeros(3, np.float32), False, other=1.0)  # still usable
    with DiskReplay.open(tmp_path / "inferred") as buf:
        assert set(buf.fields) == set(FIELDS) | {"other"}


def test_reserved_names_cover_the_store_files_and_cli_keys():
    from diskreplay.format.directory import NS_FILE
    from diskreplay.format.rowsums import ROWSUMS_FILE
    for file in (NS_FILE, ROWSUMS_FILE):
        assert file[:-len(".npy")] in RESERVED_NAMES  # a memmap field <name>.npy would be that file
    assert {"next_states", "slots", "slot", "idxs"} <= set(RESERVED_NAMES)


# ---------------------------------------------------------------- outputs inside a store
@pytest.mark.parametrize("target", ["rewards.npy", "data.h5", "export.npz", "sub/dir/x.h5"])
def test_export_refuses_an_output_inside_any_store(tmp_path, backend, target):
    with _filled(tmp_path / "src", backend):
        pass
    with _filled(tmp_path / "other", backend):
        pass
    for store in ("src", "other"):
        out = tmp_path / store / target  # sub/dir does not exist: still inside the store
        before = _tree(tmp_path / store)
        with DiskReplay.open(tmp_path / "src", mode="r") as buf:
            with pytest.raises(InvalidArgumentError, match="inside the store"):
                export_store(buf, out)
        assert _tree(tmp_path / store) == before
        result = CliRunner().invoke(cli, ["export", str(tmp_path / "src"), str(out), "--overwrite"])
        assert result.exit_code != 0 and "inside the store" in result.output
        assert _tree(tmp_path / store) == before
    with DiskReplay.open(tmp_path / "src") as buf:  # the stores are intact
        assert buf.verify_rows()[1] == [] and buf.size == 16
    # and the store can still be replaced by create(overwrite=True): no foreign file was left
    DiskReplay.create(tmp_path / "src", 4, backend=backend, overwrite=True).close()


def test_plot_and_convert_refuse_outputs_inside_a_store(tmp_path, backend):
    with _filled(tmp_path / "src", backend):
        pass
    before = _tree(tmp_path / "src")
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "src"), str(tmp_path / "src" / "p.png")])
    assert result.exit_code != 0 and "inside the store" in result.output
    for dst in (tmp_path / "src" / "copy.replay", tmp_path / "src"):
        with pytest.raises(InvalidArgumentError):
            DiskReplay.convert(tmp_path / "src", dst, backend="hdf5", overwrite=True)
    assert _tree(tmp_path / "src") == before


# ---------------------------------------------------------------- files changed under a reader
@pytest.mark.parametrize("how", ["truncate", "replace"])
def test_a_reader_refuses_a_file_changed_under_it(tmp_path, backend, how):
    with _filled(tmp_path / "s", backend):
        pass
    victim = tmp_path / "s" / ("states.npy" if backend == "memmap" else "data.h5")
    with DiskReplay.open(tmp_path / "s", mode="r") as ro:
        ro.sample(8)
        if how == "truncate":
            os.truncate(victim, 64)  # reading through the old mapping would be SIGBUS
        else:
            data = victim.read_bytes()
            os.unlink(victim)
            victim.write_bytes(data)
        for read in (lambda: ro.sample(8), lambda: ro.get([0, 1]), lambda: ro.size):
            with pytest.raises(CorruptStoreError, match="truncated|replaced"):
                read()


def test_hdf5_file_held_by_another_program_is_reported_locked(tmp_path):
    with _filled(tmp_path / "s", "hdf5"):
        pass
    holder = subprocess.Popen(
        [sys.executable, "-c", "import h5py, sys, time\nf = h5py.File(sys.argv[1], 'a')\nprint('ready', flush=True)\n"
         "time.sleep(60)", str(tmp_path / "s" / "data.h5")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        for mode in ("r", "r+"):
            with pytest.raises(StoreLockedError, match="another HDF5 program"):
                DiskReplay.open(tmp_path / "s", mode=mode)
        report = verify_store(tmp_path / "s")
        assert report.locked and not report.problems
        assert "LOCKED" in report.summary() and "DAMAGED" not in report.summary()
    finally:
        holder.kill()
        holder.wait()
    with DiskReplay.open(tmp_path / "s") as buf:  # nothing was damaged
        assert buf.size == 16


# ---------------------------------------------------------------- the small cases
@pytest.mark.parametrize("path", [b"x.replay", "a\0b", ""])
def test_bad_paths_are_refused_and_create_nothing(tmp_path, path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call in (lambda: DiskReplay.create(path, 10), lambda: DiskReplay.open(path)):
        with pytest.raises(InvalidArgumentError):
            call()
    assert os.listdir(tmp_path) == []


def test_huge_batch_sizes_and_indices_are_refused(tmp_path, backend):
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        DiskReplay.create(tmp_path / "big", 10, backend=backend, batch_size=2 ** 41)
    assert not os.path.exists(tmp_path / "big")
    with _filled(tmp_path / "s", backend) as buf:
        with pytest.raises(IndexOutOfRangeError, match="9223372036854775808"):
            buf.get(np.uint64(2 ** 63))
        with pytest.raises(IndexOutOfRangeError, match="18446744073709551615"):
            buf.get(np.array([3, 2 ** 64 - 1], np.uint64))
        for bad in (10 ** 30, 2 ** 41):
            with pytest.raises(InvalidArgumentError, match="batch_size"):
                buf.sample(bad)
        assert buf.sample(4)["states"].shape == (4, 3)
