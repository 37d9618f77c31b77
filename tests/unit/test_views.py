"""diskreplay.views from Python: snapshots, chronological reads beside a writer, rows, info.

The wrapped store has max_size 10 and holds transitions 14..23 of 23: transition t has
states [t, t], actions t, rewards t/2, next state [t+1, t+1], and lives in slot (t - 1) % 10.
"""
from __future__ import annotations

import ast
import importlib
import os
import threading
import time

import numpy as np
import pytest

from diskreplay import DiskReplay, DiskReplayError, EmptyStoreError, InvalidArgumentError, TornReadError

from diskreplay.core import ring
from diskreplay.errors import OvertakenError
from diskreplay.views import (BLOCK_BYTES, ChronoReader, Snapshot, batch_keys, block_rows, read_rows,
                              sample_batch, snapshot, store_info)

MAX_SIZE, SEEN = 10, 23
FIELDS = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool")}


def fill(buf, first: int, last: int) -> None:
    """Add transitions ``first..last`` (one env)."""
    for t in range(first, last + 1):
        buf.add(np.full(2, t, np.float32), t, t / 2, np.full(2, t + 1, np.float32), t % 4 == 0)


@pytest.fixture
def wrapped(tmp_path, backend):
    path = tmp_path / "w.replay"
    with DiskReplay.create(path, MAX_SIZE, backend=backend, seed=0, fields=FIELDS) as buf:
        fill(buf, 1, SEEN)
    return path


@pytest.fixture
def live(wrapped):
    """A writer and a reader of the wrapped store, in this process."""
    writer = DiskReplay.open(wrapped, mode="r+")
    reader = DiskReplay.open(wrapped, mode="r")
    yield writer, reader
    reader.close()
    writer.close()


# ---------------------------------------------------------------- Snapshot
@pytest.mark.parametrize("seen,base,max_size", [
    (0, 0, 10), (3, 0, 10), (10, 0, 10), (23, 0, 10), (23, 20, 10), (40, 17, 10), (5, 5, 7), (1000, 3, 7)])
def test_snapshot_speaks_the_rings_terms(seen, base, max_size):
    size, head = ring.ring_size(seen, base, max_size), ring.ring_head(seen, base, max_size)
    snap = Snapshot(seen, size, head, max_size, 1)
    assert ring.ring_size(seen, snap.base, max_size) == size
    assert ring.ring_head(seen, snap.base, max_size) == head
    assert snap.slots(0, size).tolist() == ring.chronological_slots(0, size, seen, base, max_size).tolist()
    assert snap.first == seen - size + 1 and snap.transition(size - 1) == seen


def test_snapshot_bounds_work_like_slices():
    snap = Snapshot(23, 10, 2, 10, 1)
    assert snap.bounds() == (0, 10)
    assert snap.bounds(-4, -1) == (6, 9)
    assert snap.bounds(3) == (3, 10) and snap.bounds(10, 10) == (10, 10)
    # Out of range is clamped, as a slice of a list of 10 would be.
    assert snap.bounds(11) == (10, 10) and snap.bounds(-11) == (0, 10) and snap.bounds(-1000, -8) == (0, 2)
    assert snap.bounds(5, 3) == (5, 5) and snap.bounds(None, 11) == (0, 10)


def test_snapshot_of_a_store(wrapped):
    with DiskReplay.open(wrapped, mode="r") as buf:
        snap = snapshot(buf)
        assert snap == Snapshot(SEEN, MAX_SIZE, (SEEN - 1) % MAX_SIZE, MAX_SIZE, 1, buf.generation)
        assert buf.get(snap.slots(0, snap.size))["actions"].tolist() == list(range(14, 24))


