"""n-step returns at sample time (issue 15, item 3): ``sample``/``get`` with ``n_step`` and
``gamma`` against a plain-Python computation over the in-memory model, on every backend."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from model import ReplayModel
from nstep_writer import FIELDS, WRITER, add_steps, step_args

from diskreplay import DiskReplay, InvalidArgumentError, NStepTooLargeError, RecoveryWarning, StoreClosedError
from diskreplay.core import ring
from diskreplay.backends import BACKENDS
from diskreplay.core.nstep import max_n_step
from diskreplay.testing import ring_state


def nstep_fields(reward_dtype="float32", reward_shape=(), truncation=True) -> dict:
    fields = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": (reward_shape, reward_dtype),
              "dones": ((), "bool"), "tags": ((2,), "int16")}
    if truncation:
        fields["truncateds"] = ((), "bool")
    return fields


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def install_jumps(buf, jumped: set) -> None:
    """Make the store report the transitions numbered in ``jumped`` as having a recorded
    next-state exception, besides those its jump ring holds, so that chains stop there."""
    session = buf._session
    recorded = session._jumps

    def jumps(slots, head):
        held = ring.transition_of_slots(np.asarray(slots), session.seen, session.base, session.max_size)
        return recorded(slots, head) | np.isin(held, np.fromiter(jumped, np.int64, len(jumped)))
    session._jumps = jumps


class NStepMachine(RuleBasedStateMachine):
    """Random steps with dones, truncations and jumps, wraps, resets and reopens; every
    check compares ``get(idxs, n_step=k, gamma=g)`` key by key with the model's n-step rows."""

    @initialize(backend=st.sampled_from(BACKENDS), num_envs=st.integers(1, 4), extra=st.integers(0, 9),
                reward=st.sampled_from([("float32", ()), ("float64", ()), ("int32", ()), ("float32", (2,))]),
                truncation=st.booleans())
    def create(self, backend, num_envs, extra, reward, truncation):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "s")
        max_size = num_envs + extra  # often not a multiple of num_envs
        self.fields = nstep_fields(*reward, truncation=truncation)
        self.buf = DiskReplay.create(self.path, max_size, num_envs=num_envs, backend=backend, seed=5,
                                     fields=self.fields)
        self.model = ReplayModel(max_size, num_envs)
        self.jumped: set = set()
        install_jumps(self.buf, self.jumped)
        self.obs = np.zeros((num_envs, 3), np.float32)

    @rule(steps=st.integers(1, 5), seed=st.integers(0, 2**32 - 1), end_rate=st.sampled_from([0.0, 0.2, 0.5]))
    def add(self, steps, seed, end_rate):
        rng = np.random.default_rng(seed)
        n = self.buf.num_envs
        shape, dtype = self.fields["rewards"]
        for _ in range(steps):
            # Each step's states are the previous step's next states except at autoresets
            # (real jumps, in the jump ring); more jumps are reported by ``install_jumps``.
            next_obs = rng.normal(size=(n, 3)).astype(np.float32)
            values = [self.obs, rng.integers(0, 9, n), rng.integers(-5, 6, (n,) + shape).astype(dtype),
                      next_obs, rng.random(n) < end_rate]
            extra = {"tags": rng.integers(-99, 99, (n, 2)).astype(np.int16)}
            if "truncateds" in self.fields:
                extra["truncateds"] = rng.random(n) < end_rate
            if n == 1:
                values = [v[0] for v in values]
                extra = {k: v[0] for k, v in extra.items()}
            first = self.model.seen_size + 1
            self.buf.add(*values, **extra)
            self.model.add(*values, **extra)
            self.jumped.update(first + e for e in range(n) if rng.random() < end_rate / 2)
            autoreset = (rng.random(n) < end_rate / 2)[:, None]
            self.obs = np.where(autoreset, rng.normal(size=(n, 3)).astype(np.float32), next_obs)

    @rule()
    def reset(self):
        self.buf.reset()
        self.model.reset()

    @rule(read_only=st.booleans())
    def reopen(self, read_only):
        self.buf.close()
        if read_only:
            with DiskReplay.open(self.path, mode="r") as ro:
                install_jumps(ro, self.jumped)
                self.check_all(ro, 2, 0.9)
        self.buf = DiskReplay.open(self.path, mode="r+")
        install_jumps(self.buf, self.jumped)

    @precondition(lambda self: self.model.size > 0)
    @rule(k=st.integers(1, 6), gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]) | st.floats(0, 1),
          seed=st.integers(0, 2**32 - 1), reader=st.booleans())
    def check(self, k, gamma, seed, reader):
        k = min(k, max_n_step(self.model.max_size, self.model.num_envs))
        idxs = np.random.default_rng(seed).integers(0, self.model.size, 12)
        if reader:  # a reader beside this live writer
            with DiskReplay.open(self.path, mode="r") as ro:
                install_jumps(ro, self.jumped)
                self.check_idxs(ro, idxs, k, gamma)
        else:
            self.check_idxs(self.buf, idxs, k, gamma)

    def check_all(self, buf, k, gamma):
        if self.model.size:
            self.check_idxs(buf, np.arange(self.model.size), min(k, max_n_step(buf.max_size, buf.num_envs)), gamma)

    def check_idxs(self, buf, idxs, k, gamma):
        got = buf.get(idxs, n_step=k, gamma=gamma)
        if k == 1:
            assert_same(got, self.model.get(idxs))
        else:
            assert_same(got, self.model.nstep_get(idxs, k, gamma, self.jumped))

    def teardown(self):
        self.buf.close()
        self.tmp.cleanup()


