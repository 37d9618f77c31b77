"""Child process of the hostile-input tests: opens a (possibly damaged) store and says what happened.

    python tests/support/hostile_child.py probe STORE MODE
        Open STORE with MODE ("r" or "r+"), then read everything (counters, every row,
        the ns_buffer, a sample, the row checksums) and close it. Prints one JSON line
        (see ``probe``) and exits 0 when the outcome was a success or a DiskReplayError,
        3 when a foreign exception escaped.

    python tests/support/hostile_child.py probe-as UID STORE MODE
        The same, as the user UID (the child starts as root, imports, then drops privileges).

    python tests/support/hostile_child.py serve
        Read JSON requests ``{"path": ..., "mode": ...}`` from stdin, one a line; for each
        fork a grandchild that runs ``probe`` and exits, wait for it and answer with one
        JSON line ``{"status": <exit code, or -signal>, "result": <probe's dict or null>}``.
        Forking after the imports keeps a case at a few milliseconds, and every case is
        still its own process whose exit status the tests check.

    python tests/support/hostile_child.py create STORE BACKEND STOP_AT
        Create a store (fields declared) but stop at STOP_AT (one of ``STOP_POINTS``):
        print ``READY`` and sleep until killed, as a creator killed half-way.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings

import numpy as np

from hostile_common import FIELDS, digest, snapshot

import diskreplay
import diskreplay.session.writer as writer_mod
from diskreplay import DiskReplay
from diskreplay.errors import DiskReplayError

def probe(path: str, mode: str) -> dict:
    """Open, read everything, close. ``outcome`` is "ok", "error" (a DiskReplayError) or
    "foreign" (anything else); ``stage`` says where it happened (open, access, close).
    A writer does not sample (that would move the store's persisted sampler)."""
    result = {"outcome": "ok", "stage": "open", "class": None, "message": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf = None
        try:
            buf = DiskReplay.open(path, mode)
            result["stage"] = "access"
            snap = snapshot(buf, sample=mode == "r")
            result["digest"] = digest(snap)
            result["size"] = snap["size"]
            result["seen_size"] = snap["seen_size"]
            checked, bad = buf.verify_rows()
            result["verify"] = [int(checked), [int(b) for b in bad]]
            result["stage"] = "close"
            buf.close()
            result["stage"] = "done"
        except DiskReplayError as exc:
            result.update(outcome="error", **{"class": type(exc).__name__}, message=str(exc))
        except BaseException as exc:  # noqa: BLE001 - reporting foreign exceptions is the point
            result.update(outcome="foreign", **{"class": f"{type(exc).__module__}.{type(exc).__qualname__}"},
                          message=f"{exc}\n{traceback.format_exc()}")
        finally:
            if buf is not None and result["outcome"] != "ok":
                try:
                    buf.close()
                except BaseException:  # noqa: BLE001
                    pass
    result["warnings"] = [[w.category.__name__, str(w.message)] for w in caught]
    return result


def serve() -> int:
    import h5py  # noqa: F401 - imported once here, not in every forked case

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # grandchild: one case, then exit
            os.close(rfd)
            code = 3
            try:
                result = probe(req["path"], req["mode"])
                code = 3 if result["outcome"] == "foreign" else 0
                data = json.dumps(result).encode()
                while data:
                    data = data[os.write(wfd, data):]
            finally:
                os.close(wfd)
                os._exit(code)
        os.close(wfd)
        chunks = []
        while True:
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        raw = b"".join(chunks)
        try:
            result = json.loads(raw) if raw else None
        except ValueError:
            result = None
        sys.stdout.write(json.dumps({"status": code, "result": result}) + "\n")
        sys.stdout.flush()
    return 0


STOP_POINTS = ("before_data", "after_data", "after_counters", "after_description")


def _hang():
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    while True:
        time.sleep(60)


def create_and_stop(path: str, backend: str, stop_at: str) -> int:
    """Create a store, stopping (until killed) at ``stop_at``: a creator killed half-way."""
    if stop_at not in STOP_POINTS:
        raise SystemExit(f"unknown stop point {stop_at!r}")
    orig_data, orig_counters, orig_desc = writer_mod.create_data_files, writer_mod.create_counters, \
        writer_mod.write_description

    def create_data(*a, **k):
        if stop_at == "before_data":
            _hang()
        orig_data(*a, **k)
        if stop_at == "after_data":
            _hang()

    def create_counters(*a, **k):
        orig_counters(*a, **k)
        if stop_at == "after_counters":
            _hang()

    def write_description(*a, **k):
        orig_desc(*a, **k)
        if stop_at == "after_description":
            _hang()

    writer_mod.create_data_files = create_data
    writer_mod.create_counters = create_counters
    writer_mod.write_description = write_description
    DiskReplay.create(path, 9, backend=backend, fields=FIELDS, seed=1, overwrite=True)
    print("FINISHED")  # the stop point was never reached: the library changed
    return 4


def main(argv) -> int:
    if argv[:1] == ["serve"]:
        return serve()
    if argv[:1] == ["probe"] and len(argv) == 3:
        result = probe(argv[1], argv[2])
        print(json.dumps(result), flush=True)
        return 3 if result["outcome"] == "foreign" else 0
    if argv[:1] == ["probe-as"] and len(argv) == 4:
        # Import everything first, what the probe would import lazily included (numpy.random
        # for sample): the interpreter, the venv and the checkout may live where the user
        # cannot read (a 0700 home). Then drop root's privileges: permission bits apply from
        # here on. ``unreadable_code`` lists the package directories the user cannot read, so
        # a test can tell an import that failed for that reason from a real failure.
        import h5py
        import numpy.random
        packages = [os.path.dirname(m.__file__) for m in (numpy, h5py, diskreplay)]
        os.setgroups([])
        os.setgid(int(argv[1]))
        os.setuid(int(argv[1]))
        result = probe(argv[2], argv[3])
        result["unreadable_code"] = [d for d in packages if not os.access(d, os.R_OK | os.X_OK)]
        print(json.dumps(result), flush=True)
        return 3 if result["outcome"] == "foreign" else 0
    if argv[:1] == ["create"] and len(argv) == 4:
        return create_and_stop(argv[1], argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    assert diskreplay  # imported before any fork
    sys.exit(main(sys.argv[1:]))
