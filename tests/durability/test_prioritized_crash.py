"""Prioritized stores killed with ``kill -9`` during update loops (real processes), and
power-cut images (``test_power_loss``'s recorder), Ctrl-C at every line of ``reset``: no
acknowledged update lost, no torn tree, and after a power cut exactly the priorities of the
last flush."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import diskreplay.format.counters
from diskreplay import DiskReplay, DiskReplayError
from diskreplay.session import flushing
from diskreplay.backends import BACKENDS
from diskreplay.format.checkpoint import CheckpointFile
from diskreplay.errors import RecoveryWarning
from diskreplay.parts.priorities.files import Priorities
from fields import cartpole_fields, step_values
from prio_crash_child import prio_op
from prio_model import PriorityModel
from test_power_loss import IMAGES_PER_CRASH, PowerLossRecorder, crash_image
import paths

SUPPORT = paths.SUPPORT
CHILD = os.path.join(SUPPORT, "prio_crash_child.py")
MAX_SIZE = 50


def _create(path, backend):
    with DiskReplay.create(path, MAX_SIZE, backend=backend, fields=cartpole_fields(), prioritized=True,
                           seed=3) as buf:
        for t in range(1, 31):
            buf.add(*step_values(t))
    model = PriorityModel(MAX_SIZE, 0.6, 1e-6)
    model.add(30)
    return model


def _apply(model, op):
    if op[0] == "add":
        model.add(1)
    elif op[0] == "update":
        model.update(op[1], op[2])


def _problems(buf, before, after) -> list[str]:
    """Slot by slot the store holds the state after the last acknowledged operation, or
    (for slots the operation in flight wrote) the state after that one; the tree agrees."""
    out = []
    if buf.size not in (before.size, after.size):
        out.append(f"size {buf.size}, expected {before.size} or {after.size}")
        return out
    got = buf.get(np.arange(buf.size))["priorities"]
    ok = np.isclose(got, before.p[:buf.size], rtol=1e-12) | np.isclose(got, after.p[:buf.size], rtol=1e-12)
    if not ok.all():
        out.append(f"slots {np.flatnonzero(~ok)[:5].tolist()} hold {got[~ok][:5]}, acknowledged "
                   f"{before.p[:buf.size][~ok][:5]}")
    prio = buf._session.prio
    out += prio.tree.problems()
    if np.any(prio.tree.leaves[buf.size:] != 0):
        out.append("an empty slot has a priority in the tree")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_9_during_update_loops_loses_no_acknowledged_update(tmp_path, backend):
    rng = random.Random(7 + (backend == "hdf5"))
    path = str(tmp_path / "s.replay")
    model = _create(path, backend)
    done = 0  # operations acknowledged so far, over every child
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")]))}
    for round_ in range(6):
        child = subprocess.Popen([sys.executable, "-u", CHILD, path], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env, text=True)
        target = rng.randrange(20, 400)
        acked = 0
        for line in child.stdout:
            acked = int(line)
            if acked >= target:
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for line in child.stdout.read().split("\n")[:-1]:  # acknowledged before the kill landed
            acked = int(line)
        assert child.returncode == -signal.SIGKILL, child.stderr.read()
        # The child numbers its operations from 1 with the store's state when it opened:
        # replay them on the model, and the one in flight on a copy.
        ops = []
        for i in range(1, acked + 2):
            op = prio_op(i, model.size, model.count)
            ops.append(op)
            if i <= acked:
                _apply(model, op)
        after = PriorityModel(MAX_SIZE, 0.6, 1e-6)
        after.p, after.max_p, after.count = model.p.copy(), model.max_p, model.count
        _apply(after, ops[-1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecoveryWarning)
            with DiskReplay.open(path, mode="r") as ro:  # a reader of the dead writer's store
                assert _problems(ro, model, after) == [], round_
            with DiskReplay.open(path) as buf:
                assert _problems(buf, model, after) == [], round_
                # whatever the in-flight operation left is now the state: adopt it
                got = buf.get(np.arange(buf.size))["priorities"]
                model.p[:buf.size] = got
                model.count = buf.seen_size
                model.max_p = buf._session.prio.max_p
        done += acked
    assert done > 300


# ---------------------------------------------------------------- power cuts
class PrioRecorder(PowerLossRecorder):
    """Also records the priorities each flush made durable (and the one being written)."""

    flushed_p = pending = None

    def maybe_crash(self, force: bool = False):
        before = len(self.crashes)
        super().maybe_crash(force)
        if len(self.crashes) > before:
            self.crashes[-1] = self.crashes[-1] + (self.flushed_p, self.pending)


def run_prio_workload(store, backend, rng, monkeypatch, drop_snapshot=False):
    buf = DiskReplay.create(store, 37, backend=backend, fields=cartpole_fields(), prioritized=True, seed=7,
                            flush_every=5)
    rec = PrioRecorder(store, rng, crash_prob=0.03)
    real_write, real_checkpoint = CheckpointFile.commit, Priorities.checkpoint

    def write_checkpoint(self, slot, generation, seen, *args, **kwargs):
        real_write(self, slot, generation, seen, *args, **kwargs)
        rec.flushed = seen
        rec.flushed_p = rec.pending
        rec.armed = rec.armed or seen > 0

    def prio_checkpoint(self, generation, seen, base):
        if drop_snapshot:
            self.catch_up(seen, base)
        else:
            real_checkpoint(self, generation, seen, base)
        rec.pending = (seen, self.tree.leaves[:self.max_size].copy())

    with monkeypatch.context() as mp:
        mp.setattr(os, "fsync", rec.fsync)
        mp.setattr(os, "pwrite", rec.pwrite)
        mp.setattr(CheckpointFile, "commit", write_checkpoint)
        mp.setattr(Priorities, "checkpoint", prio_checkpoint)
        t = 1
        while len(rec.crashes) < 30:
            if rng.random() < 0.3:
                rec.issued = t
                buf.add(*step_values(t))
                t += 1
            elif buf.size:
                k = rng.randrange(1, 9)
                buf.update_priorities([rng.randrange(buf.size) for _ in range(k)], [rng.random() * 9 for _ in range(k)])
            rec.maybe_crash()
            if rng.random() < 0.1:
                buf.flush()
        buf.close()
    return rec


def check_prio_images(rec, tmp_path, rng, monkeypatch) -> tuple[int, list]:
    other_boot = diskreplay.format.counters.current_boot_id() ^ 0x5A5A
    images, violations = 0, []
    with monkeypatch.context() as mp:
        mp.setattr(diskreplay.format.counters, "current_boot_id", lambda: other_boot)
        for c, (durable, current, flushed, issued, flushed_p, pending) in enumerate(rec.crashes):
            for i in range(IMAGES_PER_CRASH):
                d = tmp_path / f"image-{c}-{i}.replay"
                d.mkdir()
                for name, data in crash_image(durable, current, rng).items():
                    (d / name).write_bytes(data)
                images += 1
                found = []
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RecoveryWarning)
                        with DiskReplay.open(str(d), mode="r") as ro:  # the same, read virtually
                            want = [p for s, p in (flushed_p, pending) if s == ro.seen_size] if flushed_p else []
                            got = ro.get(np.arange(ro.size))["priorities"]
                            if not any(np.array_equal(got, w[:ro.size]) for w in want):
                                found.append(f"reader at seen {ro.seen_size}: priorities are not those of its flush")
                        with DiskReplay.open(str(d)) as buf:
                            seen = buf.seen_size
                            want = [p for s, p in (flushed_p, pending) if s == seen] if flushed_p else []
                            got = buf._session.prio.tree.leaves[:37]
                            if not any(np.array_equal(got, w) for w in want):
                                found.append(f"seen {seen}: priorities are not those of its flush")
                            found += buf._session.prio.tree.problems()
                except DiskReplayError as exc:
                    found.append(f"open failed: {type(exc).__name__}: {exc}")
                violations += [f"image {c}/{i} (flushed {flushed}): {p}" for p in found]
                for name in os.listdir(d):
                    os.unlink(d / name)
                d.rmdir()
    return images, violations


@pytest.mark.parametrize("early_bytes", [None, 1], ids=["default", "copying-ahead"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_power_cut_images_hold_the_priorities_of_the_last_flush(tmp_path, monkeypatch, backend, early_bytes):
    """``copying-ahead``: early work after every add, so the undo rows are copied ahead
    (undocopy.py) and crash points fall inside those copies too."""
    if early_bytes is not None:
        monkeypatch.setattr(flushing, "EARLY_BYTES", early_bytes)
    rng = random.Random(23 + (backend == "hdf5") + 7 * (early_bytes or 0))
    rec = run_prio_workload(str(tmp_path / "src.replay"), backend, rng, monkeypatch)
    images, violations = check_prio_images(rec, tmp_path, rng, monkeypatch)
    assert images >= 30 * IMAGES_PER_CRASH
    assert violations == [], violations[:5]


def test_power_cut_check_has_teeth(tmp_path, monkeypatch):
    """Without the snapshot, images come back with priorities from after the flush."""
    rng = random.Random(5)
    rec = run_prio_workload(str(tmp_path / "src.replay"), "memmap", rng, monkeypatch, drop_snapshot=True)
    images, violations = check_prio_images(rec, tmp_path, rng, monkeypatch)
    assert images > 0 and violations


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reader_samples_by_priority_beside_a_writer_process(tmp_path, backend):
    """A child process updates, adds and flushes without pause; this process reads with
    mode='r': every batch comes from a consistent copy (its tree agrees with it), every
    weight is finite and positive, nothing is written by the reader."""
    path = str(tmp_path / "s.replay")
    _create(path, backend)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-u", CHILD, path], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env)
    try:
        with DiskReplay.open(path, mode="r") as ro:
            seen, batches, deadline = set(), 0, time.monotonic() + 30
            while (len(seen) < 20 or batches < 300) and time.monotonic() < deadline:
                batches += 1
                batch = ro.sample(32, beta=0.7)
                prio = ro._session.prio
                assert prio.tree.problems() == []
                assert np.all(np.isfinite(batch["weights"])) and np.all(batch["weights"] > 0)
                assert np.all(batch["weights"] <= 1.0 + 1e-6)
                assert np.all(prio.tree.leaves[ro.batch_idxs] > 0)
                seen.add(int(prio.words[5]))
            assert len(seen) >= 20, "the writer hardly updated while the reader sampled"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read()


def test_a_reset_cut_short_at_any_line_keeps_the_priorities_with_the_rows(tmp_path, backend):
    """Ctrl-C at every line of ``reset``: either the reset happened (no rows, no priorities)
    or it did not, and then every priority is as before, in the tree, the live dataset and
    after reopening."""
    from line_injector import LineInjector

    def prepared(path):
        buf = DiskReplay.create(path, 20, backend=backend, fields=cartpole_fields(), prioritized=True, seed=5)
        for t in range(1, 26):
            buf.add(*step_values(t))
        buf.update_priorities(np.arange(20), np.arange(20.0) + 1)
        return buf

    with prepared(tmp_path / "probe") as buf:
        probe = LineInjector()
        probe.run(buf.reset)
    assert probe.lines > 5
    for at in range(1, probe.lines + 1):
        path = tmp_path / f"s{at}"
        buf = prepared(path)
        before = buf.get(np.arange(buf.size))["priorities"]
        with pytest.raises(KeyboardInterrupt):
            LineInjector(at).run(buf.reset)
            raise KeyboardInterrupt  # the line count is exact: never reached
        prio = buf._session.prio
        assert prio.tree.problems() == []
        if buf.size:
            np.testing.assert_array_equal(buf.get(np.arange(buf.size))["priorities"], before, err_msg=f"line {at}")
            np.testing.assert_array_equal(np.asarray(prio.live), before)
        buf.close()
        with DiskReplay.open(path) as again:
            assert again.size in (0, 20)
            if again.size:
                np.testing.assert_array_equal(again.get(np.arange(again.size))["priorities"], before, err_msg=f"line {at}, reopened")
