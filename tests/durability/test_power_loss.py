"""Simulated power loss: crash images built from what a disk may hold after a power cut.

The workload runs in this process. ``os.fsync`` is wrapped so that each completed sync
of a store file records the file's contents: that is what is durable. At random crash
points (before and after every fsync and pwrite, and after adds) the current contents
of every file are taken too. A crash image is, per file, the durable contents plus a
random subset of the 4 KiB pages that changed since, one of them torn (a random prefix
new, the rest old). Each image is opened after a simulated reboot (another boot id) and
must satisfy the power-cut promise: it opens, its ``seen_size`` is at least the one of
the last completed ``flush()`` (and at most what was being added), and every slot holds
the whole transition its position implies, so every flushed transition the later adds
had not evicted is present and nothing is half-present. Then it takes more adds.

``test_power_loss_check_has_teeth`` removes the data-before-checkpoint barrier (the
data files are no longer synced in ``flush``) and asserts the same check catches it.
"""
from __future__ import annotations

import os
import random
import warnings

import pytest

from crash_common import FRAME, add_step, crash_fields, store_problems

import diskreplay.format.counters
from diskreplay.session import flushing
from diskreplay import DiskReplay, DiskReplayError
from diskreplay.backends import BACKENDS
from diskreplay.backends.base import RowStorage
from diskreplay.format.checkpoint import CheckpointFile
from diskreplay.errors import RecoveryWarning
from diskreplay.session.undocopy import UndoCopy

PAGE = 4096
IMAGES_PER_CRASH = 4
CRASH_POINTS = 30  # per case: 8 cases x 30 x 4 = 960 images


def _read_files(directory: str) -> dict:
    out = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = f.read()
    return out


class PowerLossRecorder:
    """Durable file contents as of each completed fsync, and crash points."""

    def __init__(self, directory: str, rng: random.Random, crash_prob: float):
        self.dir = os.path.abspath(directory)
        self.rng = rng
        self.crash_prob = crash_prob
        self.durable = _read_files(self.dir)
        self.flushed = 0  # seen_size at the last completed flush()
        self.issued = 0  # seen_size the add in progress (or the last one) completes
        self.crashes = []
        self.copied_ahead = 0  # blocks of undo rows copied ahead by adds' early work
        self.armed = False  # crash points are taken once the first flush has completed
        self.real_fsync = os.fsync
        self.real_pwrite = os.pwrite

    def fsync(self, fd):
        self.maybe_crash()
        self.real_fsync(fd)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if os.path.dirname(path) == self.dir and os.path.isfile(path):
            with open(path, "rb") as f:
                self.durable[os.path.basename(path)] = f.read()
        self.maybe_crash()

    def pwrite(self, fd, data, offset):
        n = self.real_pwrite(fd, data, offset)
        self.maybe_crash()
        return n

    def maybe_crash(self, force: bool = False):
        if force or (self.armed and self.rng.random() < self.crash_prob):
            self.crashes.append((dict(self.durable), _read_files(self.dir), self.flushed, self.issued))


def crash_image(durable: dict, current: dict, rng: random.Random) -> dict:
    """Durable files + a random subset of the changed pages, one of the chosen pages torn."""
    image, changed = {}, []
    for name, now in current.items():
        old = durable.get(name, b"")
        if len(old) != len(now):
            old = old[: len(now)].ljust(len(now), b"\0")
        buf = bytearray(old)
        pages = [p for p in range(0, len(now), PAGE) if old[p:p + PAGE] != now[p:p + PAGE]]
        for p in pages:
            if rng.random() < 0.5:
                buf[p:p + PAGE] = now[p:p + PAGE]
                changed.append((name, p))
        image[name] = (buf, old, now)
    if changed:
        name, p = rng.choice(changed)
        buf, old, now = image[name]
        end = min(p + PAGE, len(now))
        cut = rng.randrange(p + 1, end) if end - p > 1 else end
        if rng.random() < 0.5:
            buf[p:end] = now[p:cut] + old[cut:end]
        else:
            buf[p:end] = old[p:cut] + now[cut:end]
    return {name: bytes(v[0]) for name, v in image.items()}


