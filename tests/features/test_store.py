"""Contract tests of DiskReplay, run against every backend."""
import errno
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from diskreplay import (DiskReplay, DiskReplayError, EmptyStoreError, IncompleteStoreError,
                        IndexOutOfRangeError, InvalidArgumentError, NotAStoreError, ReadOnlyError,
                        SchemaMismatchError, StoreClosedError, StoreExistsError, StoreIOError,
                        StoreNotFoundError)
import diskreplay.backends.gather as gather_module
from diskreplay.backends import BACKENDS
from diskreplay.core.ring import next_state_sources
from fields import cartpole_fields, step_values
from model import ReplayModel


def fill(buf, steps, start=1):
    n = buf.num_envs
    for k in range(steps):
        buf.add(*step_values(start + k * n, n))


def assert_matches_model(buf, model):
    assert (buf.size, buf.head, buf.seen_size) == (model.size, model.head, model.seen_size)
    if model.size == 0:
        return
    idxs = np.arange(model.size)
    got, want = buf.get(idxs), model.get(idxs)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        assert got[key].dtype == want[key].dtype or key != "states", key


# ---------------------------------------------------------------- semantics
@pytest.mark.parametrize("num_envs,max_size,steps", [(1, 10, 13), (3, 9, 7), (4, 10, 9), (2, 7, 20)])
def test_contents_match_seed_model(tmp_path, backend, num_envs, max_size, steps):
    model = ReplayModel(max_size, num_envs)
    with DiskReplay.create(tmp_path / "s", max_size, num_envs=num_envs, backend=backend, seed=1) as buf:
        for k in range(steps):
            values = step_values(1 + k * num_envs, num_envs)
            buf.add(*values)
            model.add(*values)
            assert_matches_model(buf, model)


def test_wrap_bug_regression_single_env(tmp_path, backend):
    """max_size=10, num_envs=1, head=9: the seed returned states[0] for slot 9."""
    with DiskReplay.create(tmp_path / "s", 10, backend=backend) as buf:
        fill(buf, 10)
        assert buf.head == 9
        got = buf.get([9])["next_states"][0]
        np.testing.assert_array_equal(got, np.full(4, 10.5, np.float32))  # its own next_state
        assert not np.array_equal(got, buf.get([0])["states"][0])


def test_wrap_bug_regression_three_envs(tmp_path, backend):
    """max_size=9, num_envs=3, head=8: slots 6..8 take next states from the ns_buffer."""
    with DiskReplay.create(tmp_path / "s", 9, num_envs=3, backend=backend) as buf:
        fill(buf, 3)
        assert buf.head == 8
        got = buf.get([6, 7, 8])["next_states"][:, 0]
        np.testing.assert_array_equal(got, [7.5, 8.5, 9.5])
        older = buf.get([0, 3])["next_states"][:, 0]  # step_values' next states are t + 0.5, never the
        np.testing.assert_array_equal(older, [1.5, 4.5])  # state of slot i + 3 (4, 7): exact, from the jump ring


def test_seed_rule_is_buggy_where_the_fix_is_not():
    """The seed's test `head < ns_idx <= head + offset` misses wrapped buffer slots."""
    idxs, head, m, n = np.array([6, 7, 8]), 8, 9, 3
    ns = (idxs + n) % m
    seed_in_buffer = (head < ns) & (ns <= head + n)
    _, fixed_in_buffer, buffer_idx = next_state_sources(idxs, head, m, n)
    assert not seed_in_buffer.any()
    assert fixed_in_buffer.all() and buffer_idx.tolist() == [0, 1, 2]


