"""Temporary outputs that cannot be hijacked (issue 35 item 5): export (npz, hdf5, d4rl),
plot and convert write a new file made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a directory
with ``mkdir``) under an unguessable name beside the output, rename it into place, and give
it the permissions a plain new file gets. A symlink planted at the temporary name is never
followed; one at OUT is replaced itself (its target is never written); convert refuses a
``dst`` that is a symlink (tests/features/test_convert_crashed.py)."""
import os
import stat

import numpy as np
import pytest

from cli_run import invoke
from diskreplay import DiskReplay
from diskreplay.disk import fsutil
from diskreplay.export import export_store

FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


@pytest.fixture
def store(tmp_path, backend):
    path = tmp_path / "s"
    with DiskReplay.create(path, 20, fields=FIELDS, backend=backend, seed=0) as buf:
        for t in range(30):
            buf.add(np.full(3, t, np.float32), t, 1.0, np.full(3, t + 1, np.float32), t % 7 == 6)
    return path


def _plant(monkeypatch, tmp_path, out_name: str):
    """The first temporary name the next output would take, with a symlink planted there
    (to a victim file); returns the victim's path."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = []
    real = fsutil.temp_name

    def predictable(path):
        name = real(path)
        if not planted:  # as if an attacker had guessed the first name
            os.symlink(victim, name)
            planted.append(name)
        return name
    monkeypatch.setattr(fsutil, "temp_name", predictable)
    return victim, planted


def _write(kind: str, store, out):
    if kind == "plot":
        r = invoke("plot", store, out)
        assert r.code == 0, r
    else:
        export_store(DiskReplay.open(store, mode="r"), out, fmt=kind)


KINDS = {"npz": "out.npz", "hdf5": "out.h5", "d4rl": "out.hdf5", "plot": "out.png"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_symlink_planted_at_the_temporary_name_is_not_followed(tmp_path, store, monkeypatch, kind):
    out = tmp_path / KINDS[kind]
    victim, planted = _plant(monkeypatch, tmp_path, out.name)
    _write(kind, store, out)
    assert planted and victim.read_text() == "precious"  # the planted link was met, and not followed
    assert os.path.islink(planted[0])  # nor removed: it is not ours
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_symlink_at_out_is_replaced_and_its_target_untouched(tmp_path, store, kind):
    out = tmp_path / KINDS[kind]
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, out)
    _write(kind, store, out)
    assert victim.read_text() == "precious"
    assert out.is_file() and not out.is_symlink()
    left = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert left == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_output_gets_the_permissions_of_a_plain_new_file(tmp_path, store, kind):
    old = os.umask(0o027)
    try:
        out = tmp_path / KINDS[kind]
        _write(kind, store, out)
        plain = tmp_path / "plain"
        plain.write_text("x")
        assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_killed_exports_temporary_file_is_removed_by_the_next_export(tmp_path, store):
    out = tmp_path / "out.npz"
    dead = 2 ** 22 + 12345  # above pid_max's default: no process has it
    stale = tmp_path / f".out.npz.{dead}.0123456789abcdef.tmp"
    stale.write_bytes(b"half an export")
    mine = tmp_path / f".out.npz.{os.getpid()}.0123456789abcdef.tmp"  # a live process's: kept
    mine.write_bytes(b"in progress")
    export_store(DiskReplay.open(store, mode="r"), out)
    assert not stale.exists() and mine.exists() and out.is_file()