def run_workload(store: str, backend: str, num_envs: int, rng: random.Random, monkeypatch,
                 remove_data_barrier: bool = False, flush_every: int | None = None,
                 frame_stack: int | None = None, max_size: int = 37, early_bytes: int | None = None) -> PowerLossRecorder:
    """``frame_stack``: a frame-stack store (``crash_common.stack_step_args``), for tests/features/test_frame_stack.py
    (``max_size`` a multiple of ``num_envs``: its frames env-major). ``early_bytes``: the writer's
    early work after every ``early_bytes`` of rows (undo rows copied ahead, ``undocopy.py``);
    its default (1 MiB) never comes in these small stores."""
    fields = crash_fields((frame_stack,) + FRAME) if frame_stack else crash_fields()
    buf = DiskReplay.create(store, max_size, num_envs=num_envs, backend=backend, fields=fields,
                            seed=7, flush_every=flush_every, frame_stack=frame_stack)
    rec = PowerLossRecorder(store, rng, crash_prob=0.02)
    real_write = CheckpointFile.commit

    def write_checkpoint(self, slot, generation, seen, *args, **kwargs):
        real_write(self, slot, generation, seen, *args, **kwargs)
        rec.flushed = seen  # the checkpoint is durable: this flush has completed its promise
        rec.armed = rec.armed or seen > 0

    with monkeypatch.context() as mp:
        mp.setattr(os, "fsync", rec.fsync)
        mp.setattr(os, "pwrite", rec.pwrite)
        mp.setattr(CheckpointFile, "commit", write_checkpoint)
        if remove_data_barrier:
            mp.setattr(RowStorage, "sync", lambda self: None)
        if early_bytes is not None:
            mp.setattr(flushing, "EARLY_BYTES", early_bytes)
            real_copy = UndoCopy.copy

            def copy(self, ckfile, storage, upto, num_envs, wanted=None):
                if wanted is not None and upto > self.done:
                    rec.copied_ahead += 1
                return real_copy(self, ckfile, storage, upto, num_envs, wanted)

            mp.setattr(UndoCopy, "copy", copy)
        seen = 0
        while len(rec.crashes) < CRASH_POINTS:
            rec.issued = seen + num_envs
            add_step(buf, seen + 1)
            seen += num_envs
            rec.maybe_crash()
            if rng.random() < 0.08:
                buf.flush()
        buf.close()
    return rec


def check_images(rec: PowerLossRecorder, tmp_path, rng: random.Random, monkeypatch) -> tuple[int, list]:
    """Open every crash image after a simulated reboot; returns (images, violations)."""
    other_boot = diskreplay.format.counters.current_boot_id() ^ 0x5A5A
    images, violations = 0, []
    with monkeypatch.context() as mp:
        mp.setattr(diskreplay.format.counters, "current_boot_id", lambda: other_boot)
        for c, (durable, current, flushed, issued) in enumerate(rec.crashes):
            for i in range(IMAGES_PER_CRASH):
                files = crash_image(durable, current, rng)
                d = tmp_path / f"image-{c}-{i}.replay"
                d.mkdir()
                for name, data in files.items():
                    (d / name).write_bytes(data)
                images += 1
                where = f"image {c}/{i} (flushed {flushed}, adding {issued})"
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RecoveryWarning)
                        with DiskReplay.open(str(d), mode="r+") as buf:
                            found = store_problems(buf, min_seen=flushed, max_seen=issued)
                            if not found and i == 0:
                                seen = buf.seen_size
                                for _ in range(3):
                                    add_step(buf, seen + 1)
                                    seen += buf.num_envs
                        if not found and i == 0:
                            with DiskReplay.open(str(d), mode="r+") as buf:
                                found = store_problems(buf, min_seen=seen, max_seen=seen)
                except DiskReplayError as exc:
                    found = [f"open failed: {type(exc).__name__}: {exc}"]
                violations += [f"{where}: {p}" for p in found]
                for name in files:
                    (d / name).unlink()
                d.rmdir()
    return images, violations


