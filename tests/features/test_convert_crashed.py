"""Convert on crashed stores (issue 35 item 7) and its output (items 2 and 5).

A store whose writer was killed mid-add (rows written, never committed) is converted the
way ``info``, ``export`` and ``verify`` read it: as recovery would leave it, without writing
to it, a read-only copy included. The new store is built under a temporary name and renamed
into place: an existing store at ``dst`` stays until the new one is whole, and ``dst`` may
not be a symlink."""
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from diskreplay import DiskReplay, InvalidArgumentError, RecoveryWarning, StoreExistsError

FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}

# A writer that fills past one lap, then is killed by SIGKILL where its next add would commit.
KILLED_WRITER = """
import os, signal, sys
import numpy as np
import diskreplay.session.writer as writer
from diskreplay import DiskReplay
buf = DiskReplay.create(sys.argv[1], 16, num_envs=2, backend=sys.argv[2], seed=3, prioritized=True, fields={fields!r})
row = lambda t: np.full((2, 3), t, np.float32)
for t in range(13):
    buf.add(row(t), [t, t], [t / 2, t / 2], row(t + 1), [t % 4 == 3, False])
    if t == 9:
        buf.flush()
buf.update_priorities(np.arange(16), np.linspace(0.5, 4.0, 16))
writer.commit_step = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # rows written, never committed
buf.add(row(99), [99, 99], [9.0, 9.0], row(100), [False, False])
"""


def killed_store(path, backend: str) -> str:
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER.format(fields=FIELDS), str(path), backend])
    assert proc.returncode == -9, proc.returncode
    return str(path)


def digest(directory) -> dict:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = (hashlib.sha256(f.read()).hexdigest(), os.stat(os.path.join(directory, name)).st_mtime_ns)
    return out


def held(path) -> dict:
    """Everything a reader sees: counters, rows (next states included), priorities, ns_buffer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        with DiskReplay.open(path, mode="r") as buf:
            rows = buf.get(np.arange(buf.size)) if buf.size else {}
            return {"seen": buf.seen_size, "size": buf.size, "head": buf.head, "ns": buf.ns_buffer.tolist(),
                    **{k: v.tolist() for k, v in rows.items()}}


def test_a_killed_store_converts_as_a_reader_sees_it_without_being_written(tmp_path, backend):
    src = killed_store(tmp_path / "src", backend)
    other = "hdf5" if backend == "memmap" else "memmap"
    before, want = digest(src), held(src)
    assert want["seen"] == 26  # the killed add is not there
    DiskReplay.convert(src, tmp_path / "dst", backend=other)
    assert digest(src) == before  # not a byte, not an mtime: nothing was written
    assert held(tmp_path / "dst") == want
    with DiskReplay.open(tmp_path / "dst") as dst:  # a clean store, no recovery needed
        assert dst.verify_rows()[1] == []
        assert len(dst.sample(8)["weights"]) == 8
    with pytest.warns(RecoveryWarning, match="during an add"):
        DiskReplay.open(src).close()  # what a writer's recovery makes of it: the same
    assert held(src) == want


def _read_only_child():
    """In the child (root only): a new user namespace without mappings, where the files of
    this test (owned by root, unmapped there) get their permission bits checked."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")


def test_a_read_only_copy_of_a_killed_store_converts(tmp_path, backend):
    src = killed_store(tmp_path / "src", backend)
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    want = held(copy)
    for name in os.listdir(copy):
        os.chmod(copy / name, 0o444)
    os.chmod(copy, 0o555)
    try:
        code = (f"from diskreplay import DiskReplay\n"
                f"DiskReplay.convert({str(copy)!r}, {str(tmp_path / 'dst')!r}, backend={backend!r})\n"
                f"try:\n    open({str(copy / 'probe')!r}, 'w')\n    print('writable')\n"
                f"except PermissionError:\n    print('read-only')\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              preexec_fn=_read_only_child if os.geteuid() == 0 else None)
        # The convert returned; the probe after it proves the copy really was read-only to it.
        assert proc.returncode == 0 and proc.stdout.strip() == "read-only", proc.stdout + proc.stderr
    finally:
        os.chmod(copy, 0o755)
    assert not (copy / "probe").exists()
    assert held(tmp_path / "dst") == want


def test_overwrite_keeps_the_old_store_until_the_new_one_is_whole(tmp_path, backend, monkeypatch):
    from diskreplay.session import convert as convert_module
    src = killed_store(tmp_path / "src", backend)
    with DiskReplay.create(tmp_path / "dst", 8, fields=FIELDS, seed=1) as old:
        old.add(np.zeros(3, np.float32), 7, 0.0, np.ones(3, np.float32), False)
    old_rows = held(tmp_path / "dst")
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        DiskReplay.convert(src, tmp_path / "dst", backend=backend)

    def broken(source, target, size, progress, block_rows):
        raise KeyboardInterrupt  # Ctrl-C half-way
    monkeypatch.setattr(convert_module, "_copy_rows", broken)
    with pytest.raises(KeyboardInterrupt):
        DiskReplay.convert(src, tmp_path / "dst", backend=backend, overwrite=True)
    assert held(tmp_path / "dst") == old_rows  # the old store, whole
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]  # and no temporary left
    monkeypatch.undo()
    DiskReplay.convert(src, tmp_path / "dst", backend=backend, overwrite=True)
    assert held(tmp_path / "dst") == held(src)
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]


def test_a_symlink_at_dst_is_refused_and_its_target_untouched(tmp_path, backend):
    src = killed_store(tmp_path / "src", backend)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("keep")
    os.symlink(target, tmp_path / "dst")
    with pytest.raises(InvalidArgumentError, match="symbolic link"):
        DiskReplay.convert(src, tmp_path / "dst", backend=backend)
    assert os.listdir(target) == ["precious"] and os.path.islink(tmp_path / "dst")