@pytest.mark.parametrize("max_size,num_envs", [(10, 1), (9, 3), (10, 4)])
def test_next_state_matches_model_for_every_head(tmp_path, backend, max_size, num_envs):
    model = ReplayModel(max_size, num_envs)
    with DiskReplay.create(tmp_path / "s", max_size, num_envs=num_envs, backend=backend) as buf:
        for k in range(3 * max_size // num_envs + 2):
            values = step_values(1 + k * num_envs, num_envs)
            buf.add(*values)
            model.add(*values)
            idxs = np.arange(model.size)
            np.testing.assert_array_equal(buf.get(idxs)["next_states"], model.get(idxs)["next_states"])


def test_dtypes_are_kept(tmp_path, backend):
    fields = {"states": ((2, 3), "uint8"), "actions": ((), "int16"), "rewards": ((), "float64"),
              "dones": ((), "bool")}
    with DiskReplay.create(tmp_path / "s", 5, backend=backend, fields=fields) as buf:
        frame = np.arange(6, dtype=np.uint8).reshape(2, 3) + 250
        buf.add(frame, np.int16(-7), 123456.789, frame, True)
        buf.add(frame, np.int16(3), 1e300, frame, False)
        got = buf.get([0, 1])
        assert got["states"].dtype == np.uint8 and got["states"][0].tolist() == frame.tolist()
        assert got["rewards"].dtype == np.float64 and got["rewards"].tolist() == [123456.789, 1e300]
        assert got["actions"].dtype == np.int16 and got["actions"].tolist() == [-7, 3]
        assert got["dones"].dtype == np.bool_


def test_float64_state_above_float16_range(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 4, backend=backend) as buf:
        big = np.array([70000.5, -1e10], np.float64)
        buf.add(big, 0, 0.0, big * 2, False)
        assert buf.fields["states"] == ((2,), np.dtype("float64"))
        np.testing.assert_array_equal(buf.get([0])["states"][0], big)
        np.testing.assert_array_equal(buf.get([0])["next_states"][0], big * 2)


def test_inference_rule(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 4, backend=backend) as buf:
        buf.add(np.zeros(3, np.uint8), 1, 0.5, np.zeros(3, np.uint8), True, log_probs=np.float64(0.1))
        assert buf.fields == {"states": ((3,), np.dtype("uint8")), "actions": ((), np.dtype("int64")),
                              "rewards": ((), np.dtype("float32")), "dones": ((), np.dtype("bool")),
                              "log_probs": ((), np.dtype("float64"))}
    with DiskReplay.open(tmp_path / "s", mode="r") as buf:
        assert buf.get([0])["log_probs"].tolist() == [0.1]


def test_extra_fields_are_stored_and_sampled(tmp_path, backend):
    fields = dict(cartpole_fields(), truncateds=((), "bool"))
    with DiskReplay.create(tmp_path / "s", 8, num_envs=2, backend=backend, fields=fields, seed=0) as buf:
        for k in range(5):
            s, a, r, ns, d = step_values(1 + 2 * k, 2)
            buf.add(s, a, r, ns, d, truncateds=np.array([k % 2 == 0, False]))
        batch = buf.sample(16)
        assert set(batch) == {"states", "actions", "rewards", "next_states", "dones", "truncateds"}
        expected = buf.get(buf.batch_idxs)["truncateds"]
        np.testing.assert_array_equal(batch["truncateds"], expected)
        with pytest.raises(SchemaMismatchError, match="truncateds"):
            buf.add(*step_values(11, 2))


def test_sample_shapes_order_and_cer(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 50, backend=backend, batch_size=7, use_cer=True, seed=3) as buf:
        fill(buf, 60)
        batch = buf.sample()
        assert batch["states"].shape == (7, 4) and batch["next_states"].shape == (7, 4)
        assert list(batch) == ["states", "actions", "rewards", "next_states", "dones"]
        assert buf.batch_idxs[-1] == buf.head
        for key, value in buf.get(buf.batch_idxs).items():
            np.testing.assert_array_equal(batch[key], value)
        assert buf.sample(300)["actions"].shape == (300,)
        assert set(buf.batch_idxs.tolist()) <= set(range(50))


def test_sampling_is_uniform_over_the_occupied_slots(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 100, backend=backend, seed=5) as buf:
        fill(buf, 10)
        counts = np.bincount(np.concatenate([buf.sample(1000) and buf.batch_idxs for _ in range(20)]),
                             minlength=10)
        assert counts.sum() == 20000 and len(counts) == 10
        assert counts.min() > 1700 and counts.max() < 2300  # binomial sd ~42: 7 sigma


# ---------------------------------------------------------------- persistence
def test_resume_continues_the_sample_stream(tmp_path, backend):
    def build(path):
        buf = DiskReplay.create(path, 20, backend=backend, seed=42)
        fill(buf, 30)
        buf.sample(5)
        return buf

    stay = build(tmp_path / "a")
    expected = [stay.sample(5) and stay.batch_idxs.tolist() for _ in range(3)]
    stay.close()
    first = build(tmp_path / "b")
    first.close()
    with DiskReplay.open(tmp_path / "b") as again:
        got = [again.sample(5) and again.batch_idxs.tolist() for _ in range(3)]
    assert got == expected


def test_reopen_keeps_contents_and_counters(tmp_path, backend):
    model = ReplayModel(11, 2)
    with DiskReplay.create(tmp_path / "s", 11, num_envs=2, backend=backend) as buf:
        for k in range(9):
            values = step_values(1 + 2 * k, 2)
            buf.add(*values)
            model.add(*values)
    with DiskReplay.open(tmp_path / "s") as buf:
        assert_matches_model(buf, model)
        values = step_values(19, 2)
        buf.add(*values)
        model.add(*values)
        assert_matches_model(buf, model)


def test_same_seed_same_stream_different_seed_different(tmp_path, backend):
    streams = []
    for name, seed in [("a", 7), ("b", 7), ("c", 8)]:
        with DiskReplay.create(tmp_path / name, 100, backend=backend, seed=seed) as buf:
            fill(buf, 100)
            buf.sample(20)
            streams.append(buf.batch_idxs.tolist())
    assert streams[0] == streams[1] != streams[2]


def test_numpy_load_opens_memmap_data_files(tmp_path):
    with DiskReplay.create(tmp_path / "s", 6, seed=0) as buf:
        fill(buf, 4)
    states = np.load(tmp_path / "s" / "states.npy", mmap_mode="r")
    assert states.shape == (6, 4) and states[3, 0] == 4
    assert np.load(tmp_path / "s" / "actions.npy", mmap_mode="r")[:4].tolist() == [1, 2, 3, 4]


def test_hdf5_store_is_readable_with_plain_h5py(tmp_path):
    import h5py

    with DiskReplay.create(tmp_path / "s", 6, backend="hdf5") as buf:
        fill(buf, 8)
        with h5py.File(tmp_path / "s" / "data.h5", "r") as f:  # while the writer is open
            assert f["actions"][:].tolist() == [7, 8, 3, 4, 5, 6]
            assert f["states"].shape == (6, 4) and f["states"].dtype == np.float32


def test_description_is_json_with_format_version(tmp_path, backend):
    DiskReplay.create(tmp_path / "s", 6, backend=backend, fields=cartpole_fields()).close()
    desc = json.loads((tmp_path / "s" / "store.json").read_text())
    assert desc["format_version"] == 2 and desc["backend"] == backend
    assert desc["fields"]["states"] == {"shape": [4], "dtype": "<f4"}


# ---------------------------------------------------------------- read-only mode
def test_read_only_mode(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 10, backend=backend, seed=0) as buf:
        fill(buf, 12)
    before = {p: p.read_bytes() for p in (tmp_path / "s").iterdir()}
    with DiskReplay.open(tmp_path / "s", mode="r") as ro:
        assert (ro.size, ro.seen_size, ro.head) == (10, 12, 1)
        ro.sample(8)
        ro.get([0, 9])
        with pytest.raises(ReadOnlyError):
            ro.add(*step_values(13))
        with pytest.raises(ReadOnlyError):
            ro.flush()
        with pytest.raises(DiskReplayError):
            ro.reset()
    after = {p: p.read_bytes() for p in (tmp_path / "s").iterdir()}
    assert after == before  # sampling read-only wrote nothing, not even the sampler state


def test_reader_sees_writer_progress(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 10, backend=backend) as buf:
        fill(buf, 3)
        with DiskReplay.open(tmp_path / "s", mode="r") as ro:
            assert ro.size == 3
            fill(buf, 9, start=4)
            assert (ro.size, ro.seen_size) == (10, 12)
            np.testing.assert_array_equal(ro.get(np.arange(10))["states"], buf.get(np.arange(10))["states"])
            np.testing.assert_array_equal(ro.get([ro.head])["next_states"], buf.get([buf.head])["next_states"])


# ---------------------------------------------------------------- reset and close
def test_reset_empties_and_keeps_seen_size(tmp_path, backend):
    model = ReplayModel(6, 1)
    with DiskReplay.create(tmp_path / "s", 6, backend=backend) as buf:
        for t in range(1, 9):
            buf.add(*step_values(t))
            model.add(*step_values(t))
        buf.reset()
        model.reset()
        assert (buf.size, buf.head, buf.seen_size) == (0, -1, 8)
        with pytest.raises(EmptyStoreError):
            buf.sample()
        for t in range(9, 12):
            buf.add(*step_values(t))
            model.add(*step_values(t))
        assert_matches_model(buf, model)
    with DiskReplay.open(tmp_path / "s") as buf:
        assert_matches_model(buf, model)


def test_close_is_idempotent_and_closed_store_refuses(tmp_path, backend):
    buf = DiskReplay.create(tmp_path / "s", 5, backend=backend)
    fill(buf, 2)
    buf.close()
    buf.close()
    with pytest.raises(DiskReplayError, match="closed"):
        buf.sample()
    with pytest.raises(DiskReplayError, match="closed"):
        buf.add(*step_values(3))


@pytest.mark.parametrize("num_envs", [1, 3])
def test_a_kept_reference_to_add_refuses_after_close_and_after_a_failed_flush(tmp_path, backend, num_envs,
                                                                              monkeypatch):
    """``add`` is a specialised closure; one kept by the caller must not write into unmapped
    memory after close() nor past a failed sync."""
    buf = DiskReplay.create(tmp_path / "a", 12, num_envs=num_envs, backend=backend)
    buf.add(*step_values(1, num_envs))
    add = buf.add
    add(*step_values(1 + num_envs, num_envs))  # the fast path, taken
    buf.close()
    with pytest.raises(StoreClosedError):
        add(*step_values(1 + 2 * num_envs, num_envs))
    with DiskReplay.open(tmp_path / "a") as buf:
        assert buf.seen_size == 2 * num_envs
        add = buf.add

        def failing_sync():
            raise OSError(errno.EIO, "injected")

        monkeypatch.setattr(buf._session.storage, "sync", failing_sync)
        with pytest.raises(StoreIOError):
            buf.flush()
        monkeypatch.undo()
        with pytest.raises(StoreIOError, match="refuses writes"):
            add(*step_values(1 + 2 * num_envs, num_envs))
        assert buf.seen_size == 2 * num_envs


def test_close_stops_a_live_prefetcher_first(tmp_path, backend):
    buf = DiskReplay.create(tmp_path / "p", 30, backend=backend, seed=3)
    fill(buf, 20)
    batches = buf.batches(4, prefetch=3)
    next(batches)
    buf.close()  # the background thread must not gather from mappings being unmapped
    assert batches.closed and not batches._thread.is_alive()
    with pytest.raises(StopIteration):
        next(batches)
    with DiskReplay.open(tmp_path / "p", mode="r") as ro:
        assert ro.seen_size == 20


# ---------------------------------------------------------------- bad input
def snapshot_files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "lock"}