@pytest.mark.parametrize("num_envs, flush_every", [
    (1, None), (1, 5), (4, None), (4, 5)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_power_loss_images_keep_every_flushed_transition(tmp_path, monkeypatch, backend, num_envs, flush_every):
    rng = random.Random(17 + num_envs + 100 * (backend == "hdf5") + (flush_every or 0))
    rec = run_workload(str(tmp_path / "src.replay"), backend, num_envs, rng, monkeypatch, flush_every=flush_every)
    assert len(rec.crashes) >= CRASH_POINTS
    assert rec.flushed > 3 * 37  # flushes happened while the ring wrapped
    images, violations = check_images(rec, tmp_path, rng, monkeypatch)
    assert images >= CRASH_POINTS * IMAGES_PER_CRASH
    assert violations == [], violations[:10]


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_power_loss_while_undo_rows_are_copied_ahead(tmp_path, monkeypatch, backend, num_envs):
    """Early work after every step copies the next checkpoint's undo rows into its slot
    (a reserve of 5 steps in a ring of at least 2 reserves, so a flush at the limit finds its
    rows copied): crash points fall inside those copies too, and every image keeps the promise."""
    rng = random.Random(41 + num_envs + 100 * (backend == "hdf5"))
    max_size = 37 if num_envs == 1 else 45  # 45: steps of 4 wrap part-way
    rec = run_workload(str(tmp_path / "src.replay"), backend, num_envs, rng, monkeypatch, flush_every=5,
                       early_bytes=1, max_size=max_size)
    assert rec.copied_ahead > 20 and rec.flushed > 3 * max_size
    images, violations = check_images(rec, tmp_path, rng, monkeypatch)
    assert images >= CRASH_POINTS * IMAGES_PER_CRASH
    assert violations == [], violations[:10]


@pytest.mark.parametrize("backend", BACKENDS)
def test_power_loss_check_catches_undo_rows_copied_ahead_wrong(tmp_path, monkeypatch, backend):
    """Undo rows copied ahead from the slots one transition on (and trusted by the flush as
    if right): some image restores wrong rows, and the check says so."""
    real_copy = UndoCopy.copy

    def copy_one_off(self, ckfile, storage, upto, num_envs, wanted=None):
        if wanted is None:
            return real_copy(self, ckfile, storage, upto, num_envs)
        key = self.key
        self.key = (key[0], key[1] + 1) + key[2:]
        try:
            return real_copy(self, ckfile, storage, upto, num_envs, wanted)
        finally:
            self.key = key

    monkeypatch.setattr(UndoCopy, "copy", copy_one_off)
    rng = random.Random(43)
    rec = run_workload(str(tmp_path / "src.replay"), backend, 1, rng, monkeypatch, flush_every=5, early_bytes=1)
    assert rec.copied_ahead > 20
    images, violations = check_images(rec, tmp_path, rng, monkeypatch)
    assert images > 0
    assert violations, "undo rows copied from the wrong slots went unnoticed"


@pytest.mark.parametrize("backend", BACKENDS)
def test_power_loss_check_has_teeth(tmp_path, monkeypatch, backend):
    """Without the data sync before the checkpoint, some image loses flushed rows."""
    rng = random.Random(99)
    # A reserve smaller than the ring (flush_every=5): with the default reserve of
    # max_size + num_envs rows every slot has an undo copy and the data sync is moot.
    rec = run_workload(str(tmp_path / "src.replay"), backend, 1, rng, monkeypatch, remove_data_barrier=True,
                       flush_every=5)
    images, violations = check_images(rec, tmp_path, rng, monkeypatch)
    assert images > 0
    assert violations, "removing the data-before-checkpoint barrier went unnoticed"


@pytest.mark.parametrize("backend", BACKENDS)
def test_power_loss_before_the_first_flush(tmp_path, monkeypatch, backend):
    """A power cut before any flush must reopen to the empty store the creation made durable."""
    rng = random.Random(5)
    store = str(tmp_path / "src.replay")
    buf = DiskReplay.create(store, 37, backend=backend, fields=crash_fields())
    rec = PowerLossRecorder(store, rng, crash_prob=0.0)
    with monkeypatch.context() as mp:
        mp.setattr(os, "fsync", rec.fsync)
        for t in range(1, 6):
            rec.issued = t
            add_step(buf, t)
        rec.maybe_crash(force=True)
    buf.close()
    images, violations = check_images(rec, tmp_path, rng, monkeypatch)
    assert images == IMAGES_PER_CRASH
    assert violations == [], violations[:4]
