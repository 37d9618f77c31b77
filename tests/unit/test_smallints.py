"""The C kernels of ``_scan`` (``smallints`` with the extension built) against numpy (the
fallback, ``smallints`` without it): the same exact numbers for the same elements, and
the same ``compute_stats`` and ``histograms`` of a store. Each test runs on every
implementation present (``kernels.py``): the kernel's skip where it is absent (not built,
or DISKREPLAY_PURE=1), numpy always."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from diskreplay import DiskReplay, native, smallints

from diskreplay.stats import compute_stats, histograms
from kernels import IMPLS, c_kernel, implementation

DTYPES = ["uint8", "int8", "uint16", "int16", "bool"]


def test_the_kernels_are_used_where_built():
    c_kernel("scan")
    assert smallints.implementation() == "C"
    with native.turned_off("scan"):
        assert smallints.implementation() == "numpy"


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=200, deadline=None)
@given(x=st.sampled_from(DTYPES).flatmap(lambda dt: arrays(np.dtype(dt), st.integers(1, 3000))))
def test_moments_and_tallies_equal_numpys(impl, x):
    with implementation("scan", impl):
        _check_moments_and_tallies(x)


def _check_moments_and_tallies(x):
    counts = np.zeros(256 if x.itemsize == 1 else 65536, np.int64)
    expected = counts.copy()
    smallints.tally(x, counts)
    smallints.tally_numpy(x, expected)
    assert np.array_equal(counts, expected)
    assert smallints.moments(x) == smallints.moments_numpy(x)
    ints = x.astype(np.int64)  # the definition, in Python ints
    assert smallints.moments(x) == (int(ints.min()), int(ints.max()), sum(ints.tolist()),
                                    sum(v * v for v in ints.tolist()))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_extremes_over_many_chunks_stay_exact(dtype, impl):
    """Every element at the extreme that makes the narrow partial sums largest, over more
    than one of the kernel's chunks, with the extreme of the other side once at the end."""
    info = np.iinfo(dtype) if dtype != "bool" else None
    worst, other = (1, 0) if info is None else ((info.min, info.max) if info.min < 0 else (info.max, 0))
    x = np.full(100_003, worst, dtype)
    x[-1] = other
    ints = x.astype(np.int64)
    counts = np.zeros(256 if x.itemsize == 1 else 65536, np.int64)
    with implementation("scan", impl):
        assert smallints.moments(x) == smallints.moments_numpy(x) == \
            (int(ints.min()), int(ints.max()), int(ints.sum()), int((ints * ints).sum()))
        smallints.tally(x, counts)
    assert counts.sum() == x.size and counts[np.array(worst, dtype).view(f"u{x.itemsize}")] == x.size - 1


def test_the_kernels_check_their_arguments():
    _scan = c_kernel("scan")
    x = np.arange(10, dtype=np.uint8)
    with pytest.raises(ValueError, match="kind must be one of"):
        _scan.moments(x, "q")
    with pytest.raises(ValueError, match="1 to"):
        _scan.moments(x[:0], "B")
    with pytest.raises(ValueError, match="whole number of elements"):
        _scan.moments(x[:3], "H")
    with pytest.raises(ValueError, match="counts must be 256 int64 values"):
        _scan.tally(x, "B", np.zeros(255, np.int64))
    with pytest.raises(ValueError, match="counts must be 65536 int64 values"):
        _scan.tally(x, "H", np.zeros(256, np.int64))
    with pytest.raises(ValueError, match="counts must be 256 int64 values"):
        _scan.tally(x, "B", np.zeros(256, np.float64))
    with pytest.raises(BufferError):
        _scan.tally(x, "B", bytes(8 * 256))  # not writable
    with pytest.raises(ValueError, match="not C-contiguous"):
        _scan.moments(np.arange(10, dtype=np.uint8)[::2], "B")  # not contiguous


@pytest.mark.parametrize("impl", IMPLS)
def test_non_native_byte_order_goes_to_numpy(impl):
    x = np.arange(-300, 300, dtype=">i2")
    with implementation("scan", impl):
        assert smallints.moments(x) == smallints.moments_numpy(x) == (-300, 299, -300, sum(v * v for v in range(-300, 300)))


def test_stats_and_histograms_of_a_store_are_the_same_either_way(tmp_path, backend):
    fields = {"states": ((3, 5), "uint8"), "actions": ((), "int16"), "rewards": ((), "float32"),
              "dones": ((), "bool"), "flags": ((2,), "int8")}
    rng = np.random.default_rng(4)
    with DiskReplay.create(tmp_path / "s.replay", 500, num_envs=3, backend=backend, fields=fields) as buf:
        for _ in range(230):  # wraps
            s = rng.integers(0, 256, (3, 3, 5)).astype(np.uint8)
            buf.add(s, rng.integers(-300, 300, 3).astype(np.int16), rng.normal(size=3).astype(np.float32), s,
                    rng.random(3) < 0.05, flags=rng.integers(-128, 128, (3, 2)).astype(np.int8))
    results = []
    for off in ((), ("scan",)):  # as this process has it (C where built and in use), then numpy
        with native.turned_off(*off) if off else contextlib.nullcontext():
            assert smallints.implementation() == ("numpy" if off or native.scan is None else "C")
            with DiskReplay.open(tmp_path / "s.replay", mode="r") as buf:
                plain = compute_stats(buf, keep_returns=True)
                tallied = compute_stats(buf, keep_returns=True, keep_tallies=True)
                ranges = {name: (f["min"], f["max"]) for name, f in plain["fields"].items()}
                hists = histograms(buf, ranges, tallies=tallied.pop("tallies"))
        results.append((plain, tallied, {k: (c.tolist(), e.tolist()) for k, (c, e) in hists.items()}))
    assert results[0] == results[1]
    plain, tallied, _ = results[0]
    assert plain == tallied  # moments from the tally are the moments summed
