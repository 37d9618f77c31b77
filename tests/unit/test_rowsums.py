"""rowsums.batch_sums (many rows at once, in C, numpy or zlib) against the format's own
definition, zlib's CRC-32 of the transition number then each field's bytes (row_sum), on
every implementation present (``kernels.py``: the C kernel skips where it is absent)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from diskreplay.format.rowsums import VECTOR_ROW_BYTES, batch_sums, row_sum
from kernels import IMPLS, implementation


@pytest.mark.parametrize("widths", [[16, 8, 4, 1], [3], [1, 1, 1], [100, 200, 195], [VECTOR_ROW_BYTES - 8],
                                    [VECTOR_ROW_BYTES - 7], [28224, 8, 4, 1]])
@pytest.mark.parametrize("impl", IMPLS)
def test_batch_sums_are_zlibs_crc_of_each_row(widths, impl):
    rng = np.random.default_rng(len(widths) * 1000 + sum(widths))
    n = 300
    rows = [rng.integers(0, 256, (n, w), dtype=np.uint8) for w in widths]
    ts = rng.integers(-3, 10**15, n)
    with implementation("rows", impl):
        got = batch_sums(rows, ts)
    for i in range(n):
        want = zlib.crc32(b"".join([int(ts[i]).to_bytes(8, "little", signed=True)] + [r[i].tobytes() for r in rows]))
        assert int(got[i]) == want == row_sum(rows, i, int(ts[i]))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_changed_byte_changes_the_sum(impl):
    rows = [np.zeros((64, 37), np.uint8)]
    ts = np.arange(64)
    with implementation("rows", impl):
        before = batch_sums(rows, ts)
        rows[0][5, 36] = 1
        after = batch_sums(rows, ts)
    assert np.flatnonzero(before != after).tolist() == [5]
