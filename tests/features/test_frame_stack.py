"""Frame stacks (``DiskReplay.create(..., frame_stack=k)``, ``diskreplay/parts/stacks/``):
one frame stored per transition, and every state and next state returned exactly as given.

* ``StackMachine``: a Hypothesis state machine against the in-memory model that keeps every
  stack as given (tests/support/model.py): envs whose episodes end at random (shorter than
  k too), padded first states, states that do not overlap, frames from a two-value alphabet
  (so frames and stacks often coincide by accident), num_envs 1-4, max_size not a multiple
  of num_envs (the ring wraps), flushes, resets and reopens.
* kill -9 of stacking writers and power-cut images: tests/durability/test_frame_stack_crash.py.
* a Gymnasium pipeline: a small pixel env in ``FrameStackObservation(stack_size=4)``,
  recorded by ``diskreplay.gym.RecordTransitions`` and compared transition by transition.
* bad input: clear errors, nothing written.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from crash_common import FRAME, add_step, crash_fields, stack_of, store_problems
from model import ReplayModel
from stack_envs import Envs

from diskreplay import DiskReplay
from diskreplay.backends import BACKENDS
from diskreplay.errors import InvalidArgumentError, SchemaMismatchError
from diskreplay.testing import part_counts, raw_rows
import paths


def assert_matches(buf, model):
    assert (buf.size, buf.head, buf.seen_size) == (model.size, model.head, model.seen_size)
    if model.size == 0:
        return
    idxs = np.arange(model.size)
    got, want = buf.get(idxs), model.get(idxs)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        if key in ("states", "next_states"):
            assert got[key].dtype == want[key].dtype, key


class StackMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.buf = None

    @initialize(num_envs=st.integers(1, 4), extra=st.integers(0, 9), backend=st.sampled_from(BACKENDS),
                k=st.sampled_from([2, 3, 4]), frame=st.sampled_from([(2,), (3, 2)]),
                flush_every=st.sampled_from([None, 1, 3]), declared=st.booleans(), seed=st.integers(0, 2**16))
    def create(self, num_envs, extra, backend, k, frame, flush_every, declared, seed):
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "s")
        max_size = num_envs + extra + (num_envs > 1)  # often not a multiple of num_envs
        fields = None
        if declared:
            fields = {"states": ((k,) + frame, "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
                      "dones": ((), "bool")}
        self.buf = DiskReplay.create(self.path, max_size, num_envs=num_envs, backend=backend, seed=3,
                                     flush_every=flush_every, frame_stack=k, fields=fields)
        self.model = ReplayModel(max_size, num_envs)
        self.envs = Envs(num_envs, k, frame, np.random.default_rng(seed))

    @rule(steps=st.integers(1, 8), end_prob=st.sampled_from([0.0, 0.3, 0.8]), odd_prob=st.sampled_from([0.0, 0.2]))
    def add(self, steps, end_prob, odd_prob):
        for _ in range(steps):
            values = self.envs.step(end_prob, odd_prob)
            self.buf.add(*values)
            self.model.add(*values)

    @precondition(lambda self: self.model.size > 0)
    @rule(batch=st.integers(1, 20))
    def sample(self, batch):
        got = self.buf.sample(batch)
        want = self.model.get(self.buf.batch_idxs)
        named = self.buf.get(self.buf.batch_idxs, fields=list(want))  # named fields: the general path
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            np.testing.assert_array_equal(named[key], want[key], err_msg=key)

    @rule()
    def flush(self):
        self.buf.flush()

    @rule()
    def reset(self):
        self.buf.reset()
        self.model.reset()

    @rule(read_only_peek=st.booleans())
    def reopen(self, read_only_peek):
        self.buf.close()
        if read_only_peek:
            with DiskReplay.open(self.path, mode="r") as ro:
                assert ro.frame_stack == self.envs.k
                assert_matches(ro, self.model)
        self.buf = DiskReplay.open(self.path, mode="r+")

    @invariant()
    def every_slot_matches(self):
        if self.buf is not None:
            assert_matches(self.buf, self.model)

    def teardown(self):
        if self.buf is not None:
            self.buf.close()
            self.tmp.cleanup()


TestStackMachine = StackMachine.TestCase
TestStackMachine.settings = settings(max_examples=70, stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- storage, exports, convert
def fill_stacked(path, backend, num_envs=2, max_size=23, steps=40, k=4, **kwargs):
    buf = DiskReplay.create(path, max_size, num_envs=num_envs, backend=backend, frame_stack=k,
                            fields=crash_fields((k,) + FRAME), seed=5, **kwargs)
    for t in range(1, 1 + steps * num_envs, num_envs):
        add_step(buf, t)
    return buf


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_frame_per_transition_on_disk(tmp_path, backend):
    """The states rows hold one frame, and store.json says so (with frame_stack)."""
    with fill_stacked(str(tmp_path / "s"), backend) as buf:
        assert buf.fields["states"] == ((4,) + FRAME, np.dtype(np.float32))
        assert raw_rows(buf)["states"].shape == (23,) + FRAME
    desc = json.load(open(tmp_path / "s" / "store.json"))
    assert desc["frame_stack"] == 4 and desc["fields"]["states"]["shape"] == list(FRAME)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_reader_returns_whole_stacks(tmp_path, backend):
    """get, sample, episodes, exports, convert and the CLI all see the stacks given."""
    from click.testing import CliRunner

    from diskreplay.cli.main import main
    path = str(tmp_path / "s")
    fill_stacked(path, backend).close()
    with DiskReplay.open(path, mode="r") as buf:
        assert store_problems(buf, min_seen=80, max_seen=80) == []
        for ep in buf.episodes():
            ts = [buf.seen_size - (buf.head - s) % buf.max_size for s in ep["slots"].tolist()]
            want = [stack_of(t, 2, 4) for t in ts] + [stack_of(ts[-1], 2, 4, True)]
            np.testing.assert_array_equal(ep["states"], np.stack(want))
        whole = buf.get(np.arange(buf.size))
    out = str(tmp_path / "x.npz")
    result = CliRunner().invoke(main, ["export", path, out])
    assert result.exit_code == 0, result.output
    with np.load(out) as z:
        assert z["states"].shape == (23, 4) + FRAME
        for key in ("states", "next_states"):  # rows oldest first, each with its slot
            np.testing.assert_array_equal(z[key], whole[key][z["slots"]], err_msg=key)
    result = CliRunner().invoke(main, ["info", path, "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["frame_stack"] == 4
    assert json.loads(result.output)["fields"]["states"]["shape"] == [4, *FRAME]
    other = "hdf5" if backend == "memmap" else "memmap"
    DiskReplay.convert(path, str(tmp_path / "c"), backend=other)
    with DiskReplay.open(str(tmp_path / "c"), mode="r+") as conv:
        assert conv.frame_stack == 4
        assert store_problems(conv, min_seen=80, max_seen=80) == []
        for t in range(81, 81 + 30 * 2, 2):  # the converted store carries on
            add_step(conv, t)
        assert store_problems(conv, min_seen=140, max_seen=140) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_live_reader_sees_whole_stacks(tmp_path, backend):
    path = str(tmp_path / "s")
    with fill_stacked(path, backend, num_envs=3, max_size=29, steps=5) as buf:
        with DiskReplay.open(path, mode="r") as reader:
            seen = buf.seen_size
            for _ in range(40):
                add_step(buf, seen + 1)
                seen += 3
                assert store_problems(reader, min_seen=seen, max_seen=seen) == []


def test_frames_stored_once(tmp_path):
    """Long episodes: the stack ring holds only the bases, the disk about a frame a transition."""
    k, n, m = 4, 2, 400
    buf = DiskReplay.create(str(tmp_path / "s"), m, num_envs=n, frame_stack=k, seed=1)
    rng = np.random.default_rng(0)
    cur = rng.integers(0, 255, (n, k, 64, 64), dtype=np.uint8)
    for _ in range(m):  # no episode ends
        nxt = np.concatenate([cur[:, 1:], rng.integers(0, 255, (n, 1, 64, 64), dtype=np.uint8)], axis=1)
        buf.add(cur, np.zeros(n, np.int64), np.zeros(n, np.float32), nxt, np.zeros(n, bool))
        cur = nxt
    assert part_counts(buf)["stacks"] == n  # only the first states are whole
    buf.close()
    states_bytes = os.path.getsize(tmp_path / "s" / "states.npy")
    assert states_bytes < m * 64 * 64 + 4096


# ---------------------------------------------------------------- crashes
# ---------------------------------------------------------------- a real Gymnasium pipeline
def make_pixel_env(seed: int):
    import gymnasium
    from gymnasium import spaces

    class Dot(gymnasium.Env):
        """A dot moving on an 8x8 image; an episode ends at random (1 to 12 steps)."""

        observation_space = spaces.Box(0, 255, (8, 8), np.uint8)
        action_space = spaces.Discrete(4)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.pos = self.np_random.integers(0, 8, 2)
            self.left = int(self.np_random.integers(1, 13))
            return self._obs(), {}

        def _obs(self):
            img = np.zeros((8, 8), np.uint8)
            img[self.pos[0], self.pos[1]] = 255
            img[0, 0] = self.left
            return img

        def step(self, action):
            self.pos = (self.pos + [(0, 1), (1, 0), (0, -1), (-1, 0)][action]) % 8
            self.left -= 1
            return self._obs(), 1.0, self.left == 0, False, {}

    env = gymnasium.wrappers.FrameStackObservation(Dot(), stack_size=4)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


@pytest.mark.parametrize("backend", BACKENDS)
def test_gymnasium_frame_stack_pipeline(tmp_path, backend):
    from diskreplay.gym import RecordTransitions, transition_fields

    env = make_pixel_env(3)
    fields = transition_fields(env.observation_space, env.action_space, "the test")  # states (4, 8, 8)
    store = DiskReplay.create(str(tmp_path / "s"), 150, backend=backend, frame_stack=4, seed=0, fields=fields)
    rec = RecordTransitions(env, store)
    given = []
    obs, _ = rec.reset(seed=3)
    for _ in range(400):  # wraps the 150-slot ring
        action = env.action_space.sample()
        nxt, reward, term, trunc, _ = rec.step(action)
        given.append((obs, action, nxt, term))
        obs = nxt
        if term or trunc:
            obs, _ = rec.reset()
    store.flush()
    assert obs.shape == (4, 8, 8)
    for buf in (store, DiskReplay.open(str(tmp_path / "s"), mode="r")):
        batch = buf.get(np.arange(buf.size))
        for slot in range(buf.size):
            t = buf.seen_size - (buf.head - slot) % buf.max_size
            s, a, ns, term = given[t - 1]
            np.testing.assert_array_equal(batch["states"][slot], s)
            np.testing.assert_array_equal(batch["next_states"][slot], ns)
            assert batch["actions"][slot] == a and batch["dones"][slot] == term
        if buf is not store:
            buf.close()
    assert part_counts(store)["stacks"] < 150  # continuing states stored one frame each
    rec.close()
    store.close()


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("k", [0, 1, -3, True, 2.0, "4"])
def test_bad_frame_stack_values(tmp_path, k):
    with pytest.raises(InvalidArgumentError, match="frame_stack"):
        DiskReplay.create(str(tmp_path / "s"), 10, frame_stack=k)
    assert not os.path.exists(tmp_path / "s")


@pytest.mark.parametrize("shape, k", [((3, 5), 4), ((8, 5), 4), ((), 2), ((5,), 4)])
def test_declared_states_that_cannot_stack(tmp_path, shape, k):
    fields = {"states": (shape, "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}
    with pytest.raises(InvalidArgumentError, match="frame_stack"):
        DiskReplay.create(str(tmp_path / "s"), 10, frame_stack=k, fields=fields)
    assert not os.path.exists(tmp_path / "s")


@pytest.mark.parametrize("backend", BACKENDS)
def test_inferred_states_that_cannot_stack_leave_the_store_empty(tmp_path, backend):
    path = str(tmp_path / "s")
    with DiskReplay.create(path, 10, frame_stack=4, backend=backend) as buf:
        for bad in (np.zeros((3, 5), np.uint8), np.zeros((5, 4, 2), np.uint8), np.uint8(3)):
            with pytest.raises(SchemaMismatchError, match="frame_stack"):
                buf.add(bad, 0, 0.0, bad, False)
            assert buf.fields is None and buf.seen_size == 0
        good = np.zeros((4, 5), np.uint8)
        buf.add(good, 0, 0.0, good, False)
        assert buf.fields["states"] == ((4, 5), np.dtype(np.uint8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_stacks_after_the_first_add_change_nothing(tmp_path, backend):
    path = str(tmp_path / "s")
    with fill_stacked(path, backend, num_envs=1, max_size=11, steps=15) as buf:
        before = buf.get(np.arange(buf.size))
        s = stack_of(16, 1, 4)
        for state, next_state in [(s[:3], s), (s, s[:3]), (np.concatenate([s, s]), s), (s[:, :5], s)]:
            with pytest.raises(SchemaMismatchError):
                buf.add(state, 16, 8.0, next_state, False, tags=np.int32(-16))
        assert buf.seen_size == 15
        after = buf.get(np.arange(buf.size))
        for key in before:
            np.testing.assert_array_equal(before[key], after[key])
        assert store_problems(buf, min_seen=15, max_seen=15) == []
        add_step(buf, 16)
        assert store_problems(buf, min_seen=16, max_seen=16) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frame_dtype_change_is_refused(tmp_path, backend):
    with DiskReplay.create(str(tmp_path / "s"), 10, frame_stack=2, backend=backend) as buf:
        s = np.arange(6, dtype=np.uint8).reshape(2, 3)
        buf.add(s, 0, 0.0, s, False)
        for bad in (s + 0.5, s.astype(np.int16) + 300):
            with pytest.raises(SchemaMismatchError, match="states"):
                buf.add(bad, 0, 0.0, s, False)
        assert buf.seen_size == 1
        np.testing.assert_array_equal(buf.get([0])["states"][0], s)


@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_answers_as_a_store_of_whole_states(tmp_path, backend, num_envs):
    """Fed the same steps, a frame-stack store and a store of whole states answer every read
    alike: rows, n-step rows, named fields with jumps, and episodes."""
    plain = DiskReplay.create(str(tmp_path / "p"), 31, num_envs=num_envs, backend=backend, seed=2)
    stacked = DiskReplay.create(str(tmp_path / "s"), 31, num_envs=num_envs, backend=backend, seed=2, frame_stack=3)
    envs = Envs(num_envs, 3, (4,), np.random.default_rng(num_envs))
    for _ in range(50):
        values = envs.step(0.25, 0.05)
        plain.add(*values)
        stacked.add(*values)
    idxs = np.arange(plain.size)
    for kwargs in ({}, {"n_step": 3, "gamma": 0.9}, {"fields": ["next_states", "jumps", "dones"]},
                   {"fields": "states"}):
        want, got = plain.get(idxs, **kwargs), stacked.get(idxs, **kwargs)
        assert list(want) == list(got)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{kwargs} {key}")
    pairs = list(zip(plain.episodes(), stacked.episodes()))
    assert len(pairs) == len(list(plain.episodes())) > 5
    for want, got in pairs:
        assert list(want) == list(got)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    plain.close()
    stacked.close()


@pytest.mark.parametrize("m", [29, 30])  # frames in slot order, and env-major
def test_plain_numpy_rebuilds_stacks_as_format_md_says(tmp_path, m):
    """The recipe of FORMAT.md ("Frame stacks"), run as written, on a store that wrapped."""
    path = str(tmp_path / "s")
    with fill_stacked(path, "memmap", num_envs=3, max_size=m, steps=40) as buf:
        want = buf.get(np.arange(buf.size))
        jumps = buf.get(np.arange(buf.size), fields="jumps")["jumps"]  # next states from the jump ring
        head = buf.head
    doc = open(os.path.join(paths.ROOT, "FORMAT.md")).read()
    section = doc.split("## Frame stacks", 1)[1]
    recipe = section.split("```python", 1)[1].split("```", 1)[0]
    desc = json.load(open(f"{path}/store.json"))
    words = np.fromfile(f"{path}/meta.bin", dtype="<i8", count=16)
    seen = int(words[3]) ^ int(words[7])
    scope = {"np": np, "path": path, "desc": desc, "seen": seen, "base": int(words[5]), "m": m, "n": 3}
    exec(recipe, scope)
    assert desc.get("frames_layout") == ("env-major" if m == 30 else None)
    for slot in range(m):
        t = seen - (head - slot) % m
        np.testing.assert_array_equal(scope["state"](t), want["states"][slot])
        if t <= seen - 3 and not jumps[slot]:
            np.testing.assert_array_equal(scope["state"](t + 3), want["next_states"][slot])


# ---------------------------------------------------------------- the fast add
@pytest.mark.parametrize("num_envs", [1, 3])
def test_continuing_stacks_take_the_fast_add(tmp_path, num_envs):
    """Only steps with a base (here the first) or a flush due go through the general path;
    overwriting the ring (tail copies) stays on the fast one."""
    n = num_envs
    buf = DiskReplay.create(tmp_path / "s", 30, num_envs=n, frame_stack=4, seed=0,
                            fields={"states": ((4, 5), "uint8"), "actions": ((), "int64"),
                                    "rewards": ((), "float32"), "dones": ((), "bool")})
    general_steps = []
    write_step = buf._session._write_step
    buf._session._write_step = lambda values: (general_steps.append(buf.seen_size), write_step(values))
    envs = Envs(n, 4, (5,), np.random.default_rng(1))
    model = ReplayModel(30, n)
    for _ in range(75 // n):  # 75 transitions: wraps twice
        values = envs.step(0.0, 0.0)
        buf.add(*values)
        model.add(*values)
    assert general_steps == [0, 30, 60], general_steps  # the first step, then the flushes the undo reserve asks
    assert_matches(buf, model)
    buf.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cold_frames_read_by_positioned_reads(tmp_path, backend, monkeypatch):
    """Frames not in RAM (the residency probe says so) are read once per distinct slot by
    positioned reads; the stacks are the same."""
    from diskreplay.backends.gather import Gatherer

    buf = DiskReplay.create(tmp_path / "s", 50, num_envs=3, frame_stack=4, seed=0, backend=backend)
    envs = Envs(3, 4, (64, 64), np.random.default_rng(2))
    model = ReplayModel(50, 3)
    for _ in range(40):
        values = envs.step(0.1, 0.05)
        buf.add(*values)
        model.add(*values)
    reads = []
    real = Gatherer.stack_rows

    def cold(self, idxs, names, frame_slots, head, ns_rows):
        reads.append(len(frame_slots))
        return real(self, idxs, names, frame_slots, head, ns_rows)
    monkeypatch.setattr(Gatherer, "rows_cached", lambda self, idxs: False)
    monkeypatch.setattr(Gatherer, "stack_rows", cold)
    assert_matches(buf, model)
    got, want = buf.sample(16), model.get(buf.batch_idxs)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert reads and buf._session.gatherer.row_reader is not None  # the positioned reads were used
    buf.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cli_commands_on_a_stacking_store(tmp_path, backend):
    """show, sample, stats, episodes and verify read a frame-stack store as any other."""
    from click.testing import CliRunner

    from diskreplay.cli.main import main
    from diskreplay.verify import verify_store
    path = str(tmp_path / "s")
    fill_stacked(path, backend, steps=30).close()
    runner = CliRunner()
    for args in (["show", path, "--json"], ["sample", path, "--json"], ["stats", path, "--json"],
                 ["episodes", path, "--json"], ["verify", path], ["info", path]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    assert "frame_stack" in runner.invoke(main, ["info", path]).output
    shown = json.loads(runner.invoke(main, ["show", path, "--json", "--tail", "3"]).output)
    assert len(shown) == 3
    for row in shown:
        np.testing.assert_array_equal(np.array(row["states"], np.float32), stack_of(row["transition"], 2, 4))
        np.testing.assert_array_equal(np.array(row["next_states"], np.float32), stack_of(row["transition"], 2, 4, True))
    report = verify_store(path)
    assert report.ok, report.problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reader_beside_a_writer_thread(tmp_path, backend):
    """A reader samples while a writer thread adds stacked steps over a small ring that wraps
    many times: every row it gets is a whole transition with its exact stacks."""
    import threading

    from crash_common import stack_row_problems
    path = str(tmp_path / "s")
    writer = fill_stacked(path, backend, num_envs=3, max_size=29, steps=12)
    stop, problems = threading.Event(), []

    def write():
        t = writer.seen_size + 1
        while not stop.is_set() and t < 3 * 2000:
            add_step(writer, t)
            t += 3
    thread = threading.Thread(target=write)
    reader = DiskReplay.open(path, mode="r")
    thread.start()
    try:
        batches = 0
        while thread.is_alive() and batches < 400:
            batch = reader.sample(16)
            problems += stack_row_problems(batch, batch["actions"], 3, 4)
            batches += 1
    finally:
        stop.set()
        thread.join()
        reader.close()
        writer.close()
    assert batches > 20 and problems == [], problems[:5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_checks_that_every_jump_is_followed_by_a_base(tmp_path, backend):
    """Batches search the jump ring only at bases (FORMAT.md): verify checks the writer's
    rule that the transition after an autoreset jump is one, and reports a store where not."""
    from diskreplay.verify import verify_store

    path = str(tmp_path / "s")
    fields = {"states": ((2, 3), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    with DiskReplay.create(path, 50, backend=backend, frame_stack=2, fields=fields) as buf:
        frame = 0
        for _ in range(4):  # episodes of 5 steps; each final next state is not the next state
            s = np.stack([np.full(3, frame, np.uint8)] * 2)
            for step in range(5):
                frame += 1
                ns = np.stack([s[-1], np.full(3, frame, np.uint8)])
                buf.add(s, 0, 1.0, ns, step == 4)
                s = ns
            frame += 1
        assert list(np.flatnonzero(buf.get(np.arange(20), fields="jumps")["jumps"])) == [4, 9, 14]
    report = verify_store(path)
    assert report.ok and report.checked["jump_bases"] == 3, report.problems
    records = np.load(os.path.join(path, "stack_records.npy"), mmap_mode="r+")
    assert list(records[:4]) == [1, 6, 11, 16]
    records[2] = 10  # still in order, but transition 11 (after the jump at 10) is no base any more
    records.flush()
    del records
    report = verify_store(path)
    assert not report.ok and any("not bases (first: 11)" in p for p in report.problems), report.problems