@pytest.mark.parametrize("bad,match", [
    (lambda: (np.zeros(5, np.float32), 1, 1.0, np.zeros(5, np.float32), False), r"states: got shape \(5,\)"),
    (lambda: (np.zeros((1, 4), np.float32), 1, 1.0, np.zeros((1, 4), np.float32), False), "shape"),
    (lambda: (np.zeros(4, np.float32), 1.5, 1.0, np.zeros(4, np.float32), False), "actions: got float"),
    (lambda: (np.zeros(4, np.float32), "left", 1.0, np.zeros(4, np.float32), False), "actions"),
    (lambda: (np.zeros(4, np.float32), 1, None, np.zeros(4, np.float32), False), "rewards"),
    (lambda: (np.array(["a"] * 4), 1, 1.0, np.zeros(4, np.float32), False), "non-numeric"),
    (lambda: (np.zeros(4, np.float32), 1, 1.0, np.zeros(3, np.float32), False), "next_states"),
    (lambda: (np.zeros(4, np.float32), 1, 1.0, np.zeros(4, np.float32), 2), "dones"),
    (lambda: (np.zeros(4, np.float32), 2 ** 70, 1.0, np.zeros(4, np.float32), False), "actions"),
])
def test_bad_add_is_refused_and_store_unchanged(tmp_path, backend, bad, match):
    with DiskReplay.create(tmp_path / "s", 5, backend=backend) as buf:
        fill(buf, 7)  # wrapped: a bad add must not touch the oldest row
        buf.flush()
        before = snapshot_files(tmp_path / "s")
        counters = (buf.size, buf.seen_size, buf.head)
        with pytest.raises(SchemaMismatchError, match=match):
            buf.add(*bad())
        assert (buf.size, buf.seen_size, buf.head) == counters
        assert snapshot_files(tmp_path / "s") == before
        buf.add(*step_values(8))  # still usable
        assert buf.seen_size == 8


