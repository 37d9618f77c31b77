"""The writer's flush limit (issue 19 item 4): no add ever leaves more than ``reserve_rows``
transitions after the newest checkpoint, before the ring's first wrap as after it, so no
flush has more than one reserve of rows to sum and sync. Asserted on the writer's state
(its checkpoint and counters), never on timing."""
from __future__ import annotations

import numpy as np
import pytest

from diskreplay import DiskReplay, ring

# Rows of 256 KiB (and 13 bytes) give a reserve of 63 rows (16 MiB): a ring of 200 slots fills three
# reserves before its first wrap.
FIELDS = {"states": ((1 << 18,), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool")}


def _unflushed(buf) -> int:
    session = buf._session
    return session.seen - session.checkpoint.seen


@pytest.mark.parametrize("num_envs", [1, 4])
def test_unflushed_rows_never_exceed_the_reserve(tmp_path, backend, num_envs):
    max_size = 200
    with DiskReplay.create(tmp_path / "s", max_size, num_envs=num_envs, backend=backend, fields=FIELDS) as buf:
        session = buf._session
        reserve = session.reserve_rows
        assert reserve == 63
        state = np.zeros((num_envs, 1 << 18) if num_envs > 1 else (1 << 18,), np.uint8)
        if num_envs > 1:
            args = (np.zeros(num_envs, np.int64), np.zeros(num_envs, np.float32), state, np.zeros(num_envs, bool))
        else:
            args = (0, 0.0, state, False)
        generations, most = [], 0
        while buf.seen_size < 3 * max_size:  # the fast adds: the states chain, no jump
            buf.add(state, *args)
            most = max(most, _unflushed(buf))
            assert _unflushed(buf) <= reserve
            generations.append(session.checkpoint.generation)
            if buf.seen_size == max_size:
                # Before the first wrap nothing was overwritten, yet flushes came every reserve.
                assert session.checkpoint.generation >= 1 + max_size // reserve
                assert session.checkpoint.seen >= max_size - reserve
        assert most > reserve - num_envs  # the limit is used up to the reserve, not below it
        assert generations == sorted(generations) and generations[-1] >= 1 + 3 * max_size // reserve - 1


def test_the_general_add_keeps_the_limit_too(tmp_path, backend):
    """Adds the fast path refuses (lists to convert) go through the general path, which
    applies the same limit."""
    with DiskReplay.create(tmp_path / "s", 150, backend=backend, fields=FIELDS) as buf:
        session = buf._session
        state = [0] * (1 << 18)  # a list: converted by the general add
        for _ in range(130):
            buf.add(state, 0, 0.0, state, False)
            assert _unflushed(buf) <= session.reserve_rows
        assert session.checkpoint.seen >= 130 - session.reserve_rows and buf.seen_size == 130


@pytest.mark.parametrize("max_size", [40, 100])
def test_the_checkpoint_crc_computed_as_written_matches_the_file(tmp_path, backend, max_size):
    """``CheckpointFile.write`` computes the body's CRC from the bytes it writes (reading back
    only the unused reserve rows) and the flush no longer reads the body back: the CRC in
    each header must equal one computed from the file, with a reserve wholly unused (before
    the wrap), partly used (the wrap inside it) and full (after the wrap)."""
    rng = np.random.default_rng(3)
    with DiskReplay.create(tmp_path / "s", max_size, backend=backend, fields=FIELDS) as buf:
        session = buf._session
        ckfile = session.data.ckfile
        counts = {}
        for i in range(3 * max_size):
            state = rng.integers(0, 255, 1 << 18, dtype=np.uint8)
            buf.add(state, i, float(i), state, False)
            c = session.checkpoint
            if c.generation not in counts:
                counts[c.generation] = c.reserve_count
                assert ckfile.read_header(c.slot) == c, f"generation {c.generation}"  # the body read back
        reserve = session.reserve_rows
        assert 0 in counts.values() and reserve in counts.values()
        if max_size == 100:  # reserve 63: the flush at seen 63 copies 26 rows (101..126) of 63
            assert any(0 < n < reserve for n in counts.values())


@pytest.mark.parametrize("num_envs", [1, 4])
def test_background_checkpoints_always_leave_the_next_step_covered(tmp_path, backend, num_envs):
    """Half-way to the limit the next checkpoint is written on a thread while adds go on.
    Whenever the next step may start without a flush first, the newest valid checkpoint in
    the file (what recovery after a kill or a power cut would take, whichever of the two it
    is at that moment) must hold an undo copy, equal to the row in the ring now, of every
    row that step overwrites; and the adds must really go on while a checkpoint is being
    written."""

    fields = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    max_size, n = 40, num_envs
    rng = np.random.default_rng(5)
    with DiskReplay.create(tmp_path / "s", max_size, num_envs=n, backend=backend, fields=fields) as buf:
        session = buf._session
        ckfile, arrays = session.data.ckfile, session.storage.arrays
        assert session.reserve_rows == max_size  # capped: a half-reserve of 20 rows
        overlapped = checked = 0
        obs = rng.standard_normal((n, 3)).astype(np.float32)
        for _ in range(6 * max_size // n):
            nxt = rng.standard_normal((n, 3)).astype(np.float32)
            if n == 1:
                buf.add(obs[0], 1, 0.5, nxt[0], False)
            else:
                buf.add(obs, np.ones(n, np.int64), np.full(n, 0.5, np.float32), nxt, np.zeros(n, bool))
            obs = nxt
            job = session.background
            if job is not None and job.snap.seen < session.seen:
                overlapped += 1
            seen, base = session.seen, session.base
            c = ckfile.newest()
            assert c is not None and c.seen <= seen and seen - c.seen <= session.reserve_rows
            if seen + n > session.flush_before:
                continue  # the next add waits for the checkpoint being written, or flushes, first
            for t in range(seen + 1, seen + n + 1):
                if t - base <= max_size:
                    continue  # the slot is empty: nothing to undo
                assert c.reserve_first <= t < c.reserve_first + c.reserve_count, (t, c)
                slot = ring.slot_of(t, base, max_size)
                for name, arr in arrays.items():
                    kept = ckfile.read_reserve_rows(c.slot, name, np.array([t - c.reserve_first]))
                    assert kept.tobytes() == arr[slot:slot + 1].tobytes(), (name, t, c)
                checked += 1
        assert overlapped >= 5 and checked > max_size
        buf.flush()
        assert session.background is None and session.checkpoint.seen == session.seen


def test_a_background_checkpoint_keeps_the_rows_adds_overwrote_meanwhile(tmp_path, backend):
    """The thread is held back until the adds have overwritten every slot they may before
    it lands (up to the previous checkpoint's limit). The checkpoint it then writes must
    hold those rows as they were at its snapshot (copied from the previous checkpoint's
    reserve, not from the ring), and the rows after that limit from the ring."""
    import threading

    fields = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    max_size = 40
    rng = np.random.default_rng(9)
    with DiskReplay.create(tmp_path / "s", max_size, backend=backend, fields=fields) as buf:
        session = buf._session
        ckfile, arrays = session.data.ckfile, session.storage.arrays
        gate = threading.Event()
        real = session._write_snapshot

        def gated(snap, previous, copied_upto):
            if previous is not None:  # the background one
                assert gate.wait(30)
            return real(snap, previous, copied_upto)

        obs = rng.standard_normal(3).astype(np.float32)

        def add():
            nonlocal obs
            nxt = rng.standard_normal(3).astype(np.float32)
            buf.add(obs, 1, 0.5, nxt, False)
            obs = nxt

        while session.seen < 2 * max_size:  # wrapped: every slot holds a row to keep
            add()
        buf.flush()  # no background checkpoint pending from here
        session._write_snapshot = gated
        while session.background is None:
            add()
        job = session.background
        before, limit, s1 = job.previous, job.copied_upto, job.snap.seen
        assert session.seen == s1 + 1 and limit > s1 + 1
        expected = {}  # transition -> its slot's rows as they were at the snapshot
        for t in range(s1 + 1, s1 + session.reserve_rows + 1):
            slot = ring.slot_of(t, session.base, max_size)
            if t <= limit:
                k = np.array([t - before.reserve_first])
                expected[t] = [ckfile.read_reserve_rows(before.slot, name, k).tobytes() for name in arrays]
            else:
                expected[t] = [arr[slot:slot + 1].tobytes() for arr in arrays.values()]
        while session.seen + 1 <= session.flush_before:  # overwrite all the slots up to the limit
            add()
        assert session.seen == limit and not job.done.is_set()
        gate.set()
        add()  # past the limit: waits for the background checkpoint, takes it over, goes on
        c = session.checkpoint
        assert session.background is None and job.done.is_set() and c.seen == s1
        assert c == ckfile.read_header(c.slot)  # valid as read back whole
        assert c.reserve_count == session.reserve_rows
        for t, rows in expected.items():
            k = np.array([t - c.reserve_first])
            assert [ckfile.read_reserve_rows(c.slot, name, k).tobytes() for name in arrays] == rows, t
