"""An interruption at any line of every public operation besides ``add`` (issue 35 item 2):
``sample``, ``get``, ``batches`` and its iteration, ``update_priorities``, ``flush``, ``reset``,
``episodes``, ``close``, ``export`` and ``convert``. Injected with ``sys.settrace`` at every line
diskreplay executes in the operation, one run per line, three ways: Ctrl-C (KeyboardInterrupt),
an ordinary exception, and the README's SIGTERM recipe (a handler that calls ``buf.close()``,
then ``sys.exit(0)``: the close runs at that line, inside the operation). Afterwards the same
object is used again (or, closed, reopened) and every acknowledged transition must be back,
whole, with finite priorities and clean row sums; the exception raised is the one injected
(the recipe's ``SystemExit`` reaches the caller: the process exits); an export or a convert
leaves its output whole or absent, never partial."""
import faulthandler
import os
import shutil
import warnings

import numpy as np
import pytest

from diskreplay import DiskReplay, DiskReplayError, RecoveryWarning
from diskreplay.export import export_store
from diskreplay.testing import ring_state
from interrupt_common import add_step, check_whole, fields_for
from line_injector import LineInjector

CHAIN = "fast-vector"  # interrupt_common's step chain: 3 envs, 12 slots
NUM_ENVS, MAX_SIZE = 3, 12


class Injected(Exception):
    """The ordinary exception injected."""


def _create(path, backend: str) -> DiskReplay:
    buf = DiskReplay.create(path, MAX_SIZE, num_envs=NUM_ENVS, backend=backend, seed=1, prioritized=True,
                            fields=fields_for(False))
    while buf.seen_size < MAX_SIZE + 2 * NUM_ENVS:  # past one lap: the next adds overwrite acknowledged rows
        add_step(buf, CHAIN)
    buf.update_priorities(np.arange(MAX_SIZE), np.linspace(0.5, 3.0, MAX_SIZE))
    buf.flush()
    return buf


def _learn(buf: DiskReplay) -> None:
    """The README's prioritized learner loop, two batches of it."""
    with buf.batches(4, count=2) as batches:
        for batch in batches:
            buf.update_priorities(batch["idxs"], np.abs(batch["rewards"]) + 0.25)


def _other(backend: str) -> str:
    return "hdf5" if backend == "memmap" else "memmap"


# name: (the call on an open store (buf, tmp_path, backend), whether it needs the store closed first)
OPERATIONS = {
    "sample": (lambda buf, tmp, backend: buf.sample(4), False),
    "sample-nstep": (lambda buf, tmp, backend: buf.sample(4, n_step=3, gamma=0.9), False),
    "get": (lambda buf, tmp, backend: buf.get([0, 5, 11], n_step=2), False),
    "batches": (lambda buf, tmp, backend: _learn(buf), False),
    "update_priorities": (lambda buf, tmp, backend: buf.update_priorities([1, 4, 4, 9], [0.1, 7.0, 2.0, 0.0]),
                          False),
    "flush": (lambda buf, tmp, backend: buf.flush(), False),
    "reset": (lambda buf, tmp, backend: buf.reset(), False),
    "episodes": (lambda buf, tmp, backend: list(buf.episodes()), False),
    "close": (lambda buf, tmp, backend: buf.close(), False),
    "export": (lambda buf, tmp, backend: export_store(buf, str(tmp / "out.npz")), False),
    "convert": (lambda buf, tmp, backend: DiskReplay.convert(str(tmp / "pristine"), str(tmp / "c"),
                                                             backend=_other(backend)), True),
}
HOW = ["KeyboardInterrupt", "error", "recipe"]


def _injector(how: str, at, buf) -> LineInjector:
    if how == "KeyboardInterrupt":
        return LineInjector(at, KeyboardInterrupt)
    if how == "error":
        return LineInjector(at, Injected)
    return LineInjector(at, SystemExit, before=buf.close)  # the README's handler: close, then sys.exit(0)


def _expected(how: str):
    return {"KeyboardInterrupt": (KeyboardInterrupt,), "error": (Injected, DiskReplayError),
            "recipe": (SystemExit,)}[how]


def _reopen(store) -> DiskReplay:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)  # a close cut short recovers
        return DiskReplay.open(store)


def _check_store(buf: DiskReplay, acked: int, bases: set, op: str, at: int) -> None:
    state = ring_state(buf)
    assert buf.seen_size == acked, (op, at, buf.seen_size, acked)
    assert state.base in bases, (op, at, state, bases)  # a reset happened whole or not at all
    check_whole(buf, CHAIN)
    if buf.size:
        got = buf.get(np.arange(buf.size))["priorities"]
        assert np.isfinite(got).all() and (got >= 0).all(), (op, at, got)
        assert len(buf.sample(4)["actions"]) == 4
    assert buf.verify_rows()[1] == [], (op, at)