def test_snapshots_beside_a_live_writer_are_consistent(live):
    writer, reader = live
    stop = threading.Event()

    def write():
        t = SEEN
        while not stop.is_set():
            t += 1
            fill(writer, t, t)

    thread = threading.Thread(target=write)
    thread.start()
    deadline = time.monotonic() + 10
    try:
        seen = [SEEN]
        while (len(seen) < 300 or seen[-1] < SEEN + 100) and time.monotonic() < deadline:
            snap = snapshot(reader)
            assert snap.size == MAX_SIZE and snap.head == (snap.seen - 1) % MAX_SIZE
            seen.append(snap.seen)
    finally:
        stop.set()
        thread.join()
    assert seen == sorted(seen) and seen[-1] >= SEEN + 100


# ---------------------------------------------------------------- ChronoReader
@pytest.mark.parametrize("ahead", [False, True])
def test_chrono_reader_reads_a_wrapped_store_oldest_first(wrapped, ahead):
    calls = []
    with DiskReplay.open(wrapped, mode="r") as buf:
        blocks = list(ChronoReader(buf, rows=3, progress=lambda done, total: calls.append((done, total)),
                                   ahead=ahead))
        assert [len(b.slots) for b in blocks] == [3, 3, 3, 1]
        ts = np.concatenate([b.transitions for b in blocks])
        assert ts.tolist() == list(range(14, 24))
        assert np.concatenate([b.positions for b in blocks]).tolist() == list(range(10))
        assert np.concatenate([b.slots for b in blocks]).tolist() == ((ts - 1) % MAX_SIZE).tolist()
        for b in blocks:
            assert b.batch["actions"].tolist() == b.transitions.tolist()
            assert b.batch["next_states"][:, 0].tolist() == (b.transitions + 1).tolist()
        assert calls == [(3, 10), (6, 10), (9, 10), (10, 10)]
        part = list(ChronoReader(buf, -4, -1))
        assert len(part) == 1 and part[0].batch["actions"].tolist() == [20, 21, 22]


class FailingReads:
    """A store's read API whose ``get`` fails from the ``fail_at``-th call on."""

    def __init__(self, buf, fail_at: int):
        self.buf, self.fail_at, self.calls = buf, fail_at, 0

    def get(self, *args, **kwargs):
        self.calls += 1
        if self.calls >= self.fail_at:
            raise OSError(5, "Input/output error")
        return self.buf.get(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.buf, name)


def reading_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "diskreplay-prefetch"]


def test_chrono_reader_ahead_raises_in_the_caller_and_leaves_no_thread(wrapped):
    """``ahead=True`` reads on a background thread: its errors reach the caller after the
    blocks read before them, and the thread ends when the iteration does, however it ends."""
    with DiskReplay.open(wrapped, mode="r") as buf:
        got = []
        with pytest.raises(OSError, match="Input/output error"):
            for block in ChronoReader(FailingReads(buf, fail_at=3), rows=3, ahead=True):
                got.append(block.batch["actions"].tolist())
                assert threading.current_thread() is threading.main_thread()
        assert got == [[14, 15, 16], [17, 18, 19]] and not reading_threads()
        blocks = iter(ChronoReader(buf, rows=1, ahead=True))
        assert next(blocks).batch["actions"].tolist() == [14] and len(reading_threads()) == 1
        blocks.close()  # the caller stops early: the thread stops too
        assert not reading_threads()


def test_chrono_reader_starts_over_when_overtaken_before_yielding(live):
    writer, reader = live
    snap = snapshot(reader)
    fill(writer, SEEN + 1, SEEN + 5)  # transitions 14..18 of the snapshot are gone
    chrono = ChronoReader(reader, snap=snap, rows=100)
    (block,) = list(chrono)
    assert chrono.snap.seen == SEEN + 5 and chrono.skipped == 0
    assert block.batch["actions"].tolist() == list(range(19, 29))

    fill(writer, SEEN + 6, SEEN + 8)
    chrono = ChronoReader(reader, snap=chrono.snap, rows=100, restarts=0)
    (block,) = list(chrono)
    assert chrono.skipped == 3  # the three oldest were dropped, the rest read
    assert block.batch["actions"].tolist() == list(range(22, 29))
    assert block.positions.tolist() == list(range(3, 10))


