"""Hostile input (issue 7, and the "Bad input" section of issue 2): corrupt, truncated,
foreign, half-created and read-only stores, and bad arguments, get a specific
DiskReplayError (or a safe, announced recovery), never a crash, a foreign exception or
a store damaged further."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import diskreplay.errors as errors  # noqa: E402
from diskreplay import DiskReplay, DiskReplayError  # noqa: E402
from diskreplay.errors import (CorruptStoreError, EmptyStoreError, IncompleteStoreError,  # noqa: E402
                               IndexOutOfRangeError, InvalidArgumentError, NotAStoreError,
                               ReadOnlyError, RecoveryWarning, SchemaMismatchError, StoreExistsError,
                               StoreNotFoundError, StorePermissionError, UnsupportedFormatError)
from hostile_cases import ANY_FILE, DATA_FILES, SMALL_FILES, cases  # noqa: E402
from hostile_common import (FIELDS, MAX_SIZE, NUM_ENVS, build_store, file_bytes, put_file,  # noqa: E402
                            read_digest, step_args, tree_state)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "hostile_child.py")
BACKENDS = ["memmap", "hdf5"]


# ====================================================================== the child process

class Child:
    """``hostile_child.py serve``: every probe runs in its own forked process."""

    def __init__(self, tmpdir):
        self.errlog = open(os.path.join(tmpdir, "child-stderr.txt"), "w+")
        self.proc = subprocess.Popen([sys.executable, CHILD, "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errlog, text=True)

    def probe(self, path, mode) -> dict:
        self.proc.stdin.write(json.dumps({"path": str(path), "mode": mode}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the probe server died: {self.stderr()}"
        return json.loads(line)

    def stderr(self) -> str:
        self.errlog.flush()
        self.errlog.seek(0)
        return self.errlog.read()[-4000:]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.errlog.close()


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    c = Child(str(tmp_path_factory.mktemp("child")))
    yield c
    c.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """{backend: (directory, {file: bytes}, digest)} of a closed, wrapped store."""
    out = {}
    for backend in BACKENDS:
        d = str(tmp_path_factory.mktemp(f"pristine-{backend}") / "store")
        build_store(d, backend)
        out[backend] = (d, file_bytes(d), {"r": read_digest(d), "r+": read_digest(d, sample=False)})
    return out


def _label(reply: dict, pristine_digest: str) -> str:
    """What the probe did, as a label of hostile_cases (or a description of a failure)."""
    status, res = reply["status"], reply["result"]
    if status < 0:
        return f"killed by signal {signal.Signals(-status).name}"
    if res is None:
        return f"exit status {status} without a result"
    if res["outcome"] == "foreign":
        return f"foreign exception {res['class']}: {res['message']}"
    if status != 0:
        return f"exit status {status}"
    if res["outcome"] == "error":
        return res["class"]
    recovered = any(cat == "RecoveryWarning" for cat, _ in res["warnings"])
    if res["digest"] != pristine_digest:
        if res["verify"][1] and not recovered:
            return "damaged"
        return f"opened ({'recovered' if recovered else 'silently'}) with different contents"
    return "recover" if recovered else "ok"


def _copy_store(src, dst):
    shutil.copytree(src, dst)
    return dst


def _case_params():
    params = []
    for backend in BACKENDS:
        for case in cases(backend):
            marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
            params.append(pytest.param(backend, case, id=f"{backend}-{case.id}", marks=marks))
    return params


@pytest.mark.parametrize("backend,case", _case_params())
def test_garbled_file_gets_a_specific_error_or_safe_recovery(tmp_path, child, pristine, backend, case):
    src, originals, want = pristine[backend]
    store = _copy_store(src, str(tmp_path / "store"))
    target = os.path.join(store, case.file)
    case.garble(target)

    for mode, allowed in (("r", case.r), ("r+", case.rw)):
        reply = child.probe(store, mode)
        label = _label(reply, want[mode])
        res = reply["result"]
        assert label in allowed, (f"mode {mode!r}: got {label}, expected one of {sorted(allowed)}; "
                                  f"result {res}; child stderr: {child.stderr()}")
        if res["outcome"] == "error":
            msg = res["message"]
            names = case.names or (case.file,)
            known = names
            if ANY_FILE in names or "<store>" in names:
                known = known + (store,)
            assert any(n in msg for n in known if n not in (ANY_FILE, "<store>")), \
                f"mode {mode!r}: the message does not name {names}: {msg!r}"
            if case.sizes:
                actual = os.path.getsize(target)
                expected = len(originals[case.file])
                assert str(actual) in msg and str(expected) in msg, \
                    f"mode {mode!r}: the message should give the size {actual} and the expected {expected}: {msg!r}"
        if label == "recover":
            notes = [m for cat, m in res["warnings"] if cat == "RecoveryWarning"]
            assert any(store in m for m in notes), notes
        if label == "damaged":
            assert res["verify"][1], "verify must report the damaged rows"

    # Put the file back: the store is as it was, for a reader and for a writer.
    put_file(target, originals[case.file])
    for mode in ("r", "r+", "r"):
        reply = child.probe(store, mode)
        assert _label(reply, want[mode]) == "ok", (mode, reply, child.stderr())


def test_corruption_cases_cover_every_file_of_a_store(pristine):
    for backend in BACKENDS:
        _, originals, _ = pristine[backend]
        covered = {c.file for c in cases(backend)}
        assert set(originals) == covered == set(SMALL_FILES + DATA_FILES[backend]), (
            f"{backend}: the store holds {sorted(originals)}, the corruption cases cover {sorted(covered)}")


# ====================================================================== half-created stores

from hostile_child import STOP_POINTS  # noqa: E402


def _neighbours(parent):
    os.makedirs(os.path.join(parent, "other.replay"), exist_ok=True)
    with open(os.path.join(parent, "other.replay", "store.json"), "w") as f:
        f.write("{}")
    with open(os.path.join(parent, "notes.txt"), "w") as f:
        f.write("keep me")
    return {k: v for k, v in tree_state(parent).items() if not k.startswith("s.replay")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stop_at", STOP_POINTS)
def test_creator_killed_half_way(tmp_path, backend, stop_at):
    parent = str(tmp_path)
    before = _neighbours(parent)
    store = os.path.join(parent, "s.replay")
    proc = subprocess.Popen([sys.executable, CHILD, "create", store, backend, stop_at],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
    finally:
        proc.kill()
        proc.wait()
    for mode in ("r", "r+"):
        with pytest.raises(IncompleteStoreError, match="never completely created"):
            DiskReplay.open(store, mode=mode)
    with pytest.raises(StoreExistsError):
        DiskReplay.create(store, 5, backend=backend, fields=FIELDS)
    with DiskReplay.create(store, 5, backend=backend, fields=FIELDS, overwrite=True) as buf:
        args, extra = step_args(0, 1)
        buf.add(*[a[0] for a in args], **{k: v[0] for k, v in extra.items()})
    with DiskReplay.open(store, mode="r") as buf:
        assert buf.size == 1 and buf.max_size == 5
    after = {k: v for k, v in tree_state(parent).items() if not k.startswith("s.replay")}
    assert after == before


@pytest.mark.parametrize("leftover", [["CREATING"], ["meta.bin"], ["CREATING", "store.json"]])
def test_only_some_files_is_incomplete(tmp_path, leftover):
    store = tmp_path / "s.replay"
    store.mkdir()
    for name in leftover:
        (store / name).write_bytes(b"")
    before = _neighbours(str(tmp_path))
    for mode in ("r", "r+"):
        with pytest.raises(IncompleteStoreError):
            DiskReplay.open(store, mode=mode)
    DiskReplay.create(store, 3, fields=FIELDS, overwrite=True).close()
    assert sorted(os.listdir(store)) == sorted(file_bytes(store))
    after = {k: v for k, v in tree_state(str(tmp_path)).items() if not k.startswith("s.replay")}
    assert after == before


# ====================================================================== paths

def test_a_file_where_a_directory_is_expected(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"data")
    with pytest.raises(NotAStoreError, match="file"):
        DiskReplay.open(f)
    for overwrite in (False, True):
        with pytest.raises(DiskReplayError):
            DiskReplay.create(f, 5, overwrite=overwrite)
    with pytest.raises((StoreNotFoundError, NotAStoreError)):
        DiskReplay.create(f / "sub", 5)
    with pytest.raises((StoreNotFoundError, NotAStoreError)):
        DiskReplay.open(f / "sub")
    assert f.read_bytes() == b"data"


@pytest.mark.parametrize("contents", [
    {"notes.txt": b"mine"},
    {"store.json": b'{"name": "not diskreplay"}', "notes.txt": b"mine"},
    {"model.h5": b"weights", "readme": b"x"},
])
def test_create_refuses_a_directory_of_other_things(tmp_path, contents):
    d = tmp_path / "d"
    d.mkdir()
    for name, data in contents.items():
        (d / name).write_bytes(data)
    before = tree_state(str(d))
    for overwrite in (False, True):
        with pytest.raises(StoreExistsError, match="not a diskreplay store"):
            DiskReplay.create(d, 5, overwrite=overwrite)
    assert tree_state(str(d)) == before
    with pytest.raises((NotAStoreError, CorruptStoreError)):
        DiskReplay.open(d)


@pytest.mark.xfail(strict=True, reason="library bug: create(overwrite=True) takes a directory holding a foreign "
                   "store.json and .npy files for a store and deletes them")
def test_create_overwrite_keeps_a_foreign_store_json_and_npy_files(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "store.json").write_bytes(b'{"name": "my web app"}')
    (d / "embeddings.npy").write_bytes(b"precious")
    before = tree_state(str(d))
    with pytest.raises(StoreExistsError):
        DiskReplay.create(d, 5, overwrite=True)
    assert tree_state(str(d)) == before


def test_missing_parent(tmp_path):
    with pytest.raises(StoreNotFoundError, match="parent"):
        DiskReplay.create(tmp_path / "no" / "such" / "s", 5)
    assert not (tmp_path / "no").exists()
    with pytest.raises(StoreNotFoundError):
        DiskReplay.open(tmp_path / "no" / "s")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotAStoreError):
        DiskReplay.open(empty)
    with pytest.raises(InvalidArgumentError, match="mode"):
        DiskReplay.open(empty, mode="w")


# ---------------------------------------------------------------------- permissions (unprivileged child)

NOBODY = 65534


def _as_nobody(cmd, *args):
    """Run ``hostile_child.py probe`` as an unprivileged user (root ignores permission bits)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as an unprivileged user")
    assert cmd == "probe"
    out = subprocess.run([sys.executable, CHILD, "probe-as", str(NOBODY), *args], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture
def shared_tmp():
    """A directory an unprivileged user can reach (pytest's tmp_path is private to root)."""
    d = tempfile.mkdtemp(prefix="diskreplay-hostile-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_without_write_permission(shared_tmp, backend):
    store = os.path.join(shared_tmp, "s")
    build_store(store, backend)
    want = read_digest(store)
    before = tree_state(store)
    os.chmod(store, 0o755)
    for name in os.listdir(store):
        os.chmod(os.path.join(store, name), 0o644)
    res = _as_nobody("probe", store, "r")
    assert res["outcome"] == "ok" and res["digest"] == want, res
    res = _as_nobody("probe", store, "r+")
    assert res["outcome"] == "error" and res["class"] in ("ReadOnlyError", "StorePermissionError"), res
    assert "write" in res["message"] and store in res["message"], res
    assert tree_state(store) == before


def test_store_without_read_permission(shared_tmp):
    store = os.path.join(shared_tmp, "s")
    build_store(store, "memmap")
    os.chmod(store, 0o700)
    res = _as_nobody("probe", store, "r")
    assert res["outcome"] == "error" and res["class"] == "StorePermissionError", res
    assert store in res["message"]
    os.chmod(store, 0o755)
    os.chmod(os.path.join(store, "states.npy"), 0o600)
    res = _as_nobody("probe", store, "r")
    assert res["outcome"] == "error" and res["class"] == "StorePermissionError", res
    assert "states.npy" in res["message"]


# ---------------------------------------------------------------------- read-only filesystem

@pytest.fixture
def ro_mount(tmp_path):
    """(source dir, read-only bind mount of it); skipped where mounting is not permitted."""
    src, dst = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    dst.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a read-only bind mount needs root and mount(8)")
    r = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mount --bind is not permitted here: {r.stderr.decode().strip()}")
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(dst)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"remounting read-only is not permitted here: {r.stderr.decode().strip()}")
        yield src, dst
    finally:
        subprocess.run(["umount", str(dst)], check=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_filesystem(child, ro_mount, backend):
    src, dst = ro_mount
    build_store(str(src / "s"), backend)
    want = read_digest(str(src / "s"))
    before = tree_state(str(src / "s"))
    with pytest.raises(OSError) as exc:
        open(dst / "probe-write", "wb")
    assert exc.value.errno == errno.EROFS
    reply = child.probe(str(dst / "s"), "r")
    assert _label(reply, want) == "ok", reply
    reply = child.probe(str(dst / "s"), "r+")
    res = reply["result"]
    assert reply["status"] == 0 and res["outcome"] == "error", reply
    assert res["class"] in ("ReadOnlyError", "StorePermissionError"), res
    assert "read-only" in res["message"] or "write" in res["message"], res
    with pytest.raises((ReadOnlyError, StorePermissionError)):
        DiskReplay.create(dst / "new", 5)
    assert tree_state(str(src / "s")) == before