def _check_output(tmp, op: str, at: int) -> None:
    """An export or convert cut short leaves its output whole or absent, and no temporary file."""
    left = sorted(name for name in os.listdir(tmp) if name not in ("s", "out.npz", "c", "pristine"))
    assert left == [], (op, at, left)
    if op == "export" and os.path.exists(tmp / "out.npz"):
        with np.load(tmp / "out.npz") as got:
            assert len(got["actions"]) == MAX_SIZE, (op, at)
    if op == "convert" and os.path.exists(tmp / "c"):
        with DiskReplay.open(tmp / "c", mode="r") as copy:
            assert copy.seen_size == MAX_SIZE + 2 * NUM_ENVS
            check_whole(copy, CHAIN)


# The prefetch thread's timing changes how many lines the main thread runs in next().
UNEVEN = {"batches"}


# convert reads a closed store: the recipe's close has nothing to close there, and its
# SystemExit takes the paths KeyboardInterrupt takes (neither is an Exception).
CASES = [(op, how) for op in OPERATIONS for how in HOW if not (OPERATIONS[op][1] and how == "recipe")]


def _digest(directory) -> dict:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = (f.read(), os.stat(os.path.join(directory, name)).st_mtime_ns)
    return out


@pytest.mark.parametrize("op,how", CASES, ids=[f"{op}-{how}" for op, how in CASES])
def test_an_interruption_at_every_line_of_an_operation_loses_and_tears_nothing(tmp_path, backend, op, how):
    call, needs_closed = OPERATIONS[op]
    store, pristine = tmp_path / "s", tmp_path / "pristine"
    with _create(pristine, backend) as buf:
        acked, acked_base = buf.seen_size, ring_state(buf).base
    if needs_closed:
        return _interrupt_a_closed_store_operation(tmp_path, pristine, backend, op, how)
    faulthandler.dump_traceback_later(600, exit=True)  # a deadlock fails the run instead of hanging it
    buf = None
    try:
        at, lines = 0, None
        while lines is None or at < lines:
            at += 1
            for name in ("s", "out.npz", "c"):
                _remove(tmp_path / name)
            shutil.copytree(pristine, store)  # every run starts from the same store, sampler included
            buf = DiskReplay.open(store)
            if lines is None:  # the first run counts the lines the operation executes
                probe = LineInjector()
                probe.run(lambda: call(buf, tmp_path, backend))
                lines = probe.lines
                assert lines > 5, lines
                buf.close()
                at = 0
                continue
            injector = _injector(how, at, buf)
            with pytest.raises(_expected(how)) as raised:
                injector.run(lambda: call(buf, tmp_path, backend))
                if op in UNEVEN and injector.lines < at:  # this run took fewer lines: nothing to inject
                    raise Injected("not reached")
                raise Injected("the injection point was not reached")  # the line count is exact
            if raised.type is Injected and str(raised.value) == "not reached":
                buf.close()
                continue
            assert raised.type is not Injected or "not reached" not in str(raised.value), (at, lines)
            if op == "export":
                _check_output(tmp_path, op, at)
            now = (acked, acked_base)
            if not buf.closed:
                # The object stays usable: what it serves is whole, and it takes more adds.
                check_whole(buf, CHAIN)
                add_step(buf, CHAIN)
                check_whole(buf, CHAIN)
                now = (buf.seen_size, ring_state(buf).base)
                buf.close()
            buf = _reopen(store)
            bases = {now[1]} | ({acked} if op == "reset" else set())  # reset: base = the seen_size it met
            _check_store(buf, now[0], bases, op, at)
            buf.close()
    finally:
        faulthandler.cancel_dump_traceback_later()
        if buf is not None:
            buf.close()


def _interrupt_a_closed_store_operation(tmp_path, pristine, backend, op, how) -> None:
    """convert: its source is never written (every byte and mtime the same after all the
    runs), and each run leaves the new store whole or absent, with no temporary behind."""
    call = OPERATIONS[op][0]
    before = _digest(pristine)
    probe = LineInjector()
    probe.run(lambda: call(None, tmp_path, backend))
    assert probe.lines > 5, probe.lines
    faulthandler.dump_traceback_later(900, exit=True)
    try:
        for at in range(1, probe.lines + 1):
            _remove(tmp_path / "c")
            with pytest.raises(_expected(how)):
                _injector(how, at, None).run(lambda: call(None, tmp_path, backend))
                raise Injected("the injection point was not reached")
            _check_output(tmp_path, op, at)
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert _digest(pristine) == before


def _remove(path) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def test_real_sigterms_into_a_prioritized_learner_loop_tear_nothing(tmp_path, backend):
    """520 real SIGTERMs per backend at random moments into children running the README's
    recipe in a prioritized ``batches()`` loop with ``update_priorities`` and adds
    (tests/support/sigterm_learner.py): no segfault (a close from the handler unmapping
    what the interrupted update wrote through), no hang (the close joining the prefetch
    thread that waits for the lock the interrupted thread holds), no torn or lost row."""
    import json
    import subprocess
    import sys

    import paths
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([paths.SUPPORT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(paths.SUPPORT, "sigterm_learner.py"), str(tmp_path), backend,
                           "520", "35"], capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["signals"] == 520
    assert report["torn"] == report["lost"] == report["unclean"] == report["bad_exit"] == 0, report
    assert report["hangs"] == report["crashes"] == 0, report
