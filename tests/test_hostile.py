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
