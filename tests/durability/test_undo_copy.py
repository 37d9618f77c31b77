"""Undo rows copied ahead (``undocopy.py``): the checkpoints a writer commits are the same
bytes whether its adds copied the next checkpoint's undo rows ahead or the flush copied
them all, whatever comes between (explicit flushes off the plan, resets, a ring end inside
a step, frame stacks laid out env-major); the body CRC joined from per-field CRCs
(``crcjoin.py``) is zlib's; and a close() from a signal handler in the middle of a copy
stops it. Crash images and kill -9 while copying ahead: tests/durability/test_power_loss.py and
tests/durability/test_crash.py."""
from __future__ import annotations

import os
import random
import threading
import time
import warnings
import zlib

import numpy as np
import pytest

from crash_common import FRAME, add_step, crash_fields, store_problems

from diskreplay import DiskReplay, DiskReplayError, RecoveryWarning, StoreIOError

from diskreplay.format import crcjoin

from diskreplay.session import flushing
from diskreplay.format.checkpoint import HEADER_BYTES, CheckpointFile
from diskreplay.session.undocopy import UndoCopy
from diskreplay.testing import raw_rows


@pytest.mark.parametrize("join", [crcjoin.join, crcjoin.join_python], ids=["as built", "python"])
def test_join_is_the_crc_of_the_concatenation(join):
    rng = random.Random(3)
    for _ in range(400):
        a = rng.randbytes(rng.choice([0, 1, 7, rng.randrange(0, 5000)]))
        b = rng.randbytes(rng.choice([0, 1, 8, rng.randrange(0, 5000)]))
        assert join(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    # Lengths far beyond the small ones: 3 GiB of zeros joined from 1 MiB blocks, and from
    # 64 MiB blocks (each itself joined from 1 MiB), agree (other powers of x on each side).
    mib = zlib.crc32(bytes(1 << 20))

    def zeros(blocks: int, crc: int, nbytes: int) -> int:
        out = 0
        for _ in range(blocks):
            out = join(out, crc, nbytes)
        return out

    assert zeros(3 << 10, mib, 1 << 20) == zeros(48, zeros(64, mib, 1 << 20), 64 << 20)
    assert zeros(2, mib, 1 << 20) == zlib.crc32(bytes(2 << 20))
    with pytest.raises(ValueError):
        crcjoin.shift(-1)


def test_the_python_join_of_a_known_length_is_a_few_lines():
    """The pure join keeps its tables per length: a flush joins the same few lengths every
    time, so under DISKREPLAY_PURE=1 it costs a few line events, as the C join costs none
    (the tests that inject an exception at every line, tests/durability/test_interrupts.py and
    test_prioritized.py, had about 5x more points, and took 5x longer, while every join
    stepped through ``_times`` about 400 lines at a time)."""
    from line_injector import LineInjector

    nbytes = 3 * 4099  # a length no other test joins
    first, again = LineInjector(), LineInjector()
    first.run(lambda: crcjoin.join_python(1, 2, nbytes))
    again.run(lambda: crcjoin.join_python(3, 4, nbytes))
    assert first.lines > 100 and again.lines <= 4, (first.lines, again.lines)
    a, b = bytes(range(256)) * 3, bytes(reversed(range(256))) * 48 + bytes(3)
    assert crcjoin.join_python(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_the_built_join_is_in_use():
    """Where ``_rows`` is built, the flush joins in C (no line events at all:
    tests/durability/test_interrupts.py injects at every one)."""
    from diskreplay.format.rowsums import implementation

    if implementation() == "C":
        assert crcjoin.join is not crcjoin.join_python
    else:
        assert crcjoin.join is crcjoin.join_python


def _newest(buf) -> tuple:
    """The newest checkpoint as read from the file (its body CRC checked), with its body.
    (The other slot differs: copying ahead overwrites it between flushes.)"""
    ck = buf._session.data.ckfile
    c = ck.newest()
    body = os.pread(ck.fd, ck.layout.body_bytes, ck.layout.slot_offset(c.slot) + HEADER_BYTES)
    return c.slot, c.generation, c.seen, c.base, c.reserve_first, c.reserve_count, body


CASES = [  # (num_envs, max_size, flush_every, frame_stack)
    (1, 37, 5, None),
    (3, 40, 4, None),   # 40 slots, steps of 3: the ring end falls inside steps
    (4, 48, 3, 2),      # frame stacks, frames env-major (48 = 4 x 12)
]


@pytest.mark.parametrize("num_envs, max_size, flush_every, frame_stack", CASES)
def test_copied_ahead_or_not_the_checkpoints_are_the_same(tmp_path, monkeypatch, backend, num_envs, max_size,
                                                           flush_every, frame_stack):
    fields = crash_fields((frame_stack,) + FRAME) if frame_stack else crash_fields()
    stores = {}
    for early in ("ahead", "at flush"):
        stores[early] = DiskReplay.create(tmp_path / early.replace(" ", "_"), max_size, num_envs=num_envs,
                                          backend=backend, fields=fields, seed=1, flush_every=flush_every,
                                          frame_stack=frame_stack)
    copied = []
    real_copy = UndoCopy.copy

    def copy(self, ckfile, storage, upto, n, wanted=None):
        if wanted is not None and upto > self.done:
            copied.append(upto)
        return real_copy(self, ckfile, storage, upto, n, wanted)

    monkeypatch.setattr(UndoCopy, "copy", copy)
    rng = random.Random(num_envs)
    seen, compared = 0, 0
    for step in range(12 * max_size // num_envs):
        events = []
        if rng.random() < 0.03:
            events.append("flush")
        if rng.random() < 0.01:
            events.append("reset")
        for early, buf in stores.items():
            monkeypatch.setattr(flushing, "EARLY_BYTES", 1 if early == "ahead" else 1 << 40)
            add_step(buf, seen + 1)
            for event in events:
                getattr(buf, event)()
        seen += num_envs
        a, b = (_newest(buf) for buf in stores.values())
        assert a == b, f"step {step}"
        compared += 1
    assert len(copied) > 10 * max_size // num_envs // flush_every  # the adds did copy ahead
    a, b = stores.values()
    assert (a.seen_size, a.size) == (b.seen_size, b.size) and a.seen_size == seen
    for name, rows in raw_rows(a).items():
        assert np.array_equal(rows, raw_rows(b)[name]), name
    for buf in stores.values():
        buf.flush()
        checked, bad = buf.verify_rows()
        assert checked == buf.size and bad == []
        buf.close()


def test_a_close_while_the_thread_copies_waits_for_its_block_and_stops_it(tmp_path, monkeypatch, backend):
    """close() (a signal handler's, say) while the early work thread is inside a block of the
    copy: the close waits for that block only, the thread writes nothing after it, and the
    store reopens clean with every acknowledged transition."""
    monkeypatch.setattr(flushing, "EARLY_BYTES", 1)
    buf = DiskReplay.create(tmp_path / "s", 40, num_envs=1, backend=backend, fields=crash_fields(), seed=1,
                            flush_every=6)
    real_write_rows = CheckpointFile.write_rows
    inside = threading.Event()
    writes_after_close = []

    def slow_write_rows(self, slot, name, k, block, crc=0):
        if threading.current_thread() is not threading.main_thread():
            if buf._session.closed:
                writes_after_close.append((slot, name, k))
            inside.set()
            time.sleep(0.02)
        return real_write_rows(self, slot, name, k, block, crc)

    monkeypatch.setattr(CheckpointFile, "write_rows", slow_write_rows)
    seen = 0
    while not inside.is_set() or buf.seen_size < 100:
        add_step(buf, seen + 1)
        seen += 1
    buf.close()
    closed = _file_bytes(tmp_path / "s")
    time.sleep(0.2)  # what the thread had queued would run now
    assert _file_bytes(tmp_path / "s") == closed and writes_after_close == []
    with DiskReplay.open(tmp_path / "s", mode="r+") as again:
        assert again.recovery_note is None and again.seen_size == seen
        assert store_problems(again, min_seen=seen, max_seen=seen) == []


def _file_bytes(path) -> bytes:
    with open(os.path.join(path, "checkpoint.bin"), "rb") as f:
        return f.read()


def test_flushes_at_the_limit_continue_the_copy_early_work_planned(tmp_path, monkeypatch, backend):
    """With the default early work (1 MiB of rows), W3-like rows (28 KiB, a reserve of 1,600
    rows: 200 steps of 8) and a ring of four reserves, every flush at the limit after the first wrap is the one early work
    planned for: it continues that copy (however far the thread got) instead of starting over."""
    fields = {"states": ((4, 84, 84), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    flushes = []
    real_copy = UndoCopy.copy

    def copy(self, ckfile, storage, upto, n, wanted=None):
        if wanted is None:  # the flush's own call
            flushes.append(self is buf._session.flusher.undo_copy)
        return real_copy(self, ckfile, storage, upto, n, wanted)

    monkeypatch.setattr(UndoCopy, "copy", copy)
    with DiskReplay.create(tmp_path / "s", 4 * 1600, num_envs=8, backend=backend, fields=fields, seed=1) as buf:
        reserve = buf._session.reserve_rows
        assert reserve == 1600
        s = np.random.default_rng(0).integers(0, 255, (8, 4, 84, 84), dtype=np.uint8)
        args = (np.zeros(8, np.int64), np.zeros(8, np.float32), s, np.zeros(8, bool))
        while buf.seen_size < 3 * buf.max_size:
            buf.add(s, *args)
    after_wrap = flushes[buf.max_size // reserve + 2:-1]  # the last one: close()'s, off the plan
    assert len(after_wrap) >= 4 and all(after_wrap), flushes


def test_a_write_error_in_the_thread_surfaces_at_the_flush(tmp_path, monkeypatch, backend):
    """ENOSPC on every undo row the early work thread writes: the adds go on (the thread's
    errors are dropped), the flush that copies those rows itself meets the error and raises
    it as a ``DiskReplayError``, the writer then refuses writes, and the store reopens with
    every add that returned."""
    monkeypatch.setattr(flushing, "EARLY_BYTES", 1)
    real_write_rows = CheckpointFile.write_rows
    failing = {"on": False}

    def write_rows(self, slot, name, k, block, crc=0):
        if failing["on"]:
            raise StoreIOError(f"writing {self.path}: [Errno 28] No space left on device")
        return real_write_rows(self, slot, name, k, block, crc)

    monkeypatch.setattr(CheckpointFile, "write_rows", write_rows)
    buf = DiskReplay.create(tmp_path / "s", 40, num_envs=1, backend=backend, fields=crash_fields(), seed=1,
                            flush_every=6)
    seen = 0
    while seen < 100:
        add_step(buf, seen + 1)
        seen += 1
    failing["on"] = True
    with pytest.raises(DiskReplayError, match="No space left"):
        for _ in range(20):  # the next flush at the limit comes within 6 adds
            add_step(buf, seen + 1)
            seen += 1
    with pytest.raises(DiskReplayError):
        add_step(buf, seen + 1)
    buf.close()
    failing["on"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        with DiskReplay.open(tmp_path / "s", mode="r+") as again:
            assert again.seen_size == seen
            assert store_problems(again, min_seen=seen, max_seen=seen) == []
