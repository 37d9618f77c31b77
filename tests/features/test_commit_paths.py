"""The fast paths' equivalence machine, one for every store kind: the commit protocol has one
definition (``counters.begin_step`` / ``commit_step``, used by ``Writer._write_step``) and the
fast adds (``fastadd.py``, its table of paths) write it inline. This state machine performs
the same steps through the fast add bound for a store and through the general add on a twin
store, and requires the two to be byte-identical after every step: every field's rows, the
``ns_buffer``, the row CRCs, every file the store's parts keep (the jump ring, the stack
ring and its tail, ``priorities.bin``: ``diskreplay.testing.side_files``), the counter
record (less the per-writer key, pid and boot words) and everything a reader is served.

Kinds: ``plain``, ``extras`` (extra fields, now and then one the general path converts),
``stacks`` (``frame_stack=3``: continuing stacks take the fast stacked add, a base or a
state that does not overlap the general one) and ``priorities`` (a prioritized store, with
priority updates between steps). Steps chain (each step's states are the previous step's
next states) except at random autoreset jumps, so both every fast path and its fall-back
are taken. A vector store's fast add is bound with the C kernel of ``_rows`` or without it
(its Python body)."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from diskreplay import DiskReplay, DiskReplayError

from diskreplay import native
from diskreplay.backends import BACKENDS
from diskreplay.format.counters import NWORDS, W_BOOT, W_CHECK, W_FLUSH_NS, W_KEY, W_PID
from diskreplay.testing import counter_words, raw_rows, side_files
from stack_envs import Envs

PER_WRITER_WORDS = {W_KEY, W_CHECK, W_PID, W_BOOT, W_FLUSH_NS}
FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool")}
EXTRAS = {"truncateds": ((), "bool"), "log_probs": ((), "float32"), "hidden": ((2,), "float16")}


def extra_values(rng: np.random.Generator, num_envs: int) -> dict:
    """Extra fields in the kinds the fast adds take (one env: Python scalars and exact
    arrays; a vector env: exact arrays), now and then one the general path must convert."""
    if num_envs == 1:
        out = {"truncateds": bool(rng.integers(2)), "log_probs": float(rng.standard_normal()),
               "hidden": rng.standard_normal(2).astype(np.float16)}
    else:
        out = {"truncateds": rng.integers(0, 2, num_envs).astype(bool),
               "log_probs": rng.standard_normal(num_envs).astype(np.float32),
               "hidden": rng.standard_normal((num_envs, 2)).astype(np.float16)}
    if rng.random() < 0.2:
        out["hidden"] = np.asarray(out["hidden"], np.float64)  # converted by the general path
    return out


def step(rng: np.random.Generator, num_envs: int, obs: np.ndarray):
    """Exact-dtype inputs, the kind the fast adds take, starting from ``obs``."""
    next_obs = rng.standard_normal((num_envs, 3)).astype(np.float32)
    if num_envs == 1:
        return (obs[0], int(rng.integers(-5, 5)), float(rng.standard_normal()), next_obs[0],
                bool(rng.integers(2)))
    return (obs, rng.integers(-5, 5, num_envs), rng.standard_normal(num_envs).astype(np.float32), next_obs,
            rng.integers(0, 2, num_envs).astype(bool))


KINDS = ("plain", "extras", "stacks", "priorities")
STACK_FIELDS = {"states": ((3, 2), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
                "dones": ((), "bool")}


class CommitPaths(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = None

    @initialize(kind=st.sampled_from(KINDS), backend=st.sampled_from(list(BACKENDS)),
                num_envs=st.sampled_from([1, 2, 3]), max_size=st.sampled_from([7, 12]),
                flush_every=st.sampled_from([None, 2]), seed=st.integers(0, 2**16), kernel=st.booleans())
    def setup(self, kind, backend, num_envs, max_size, flush_every, seed, kernel):
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.rng = np.random.default_rng(seed)
        self.kind, self.num_envs = kind, num_envs
        kwargs = dict(num_envs=num_envs, backend=backend, seed=seed, flush_every=flush_every,
                      fields={**FIELDS, **EXTRAS} if kind == "extras" else FIELDS)
        if kind == "stacks":
            kwargs.update(fields=STACK_FIELDS, frame_stack=3)
            self.envs = Envs(num_envs, 3, (2,), np.random.default_rng(seed))
        if kind == "priorities":
            kwargs.update(prioritized=True)
        self.paths = [os.path.join(self.tmp.name, name) for name in ("fast.replay", "general.replay")]
        # the kernel is looked up when the fast add is bound; without it (or not built) its Python body
        with contextlib.nullcontext() if kernel else native.turned_off("rows"):
            self.fast, self.general = [DiskReplay.create(p, max_size, **kwargs) for p in self.paths]
        assert "add" in self.fast.__dict__, "the fast add is installed"
        self.obs = self.rng.standard_normal((num_envs, 3)).astype(np.float32)

    @rule(jump_rate=st.sampled_from([0.0, 0.3, 1.0]))
    def add(self, jump_rate):
        if self.kind == "stacks":
            values, extra = self.envs.step(0.3 * jump_rate, 0.2 * jump_rate), {}
        else:
            values = step(self.rng, self.num_envs, self.obs)
            extra = extra_values(self.rng, self.num_envs) if self.kind == "extras" else {}
            next_obs = np.asarray(values[3]).reshape(self.num_envs, 3)
            jumps = self.rng.random(self.num_envs) < jump_rate
            self.obs = np.where(jumps[:, None], self.rng.standard_normal((self.num_envs, 3)).astype(np.float32),
                                next_obs)
        self.fast.add(*values, **extra)
        DiskReplay.add(self.general, *values, **extra)  # the class's method: the general path

    @rule(count=st.integers(1, 4))
    def update_priorities(self, count):
        if self.kind != "priorities" or self.fast.size == 0:
            return
        idxs = self.rng.integers(0, self.fast.size, count)
        raw = self.rng.random(count) * 5
        for buf in (self.fast, self.general):
            buf.update_priorities(idxs, raw)

    @rule()
    def flush(self):
        self.fast.flush()
        self.general.flush()

    @invariant()
    def identical(self):
        if self.tmp is None:
            return
        a, b = counter_words(self.fast), counter_words(self.general)
        for w in range(NWORDS):
            if w not in PER_WRITER_WORDS:
                assert a[w] == b[w], f"counter word {w}: fast {a[w]}, general {b[w]}"
        assert a[W_CHECK] ^ a[W_KEY] == b[W_CHECK] ^ b[W_KEY]
        for fast, general in ((raw_rows(self.fast), raw_rows(self.general)),
                              (side_files(self.fast), side_files(self.general))):
            assert fast.keys() == general.keys()
            for name in fast:
                assert np.asarray(fast[name]).tobytes() == np.asarray(general[name]).tobytes(), name
        idxs = np.arange(self.fast.size)
        x, y = self.fast.get(idxs), self.general.get(idxs)
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)

    def teardown(self):
        if self.tmp is not None:
            self.fast.close()
            self.general.close()
            self.tmp.cleanup()


TestCommitPaths = CommitPaths.TestCase
TestCommitPaths.settings = settings(max_examples=100, stateful_step_count=30, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


def test_extra_fields_keep_adds_on_the_fast_path(tmp_path):
    """Issue 19 item 4: declaring extra fields no longer sends every add to the general
    path; only a step the fast rules do not accept (here: a missing extra) goes there."""
    for num_envs in (1, 3):
        buf = DiskReplay.create(tmp_path / f"x{num_envs}.replay", 64, num_envs=num_envs,  # no wrap, no flush due
                                fields={**FIELDS, **EXTRAS})
        general_steps = []
        write_step = buf._session._write_step
        buf._session._write_step = lambda values: (general_steps.append(1), write_step(values))
        rng = np.random.default_rng(0)
        obs = rng.standard_normal((num_envs, 3)).astype(np.float32)
        for i in range(20):
            values = step(rng, num_envs, obs)
            extra = extra_values(rng, num_envs)
            extra["hidden"] = extra["hidden"].astype(np.float16)
            buf.add(*values, **extra)
            obs = np.asarray(values[3]).reshape(num_envs, 3)
            if i == 0:
                general_steps.clear()  # the first step has no previous next states to chain from
        assert general_steps == []
        extra.pop("log_probs")
        with pytest.raises(DiskReplayError, match="log_probs"):
            buf.add(*step(rng, num_envs, obs), **extra)
        got = buf.get(np.arange(20 * num_envs))
        assert got["truncateds"].dtype == bool and got["hidden"].shape == (20 * num_envs, 2)
        buf.close()


def test_fastadd_docstring_tables_every_fast_path():
    """Issue 34 item 4: the fast-add module's docstring has one row per fast path (a merge
    once dropped the table; this catches it and a new path left out of it)."""
    import inspect
    import re
    from diskreplay.session import fastadd
    paths = [name for name, fn in inspect.getmembers(fastadd, inspect.isfunction)
             if name.startswith("fast_") and fn.__module__ == fastadd.__name__]
    assert paths, "no fast paths found"
    rows = re.findall(r"^``(\w+)``", fastadd.__doc__, re.M)
    assert sorted(paths) == sorted(row for row in rows if row.startswith("fast_"))
    assert "``_rows.step`` (C)" in fastadd.__doc__