TestNStepMachine = NStepMachine.TestCase
TestNStepMachine.settings = settings(max_examples=60, stateful_step_count=20, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- fixed cases
def model_of(max_size: int, num_envs: int, seen: int) -> ReplayModel:
    """The model of a never-reset store written by ``nstep_writer`` up to ``seen``."""
    model = ReplayModel(max_size, num_envs)
    for t in range(1, seen + 1, num_envs):
        s, a, r, ns, d, extra = step_args(t, num_envs)
        model.add(s, a, r, ns, d, **extra)
    return model


def test_a_chain_by_hand(tmp_path, backend):
    """Two envs, transition t's reward t/2, done at t % 7 == 0: slot 2 holds transition 3
    (env 0); its successors are 5 and 7, and 7 ends the episode."""
    with DiskReplay.create(tmp_path / "s", 20, num_envs=2, backend=backend, fields=FIELDS) as buf:
        add_steps(buf, 5)  # transitions 1..10
        got = buf.get([2, 8, 9], n_step=3, gamma=0.5)
        np.testing.assert_array_equal(got["rewards"], np.float32([1.5 + 0.5 * 2.5 + 0.25 * 3.5, 4.5, 5.0]))
        np.testing.assert_array_equal(got["discounts"], np.float32([0.125, 0.5, 0.5]))  # 9 and 10: newest
        np.testing.assert_array_equal(got["states"][:, 0], [3, 9, 10])
        np.testing.assert_array_equal(got["actions"], [3, 9, 10])
        np.testing.assert_array_equal(got["dones"], [True, False, False])
        np.testing.assert_array_equal(got["tags"], [-7, -9, -10])
        np.testing.assert_array_equal(got["next_states"][:, 0], [9, 11, 12])  # 7's next: state of 9


def test_n_step_1_is_the_plain_call(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 13, num_envs=3, backend=backend, seed=4, fields=FIELDS) as buf:
        add_steps(buf, 7)  # wrapped, 13 not a multiple of 3
        idxs = np.arange(13)
        plain, one = buf.get(idxs), buf.get(idxs, n_step=1, gamma=0.5)
        assert list(plain) == list(one)
        for key in plain:
            assert plain[key].dtype == one[key].dtype and plain[key].tobytes() == one[key].tobytes(), key
    with DiskReplay.open(tmp_path / "s", mode="r") as a, DiskReplay.open(tmp_path / "s", mode="r") as b:
        plain, one = a.sample(20), b.sample(20, n_step=1)
        assert np.array_equal(a.batch_idxs, b.batch_idxs)
        assert list(plain) == list(one)
        for key in plain:
            assert plain[key].tobytes() == one[key].tobytes(), key


def test_sample_and_batches_take_n_step(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 30, num_envs=2, backend=backend, seed=1, fields=FIELDS) as buf:
        add_steps(buf, 12)
        model = model_of(30, 2, 24)
        batch = buf.sample(16, n_step=4, gamma=0.9)
        assert_same(batch, model.nstep_get(buf.batch_idxs, 4, 0.9))
        with buf.batches(8, count=3, n_step=3, gamma=0.8) as batches:
            taken = list(batches)
        assert len(taken) == 3 and all(b["discounts"].dtype == np.float32 for b in taken)
        assert set(taken[0]) == set(batch)


def test_integer_rewards_give_float32_returns(tmp_path, backend):
    fields = nstep_fields("int64", truncation=False)
    with DiskReplay.create(tmp_path / "s", 8, backend=backend, fields=fields) as buf:
        for t in range(4):
            buf.add(np.zeros(3, np.float32), t, np.int64(t + 1), np.zeros(3, np.float32), False,
                    tags=np.zeros(2, np.int16))
        assert buf.get([0])["rewards"].dtype == np.int64
        got = buf.get([0, 3], n_step=3, gamma=0.5)
        assert got["rewards"].dtype == np.float32
        np.testing.assert_array_equal(got["rewards"], np.float32([1 + 1 + 0.75, 4]))


def test_empty_selection_has_every_key(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 8, backend=backend, fields=FIELDS) as buf:
        add_steps(buf, 3)
        got = buf.get([], n_step=2)
        assert set(got) == set(FIELDS) | {"next_states", "discounts"}
        assert all(len(v) == 0 for v in got.values())


@pytest.mark.parametrize("num_envs,max_size", [(1, 9), (3, 17)])
def test_n_step_rows_agree_with_plain_gets_of_their_chain(tmp_path, backend, num_envs, max_size):
    """On autoreset data (the step after an episode end starts from a fresh state, not the
    next state given to add), each n-step row is made of what plain ``get`` returns for its
    chain: the first slot's states and actions, the chain's discounted rewards, the last
    slot's next state, dones and extras. A chain cut short with a successor present must
    end at a done, a truncation, or a next state that is not the successor's state (a jump)."""
    n, k, gamma = num_envs, 4, 0.5
    fields = nstep_fields("float32", truncation=True)
    rng = np.random.default_rng(3)
    with DiskReplay.create(tmp_path / "s", max_size, num_envs=n, backend=backend, fields=fields) as buf:
        obs = rng.normal(size=(n, 3)).astype(np.float32)
        for _ in range(13):
            next_obs = rng.normal(size=(n, 3)).astype(np.float32)
            dones, truncs = rng.random(n) < 0.2, rng.random(n) < 0.1
            args = [obs, np.arange(n), rng.normal(size=n).astype(np.float32), next_obs, dones]
            extra = {"tags": rng.integers(0, 9, (n, 2)).astype(np.int16), "truncateds": truncs}
            if n == 1:
                args, extra = [v[0] for v in args], {key: v[0] for key, v in extra.items()}
            buf.add(*args, **extra)
            ended = (dones | truncs | (rng.random(n) < 0.2))[:, None]  # also unmarked resets
            obs = np.where(ended, rng.normal(size=(n, 3)).astype(np.float32), next_obs)
        idxs = np.arange(max_size)
        got, plain = buf.get(idxs, n_step=k, gamma=gamma), buf.get(idxs)
        m = np.rint(-np.log2(got["discounts"])).astype(np.int64)
        chain = (idxs[:, None] + np.arange(k) * n) % max_size
        last = chain[idxs, m - 1]
        at_last = buf.get(last)
        for key in ("states", "actions"):
            np.testing.assert_array_equal(got[key], plain[key], err_msg=key)
        for key in ("next_states", "dones", "truncateds", "tags"):
            np.testing.assert_array_equal(got[key], at_last[key], err_msg=key)
        newest = buf.seen_size
        held = ring.transition_of_slots(idxs, newest, 0, max_size)
        for row in idxs:
            steps = buf.get(chain[row, :m[row]])
            weights = gamma ** np.arange(m[row])
            assert got["rewards"][row] == np.float32((weights * steps["rewards"].astype(np.float64)).sum())
            assert not (steps["dones"][:-1] | steps["truncateds"][:-1]).any()
            successor = held[row] + m[row] * n
            if m[row] < k and successor <= newest and not (steps["dones"][-1] or steps["truncateds"][-1]):
                assert not np.array_equal(at_last["next_states"][row], plain["states"][chain[row, m[row]]])


# ---------------------------------------------------------------- bad input
BAD = [
    (dict(n_step=0), InvalidArgumentError, "n_step must be >= 1"),
    (dict(n_step=-3), InvalidArgumentError, "n_step must be >= 1"),
    (dict(n_step=2.5), InvalidArgumentError, "n_step must be an integer"),
    (dict(n_step="3"), InvalidArgumentError, "n_step must be an integer"),
    (dict(n_step=True), InvalidArgumentError, "n_step must be an integer"),
    (dict(n_step=None), InvalidArgumentError, "n_step must be an integer"),
    (dict(n_step=np.array([2, 3])), InvalidArgumentError, "n_step must be an integer"),
    (dict(n_step=2, gamma=1.5), InvalidArgumentError, "gamma must be a number in [0, 1]"),
    (dict(n_step=2, gamma=-0.1), InvalidArgumentError, "gamma must be a number in [0, 1]"),
    (dict(n_step=2, gamma=float("nan")), InvalidArgumentError, "gamma must be a number in [0, 1]"),
    (dict(n_step=2, gamma="0.9"), InvalidArgumentError, "gamma must be a number in [0, 1]"),
    (dict(n_step=2, gamma=np.array([0.9, 0.8])), InvalidArgumentError, "gamma must be a number in [0, 1]"),
    (dict(gamma=2.0), InvalidArgumentError, "gamma must be a number in [0, 1]"),  # checked with n_step=1 too
    (dict(n_step=5), NStepTooLargeError, "use n_step <= 4"),  # 10 slots, 3 envs: 4 steps span 10 slots
    (dict(n_step=10**30), NStepTooLargeError, "use n_step <= 4"),
]


@pytest.mark.parametrize("kwargs,error,message", BAD)
def test_bad_n_step_arguments_are_refused_before_anything_moves(tmp_path, backend, kwargs, error, message):
    with DiskReplay.create(tmp_path / "s", 10, num_envs=3, backend=backend, seed=2, fields=FIELDS) as buf:
        add_steps(buf, 4)
        before = buf.get(np.arange(10))
        state = ring_state(buf)
        for call in (lambda: buf.sample(4, **kwargs), lambda: buf.get([0, 1], **kwargs),
                     lambda: buf.batches(4, **kwargs)):
            with pytest.raises(error) as info:
                call()
            assert message in str(info.value)
        assert ring_state(buf) == state  # the sampler did not advance
        assert buf.get([1], n_step=4, gamma=0.5)["discounts"].dtype == np.float32  # the largest that fits
        after = buf.get(np.arange(10))
        for key in before:
            assert before[key].tobytes() == after[key].tobytes()
    with DiskReplay.open(tmp_path / "s", mode="r") as ro:
        with pytest.raises(error):
            ro.sample(4, **kwargs)


def test_integral_float_n_step_is_a_count(tmp_path, backend):
    """``n_step`` follows the one rule for counts (``schema.check_count``): 3.0 is 3."""
    with DiskReplay.create(tmp_path / "s", 10, backend=backend, fields=FIELDS) as buf:
        add_steps(buf, 6)
        assert_same(buf.get([0, 4], n_step=3.0, gamma=1), buf.get([0, 4], n_step=3, gamma=1.0))


def test_closed_store_refuses_n_step(tmp_path, backend):
    buf = DiskReplay.create(tmp_path / "s", 10, backend=backend, fields=FIELDS)
    add_steps(buf, 2)
    buf.close()
    with pytest.raises(StoreClosedError):
        buf.sample(2, n_step=2)


# ---------------------------------------------------------------- beside a live or dead writer
def live_row_problems(batch, k, n, seen_before, seen_after, gamma=0.5) -> list[str]:
    """Why rows sampled beside a live writer (``nstep_writer`` data: transition ``t``'s
    reward t/2, done at t % 7 == 0, next state t + n, no truncations) are not the n-step rows of the
    transitions they start from, for some ``seen`` in ``[seen_before, seen_after]``."""
    problems = []
    for pos, t in enumerate(np.asarray(batch["actions"], np.int64).tolist()):
        chain = []  # t and its successors up to the first episode end, among those added by the end
        for j in range(k):
            if t + j * n > seen_after:
                break
            chain.append(t + j * n)
            if chain[-1] % 7 == 0:
                break
        m = int(round(-np.log2(float(batch["discounts"][pos]))))  # gamma is 0.5
        # Successors not yet added at the read's snapshot (after seen_before) may be cut off.
        if not 1 <= m <= len(chain) or m < len(chain) and chain[m] <= seen_before:
            problems.append(f"row of {t}: m={m} for chain {chain}, seen in [{seen_before}, {seen_after}]")
            continue
        last = chain[m - 1]
        want_reward = np.float32(sum(gamma ** j * float(np.float32(c / 2)) for j, c in enumerate(chain[:m])))
        ns = batch["next_states"][pos]
        ns_ok = (ns == np.float32(last + n)).all()
        if not ((batch["states"][pos] == np.float32(t)).all() and batch["rewards"][pos] == want_reward and ns_ok
                and bool(batch["dones"][pos]) == (last % 7 == 0) and int(batch["tags"][pos]) == -last):
            problems.append(f"row of {t} (m={m}) is not its n-step transition: "
                            f"{ {key: batch[key][pos] for key in batch} }")
    return problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_live_reader_n_step_rows_beside_a_writer_process(tmp_path, backend):
    store = str(tmp_path / "live.replay")
    n, k, gamma = 3, 4, 0.5
    with DiskReplay.create(store, 29, num_envs=n, backend=backend, fields=FIELDS, seed=3) as buf:
        add_steps(buf, 1)
    writer = subprocess.Popen([sys.executable, WRITER, store, "--duration", "4"])
    rows, problems = 0, []
    try:
        with DiskReplay.open(store, mode="r") as ro:
            stop = time.monotonic() + 3.5
            while time.monotonic() < stop and not problems:
                before = ro.seen_size
                batch = ro.sample(16, n_step=k, gamma=gamma) if rows % 32 else ro.get(np.arange(ro.size), n_step=k,
                                                                                       gamma=gamma)
                problems += live_row_problems(batch, k, n, before, ro.seen_size)
                rows += len(batch["actions"])
            final = ro.seen_size
        assert writer.wait(timeout=60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert problems == []
    assert rows > 1000 and final > 1000  # the writer kept lapping the ring while we read


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_writers_store_read_virtually(tmp_path, backend):
    """A writer killed at random moments (often mid-add): a reader's n-step rows are those
    of the store as recovery will leave it, the same as the writer sees after recovery."""
    store = str(tmp_path / "dead.replay")
    n = 2
    with DiskReplay.create(store, 23, num_envs=n, backend=backend, fields=FIELDS, seed=3) as buf:
        add_steps(buf, 1)
    rng = np.random.default_rng(7)
    for _ in range(3):
        with DiskReplay.open(store, mode="r") as ro:
            start = ro.seen_size
            child = subprocess.Popen([sys.executable, WRITER, store])
            while ro.seen_size < start + 400 and child.poll() is None:  # let it add a few hundred first
                time.sleep(0.01)
        time.sleep(rng.random() * 0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        with DiskReplay.open(store, mode="r") as ro:
            seen, idxs = ro.seen_size, np.arange(ro.size)
            got = ro.get(idxs, n_step=3, gamma=0.7)
        assert seen >= start + 400
        assert_same(got, model_of(23, n, seen).nstep_get(idxs, 3, 0.7))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RecoveryWarning)
            buf = DiskReplay.open(store, mode="r+")
        with buf:
            assert_same(buf.get(idxs, n_step=3, gamma=0.7), got)


# ---------------------------------------------------------------- the CLI
def test_cli_sample_n_step(tmp_path, backend):
    import json

    from click.testing import CliRunner

    from diskreplay.cli.main import main

    path = str(tmp_path / "s")
    with DiskReplay.create(path, 20, num_envs=2, backend=backend, fields=FIELDS) as buf:
        add_steps(buf, 5)
    r = CliRunner().invoke(main, ["sample", path, "-n", "3", "--seed", "0", "--n-step", "3", "--gamma", "0.5",
                                  "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    idxs = np.asarray(got["idxs"])
    with DiskReplay.open(path, mode="r") as ro:
        want = ro.get(idxs, n_step=3, gamma=0.5)
    assert list(got) == ["idxs"] + list(want)
    for key in want:
        np.testing.assert_array_equal(np.asarray(got[key], want[key].dtype), want[key], err_msg=key)
    for bad, message in (("--n-step=0", "--n-step must be >= 1"), ("--n-step=11", "use --n-step <= 10"),
                         ("--gamma=1.5", "gamma must be a number in [0, 1]")):
        r = CliRunner().invoke(main, ["sample", path, "--seed", "0", bad])
        assert r.exit_code == 2 and message in r.output, r.output


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_writer_killed_mid_add_is_read_through_its_undo_rows(tmp_path, backend):
    """The killed add half-overwrote the oldest slots: a reader's n-step chains read those
    rows (and successors' fields) from the undo reserve, as recovery will restore them."""
    store, n, steps = str(tmp_path / "s"), 2, 9
    with DiskReplay.create(store, 11, num_envs=n, backend=backend, fields=FIELDS, seed=1) as buf:
        add_steps(buf, steps)  # wrapped: the next step overwrites the oldest rows
    child = subprocess.run([sys.executable, WRITER, store, "--die-mid-add"])
    assert child.returncode == -signal.SIGKILL
    model = model_of(11, n, steps * n)
    idxs = np.arange(11)
    with DiskReplay.open(store, mode="r") as ro:
        assert ro._session.needs_recovery() and ro.seen_size == steps * n
        for k in (2, 3, 6):
            assert_same(ro.get(idxs, n_step=k, gamma=0.9), model.nstep_get(idxs, k, 0.9))


@pytest.mark.parametrize("cold", [False, True])
def test_large_frames_cold_or_cached(tmp_path, backend, monkeypatch, cold):
    """Frames of 16 KiB: n-step successors and last next states read by positioned reads
    when the probe finds them out of RAM, through the mapping otherwise; same rows."""
    import diskreplay.backends.gather as gather_module

    shape = (4, 64, 64)
    fields = {"states": (shape, "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    model, rng = ReplayModel(9, 2), np.random.default_rng(0)
    with DiskReplay.create(tmp_path / "s", 9, num_envs=2, backend=backend, fields=fields) as buf:
        states = rng.integers(0, 256, (2,) + shape, dtype=np.uint8)
        for step in range(7):
            values = (states, np.arange(2) + step, rng.normal(size=2).astype(np.float32),
                      rng.integers(0, 256, (2,) + shape, dtype=np.uint8), rng.random(2) < 0.2)
            buf.add(*values)
            model.add(*values)
            states = values[3]
        monkeypatch.setattr(gather_module, "page_cached", lambda fd, pos: not cold)
        positioned = []
        real = gather_module.RowReader.gather_many
        monkeypatch.setattr(gather_module.RowReader, "gather_many",
                            lambda self, requests: positioned.append(len(requests)) or real(self, requests))
        idxs = np.arange(9)
        assert_same(buf.get(idxs, n_step=3, gamma=0.9), model.nstep_get(idxs, 3, 0.9))
        assert len(positioned) == (2 if cold else 0)  # the first rows, then the last rows' next states
