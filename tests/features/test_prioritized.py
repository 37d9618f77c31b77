"""Prioritized stores (issue 16): sampling by priority, weights, updates, bad input,
readers, reopen, and a state machine against a plain numpy model; every backend."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import diskreplay.parts.priorities.tree
from diskreplay import DiskReplay, native
from diskreplay.backends import BACKENDS
from diskreplay.errors import (DiskReplayError, IndexOutOfRangeError, InvalidArgumentError, InvalidPriorityError,
                               NotPrioritizedError, ReadOnlyError)
from diskreplay.parts.priorities.tree import SumTree
from diskreplay.testing import ring_state
from fields import cartpole_fields, step_values
from prio_model import PriorityModel


def make(path, backend, max_size=40, num_envs=1, **kw):
    kw.setdefault("seed", 5)
    return DiskReplay.create(path, max_size, num_envs=num_envs, backend=backend, fields=cartpole_fields(),
                             prioritized=True, **kw)


def fill(buf, transitions, start=1):
    n = buf.num_envs
    for t in range(start, start + transitions, n):
        buf.add(*step_values(t, n))
    return start + transitions


def chi_square(observed, expected):
    return float(((observed - expected) ** 2 / expected).sum())


def bound(df):
    """A chi-square with df degrees of freedom exceeds df + 8 sqrt(2 df) with probability < 1e-6."""
    return df + 8 * np.sqrt(2 * df)


def draw_counts(buf, batches, batch=250):
    counts = np.zeros(buf.size)
    for _ in range(batches):
        buf.sample(batch)
        counts += np.bincount(buf.batch_idxs, minlength=buf.size)
    return counts


def all_priorities(buf):
    return buf.get(np.arange(buf.size))["priorities"]


# ---------------------------------------------------------------- the sum tree alone
@pytest.mark.parametrize("capacity,fanout", [(1, 4), (5, 4), (17, 4), (64, 4), (300, 8), (1000, 128)])
def test_sumtree_finds_the_prefix_slot_and_rebuilds_bit_for_bit(capacity, fanout):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity, fanout)
    values = rng.random(capacity) ** 3
    values[rng.random(capacity) < 0.2] = 0.0
    values[0] = 0.5
    order = rng.permutation(capacity)
    for chunk in np.array_split(order, 7):
        chunk = np.sort(chunk)
        tree.update(chunk, values[chunk])
    assert tree.problems() == []
    fresh = SumTree(capacity, fanout)
    fresh.leaves[:capacity] = values
    fresh.rebuild()
    for a, b in zip(tree.sums, fresh.sums):
        np.testing.assert_array_equal(a, b)
    assert tree.total == fresh.total and abs(tree.total - values.sum()) < 1e-9
    assert tree.min_positive == values[values > 0].min()
    masses = rng.random(5000) * tree.total
    found = tree.find(masses)
    cs = np.cumsum(values)
    want = np.searchsorted(cs, masses, side="right")
    near = np.abs(masses[:, None] - cs[None, :]).min(axis=1) < 1e-9 * tree.total
    assert np.all((found == want) | near)
    assert np.all(values[found] > 0)  # a zero leaf is never found
    tree.update_range(0, capacity, 0.25)
    assert tree.problems() == [] and abs(tree.total - 0.25 * capacity) < 1e-9


def test_sumtree_problems_see_a_wrong_node():
    tree = SumTree(100, 4)
    tree.update_range(0, 100, 1.0)
    tree.sums[1][3] += 1e-9
    assert tree.problems() and "level 1" in tree.problems()[0]


# ---------------------------------------------------------------- distribution
@pytest.mark.parametrize("num_envs", [1, 4])
def test_draws_follow_the_priorities_after_wrap_and_updates(tmp_path, backend, num_envs):
    with make(tmp_path / "s", backend, max_size=60, num_envs=num_envs, seed=3) as buf:
        t = fill(buf, 100)  # wrapped: slots hold transitions 41..100
        assert buf.size == 60
        rng = np.random.default_rng(0)
        buf.update_priorities(np.arange(60), rng.random(60) * 5)
        t = fill(buf, 8, start=t)  # eight new ones at max_p
        buf.update_priorities(rng.integers(0, 60, 20), rng.random(20) * 5)
        for phase in range(2):
            p = all_priorities(buf)
            counts = draw_counts(buf, 400)
            expected = counts.sum() * p / p.sum()
            assert chi_square(counts, expected) < bound(59), phase
            # teeth: the same counts are far from uniform draws
            assert chi_square(counts, np.full(60, counts.sum() / 60)) > 10 * bound(59)
            buf.update_priorities(np.arange(0, 60, 3), np.zeros(20))  # tiny p = epsilon ** alpha
            t = fill(buf, 4, start=t)


def test_weights_are_the_formula_from_the_stored_priorities(tmp_path, backend):
    for use_cer in (False, True):
        with make(tmp_path / f"s{use_cer}", backend, max_size=30, use_cer=use_cer, alpha=0.7, epsilon=0.01) as buf:
            fill(buf, 45)
            buf.update_priorities(np.arange(30), np.linspace(0, 9, 30))
            fill(buf, 2, start=46)
            for beta in (0.0, 0.4, 1.0):
                batch = buf.sample(64, beta=beta)
                idxs = buf.batch_idxs
                p = all_priorities(buf)
                probs = p / p.sum()
                want = (buf.size * probs[idxs]) ** -beta / (buf.size * probs.min()) ** -beta
                assert batch["weights"].dtype == np.float32
                np.testing.assert_allclose(batch["weights"], want, rtol=1e-6)
                np.testing.assert_array_equal(buf.get(idxs)["priorities"], p[idxs])
                if use_cer:
                    assert idxs[-1] == buf.head


def test_priorities_are_stored_with_alpha_and_epsilon_and_new_rows_get_max_p(tmp_path, backend):
    with make(tmp_path / "s", backend, max_size=10, alpha=0.5, epsilon=0.25) as buf:
        fill(buf, 3)
        np.testing.assert_array_equal(all_priorities(buf), [1.0, 1.0, 1.0])  # 1.0 in an empty store
        buf.update_priorities([0, 1, 1, 2], [8.75, 3.75, 0.75, 0.0])  # duplicates: the last wins
        np.testing.assert_allclose(all_priorities(buf), [3.0, 1.0, 0.5])
        fill(buf, 2, start=4)
        np.testing.assert_allclose(all_priorities(buf), [3.0, 1.0, 0.5, 3.0, 3.0])
        buf.update_priorities([0, 3, 4], [0.0, 0.0, 0.0])
        fill(buf, 1, start=6)  # the largest p held so far is still 3.0
        assert all_priorities(buf)[5] == 3.0
        buf.reset()
        fill(buf, 2, start=7)
        np.testing.assert_array_equal(all_priorities(buf), [1.0, 1.0])


def test_nstep_sampling_on_a_prioritized_store(tmp_path, backend):
    with make(tmp_path / "s", backend, max_size=30, num_envs=2) as buf:
        fill(buf, 40)
        buf.update_priorities(np.arange(30), np.arange(30) % 5)
        batch = buf.sample(20, n_step=3, gamma=0.5, beta=0.6)
        assert set(batch) >= {"weights", "discounts", "rewards", "next_states"}
        want = buf.get(buf.batch_idxs, n_step=3, gamma=0.5)
        np.testing.assert_array_equal(batch["rewards"], want["rewards"])
        np.testing.assert_array_equal(batch["discounts"], want["discounts"])
        np.testing.assert_array_equal(buf.get(buf.batch_idxs)["priorities"], want["priorities"])


# ---------------------------------------------------------------- bad input
def _snapshot(buf):
    path = buf.path
    files = {name: open(os.path.join(path, name), "rb").read() for name in sorted(os.listdir(path))
             if name != "lock"}
    tree = buf._session.prio.tree
    return files, [a.copy() for a in tree.sums], ring_state(buf)


BAD_UPDATES = [
    ("negative", [0, 1], [1.0, -0.5], InvalidPriorityError),
    ("nan", [0, 1], [np.nan, 1.0], InvalidPriorityError),
    ("inf", [2], [np.inf], InvalidPriorityError),
    ("strings", [2], ["a"], InvalidPriorityError),
    ("too few", [0, 1, 2], [1.0, 2.0], InvalidPriorityError),
    ("too many", [0], [1.0, 2.0], InvalidPriorityError),
    ("index at size", [0, 14], [1.0, 1.0], IndexOutOfRangeError),
    ("negative index", [-1], [1.0], IndexOutOfRangeError),
    ("float index", [0.5], [1.0], InvalidArgumentError),
]


@pytest.mark.parametrize("case", BAD_UPDATES, ids=[c[0] for c in BAD_UPDATES])
def test_bad_updates_leave_store_and_tree_exactly_as_they_were(tmp_path, backend, case):
    _, idxs, values, error = case
    with make(tmp_path / "s", backend, max_size=20) as buf:
        fill(buf, 12)
        buf.update_priorities(np.arange(12), np.arange(12.0))
        fill(buf, 2, start=13)  # pending new rows: even those stay unassigned
        buf.sample(4)
        before = _snapshot(buf)
        with pytest.raises(error) as info:
            buf.update_priorities(np.asarray(idxs), values)
        assert isinstance(info.value, DiskReplayError) and str(info.value)
        after = _snapshot(buf)
        assert before[0].keys() == after[0].keys()
        for name in before[0]:
            assert before[0][name] == after[0][name], name
        for a, b in zip(before[1], after[1]):
            np.testing.assert_array_equal(a, b)
        assert before[2] == after[2]


STORED_OUT_OF_RANGE = [  # finite raw priorities whose stored (raw + epsilon) ** alpha is not keepable
    ("inf after alpha", 2.0, 1e-6, 1e200),
    ("tree sum would overflow", 1.0, 0.0, 1e308),
    ("subnormal after alpha", 1.0, 0.0, 5e-324),
    ("subnormal from a large alpha", 50.0, 0.0, 1e-7),
]


@pytest.mark.parametrize("case", STORED_OUT_OF_RANGE, ids=[c[0] for c in STORED_OUT_OF_RANGE])
def test_priorities_that_overflow_after_alpha_are_refused_and_change_nothing(tmp_path, backend, case):
    """Issue 35 item 4: the value checked is the stored one, ``(raw + epsilon) ** alpha``."""
    _, alpha, epsilon, raw = case
    with make(tmp_path / "s", backend, max_size=20, alpha=alpha, epsilon=epsilon) as buf:
        fill(buf, 12)
        buf.update_priorities(np.arange(12), np.linspace(0.5, 2.0, 12))
        before = _snapshot(buf)
        with pytest.raises(InvalidPriorityError, match="nothing was written") as info:
            buf.update_priorities(np.array([3, 4]), [1.0, raw])
        assert repr(raw) in str(info.value)
        after = _snapshot(buf)
        assert before[0] == after[0]
        for a, b in zip(before[1], after[1]):
            np.testing.assert_array_equal(a, b)
    with DiskReplay.open(tmp_path / "s", mode="r+") as buf:
        buf.sample(8)
        assert np.isfinite(buf.get(np.arange(12))["priorities"]).all()


SPECIAL = [0.0, 5e-324, 1e-310, 2.2250738585072014e-308, 1e-200, 1e-7, 1.0, 1e100, 1e200, 1e300, 1e308,
           1.7976931348623157e308, float("inf"), float("nan"), -1.0, -0.0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(alpha=st.sampled_from([0.0, 0.5, 0.6, 1.0, 2.0, 7.5, 60.0]),
       epsilon=st.sampled_from([0.0, 1e-300, 1e-6, 0.01, 1.0]),
       updates=st.lists(st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(allow_nan=True, allow_infinity=True)),
                                 min_size=1, max_size=6), min_size=1, max_size=5))
def test_no_accepted_priority_makes_the_store_unopenable_or_sampling_degenerate(alpha, epsilon, updates):
    """Issue 35 item 4, as a property: whatever priorities, alpha and epsilon, an update is
    either refused with InvalidPriorityError (changing nothing) or stores finite values;
    afterwards sampling gives finite weights in [0, 1] and the store reopens and verifies."""
    from diskreplay.verify import verify_store
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s")
        if epsilon and alpha and epsilon ** alpha < np.finfo(np.float64).tiny:  # create refuses those
            with pytest.raises(InvalidArgumentError, match="underflows"):
                make(path, "memmap", max_size=16, alpha=alpha, epsilon=epsilon)
            return
        with make(path, "memmap", max_size=16, alpha=alpha, epsilon=epsilon) as buf:
            fill(buf, 10)
            for values in updates:
                idxs = np.arange(len(values)) % 10
                before = buf.get(np.arange(10))["priorities"]
                try:
                    buf.update_priorities(idxs, values)
                except InvalidPriorityError:
                    np.testing.assert_array_equal(buf.get(np.arange(10))["priorities"], before)
                stored = buf.get(np.arange(10))["priorities"]
                assert np.isfinite(stored).all() and (stored >= 0).all()
                batch = buf.sample(8)
                w = batch["weights"]
                assert np.isfinite(w).all() and (w >= 0).all() and (w <= 1).all()
        with DiskReplay.open(path, mode="r+") as buf:
            batch = buf.sample(8)
            assert np.isfinite(batch["weights"]).all()
        assert verify_store(path).ok


@pytest.mark.parametrize("beta", [-0.1, 1.5, float("nan"), "0.5", None, True])
def test_beta_outside_0_1_is_refused_before_the_sampler_moves(tmp_path, backend, beta):
    with make(tmp_path / "s", backend) as buf:
        fill(buf, 5)
        draws = ring_state(buf).draws
        with pytest.raises(InvalidArgumentError, match="beta"):
            buf.sample(4, beta=beta)
        assert ring_state(buf).draws == draws


def test_uniform_stores_refuse_update_priorities_and_beta(tmp_path, backend):
    with DiskReplay.create(tmp_path / "u", 10, backend=backend, seed=1) as buf:
        fill(buf, 5)
        draws = ring_state(buf).draws
        with pytest.raises(NotPrioritizedError, match="prioritized=True"):
            buf.update_priorities([0], [1.0])
        with pytest.raises(NotPrioritizedError, match="beta"):
            buf.sample(4, beta=0.4)
        assert ring_state(buf).draws == draws
        assert "weights" not in buf.sample(4) and "priorities" not in buf.get([0])
        assert not buf.prioritized and buf.alpha is None


@pytest.mark.parametrize("kwargs,match", [
    ({"alpha": -0.1}, "alpha"), ({"alpha": float("inf")}, "alpha"),
    ({"epsilon": -1.0}, "epsilon"), ({"alpha": "0.6"}, "alpha"), ({"prioritized": 1}, "prioritized"),
    ({"fields": {**cartpole_fields(), "weights": ((), "float32")}}, "reserved"),
])
def test_bad_creation_arguments(tmp_path, backend, kwargs, match):
    kwargs = {"prioritized": True, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        DiskReplay.create(tmp_path / "s", 10, backend=backend, **kwargs)
    assert not (tmp_path / "s").exists()


def test_an_inferred_field_may_not_take_a_reserved_name(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 10, backend=backend, prioritized=True) as buf:
        with pytest.raises(InvalidArgumentError, match="reserved"):
            buf.add(*step_values(1), priorities=1.0)
        assert buf.fields is None
        buf.add(*step_values(1))
        assert buf.get([0])["priorities"][0] == 1.0


# ---------------------------------------------------------------- readers and reopening
def test_reader_samples_beside_the_writer_and_never_writes(tmp_path, backend):
    with make(tmp_path / "s", backend, max_size=50) as buf:
        fill(buf, 30)
        buf.update_priorities(np.arange(30), np.arange(30.0))
        fill(buf, 5, start=31)  # pending at max_p in the writer's files
        files = {n: os.path.getmtime(os.path.join(buf.path, n)) for n in os.listdir(buf.path)}
        raw = {n: open(os.path.join(buf.path, n), "rb").read() for n in os.listdir(buf.path)}
        with DiskReplay.open(buf.path, mode="r") as ro:
            assert ro.prioritized and ro.alpha == 0.6 and ro.epsilon == 1e-6
            np.testing.assert_array_equal(all_priorities(ro), all_priorities(buf))
            batch = ro.sample(200, beta=1.0)
            p = all_priorities(buf)
            want = (p[ro.batch_idxs] / p.min()) ** -1.0
            np.testing.assert_allclose(batch["weights"], want, rtol=1e-6)
            with pytest.raises(ReadOnlyError):
                ro.update_priorities([0], [1.0])
            buf.update_priorities([3], [1000.0])  # the reader sees the writer's later updates
            fill(buf, 2, start=36)
            np.testing.assert_array_equal(all_priorities(ro), all_priorities(buf))
            assert ro.get([36])["priorities"][0] == all_priorities(buf)[3]
        for n in files:
            if n in ("meta.bin", "priorities.bin", "priorities.npy", "data.h5") or n.endswith(".npy"):
                continue  # the writer itself wrote these meanwhile
            assert open(os.path.join(buf.path, n), "rb").read() == raw[n], n


@pytest.mark.parametrize("how", ["close", "abandon"])
def test_the_sampler_stream_continues_exactly_across_reopen(tmp_path, backend, how):
    def history(buf, rounds, reopen):
        out = []
        rng = np.random.default_rng(1)
        t = 1
        for r in range(rounds):
            t = fill(buf, 7, start=t)
            out.append(buf.sample(16)["actions"].copy())
            buf.update_priorities(buf.batch_idxs, rng.random(16) * 3)
            if r % 2:
                buf.flush()
            buf = reopen(buf)
        buf.close()
        return out

    def stay(buf):
        return buf

    def reopen(buf):
        if how == "close":
            buf.close()
        else:  # as a killed writer leaves it: nothing flushed or closed, the lock gone
            buf._session.lock.release()
            buf._session.lock = None
        return DiskReplay.open(buf.path, mode="r+")

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = history(make(tmp_path / "a", backend, max_size=25, seed=8), 12, stay)
        b = history(make(tmp_path / "b", backend, max_size=25, seed=8), 12, reopen)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------- state machine
class PrioritizedMachine(RuleBasedStateMachine):
    """add / sample / update_priorities / flush / reset / reopen / kill -9 against ``PriorityModel``:
    per-slot priorities, tree totals and the sampled indices agree."""

    @initialize(num_envs=st.integers(1, 3), extra=st.integers(0, 30), backend=st.sampled_from(BACKENDS),
                alpha=st.sampled_from([0.0, 0.6, 1.0]))
    def create(self, num_envs, extra, backend, alpha):
        self.fanout = diskreplay.parts.priorities.tree.FANOUT
        diskreplay.parts.priorities.tree.FANOUT = 4  # several levels even for small stores
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "s")
        max_size = num_envs + extra
        self.buf = make(self.path, backend, max_size=max_size, num_envs=num_envs, alpha=alpha, epsilon=0.01, seed=4)
        self.model = PriorityModel(max_size, alpha, 0.01, seed=4)
        self.t = 1

    @rule(steps=st.integers(1, 5))
    def add(self, steps):
        self.t = fill(self.buf, steps * self.buf.num_envs, start=self.t)
        self.model.add(steps * self.buf.num_envs)

    @precondition(lambda self: self.model.size > 0)
    @rule(batch=st.integers(1, 20), beta=st.sampled_from([0.0, 0.5, 1.0]))
    def sample(self, batch, beta):
        got = self.buf.sample(batch, beta=beta)
        idxs, weights, masses, cs = self.model.sample(batch, beta)
        near = np.abs(masses[:, None] - cs[None, :]).min(axis=1) < 1e-9 * cs[-1]
        assert np.all((self.buf.batch_idxs == idxs) | near), (self.buf.batch_idxs, idxs)
        np.testing.assert_allclose(got["weights"], weights, rtol=1e-5)

    @precondition(lambda self: self.model.size > 0)
    @rule(data=st.data())
    def update(self, data):
        k = data.draw(st.integers(0, 12))
        idxs = data.draw(st.lists(st.integers(0, self.model.size - 1), min_size=k, max_size=k))
        raw = data.draw(st.lists(st.floats(0, 50), min_size=k, max_size=k))
        self.buf.update_priorities(np.asarray(idxs, np.int64), np.asarray(raw))
        self.model.update(idxs, raw)

    @precondition(lambda self: self.model.size > 0)
    @rule(batch=st.integers(1, 10))
    def reader_peeks(self, batch):
        """A reader beside the writer draws what the writer would draw next, by the same
        priorities, and moves nobody's sampler."""
        with DiskReplay.open(self.path, mode="r") as ro:
            np.testing.assert_allclose(all_priorities(ro), self.model.p[:self.model.size], rtol=1e-12)
            ro.sample(batch)
        draws = self.model.draws
        idxs, _, masses, cs = self.model.sample(batch)
        self.model.draws = draws
        near = np.abs(masses[:, None] - cs[None, :]).min(axis=1) < 1e-9 * cs[-1]
        assert np.all((ro.batch_idxs == idxs) | near)

    @rule()
    def flush(self):
        self.buf.flush()

    @rule()
    def reset(self):
        self.buf.reset()
        self.model.reset()

    @rule()
    def reopen(self):
        self.buf.close()
        self.buf = DiskReplay.open(self.path)

    @precondition(lambda self: self.model.size > 0)
    @rule(data=st.data())
    def killed_during_updates(self, data):
        """A child process opens the store, updates and adds, and is killed with SIGKILL
        after its calls returned; the parent reopens (recovery) and finds all of them."""
        k = data.draw(st.integers(1, 8))
        idxs = data.draw(st.lists(st.integers(0, self.model.size - 1), min_size=k, max_size=k))
        raw = data.draw(st.lists(st.floats(0, 50), min_size=k, max_size=k))
        adds = data.draw(st.integers(0, 2)) * self.buf.num_envs
        self.buf.close()
        pid = os.fork()
        if pid == 0:  # the child: no Python cleanup, no flush, no close
            try:
                child = DiskReplay.open(self.path)
                child.update_priorities(np.asarray(idxs, np.int64), np.asarray(raw))
                fill(child, adds, start=self.t)
                os.kill(os.getpid(), 9)
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, status
        self.model.update(idxs, raw)
        self.model.add(adds)
        self.t += adds
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.buf = DiskReplay.open(self.path)

    @invariant()
    def priorities_and_tree_agree(self):
        buf, model = self.buf, self.model
        assert buf.size == model.size
        prio = buf._session.prio
        if model.size:
            np.testing.assert_allclose(all_priorities(buf), model.p[:model.size], rtol=1e-12)
        if prio is not None:
            assert prio.tree.problems() == []
            assert np.all(prio.tree.leaves[model.size:] == 0)
            assert abs(prio.tree.total - model.p.sum()) <= 1e-9 * max(1.0, model.p.sum())
            assert prio.max_p == pytest.approx(model.max_p, rel=1e-12)

    def teardown(self):
        diskreplay.parts.priorities.tree.FANOUT = self.fanout
        self.buf.close()
        self.tmp.cleanup()


