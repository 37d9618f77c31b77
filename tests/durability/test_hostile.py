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

import diskreplay.errors as errors
import hostile_child
from diskreplay import DiskReplay, DiskReplayError
from diskreplay.backends import BACKENDS
from diskreplay.format.description import FORMAT_VERSION
from diskreplay.errors import (CorruptStoreError, EmptyStoreError, IncompleteStoreError,
                               IndexOutOfRangeError, InvalidArgumentError, NotAStoreError,
                               ReadOnlyError, RecoveryWarning, SchemaMismatchError, StoreExistsError,
                               StoreNotFoundError, StorePermissionError, UnsupportedFormatError)
from hostile_cases import ANY_FILE, DATA_FILES, SMALL_FILES, cases
from hostile_child import STOP_POINTS
from hostile_common import (FIELDS, MAX_SIZE, NUM_ENVS, build_store, file_bytes, put_file,
                            read_digest, snapshot, step_args, tree_state)

CHILD = os.path.abspath(hostile_child.__file__)


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
    res = json.loads(out.stdout.splitlines()[-1]) if out.stdout.strip() else None
    if (res and res["outcome"] == "foreign" and res["class"].endswith(("ModuleNotFoundError", "ImportError"))
            and res["unreadable_code"]):
        # The child imports everything it knows of as root; an import after it dropped its
        # privileges fails only because the code lives where the user cannot read.
        pytest.skip(f"user {NOBODY} cannot read {', '.join(res['unreadable_code'])} (the checkout or the "
                    f"virtualenv lies under a directory it cannot enter, such as a 0700 home), and the "
                    f"probe imported a module after dropping root's privileges: {res['message'].splitlines()[0]}")
    assert out.returncode == 0, out.stderr or out.stdout
    return res


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


# ====================================================================== format version

@pytest.mark.parametrize("backend", BACKENDS)
def test_newer_format_version_is_refused_with_both_versions_named(tmp_path, backend):
    store = str(tmp_path / "s")
    build_store(store, backend)
    p = os.path.join(store, "store.json")
    with open(p) as f:
        d = json.load(f)
    d["format_version"] = 7
    with open(p, "w") as f:
        json.dump(d, f)
    before = tree_state(store)
    for mode in ("r", "r+"):
        with pytest.raises(UnsupportedFormatError) as exc:
            DiskReplay.open(store, mode=mode)
        assert "7" in str(exc.value) and str(FORMAT_VERSION) in str(exc.value) and "store.json" in str(exc.value)
    assert tree_state(store) == before


# ====================================================================== get / sample

@pytest.mark.parametrize("backend", BACKENDS)
def test_get_and_sample_errors(tmp_path, backend):
    with DiskReplay.create(tmp_path / "e", 5, backend=backend, fields=FIELDS) as buf:
        with pytest.raises(EmptyStoreError, match="empty"):
            buf.sample()
        with pytest.raises(IndexOutOfRangeError):
            buf.get([0])
    with DiskReplay.create(tmp_path / "nofields", 5, backend=backend) as buf:
        with pytest.raises(EmptyStoreError):
            buf.sample(3)
    store = str(tmp_path / "s")
    build_store(store, backend)
    for mode in ("r+", "r"):
        with DiskReplay.open(store, mode=mode) as buf:
            before = snapshot(buf, sample=False)
            for bad in ([-1], [MAX_SIZE], [0, 99], 7, -8):
                with pytest.raises(IndexOutOfRangeError, match=r"\[0, 7\)"):
                    buf.get(bad)
            for bad in ([1.5], [0.0], ["a"], [None], [object()], True, [True], None, "0"):
                with pytest.raises(InvalidArgumentError, match="integer"):
                    buf.get(bad)
            for bad in (0, -1, 1.5, True, "4", None if False else [2]):
                with pytest.raises(InvalidArgumentError, match="batch_size"):
                    buf.sample(bad)
            after = snapshot(buf, sample=False)
            assert _same(before, after)


def _same(a, b) -> bool:
    from hostile_common import digest
    return digest(a) == digest(b)


def test_get_nothing_from_a_store_without_fields(tmp_path):
    with DiskReplay.create(tmp_path / "s", 5) as buf:
        try:
            buf.get([])
        except DiskReplayError:
            pass


# ====================================================================== input values