def test_wrong_env_axis_and_out_of_range_ints(tmp_path, backend):
    fields = {"states": ((2,), "uint8"), "actions": ((), "uint8"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    with DiskReplay.create(tmp_path / "s", 8, num_envs=2, backend=backend, fields=fields) as buf:
        ok = (np.zeros((2, 2), np.uint8), np.array([1, 2]), np.zeros(2), np.zeros((2, 2), np.uint8), [False, True])
        buf.add(*ok)
        with pytest.raises(SchemaMismatchError, match=r"expected \(2, 2\)"):
            buf.add(np.zeros((3, 2), np.uint8), *ok[1:])
        with pytest.raises(SchemaMismatchError, match="do not fit uint8"):
            buf.add(ok[0], np.array([300, 1]), *ok[2:])
        with pytest.raises(SchemaMismatchError, match="do not fit uint8"):
            buf.add(ok[0] + 0, ok[1], ok[2], np.full((2, 2), -1), ok[4])
        assert buf.seen_size == 2


def test_nan_and_inf_are_data(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 4, backend=backend) as buf:
        buf.add(np.array([np.nan, np.inf, -np.inf, 0], np.float32), 0, float("nan"), np.zeros(4, np.float32), False)
        got = buf.get([0])
        assert np.isnan(got["states"][0, 0]) and np.isposinf(got["states"][0, 1]) and np.isnan(got["rewards"][0])


@pytest.mark.parametrize("kwargs,match", [
    ({"max_size": 0}, "max_size"), ({"max_size": -3}, "max_size"), ({"max_size": 2.5}, "max_size"),
    ({"num_envs": 0}, "num_envs"), ({"batch_size": 0}, "batch_size"), ({"backend": "zarr"}, "backend"),
    ({"num_envs": 20}, "num_envs"), ({"fields": {"states": ((4,), "float32")}}, "lacks"),
    ({"fields": dict(cartpole_fields(), next_states=((4,), "float32"))}, "reserved"),
    ({"fields": dict(cartpole_fields(), extra=((2,), "U3"))}, "not supported"),
])
def test_bad_create_arguments(tmp_path, kwargs, match):
    args = {"max_size": 10, **kwargs}
    max_size = args.pop("max_size")
    with pytest.raises(InvalidArgumentError, match=match):
        DiskReplay.create(tmp_path / "s", max_size, **args)
    assert not (tmp_path / "s").exists()


def test_max_size_accepts_integral_float(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 1e3, backend=backend) as buf:
        assert buf.max_size == 1000


def test_create_on_existing_store(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 5, backend=backend) as buf:
        fill(buf, 3)
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        DiskReplay.create(tmp_path / "s", 5, backend=backend)
    with DiskReplay.open(tmp_path / "s") as buf:
        assert buf.seen_size == 3
    with DiskReplay.create(tmp_path / "s", 7, backend=backend, overwrite=True) as buf:
        assert (buf.size, buf.max_size) == (0, 7)


def test_create_refuses_a_directory_of_other_things(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "thesis.tex").write_text("precious")
    with pytest.raises(StoreExistsError, match="not a diskreplay store"):
        DiskReplay.create(tmp_path / "d", 5, overwrite=True)
    assert (tmp_path / "d" / "thesis.tex").read_text() == "precious"


def test_open_missing_and_foreign_paths(tmp_path):
    with pytest.raises(StoreNotFoundError):
        DiskReplay.open(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError):  # the builtin too
        DiskReplay.open(tmp_path / "nothing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(NotAStoreError, match="store.json"):
        DiskReplay.open(tmp_path / "other")
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotAStoreError, match="is a file"):
        DiskReplay.open(tmp_path / "f")
    with pytest.raises(InvalidArgumentError):
        DiskReplay.open(tmp_path / "other", mode="w")


def test_half_created_store(tmp_path, backend):
    DiskReplay.create(tmp_path / "s", 5, backend=backend).close()
    (tmp_path / "s" / "CREATING").write_bytes(b"")
    with pytest.raises(IncompleteStoreError, match="overwrite=True"):
        DiskReplay.open(tmp_path / "s")
    DiskReplay.create(tmp_path / "s", 5, backend=backend, overwrite=True).close()
    DiskReplay.open(tmp_path / "s").close()


def test_sample_and_get_errors(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 5, backend=backend) as buf:
        with pytest.raises(EmptyStoreError, match="empty"):
            buf.sample()
        fill(buf, 3)
        with pytest.raises(InvalidArgumentError):
            buf.sample(0)
        with pytest.raises(InvalidArgumentError):
            buf.sample(2.5)
        with pytest.raises(IndexOutOfRangeError, match=r"\[0, 3\)"):
            buf.get([3])
        with pytest.raises(IndexOutOfRangeError):
            buf.get([-1])
        with pytest.raises(InvalidArgumentError, match="integers"):
            buf.get([0.5])
        with pytest.raises(IndexError):
            buf.get([10])


def test_errors_share_one_base():
    import diskreplay

    for name in diskreplay.__all__:
        obj = getattr(diskreplay, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning):
            assert issubclass(obj, DiskReplayError), name


# ---------------------------------------------------------------- state machine
class StoreMachine(RuleBasedStateMachine):
    """Random adds, samples, flushes, resets and reopens against the in-memory model."""

    def __init__(self):
        super().__init__()
        self.buf = None

    @initialize(num_envs=st.integers(1, 4), extra=st.integers(0, 9), backend=st.sampled_from(BACKENDS),
                reserve_steps=st.sampled_from([None, 1, 3]))
    def create(self, num_envs, extra, backend, reserve_steps):
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "s")
        max_size = num_envs + extra  # often not a multiple of num_envs
        self.buf = DiskReplay.create(self.path, max_size, num_envs=num_envs, backend=backend, seed=11,
                                     flush_every=reserve_steps)
        self.model = ReplayModel(max_size, num_envs)
        self.next_t = 1
        self.reference_draws = []
        self.last_next = None  # the next states of the last step added

    @rule(steps=st.integers(1, 6), autoreset=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16))
    def add(self, steps, autoreset, seed):
        """Steps whose states are the previous step's next states, except for envs that
        autoreset (a fresh state: the model's next state is the one given, a jump)."""
        n = self.buf.num_envs
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            states, *rest = step_values(self.next_t, n)
            if self.last_next is not None:
                chained = (rng.random(n) >= autoreset).reshape((n,) + (1,) * (np.ndim(states) - (n > 1)))
                states = np.where(chained[0] if n == 1 else chained, self.last_next, states)
            values = (states, *rest)
            self.buf.add(*values)
            self.model.add(*values)
            self.last_next = values[3]
            self.next_t += n

    @precondition(lambda self: self.model.size > 0)
    @rule(batch=st.integers(1, 40))
    def sample(self, batch):
        got = self.buf.sample(batch)
        idxs = self.buf.batch_idxs
        assert idxs.min() >= 0 and idxs.max() < self.model.size
        want = self.model.get(idxs)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)

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
                assert_matches_model(ro, self.model)
        self.buf = DiskReplay.open(self.path, mode="r+")

    @invariant()
    def every_slot_matches(self):
        if self.buf is not None:
            assert_matches_model(self.buf, self.model)

    def teardown(self):
        if self.buf is not None:
            self.buf.close()
            self.tmp.cleanup()


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- row checksums
def test_row_checksums_detect_a_damaged_row(tmp_path, backend):
    with DiskReplay.create(tmp_path / "s", 10, num_envs=2, backend=backend) as buf:
        fill(buf, 8)  # wrapped
        buf.flush()
        fill(buf, 1, start=17)  # not flushed yet: not counted
        assert buf.verify_rows() == (8, [])
    target = tmp_path / "s" / ("states.npy" if backend == "memmap" else "data.h5")
    with DiskReplay.open(tmp_path / "s", mode="r") as ro:
        offset = ro._session.storage.locations["states"][1] + 5 * 16 + 2  # slot 5, byte 2 of its state
    raw = bytearray(target.read_bytes())
    raw[offset] ^= 0xFF
    target.write_bytes(bytes(raw))
    with DiskReplay.open(tmp_path / "s", mode="r") as ro:
        checked, bad = ro.verify_rows()
        assert checked == 10 and bad == [5]


