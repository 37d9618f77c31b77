"""The C sum tree (``nativetree.BinarySumTree``) against the numpy one (``sumtree.SumTree``).

Priorities here are small integers, so every sum is exact in float64 and both trees must
agree exactly: same totals, same positive minimum, the same leaf for every mass. Tests of
the C tree skip where it is absent (not built, or DISKREPLAY_PURE=1: ``kernels.py``); the
numpy tree is checked against the plain model in each of them, and always in
``test_prioritized.py``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from diskreplay import native
from diskreplay.parts.priorities import tree as sumtree
from diskreplay.parts.priorities.native_tree import BinarySumTree
from diskreplay.parts.priorities.tree import SumTree
from kernels import c_kernel


def trees(capacity: int) -> list:
    """The trees present: the C one where its kernel is in use, and the numpy one (fanout 8)."""
    wide = SumTree(capacity, 8)
    return [wide] if native.missing("sumtree") else [BinarySumTree(capacity), wide]


def test_stores_use_the_native_tree_unless_a_test_narrows_the_numpy_one(monkeypatch):
    c_kernel("sumtree")
    assert sumtree.implementation() == "C" and isinstance(sumtree.new_tree(10), BinarySumTree)
    with native.turned_off("sumtree"):
        assert sumtree.implementation() == "numpy" and isinstance(sumtree.new_tree(10), SumTree)
    monkeypatch.setattr(sumtree, "FANOUT", 4)
    assert sumtree.implementation() == "numpy" and isinstance(sumtree.new_tree(10), SumTree)


ops = st.lists(st.tuples(st.sampled_from(["update", "range", "find"]),
                         st.lists(st.integers(0, 10**6), min_size=1, max_size=40),
                         st.lists(st.integers(0, 6), min_size=1, max_size=40)), max_size=25)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 3000), ops=ops, seed=st.integers(0, 2**32 - 1))
def test_native_and_numpy_trees_agree_exactly(capacity, ops, seed):
    rng = np.random.default_rng(seed)
    present = trees(capacity)
    model = np.zeros(capacity)
    for op, where, values in ops:
        if op == "update":
            slots = np.unique(np.asarray(where) % capacity)
            vals = np.resize(np.asarray(values, float), len(slots))
            for tree in present:
                tree.update(slots, vals)
            model[slots] = vals
        elif op == "range":
            lo = where[0] % capacity
            hi = min(capacity, lo + 1 + len(values))
            for tree in present:
                tree.update_range(lo, hi, float(values[0]))
            model[lo:hi] = values[0]
        positive = model[model > 0]
        for tree in present:
            assert tree.total == model.sum()
            assert tree.min_positive == (positive.min() if len(positive) else np.inf)
        if model.sum() > 0:
            masses = np.concatenate([rng.random(64) * model.sum(), [0.0, np.nextafter(model.sum(), 0)]])
            found = present[0].find(masses)
            for tree in present[1:]:
                assert np.array_equal(found, tree.find(masses))
            assert (model[found] > 0).all()
            assert np.array_equal(found, np.searchsorted(np.cumsum(model), masses, side="right"))
    assert all(tree.problems() == [] for tree in present)


def test_a_rebuilt_native_tree_equals_the_updated_one_bit_for_bit():
    c_kernel("sumtree")
    rng = np.random.default_rng(7)
    tree = BinarySumTree(1000)
    for _ in range(50):
        slots = rng.integers(0, 1000, 32)
        tree.update(slots, rng.random(32))  # duplicated slots: the last value wins
    fresh = BinarySumTree(1000)
    fresh.leaves[:] = tree.leaves
    fresh.rebuild()
    assert np.array_equal(tree.sums, fresh.sums) and np.array_equal(tree.mins, fresh.mins)


def test_a_damaged_native_tree_is_reported():
    c_kernel("sumtree")
    tree = BinarySumTree(100)
    tree.update(np.arange(100), np.ones(100))
    tree.sums[3] += 1.0
    assert any("sum node" in p for p in tree.problems())


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 2000), block=st.sampled_from([1, 3, 512]), seed=st.integers(0, 2**32 - 1),
       calls=st.integers(1, 6), beta=st.sampled_from([0.0, 0.4, 1.0]))
def test_mirrored_updates_and_draws_agree_between_the_trees(capacity, block, seed, calls, beta):
    """``update_mirrored`` (duplicated slots: the last value wins in the tree, the copy and
    the dirty map alike) and ``draw`` (masses, CER's last index, weights) give the same on
    the C and the numpy tree, and what a plain model says."""
    rng = np.random.default_rng(seed)
    present = trees(capacity)
    copies = [np.zeros(capacity) for _ in present]
    dirties = [np.zeros(-(-capacity // block), np.uint8) for _ in present]
    model = np.zeros(capacity)
    for _ in range(calls):
        slots = rng.integers(0, capacity, rng.integers(1, 50))
        values = rng.integers(0, 7, len(slots)).astype(float)
        for tree, copy, dirty in zip(present, copies, dirties):
            tree.update_mirrored(slots, values, copy, dirty, block)
        for s, v in zip(slots.tolist(), values.tolist()):  # in order: the last one stays
            model[s] = v
        marked = np.zeros_like(dirties[0])
        marked[np.unique(slots) // block] = 3
        for tree, copy, dirty in zip(present, copies, dirties):
            assert np.array_equal(copy, model) and np.array_equal(tree.leaves[:capacity], model)
            assert np.array_equal(dirty & marked, marked)
            assert tree.problems() == []
        if model.sum() > 0:
            uniforms = rng.random(40)
            last = int(rng.integers(-1, capacity))
            want = np.searchsorted(np.cumsum(model), uniforms * model.sum(), side="right")
            if last >= 0:
                want[-1] = last
            least = model[model > 0].min()
            drawn = [tree.draw(uniforms, last, beta) for tree in present]
            for idxs, weights in drawn:
                assert np.array_equal(idxs, want) and weights.dtype == np.float32
                with np.errstate(divide="ignore"):
                    np.testing.assert_allclose(weights, (model[want] / least) ** -beta, rtol=1e-6)
            np.testing.assert_allclose(drawn[-1][1], drawn[0][1], rtol=1e-6)


def test_a_mirrored_update_with_a_bad_slot_writes_nothing():
    c_kernel("sumtree")
    tree, copy, dirty = BinarySumTree(10), np.zeros(8), np.zeros(1, np.uint8)
    with pytest.raises(IndexError):
        tree.update_mirrored(np.array([1, 9]), np.array([2.0, 3.0]), copy, dirty, 512)  # 9: past the copy
    assert tree.total == 0 and not copy.any() and not dirty.any()