def test_chrono_reader_skips_rows_overtaken_after_yielding(live):
    writer, reader = live
    chrono = ChronoReader(reader, rows=2)
    blocks = iter(chrono)
    assert next(blocks).batch["actions"].tolist() == [14, 15]
    fill(writer, SEEN + 1, SEEN + 5)  # transitions 14..18 overwritten: 16, 17, 18 were unread
    rest = list(blocks)
    assert chrono.skipped == 3
    ts = np.concatenate([b.transitions for b in rest]).tolist()
    assert ts == list(range(19, 24))  # the snapshot's positions, never a newer row mixed in
    for b in rest:
        assert b.batch["actions"].tolist() == b.transitions.tolist()


def test_chrono_reader_strict_raises_once_rows_were_yielded(live):
    writer, reader = live
    blocks = iter(ChronoReader(reader, rows=2, strict=True))
    assert next(blocks).batch["actions"].tolist() == [14, 15]
    fill(writer, SEEN + 1, SEEN + MAX_SIZE)
    with pytest.raises(OvertakenError, match="overwrote transition 16") as info:
        next(blocks)
    assert isinstance(info.value, TornReadError) and isinstance(info.value, DiskReplayError)
    with pytest.raises(InvalidArgumentError, match="start must be an integer"):
        ChronoReader(reader, 1.5)


# ---------------------------------------------------------------- rows, batches, info
def test_read_rows(wrapped):
    with DiskReplay.open(wrapped, mode="r") as buf:
        slots, batch = read_rows(buf, head=3)
        assert slots.tolist() == [3, 4, 5] and batch["actions"].tolist() == [14, 15, 16]
        slots, batch = read_rows(buf, tail=2)
        assert slots.tolist() == [1, 2] and batch["actions"].tolist() == [22, 23]
        slots, batch = read_rows(buf, index=[0, 9])
        assert slots.tolist() == [0, 9] and batch["actions"].tolist() == [21, 20]
        assert len(read_rows(buf, tail=100)[0]) == MAX_SIZE
        slots, batch = read_rows(buf, head=0)
        assert slots.tolist() == [] and batch["states"].shape == (0, 2)
        for kwargs in ({}, {"head": 1, "tail": 1}):
            with pytest.raises(InvalidArgumentError):
                read_rows(buf, **kwargs)


def test_stores_without_transitions(tmp_path):
    with DiskReplay.create(tmp_path / "u.replay", 4, seed=0) as buf:
        for call in (lambda: read_rows(buf, tail=1), lambda: batch_keys(buf), lambda: sample_batch(buf, seed=0),
                     lambda: ChronoReader(buf)):
            with pytest.raises(EmptyStoreError, match="holds no transitions yet"):
                call()
    with DiskReplay.create(tmp_path / "e.replay", 4, seed=0, fields=FIELDS) as buf:
        slots, batch = read_rows(buf, tail=5)
        assert len(slots) == 0 and sorted(batch) == sorted(batch_keys(buf))
        assert list(ChronoReader(buf)) == []
        for seed in (None, 0):
            with pytest.raises(EmptyStoreError, match="the store is empty"):
                sample_batch(buf, 2, seed=seed)


def test_sample_batch(wrapped):
    with DiskReplay.open(wrapped, mode="r") as buf:
        slots, batch = sample_batch(buf, 6, seed=3)
        assert slots.tolist() == np.random.default_rng(3).integers(0, MAX_SIZE, 6).tolist()
        assert batch["actions"].tolist() == [SEEN - (SEEN - 1 - s) % MAX_SIZE for s in slots.tolist()]
        assert sample_batch(buf, 6, seed=3)[0].tolist() == slots.tolist()
        assert len(sample_batch(buf, seed=1)[0]) == buf.batch_size
    with DiskReplay.open(wrapped, mode="r") as a, DiskReplay.open(wrapped, mode="r") as b:
        want = a.sample(5)
        slots, batch = sample_batch(b, 5)  # the store's own next batch
        assert slots.tolist() == a.batch_idxs.tolist() and batch["rewards"].tolist() == want["rewards"].tolist()


