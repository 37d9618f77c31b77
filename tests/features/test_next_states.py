"""Exact next states (issue 15, item 1): ``get`` and ``sample`` return as ``next_states``
exactly the ``next_state`` given to ``add`` for every transition, autoreset or not, on every
backend, for 1-4 envs, across wrap-around, reopen, readers (live and of a dead writer),
``convert``, ``kill -9`` in the middle of an add that recorded jumps, and the format 1 stores
that had no jump ring. The kill -9 and power-cut suites (``crash_common``: a jump every third
transition) and the state machines (``model.ReplayModel``) cover them too."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import crash_common
from diskreplay import CorruptStoreError, DiskReplay, SchemaMismatchError
from diskreplay.format.counters import W_JUMPS
from diskreplay.testing import counter_words, part_counts
from diskreplay.verify import verify_store
from format1_store import steps as format1_steps
import paths

SUPPORT = os.path.dirname(os.path.abspath(crash_common.__file__))
DATA = paths.DATA
FIELDS = {"states": ((2, 3), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


class Episodes:
    """Steps of ``num_envs`` envs that autoreset at random (the next step's states are a
    fresh observation, not the next states given), and every next state given, by number."""

    def __init__(self, num_envs: int, seed: int, reset_rate: float = 0.3, shape=(2, 3), seen: int = 0):
        self.n, self.rng, self.rate, self.shape = num_envs, np.random.default_rng(seed), reset_rate, shape
        self.obs = self.fresh()
        self.given: dict[int, np.ndarray] = {}  # transition number -> next state given
        self.pairs: dict[bytes, bytes] = {}  # bytes of a state -> bytes of the next state given with it
        self.seen = seen

    def fresh(self) -> np.ndarray:
        return self.rng.normal(size=(self.n,) + self.shape).astype(np.float32)

    def add(self, buf) -> None:
        n = self.n
        next_obs = self.fresh()
        args = [self.obs, self.rng.integers(0, 5, n), self.rng.normal(size=n).astype(np.float32), next_obs,
                self.rng.random(n) < 0.1]
        for e in range(n):  # before the add returns: a live reader may read it at once
            self.given[self.seen + e + 1] = next_obs[e].copy()
            self.pairs[self.obs[e].tobytes()] = next_obs[e].tobytes()
        buf.add(*([v[0] for v in args] if n == 1 else args))
        self.seen += n
        resets = self.rng.random(n) < self.rate
        self.obs = np.where(resets.reshape((n,) + (1,) * len(self.shape)), self.fresh(), next_obs)

    def expected(self, buf, slots) -> np.ndarray:
        head, m = buf.head, buf.max_size
        ts = buf.seen_size - (head - np.asarray(slots)) % m
        return np.stack([self.given[int(t)] for t in ts])


def assert_exact(buf, episodes: Episodes) -> None:
    slots = np.arange(buf.size)
    want = episodes.expected(buf, slots)
    np.testing.assert_array_equal(buf.get(slots)["next_states"], want)
    np.testing.assert_array_equal(buf.get(slots, fields=["next_states"])["next_states"], want)  # runs of slots
    np.testing.assert_array_equal(buf.get(slots[::-1])["next_states"], want[::-1])
    batch = buf.sample(16)
    np.testing.assert_array_equal(batch["next_states"], episodes.expected(buf, buf.batch_idxs))


@pytest.mark.parametrize("num_envs,max_size", [(1, 7), (2, 9), (3, 11), (4, 10)])  # not multiples of num_envs
def test_every_next_state_is_the_one_given(tmp_path, backend, num_envs, max_size):
    episodes = Episodes(num_envs, seed=num_envs)
    path = str(tmp_path / "s")
    with DiskReplay.create(path, max_size, num_envs=num_envs, backend=backend, seed=1, fields=FIELDS) as buf:
        for _ in range(4 * max_size // num_envs + 3):  # wraps several times
            episodes.add(buf)
            assert_exact(buf, episodes)
        assert part_counts(buf)["jumps"] > 0, "autoresets were recorded in the jump ring"
    with DiskReplay.open(path, mode="r") as ro:
        assert_exact(ro, episodes)
    with DiskReplay.open(path) as buf:  # reopened for writing: detection goes on from the ns_buffer
        for _ in range(max_size):
            episodes.add(buf)
        assert_exact(buf, episodes)
    assert verify_store(path).ok


def test_a_chained_store_records_no_jumps(tmp_path, backend):
    """Where each step starts from the previous next states the ring's rule holds: the jump
    ring stays empty and nothing is written to it (states stay stored once)."""
    episodes = Episodes(3, seed=0, reset_rate=0.0, shape=(64, 64))
    fields = dict(FIELDS, states=((64, 64), "float32"))
    with DiskReplay.create(tmp_path / "s", 10, num_envs=3, backend=backend, fields=fields) as buf:
        for _ in range(12):
            episodes.add(buf)
        assert part_counts(buf)["jumps"] == 0
        assert_exact(buf, episodes)
    info = os.stat(tmp_path / "s" / "jump_states.npy")
    assert info.st_size > 10 * 16384 and info.st_blocks * 512 <= 4096  # sparse: no row was written


def test_jumps_after_reset_and_on_the_first_step(tmp_path, backend):
    """The first step after create or reset has no previous step to compare with."""
    episodes = Episodes(2, seed=5, reset_rate=1.0)
    with DiskReplay.create(tmp_path / "s", 8, num_envs=2, backend=backend, fields=FIELDS) as buf:
        for _ in range(3):
            episodes.add(buf)
        assert part_counts(buf)["jumps"] == 4  # steps 2 and 3 jumped for both envs: transitions 1-4
        buf.reset()
        for _ in range(6):
            episodes.add(buf)
            assert_exact(buf, episodes)
        assert part_counts(buf)["jumps"] == 4 + 10


def test_the_jump_ring_forces_a_flush_before_it_outgrows_its_room(tmp_path, backend):
    """Records written since the last checkpoint never exceed ``reserve_rows`` (the ring's
    room beyond the checkpoint's window): large rows (3 MiB) give a small reserve (the 48 MiB that 200 steps may take: 15 rows), and every step
    jumps. (The row limit, ``reserve_rows`` transitions past the checkpoint even before the
    first wrap, implies the records' limit; both hold here.)"""
    fields = {"states": ((3 << 20,), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    rng = np.random.default_rng(0)
    with DiskReplay.create(tmp_path / "s", 40, backend=backend, fields=fields) as buf:
        reserve = buf._session.reserve_rows
        assert reserve == 15
        given = []
        for _ in range(30):  # every step an autoreset
            given.append(rng.integers(0, 255, 3 << 20, dtype=np.uint8))
            buf.add(rng.integers(0, 255, 3 << 20, dtype=np.uint8), 0, 0.0, given[-1], False)
            session = buf._session
            assert session.data.jumps.count - session.checkpoint.jumps <= reserve
        assert session.checkpoint.jumps > 0 and session.data.jumps.count == 29
        for slots in (np.arange(0, 30, 3), np.arange(30)):  # frames: scattered and in runs
            assert buf.get(slots)["next_states"].tobytes() == np.stack([given[i] for i in slots]).tobytes()


@pytest.mark.parametrize("src_backend", ["memmap", "hdf5"])
def test_convert_carries_the_jump_ring(tmp_path, src_backend):
    episodes = Episodes(3, seed=7)
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    with DiskReplay.create(src, 14, num_envs=3, backend=src_backend, seed=2, fields=FIELDS) as buf:
        for _ in range(11):
            episodes.add(buf)
    DiskReplay.convert(src, dst, backend="hdf5" if src_backend == "memmap" else "memmap", block_rows=2)
    with DiskReplay.open(dst) as buf:
        assert_exact(buf, episodes)
        for _ in range(5):  # the converted store goes on detecting jumps
            episodes.add(buf)
        assert_exact(buf, episodes)
    assert verify_store(dst).ok


def test_a_live_reader_sees_exact_next_states(tmp_path, backend):
    """A reader beside a writer that keeps adding (its own session, so its reads race the
    adds): every batch holds the given next states of the transitions it names."""
    episodes = Episodes(2, seed=9, reset_rate=0.5)
    path = str(tmp_path / "s")
    buf = DiskReplay.create(path, 12, num_envs=2, backend=backend, fields=FIELDS, flush_every=3)
    episodes.add(buf)
    stop = threading.Event()
    def write():
        while not stop.is_set() and episodes.seen < 4000:
            episodes.add(buf)

    writer = threading.Thread(target=write)
    writer.start()
    checked = 0
    try:
        with DiskReplay.open(path, mode="r") as ro:
            while writer.is_alive() and checked < 300:
                batch = ro.sample(8)
                for state, nxt in zip(batch["states"], batch["next_states"]):
                    assert episodes.pairs[state.tobytes()] == nxt.tobytes()  # states are unique random floats
                checked += 1
    finally:
        stop.set()
        writer.join()
        buf.close()
    assert checked > 20


KILLED_AFTER_RECORDING_JUMPS = r"""
import os, signal
import numpy as np
from crash_common import add_step, crash_fields
from diskreplay import DiskReplay
from diskreplay.format.counters import W_INTENT, W_SEEN
buf = DiskReplay.open({store!r})
n = buf.num_envs
for t in range(buf.seen_size + 1, buf.seen_size + 1 + 9 * n, n):
    add_step(buf, t)
# One more step by hand, as the general add does it, up to the jump count: intent, rows
# (garbage), jump records of every env with garbage next states, the count; then death.
writer = buf._session
words, seen = writer.words, buf.seen_size
slot = (seen - writer.base) % buf.max_size
words[W_INTENT] = seen + n
for arr in writer.storage.arrays.values():
    arr[slot:slot + n] = 77
count = writer.data.jumps.append(writer.data.jumps.count, np.arange(seen - n + 1, seen + 1),
                                 np.full((n,) + writer.fields["states"].shape, 77, np.float32))
words[{w_jumps}] = count
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("num_envs", [1, 3])
def test_a_writer_killed_after_recording_jumps(tmp_path, backend, num_envs):
    """The count is stored before the commit: a writer killed between them leaves records
    of transitions whose step never committed. Readers of the dead writer's store and the
    next writer leave them out, and every next state is exact."""
    store = str(tmp_path / "s.replay")
    with DiskReplay.create(store, 25, num_envs=num_envs, backend=backend, fields=crash_common.crash_fields()) as buf:
        for t in range(1, 1 + 4 * num_envs, num_envs):
            crash_common.add_step(buf, t)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")]))}
    code = KILLED_AFTER_RECORDING_JUMPS.format(store=store, w_jumps=W_JUMPS)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == -9, proc.stderr
    acknowledged = 13 * num_envs
    with DiskReplay.open(store, mode="r") as ro:  # the dead writer's store, as recovery would leave it
        committed = part_counts(ro)["jumps"]
        assert int(counter_words(ro)[W_JUMPS]) == committed + num_envs
        assert crash_common.store_problems(ro, min_seen=acknowledged, max_seen=acknowledged) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buf = DiskReplay.open(store)
    try:
        assert part_counts(buf)["jumps"] == committed
        assert crash_common.store_problems(buf, min_seen=acknowledged, max_seen=acknowledged) == []
        for t in range(acknowledged + 1, acknowledged + 1 + 20 * num_envs, num_envs):
            crash_common.add_step(buf, t)
        final = buf.seen_size
        assert crash_common.store_problems(buf, min_seen=final, max_seen=final) == []
    finally:
        buf.close()


# ---------------------------------------------------------------- format 1 stores
def format1_copy(tmp_path, backend) -> str:
    path = str(tmp_path / "old")
    shutil.copytree(os.path.join(DATA, f"format1-{backend}"), path)
    return path


def format1_next_states() -> dict:
    """Next states a format 1 store returns: the next row's state of the env where there is one."""
    given = {}
    steps = format1_steps()
    for k, (states, _, _, next_states, _) in enumerate(steps):
        for e in range(2):
            later = steps[k + 1][0][e] if k + 1 < len(steps) else next_states[e]
            given[2 * k + e + 1] = later
    return given


def test_a_format1_store_reads_as_before(tmp_path, backend):
    path = format1_copy(tmp_path, backend)
    with DiskReplay.open(path, mode="r") as ro:
        assert ro.format_version == 1 and ro.seen_size == 12
        want = format1_next_states()
        slots = np.arange(ro.size)
        ts = 12 - (ro.head - slots) % 7
        np.testing.assert_array_equal(ro.get(slots)["next_states"], np.stack([want[int(t)] for t in ts]))
    assert not os.path.exists(os.path.join(path, "jumps.npy"))  # a reader wrote nothing
    assert verify_store(path).ok


def test_a_format1_store_is_upgraded_by_its_next_writer(tmp_path, backend):
    path = format1_copy(tmp_path, backend)
    with DiskReplay.open(path, mode="r") as ro:
        before = ro.get(np.arange(7))
    with DiskReplay.open(path) as buf:
        assert buf._session.desc["format_version"] == 2 and os.path.exists(os.path.join(path, "jumps.npy"))
        old = buf.get(np.arange(7))
        for key in before:
            np.testing.assert_array_equal(old[key], before[key], err_msg=key)  # what was added reads the same
        # The first step after the upgrade starts fresh: the last format 1 step's transitions
        # (11, 12) are jumps, their exact next states taken from the ns_buffer.
        episodes = Episodes(2, seed=3, reset_rate=0.5, shape=(3,), seen=12)
        episodes.given.update({11: buf.ns_buffer[0], 12: buf.ns_buffer[1]})
        for _ in range(7):  # overwrites every old row
            episodes.add(buf)
        assert_exact(buf, episodes)
        assert part_counts(buf)["jumps"] >= 2
    with DiskReplay.open(path, mode="r") as ro:
        assert ro.format_version == 2
        assert_exact(ro, episodes)
    assert verify_store(path).ok


def test_a_reader_of_a_store_upgraded_under_it_is_told_to_reopen(tmp_path, backend):
    path = format1_copy(tmp_path, backend)
    with DiskReplay.open(path, mode="r") as ro:
        with DiskReplay.open(path) as buf:
            state = np.zeros(3, np.float32)
            buf.add(np.stack([state, state + 5]), np.zeros(2, np.int64), np.zeros(2, np.float32),
                    np.stack([state, state]), np.zeros(2, bool))  # a jump for both envs
        with pytest.raises(CorruptStoreError, match="upgraded to format 2.*reopen"):
            ro.sample(4)


# ---------------------------------------------------------------- bad input
def test_a_refused_add_leaves_the_jump_ring_as_it_was(tmp_path, backend):
    episodes = Episodes(2, seed=11, reset_rate=1.0)
    with DiskReplay.create(tmp_path / "s", 9, num_envs=2, backend=backend, fields=FIELDS) as buf:
        for _ in range(4):
            episodes.add(buf)
        session = buf._session
        count, records = session.data.jumps.count, session.data.jumps.records.copy()
        fresh = episodes.fresh()
        for bad_next in (np.zeros((2, 3), np.float32), np.full((2, 2, 3), 1e300), "frames"):
            with pytest.raises(SchemaMismatchError):
                buf.add(fresh, np.zeros(2, np.int64), np.zeros(2, np.float32), bad_next, np.zeros(2, bool))
        assert session.data.jumps.count == count and int(session.counters.words[W_JUMPS]) == count
        np.testing.assert_array_equal(session.data.jumps.records, records)
        assert_exact(buf, episodes)


def test_a_damaged_jump_ring_is_refused_or_reported(tmp_path, backend):
    path = str(tmp_path / "s")
    episodes = Episodes(1, seed=2, reset_rate=1.0)
    with DiskReplay.create(path, 9, backend=backend, fields=FIELDS) as buf:
        for _ in range(6):
            episodes.add(buf)
    records = np.load(os.path.join(path, "jumps.npy"), mmap_mode="r+")
    records[[0, 1]] = records[[1, 0]]  # out of order: lookups would miss exact next states
    records.flush()
    del records
    report = verify_store(path)
    assert not report.ok and any("increasing order" in p for p in report.problems), report.problems
    with open(os.path.join(path, "jump_states.npy"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(CorruptStoreError, match="jump_states.npy"):
        DiskReplay.open(path, mode="r")
    assert any("jump_states.npy" in p for p in verify_store(path).problems)


def test_plain_numpy_reads_exact_next_states_as_format_md_says(tmp_path):
    """The recipe of FORMAT.md ("Reading a store with plain numpy or h5py")."""
    episodes = Episodes(3, seed=4)
    path = str(tmp_path / "s")
    with DiskReplay.create(path, 10, num_envs=3, fields=FIELDS) as buf:
        for _ in range(9):
            episodes.add(buf)
        want = buf.get(np.arange(buf.size))["next_states"]
    import json
    desc = json.load(open(f"{path}/store.json"))
    words = np.fromfile(f"{path}/meta.bin", dtype="<i8", count=15)
    seen = int(words[3]) ^ int(words[7])
    base, m, n, jumps = int(words[5]), desc["max_size"], desc["num_envs"], int(words[14])
    size = min(seen - base, m)
    head = (seen - base - 1) % m
    states = np.load(f"{path}/states.npy", mmap_mode="r")
    ns_buffer = np.load(f"{path}/ns_buffer.npy", mmap_mode="r")[(seen // n) % 2]
    records = np.load(f"{path}/jumps.npy", mmap_mode="r")
    jump_states = np.load(f"{path}/jump_states.npy", mmap_mode="r")
    capacity = len(records)
    exact = {int(records[k % capacity]): jump_states[k % capacity] for k in range(max(0, jumps - m), jumps)}
    slots = np.arange(size)
    ts = seen - (head - slots) % m
    got = np.stack([ns_buffer[t - (seen - n + 1)] if t > seen - n else exact.get(int(t), states[(s + n) % m])
                    for s, t in zip(slots, ts)])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("num_envs", [1, 2])
def test_states_are_compared_by_their_bytes(tmp_path, backend, num_envs):
    """NaN states chain like any others (equal bytes, no jump), and -0.0 after 0.0 is a
    jump (equal values, other bytes): the next state returned is the bytes given."""
    n = num_envs
    nan, zero, neg = (np.full((n, 2, 3), x, np.float32) for x in (np.nan, 0.0, -0.0))
    steps = [(nan, zero), (zero, nan), (nan, zero), (neg, zero)]  # (states, next states)
    with DiskReplay.create(tmp_path / "s", 10, num_envs=n, backend=backend, fields=FIELDS) as buf:
        for states, nexts in steps:
            args = [states, np.zeros(n, np.int64), np.zeros(n, np.float32), nexts, np.zeros(n, bool)]
            buf.add(*([v[0] for v in args] if n == 1 else args))
        assert part_counts(buf)["jumps"] == n  # only the -0.0 step: transitions of step 3
        got = buf.get(np.arange(4 * n))["next_states"]
        want = np.concatenate([np.broadcast_to(nexts, (n, 2, 3)) for _, nexts in steps])
        assert got.tobytes() == want.tobytes()


def test_stats_and_watch_cut_episodes_at_unmarked_autoresets(tmp_path, backend):
    """An episode that ended without a done (a truncation stored as done=False, then the
    env's reset observation) is cut where the jump ring says, by get(fields=["jumps"]),
    stats' returns and watch's recent returns alike."""
    from diskreplay.stats import RecentReturns, compute_stats

    fields = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    buf = DiskReplay.create(tmp_path / "s.replay", 20, backend=backend, fields=fields)
    obs = lambda v: np.full(2, v, np.float32)  # noqa: E731
    for i in range(3):
        buf.add(obs(i), 0, 1.0, obs(i + 1), False)
    for i in range(2):  # the reset observation 100 follows the final observation 3
        buf.add(obs(100 + i), 0, 2.0, obs(101 + i), i == 1)
    assert buf.get(np.arange(5), fields=["jumps"])["jumps"].tolist() == [False, False, True, False, False]
    assert set(buf.get([0], fields=["dones", "jumps"])) == {"dones", "jumps"}
    episodes = compute_stats(buf)["episodes"]
    assert episodes["complete_episodes"] == 2
    assert (episodes["return_min"], episodes["return_max"]) == (3.0, 4.0)
    with DiskReplay.open(buf.path, mode="r") as reader:
        assert reader.get(np.arange(5), fields=["jumps"])["jumps"].tolist() == [False, False, True, False, False]
        found = RecentReturns(reader).poll()
    buf.close()
    assert [r for _, _, r in found] == [3.0, 4.0]