def test_large_rows_take_the_parallel_read_path(tmp_path, backend, monkeypatch):
    """Frames of 16 KiB and more whose first rows are not in RAM are gathered by positioned
    reads, the others through the gather mapping; contents are the same either way."""
    shape = (4, 64, 64)
    fields = cartpole_fields(shape, "uint8")
    model = ReplayModel(7, 2)
    for mode in ("r+", "r"):
        path = tmp_path / mode
        with DiskReplay.create(path, 7, num_envs=2, backend=backend, fields=fields, seed=2) as buf:
            for k in range(6):
                values = step_values(1 + 2 * k, 2, shape, np.uint8)
                values = (values[0], values[1], values[2], values[3].astype(np.uint8), values[4])
                buf.add(*values)
                if mode == "r+":
                    model.add(*values)
            reader = buf if mode == "r+" else DiskReplay.open(path, mode="r")
            for cold in (False, True):
                monkeypatch.setattr(gather_module, "page_cached", lambda fd, pos, cold=cold: not cold)
                taken = []
                gatherer = reader._session.gatherer
                real = type(gatherer)._gather_large
                monkeypatch.setattr(gatherer, "_gather_large", lambda *a: taken.append(1) or real(gatherer, *a),
                                    raising=False)
                batch = reader.sample(50)
                assert bool(taken) == cold
                want = model.get(reader.batch_idxs)
                for key in want:
                    np.testing.assert_array_equal(batch[key], want[key], err_msg=key)
                monkeypatch.undo()
            if reader is not buf:
                reader.close()


