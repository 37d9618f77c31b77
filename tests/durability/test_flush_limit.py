"""The writer's flush limit (issue 19 item 4): no add ever leaves more than ``reserve_rows``
transitions after the newest checkpoint, before the ring's first wrap as after it, so no
flush has more than one reserve of rows to sum and sync. Asserted on the writer's state
(its checkpoint and counters), never on timing."""
from __future__ import annotations

import numpy as np
import pytest

from diskreplay import DiskReplay

# Rows of 768 KiB (and 13 bytes) give a reserve of 63 rows (48 MiB, the most that the 200 steps
# of the default reserve take): a ring of 200 slots fills three reserves before its first wrap.
FIELDS = {"states": ((3 << 18,), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
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
        state = np.zeros((num_envs, 3 << 18) if num_envs > 1 else (3 << 18,), np.uint8)
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
        state = [0] * (3 << 18)  # a list: converted by the general add
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
            state = rng.integers(0, 255, 3 << 18, dtype=np.uint8)
            buf.add(state, i, float(i), state, False)
            c = session.checkpoint
            if c.generation not in counts:
                counts[c.generation] = c.reserve_count
                assert ckfile.read_header(c.slot) == c, f"generation {c.generation}"  # the body read back
        reserve = session.reserve_rows
        assert 0 in counts.values() and reserve in counts.values()
        if max_size == 100:  # reserve 63: the flush at seen 63 copies 26 rows (101..126) of 63
            assert any(0 < n < reserve for n in counts.values())