def _state_of(store):
    """Every byte of the store's files (a refused call must change none) and its readable snapshot."""
    return file_bytes(store)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_are_stored_as_given(tmp_path, backend):
    fields = {"states": ((3,), "float64"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    with DiskReplay.create(tmp_path / "s", 4, backend=backend, fields=fields) as buf:
        s = np.array([np.nan, np.inf, -np.inf])
        buf.add(s, 1, float("nan"), s[::-1].copy(), False)
        buf.add(s, 2, float("-inf"), s, True)
        b = buf.get([0, 1])
    np.testing.assert_array_equal(b["states"][0], s)
    np.testing.assert_array_equal(b["next_states"][0], s[::-1])  # the one given (exact), not slot 1's state
    assert np.isnan(b["rewards"][0]) and b["rewards"][1] == -np.inf


def _wrapped_store(path, backend, num_envs=1):
    fields = {"states": ((4,), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool"), "log_probs": ((), "float32")}
    buf = DiskReplay.create(path, 5, num_envs=num_envs, backend=backend, fields=fields, seed=0)
    for t in range(7):
        n = num_envs
        lead = (n,) if n > 1 else ()
        buf.add(np.full(lead + (4,), t, np.uint8), np.full(lead, t, np.int64) if n > 1 else t,
                np.full(lead, t, np.float32) if n > 1 else float(t), np.full(lead + (4,), t + 1, np.uint8),
                np.full(lead, False) if n > 1 else False,
                log_probs=np.full(lead, -t, np.float32) if n > 1 else -float(t))
    return buf


def _good(n):
    lead = (n,) if n > 1 else ()
    return dict(state=np.zeros(lead + (4,), np.uint8), action=np.zeros(lead, np.int64) if n > 1 else 1,
                reward=np.zeros(lead, np.float32) if n > 1 else 0.5,
                next_state=np.zeros(lead + (4,), np.uint8), done=np.zeros(lead, bool) if n > 1 else False,
                log_probs=np.zeros(lead, np.float32) if n > 1 else 0.0)


_BAD_ADDS_1 = {
    "float-into-int-action": dict(action=1.5),
    "integral-float-into-int-action": dict(action=2.0),
    "numpy-float-into-int-action": dict(action=np.float64(3.0)),
    "300-into-uint8-state": dict(state=np.array([300, 0, 0, 0])),
    "negative-into-uint8-state": dict(state=np.array([-1, 0, 0, 0])),
    "float-state-into-uint8": dict(state=np.array([0.5, 0, 0, 0])),
    "2-into-bool-done": dict(done=2),
    "float-into-bool-done": dict(done=1.0),
    "state-wrong-shape": dict(state=np.zeros(3, np.uint8)),
    "state-wrong-rank": dict(state=np.zeros((4, 1), np.uint8)),
    "next-state-wrong-shape": dict(next_state=np.zeros(5, np.uint8)),
    "action-wrong-rank": dict(action=np.array([1, 2])),
    "reward-wrong-rank": dict(reward=np.array([[0.5]])),
    "state-strings": dict(state=np.array(["a", "b", "c", "d"])),
    "state-complex": dict(state=np.zeros(4, np.complex64)),
    "action-string": dict(action="1"),
    "action-none": dict(action=None),
    "reward-object": dict(reward=object()),
    "done-none": dict(done=None),
    "state-list-of-objects": dict(state=[object()] * 4),
    "state-ragged": dict(state=[[1, 2], [3]]),
    "log_probs-missing": dict(log_probs=None),
    "log_probs-wrong-shape": dict(log_probs=np.zeros(2, np.float32)),
    "unknown-extra": dict(entropy=0.1),
}
_BAD_ADDS_2 = {
    "no-env-axis-on-state": dict(state=np.zeros(4, np.uint8)),
    "env-axis-too-long": dict(state=np.zeros((3, 4), np.uint8)),
    "scalar-action": dict(action=1),
    "env-axis-on-reward-wrong": dict(reward=np.zeros(3, np.float32)),
    "float-actions": dict(action=np.array([1.0, 2.0])),
    "300-into-uint8-next": dict(next_state=np.full((2, 4), 300)),
    "log_probs-no-env-axis": dict(log_probs=0.0),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_envs,bad", [(1, k) for k in _BAD_ADDS_1] + [(2, k) for k in _BAD_ADDS_2])
def test_bad_add_is_refused_and_leaves_the_wrapped_store_as_it_was(tmp_path, backend, num_envs, bad):
    store = str(tmp_path / "s")
    buf = _wrapped_store(store, backend, num_envs)
    try:
        assert buf.seen_size > buf.max_size  # the ring has wrapped
        kwargs = _good(num_envs)
        kwargs.update((_BAD_ADDS_1 if num_envs == 1 else _BAD_ADDS_2)[bad])
        if kwargs.get("log_probs", 0) is None:
            del kwargs["log_probs"]
        before_files = _state_of(store)
        before = snapshot(buf, sample=False)
        with pytest.raises(SchemaMismatchError) as exc:
            buf.add(kwargs.pop("state"), kwargs.pop("action"), kwargs.pop("reward"),
                    kwargs.pop("next_state"), kwargs.pop("done"), **kwargs)
        msg = str(exc.value)
        # what was found and what was expected
        assert "store has" in msg or "expected" in msg or "the store's fields are" in msg, msg
        assert _state_of(store) == before_files
        assert _same(snapshot(buf, sample=False), before)
        good = _good(num_envs)  # the store still takes good data
        buf.add(good.pop("state"), good.pop("action"), good.pop("reward"), good.pop("next_state"),
                good.pop("done"), **good)
        assert buf.seen_size == before["seen_size"] + num_envs
    finally:
        buf.close()


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_size=0), "max_size"), (dict(max_size=-3), "max_size"), (dict(max_size=2.5), "max_size"),
    (dict(max_size="10"), "max_size"), (dict(max_size=None), "max_size"),
    (dict(num_envs=0), "num_envs"), (dict(num_envs=-1), "num_envs"), (dict(num_envs=11), "num_envs"),
    (dict(batch_size=0), "batch_size"), (dict(batch_size=-2), "batch_size"),
    (dict(backend="tape"), "backend"), (dict(backend=None), "backend"),
    (dict(fields={"states": ((4,), "float32")}), "fields"),
    (dict(fields={**FIELDS, "states": ((4,), "complex64")}), "states"),
    (dict(fields={**FIELDS, "states": ((4,), "U3")}), "states"),
    (dict(fields={**FIELDS, "next_states": ((3,), "float32")}), "reserved"),
    (dict(seed=-1), "seed"), (dict(use_cer="yes"), "use_cer"),
])
def test_bad_create_arguments_create_nothing(tmp_path, kwargs, match):
    args = {"max_size": 10, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        DiskReplay.create(tmp_path / "s", args.pop("max_size"), **args)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_on_an_existing_store_without_overwrite(tmp_path, backend):
    store = str(tmp_path / "s")
    build_store(store, backend)
    before = tree_state(store)
    want = read_digest(store)
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        DiskReplay.create(store, 5, backend=backend)
    assert tree_state(store) == before and read_digest(store) == want
    with DiskReplay.open(store) as buf:  # and while a writer holds it
        with pytest.raises(StoreExistsError):
            DiskReplay.create(store, 5, backend=backend)
        with pytest.raises(errors.StoreLockedError):
            DiskReplay.create(store, 5, backend=backend, overwrite=True)
        assert buf.size == MAX_SIZE
    assert read_digest(store) == want


def test_every_error_is_a_diskreplay_error():
    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == errors.__name__:
            assert issubclass(obj, DiskReplayError) or obj in (RecoveryWarning, errors.PartialStepWarning,
                                                             errors.ShardUnavailableWarning)
    assert NUM_ENVS == 2 and warnings


# ====================================================================== after a recovery

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["bad-magic", "newer-record-version", "garbage"])
def test_a_recovered_store_is_sound_afterwards(tmp_path, backend, how):
    """Once the writer has recovered a garbled meta.bin and closed, readers open the store
    without error and a later writer needs no further recovery."""
    store = str(tmp_path / "s")
    build_store(store, backend)
    want = read_digest(store, sample=False)
    case = next(c for c in cases(backend) if c.file == "meta.bin" and c.how == how)
    case.garble(os.path.join(store, "meta.bin"))
    with pytest.warns(RecoveryWarning):
        DiskReplay.open(store, mode="r+").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecoveryWarning)
        assert read_digest(store, sample=False) == want
        DiskReplay.open(store, mode="r+").close()