def test_prefetched_batches_equal_direct_sampling(tmp_path, backend):
    def build(name):
        buf = DiskReplay.create(tmp_path / name, 30, backend=backend, seed=9)
        fill(buf, 40)
        return buf

    direct = build("a")
    expected = [direct.sample(8) for _ in range(5)]
    direct.close()
    buf = build("b")
    with buf.batches(8, prefetch=2, count=5) as it:
        got = list(it)
    assert len(got) == 5
    for g, e in zip(got, expected):
        for key in e:
            np.testing.assert_array_equal(g[key], e[key])
    fill(buf, 2, start=41)  # add works again after the prefetcher is closed
    it = buf.batches(4)
    next(it)
    buf.add(*step_values(43))  # concurrent add, under the lock
    it.close()
    assert buf.seen_size == 43
    buf.close()


def test_a_second_writer_in_the_same_process_is_refused_and_the_first_goes_on(tmp_path, backend):
    """Issue 35 item 8: one writer per store within a process, as across processes; the
    message says the holder is in this process."""
    from diskreplay import StoreLockedError
    path = tmp_path / "s"
    first = DiskReplay.create(path, 16, backend=backend)
    first.add(np.zeros(2, np.float32), 0, 0.0, np.ones(2, np.float32), False)
    for attempt in (lambda: DiskReplay.open(path, mode="r+"),
                    lambda: DiskReplay.create(path, 16, backend=backend, overwrite=True)):
        with pytest.raises(StoreLockedError, match="already open for writing in this process"):
            attempt()
    first.add(np.ones(2, np.float32), 1, 1.0, np.ones(2, np.float32), False)
    with DiskReplay.open(path, mode="r") as reader:  # readers are welcome beside it
        assert reader.seen_size == 2
    first.close()
    with DiskReplay.open(path, mode="r+") as again:
        assert again.seen_size == 2
        np.testing.assert_array_equal(again.get([1])["actions"], [1])