TestPrioritizedMachine = PrioritizedMachine.TestCase
TestPrioritizedMachine.settings = settings(max_examples=30, stateful_step_count=20, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- CLI and verify
def test_info_shows_alpha_and_epsilon_and_the_cli_samples_with_weights(tmp_path, backend):
    import json

    from click.testing import CliRunner

    from diskreplay.cli.main import main

    with make(tmp_path / "s", backend, alpha=0.5, epsilon=0.01) as buf:
        fill(buf, 20)
        runner = CliRunner()
        out = runner.invoke(main, ["info", "--json", buf.path])
        assert out.exit_code == 0, out.output
        data = json.loads(out.output)
        assert (data["prioritized"], data["alpha"], data["epsilon"]) == (True, 0.5, 0.01)
        tree = "numpy" if native.missing("sumtree") else "C"  # the install builds it; DISKREPLAY_PURE=1 not
        assert data["priority_tree"] == tree
        text = runner.invoke(main, ["info", buf.path]).output
        assert "alpha           0.5" in text and "epsilon         0.01" in text
        assert f"priority_tree   {tree}" in text
        out = runner.invoke(main, ["sample", buf.path, "-n", "3"])
        assert out.exit_code == 0 and "weights" in out.output.splitlines()[0]
    with DiskReplay.create(tmp_path / "u", 10, backend=backend) as buf:
        lines = CliRunner().invoke(main, ["info", buf.path]).output.splitlines()
        assert not [line for line in lines if line.startswith(("alpha", "prioritized", "priority_tree"))]


def test_verify_checks_the_priorities_and_their_tree(tmp_path):
    from diskreplay.verify import verify_store

    with make(tmp_path / "s", "memmap", max_size=30) as buf:
        fill(buf, 40)
        buf.update_priorities(np.arange(30), np.arange(30.0))
    report = verify_store(tmp_path / "s")
    assert report.ok and report.checked["priorities"] == 30, report.problems
    arr = np.load(tmp_path / "s" / "priorities.npy", mmap_mode="r+")
    arr[7] = np.nan
    arr.flush()
    del arr
    report = verify_store(tmp_path / "s")
    assert not report.ok and any("non-finite" in p for p in report.problems)


def test_convert_keeps_priorities_and_the_sampler_stream(tmp_path, backend):
    other = [b for b in BACKENDS if b != backend][0]
    with make(tmp_path / "s", backend, max_size=30) as buf:
        fill(buf, 40)
        buf.update_priorities(np.arange(30), np.arange(30.0))
        fill(buf, 3, start=41)  # pending at max_p
        want = all_priorities(buf)
    DiskReplay.convert(tmp_path / "s", tmp_path / "c", backend=other)
    with DiskReplay.open(tmp_path / "s") as a, DiskReplay.open(tmp_path / "c") as c:
        assert c.prioritized and (c.alpha, c.epsilon, c.backend) == (a.alpha, a.epsilon, other)
        np.testing.assert_array_equal(all_priorities(c), want)
        a.sample(16)
        c.sample(16)
        np.testing.assert_array_equal(a.batch_idxs, c.batch_idxs)
        fill(a, 1, start=44)
        fill(c, 1, start=44)
        assert all_priorities(c)[13] == all_priorities(a)[13] == max(want)


def test_an_interrupted_update_leaves_tree_and_dataset_agreeing(tmp_path, backend, monkeypatch):
    """Ctrl-C inside update_priorities: whatever reached the dataset, the tree follows it,
    and the update sequence number is even again (readers do not wait forever)."""
    with make(tmp_path / "s", backend, max_size=20) as buf:
        fill(buf, 15)
        prio = buf._session.prio

        def interrupted(tree, slots, values, copy, dirty, block):  # cut after one slot of the dataset
            dirty[slots[0] // block] = 3
            copy[slots[0]] = values[0]
            raise KeyboardInterrupt

        monkeypatch.setattr(type(prio.tree), "update_mirrored", interrupted)
        with pytest.raises(KeyboardInterrupt):
            buf.update_priorities([1, 2, 3], [5.0, 6.0, 7.0])
        monkeypatch.undo()
        assert prio.tree.problems() == [] and int(prio.words[5]) % 2 == 0
        # The tree took the cut-short slot; numpy's power on the same array, as the store computes
        # it (its SIMD pow may differ from Python's ** in the last bit, by CPU).
        assert prio.tree.leaves[1] == ((np.array([5.0, 6.0, 7.0]) + buf.epsilon) ** buf.alpha)[0]
        np.testing.assert_array_equal(prio.tree.leaves[:20], np.asarray(prio.live))
        with DiskReplay.open(buf.path, mode="r") as ro:
            np.testing.assert_array_equal(all_priorities(ro), all_priorities(buf))


# ---------------------------------------------------------------- batches, fields=, reset
def test_batches_take_beta_and_carry_the_slots_of_each_batch(tmp_path, backend):
    """``batches(beta=)`` gives what ``sample(beta=)`` gives on a twin store, each batch
    with its own ``idxs`` (``batch_idxs`` is the newest prepared one's), which
    ``update_priorities`` takes."""
    with make(tmp_path / "a", backend, seed=3) as a, make(tmp_path / "b", backend, seed=3) as b:
        for buf in (a, b):
            fill(buf, 50)
            buf.update_priorities(np.arange(40), np.arange(40.0) % 7)
        with a.batches(8, beta=0.7, count=3, prefetch=2) as it:
            got = list(it)
        assert len(got) == 3
        for batch in got:
            want = b.sample(8, beta=0.7)
            np.testing.assert_array_equal(batch["idxs"], b.batch_idxs)
            np.testing.assert_array_equal(batch["weights"], want["weights"])
            np.testing.assert_array_equal(batch["rewards"], want["rewards"])
        a.update_priorities(got[0]["idxs"], np.full(8, 3.0))
        np.testing.assert_array_equal(a.get(got[0]["idxs"])["priorities"], (np.full(8, 3.0) + a.epsilon) ** a.alpha)


def test_batches_check_every_argument_before_the_thread_starts(tmp_path, backend):
    with make(tmp_path / "p", backend) as buf:
        fill(buf, 10)
        draws = buf._session.sampler.draws
        for kwargs in ({"beta": 1.5}, {"beta": float("nan")}, {"batch_size": 0}, {"batch_size": 2.5}):
            with pytest.raises(InvalidArgumentError):
                buf.batches(**kwargs)  # raised here, not at next()
        assert buf._session.sampler.draws == draws
    with DiskReplay.create(tmp_path / "u", 20, backend=backend, fields=cartpole_fields()) as uniform:
        fill(uniform, 5)
        with pytest.raises(NotPrioritizedError):
            uniform.batches(4, beta=0.5)
        with uniform.batches(4, count=1) as it:
            assert "idxs" not in next(it)


def test_get_fields_reads_priorities_in_the_order_asked(tmp_path, backend):
    with make(tmp_path / "p", backend, max_size=20) as buf:
        fill(buf, 25)
        buf.update_priorities([0, 3], [2.0, 9.0])
        idxs = np.array([3, 0, 7])
        out = buf.get(idxs, fields=["priorities", "rewards"])
        assert list(out) == ["priorities", "rewards"]
        whole = buf.get(idxs)
        np.testing.assert_array_equal(out["priorities"], whole["priorities"])
        np.testing.assert_array_equal(out["rewards"], whole["rewards"])
        with DiskReplay.open(buf.path, mode="r") as ro:
            np.testing.assert_array_equal(ro.get(idxs, fields="priorities")["priorities"], whole["priorities"])
    with DiskReplay.create(tmp_path / "u", 20, backend=backend, fields=cartpole_fields()) as uniform:
        fill(uniform, 5)
        with pytest.raises(InvalidArgumentError, match="priorities"):
            uniform.get([0], fields=["priorities"])