def test_store_info(wrapped, backend):
    with DiskReplay.open(wrapped, mode="r") as buf:
        info = store_info(buf)
    assert info["path"] == os.path.abspath(wrapped) and info["backend"] == backend
    assert (info["max_size"], info["size"], info["seen_size"], info["head"], info["num_envs"]) == (10, 10, 23, 2, 1)
    assert info["fields"]["states"] == {"shape": [2], "dtype": "float32"}
    assert info["disk_bytes"] > 0 and info["writer_alive"] is False and info["last_flush"].endswith("Z")


def test_batch_keys_and_block_rows(tmp_path):
    fields = dict(FIELDS, log_probs=((3,), "float64"))
    with DiskReplay.create(tmp_path / "x.replay", 4, seed=0, fields=fields) as buf:
        assert batch_keys(buf) == ["states", "actions", "rewards", "next_states", "dones", "log_probs"]
        row = 8 + 8 + 4 + 1 + 24 + 8  # the fields, and next_states like states
        assert block_rows(buf) == BLOCK_BYTES // row
        assert block_rows(buf, 8) == BLOCK_BYTES // (row * 8)


# ---------------------------------------------------------------- the public API only
@pytest.mark.parametrize("name", ["views", "stats", "export", "export.d4rl", "export.minari"])
def test_library_views_read_no_private_attributes(name):
    path = importlib.import_module(f"diskreplay.{name}").__file__
    with open(path) as f:
        tree = ast.parse(f.read())
    private = {node.attr for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")}
    assert not private, f"{path} reads {sorted(private)}"


def test_get_fields_reads_only_the_keys_named(tmp_path, backend):
    """``get(idxs, fields=...)``, chronological runs of slots and random ones: the same rows
    as a full ``get``; next states only when named."""
    from diskreplay.backends.gather import RUN_ROWS, slot_runs

    fields = {"states": ((2, 3), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool"), "truncateds": ((), "bool")}
    rng = np.random.default_rng(0)
    path = tmp_path / "g.replay"
    with DiskReplay.create(path, 500, num_envs=4, backend=backend, fields=fields) as buf:
        for _ in range(160):  # 640 transitions: the ring wrapped, head in the middle
            s = rng.normal(size=(4, 2, 3)).astype(np.float32)
            buf.add(s, rng.integers(0, 9, 4), rng.normal(size=4).astype(np.float32), s + 1, rng.random(4) < 0.1,
                    truncateds=rng.random(4) < 0.1)
        head = buf.head
    chrono = (head + 1 + np.arange(500)) % 500  # oldest first: two runs
    assert slot_runs(chrono) == [(0, head + 1, 499 - head), (499 - head, 0, head + 1)]
    assert slot_runs(rng.permutation(500)) is None and slot_runs(np.arange(RUN_ROWS - 1)) is None
    with DiskReplay.open(path, mode="r") as buf:
        for idxs in (chrono, chrono[:300], rng.permutation(500)[:100], np.arange(0, 0)):
            full = buf.get(idxs)
            some = buf.get(idxs, fields=["rewards", "states"])
            assert list(some) == ["rewards", "states"]
            for key in some:
                np.testing.assert_array_equal(some[key], full[key])
            with_ns = buf.get(idxs, fields=("next_states", "truncateds"))
            np.testing.assert_array_equal(with_ns["next_states"], full["next_states"])
            np.testing.assert_array_equal(with_ns["truncateds"], full["truncateds"])
            if len(idxs) == 500:  # the plain get read by runs too, in the usual key order
                assert list(full) == ["states", "actions", "rewards", "next_states", "dones", "truncateds"]
                np.testing.assert_array_equal(full["states"], buf.get(idxs[::-1])["states"][::-1])
                np.testing.assert_array_equal(full["next_states"], buf.get(idxs[::-1])["next_states"][::-1])
        for bad in (["nope"], [], [3], "nope"):
            with pytest.raises(InvalidArgumentError, match="fields must name"):
                buf.get([0], fields=bad)
        with pytest.raises(InvalidArgumentError, match="n_step"):
            buf.get([0], fields=["rewards"], n_step=2)
