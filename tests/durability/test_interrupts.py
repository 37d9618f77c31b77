"""An exception at any line diskreplay executes inside ``add``, ``flush``, ``reset`` or
``close`` (Ctrl-C, a signal handler's ``sys.exit``, any error) never loses or tears an
acknowledged transition (issue 13): injected with ``sys.settrace`` at every line, one run
per line, on every add path and backend; then the same object is used again, closed,
reopened and checked whole."""
import os
import sys
import warnings

import numpy as np
import pytest

import diskreplay
from diskreplay import DiskReplay, DiskReplayError, RecoveryWarning
from diskreplay.testing import ring_state
from interrupt_common import PATHS, add_step, check_whole, create, step
from line_injector import LineInjector
import paths



class Injected(Exception):
    """The ordinary exception injected (KeyboardInterrupt is the other)."""


def _prepare(buf, name):
    """Fill past one lap (so the next adds overwrite acknowledged rows), then position the
    ring so the next step takes the path the scenario is named after."""
    while buf.seen_size < buf.max_size + 2 * buf.num_envs:
        add_step(buf, name)
    if name == "wrapping":  # the next step must cross the ring end
        n, m = buf.num_envs, buf.max_size
        while (buf.seen_size % m) + n <= m:
            add_step(buf, name)
    if name == "flush-due":
        add_step(buf, name)  # with flush_every=1 the add after this one flushes first
    buf.flush() if name != "flush-due" else None


OPERATIONS = {
    "add": lambda buf, name: (lambda: add_step(buf, name)),
    "flush": lambda buf, name: buf.flush,
    "reset": lambda buf, name: buf.reset,
    "close": lambda buf, name: buf.close,
}

CASES = [(path, "add") for path in PATHS] + [("fast-vector", "flush"), ("general-extras", "reset"),
                                              ("fast-single", "close"), ("flush-due", "close")]

EXPECTED_FUNCTIONS = {  # proof that each scenario takes the path it is named after
    "fast-single": ("fastadd.py", "add"), "fast-vector": ("fastadd.py", "add"),
    "fast-extras": ("fastadd.py", "add"),
    "general-extras": ("writer.py", "_coerced_values"), "wrapping": ("writer.py", "_write_step"),
    "flush-due": ("flushing.py", "flush"),
}


@pytest.mark.parametrize("exc", [KeyboardInterrupt, Injected], ids=["KeyboardInterrupt", "error"])
@pytest.mark.parametrize("path,op", CASES, ids=[f"{p}-{o}" for p, o in CASES])
def test_exception_at_every_line_keeps_every_acknowledged_transition(tmp_path, backend, path, op, exc):
    store = tmp_path / "s"
    with create(store, path, backend) as buf:
        _prepare(buf, path)
        probe = LineInjector()
        probe.run(OPERATIONS[op](buf, path))
    if op == "add":
        assert EXPECTED_FUNCTIONS[path] in probe.functions, probe.functions
        if path.startswith("fast"):
            assert ("writer.py", "add") not in probe.functions  # really the fast closure
    assert probe.lines > 5
    buf = DiskReplay.open(store)
    try:
        for at in range(1, probe.lines + 1):
            _prepare(buf, path)
            acked, acked_base = buf.seen_size, ring_state(buf).base
            before = acked
            injector = LineInjector(at, exc)
            with pytest.raises((exc, DiskReplayError)):
                injector.run(OPERATIONS[op](buf, path))
                raise exc("the injection point was not reached")  # the line count is exact
            if not buf.closed:
                # The object stays usable: what it serves is whole, and it takes more adds.
                check_whole(buf, path)
                add_step(buf, path)
                check_whole(buf, path)
                acked = buf.seen_size
                buf.close()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RecoveryWarning)  # a close cut short recovers
                buf = DiskReplay.open(store)
            state = ring_state(buf)
            n = buf.num_envs
            if op == "reset":
                assert state.base in (acked_base, before), (at, state)  # reset or not, never half
            else:
                assert state.base == acked_base
            assert buf.seen_size in (acked, acked + n), (at, acked, buf.seen_size)
            check_whole(buf, path)
            checked, damaged = buf.verify_rows()
            assert damaged == [], (at, damaged)
    finally:
        buf.close()


def test_fast_add_refuses_a_late_overflow_before_touching_a_row(tmp_path, backend):
    """The fast one-env path: a reward of 10**400 (or 1e300 into float32) is refused, the
    slot's state and action untouched; the same values are refused on the general path."""
    with create(tmp_path / "s", "fast-single", backend) as buf:
        while buf.seen_size < buf.max_size + 3:
            add_step(buf, "fast-single")
        (s, a, r, ns, d), _ = step("fast-single", buf.seen_size + 1)
        for bad in (10 ** 400, 1e300, np.float64(-1e300), 10 ** 39):
            with pytest.raises(diskreplay.SchemaMismatchError, match="rewards"):
                buf.add(s, a, bad, ns, d)
            with pytest.raises(diskreplay.SchemaMismatchError, match="rewards"):
                buf.add(s, a, np.array(bad, dtype=object if isinstance(bad, int) else np.float64), ns, d)
            check_whole(buf, "fast-single")
        buf.add(s, a, float("inf"), ns, d)  # infinities given as such are stored
        buf.add(*step("fast-single", buf.seen_size + 1)[0][:2], np.float64("nan"),
                *step("fast-single", buf.seen_size + 1)[0][3:])
        rewards = buf.get([buf.head - 1, buf.head])["rewards"]
        assert np.isinf(rewards[0]) and np.isnan(rewards[1])


@pytest.mark.parametrize("path", ["fast-vector", "general-extras"])
def test_vector_overflow_is_refused_the_same_way(tmp_path, backend, path):
    with create(tmp_path / "s", path, backend) as buf:
        (s, a, r, ns, d), extra = step(path, 1)
        for bad in (np.full(len(r), 1e300), [10 ** 400] * len(r), [10 ** 39] * len(r)):
            with pytest.raises(diskreplay.SchemaMismatchError, match="rewards"):
                buf.add(s, a, bad, ns, d, **extra)
        assert buf.seen_size == 0
        buf.add(s, a, [10 ** 30] * len(r), ns, d, **extra)  # big but finite in float32: stored
        assert buf.get([0])["rewards"][0] == np.float32(1e30)


@pytest.mark.parametrize("signals, early_bytes", [(520, None), (130, 1)])
def test_real_sigterms_into_the_readme_recipe_tear_nothing(tmp_path, backend, signals, early_bytes):
    """500+ real SIGTERMs per backend at random moments into children that add in a loop
    with the README's handler (close, then sys.exit): every store closes cleanly with no
    acknowledged step lost and every row whole (the pre-issue-13 code tore a few). With
    ``early_bytes=1`` early work comes after every step, so the signals also land while the
    writer's early work thread starts writebacks and copies undo rows ahead."""
    import json
    import subprocess

    support = paths.SUPPORT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([support, os.environ.get("PYTHONPATH", "")]))
    extra = [] if early_bytes is None else [str(early_bytes)]
    proc = subprocess.run([sys.executable, os.path.join(support, "sigterm_child.py"), str(tmp_path), backend,
                           str(signals), "13"] + extra, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["signals"] == signals
    assert report["torn"] == report["lost"] == report["unclean"] == report["bad_exit"] == 0, report
