"""ShardedReplay on a local Ray cluster (started once for the module): uniform sampling over
the union of shards, the life cycle, shards that die and come back, bad input."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import ray

from diskreplay import DiskReplay, EmptyStoreError, InvalidArgumentError, RecoveryWarning, StoreMismatchError
from diskreplay.errors import DuplicateShardError, ShardMismatchError, UnknownNodeError
from diskreplay.ray import ShardedReplay
from diskreplay.ray.split import chunk_counts, split_batch

FIELDS = {"states": ((2,), "int64"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the env-runner tasks below are this module's functions; Ray's workers cannot import
    # tests/, so they travel by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def steps(ids):
    """Rows that say who they are: state (id, id), next state (id, -1), action id."""
    ids = np.asarray(ids, np.int64)
    states = np.stack([ids, ids], axis=1)
    return (states, ids, ids.astype(np.float32), np.stack([ids, -np.ones_like(ids)], axis=1),
            np.zeros(len(ids), bool))


def fill(sharded, i, ids):
    return ray.get(sharded.writer(i).add_many.remote(*steps(ids)))


def chi_square(observed, expected):
    return float(((observed - expected) ** 2 / expected).sum())


def bound(df):
    """Chi-square with df degrees of freedom exceeds df + 8 sqrt(2 df) with probability < 1e-6."""
    return df + 8 * np.sqrt(2 * df)


# ---------------------------------------------------------------------- the split, without Ray
def test_chunks_cover_the_share_in_near_equal_parts():
    assert chunk_counts(0, 4) == []
    assert chunk_counts(10, 4, min_rows=16) == [10]
    assert chunk_counts(100, 4, min_rows=16) == [25, 25, 25, 25]
    assert chunk_counts(50, 4, min_rows=16) == [17, 17, 16]
    assert sum(chunk_counts(1001, 3)) == 1001


def test_split_gives_empty_shards_nothing_and_follows_sizes():
    rng = np.random.default_rng(0)
    counts = np.array([split_batch(rng, 64, [100, 0, 300]) for _ in range(2000)])
    assert (counts.sum(axis=1) == 64).all() and (counts[:, 1] == 0).all()
    assert abs(counts[:, 2].mean() / 64 - 0.75) < 0.01


# ---------------------------------------------------------------------- on the cluster
@pytest.mark.parametrize("backend", ["memmap", "hdf5"])
def test_samples_are_uniform_over_the_union_of_shards(cluster, tmp_path, backend):
    sizes = [40, 120, 240]
    paths = [str(tmp_path / f"s{i}") for i in range(3)]
    with ShardedReplay.create(paths, 300, fields=FIELDS, backend=backend, seed=1) as sharded:
        start = 0
        for i, n in enumerate(sizes):
            fill(sharded, i, range(start, start + n))
            start += n
        assert sharded.sizes() == sizes and len(sharded) == 400
        shard_hits, slot_hits = np.zeros(3), np.zeros(400)
        offsets = np.cumsum([0] + sizes[:-1])
        for _ in range(100):
            batch = sharded.sample(512)
            # each row is the one its shard and slot name (no mix-up in the gather)
            ids = offsets[batch["shards"]] + batch["batch_idxs"]
            assert (batch["actions"] == ids).all() and (batch["states"][:, 0] == ids).all()
            assert (batch["next_states"][:, 0] == ids + 1).sum() + (batch["next_states"][:, 1] == -1).sum() \
                == len(ids)  # next state: the next slot's state, or the newest row's stored one
            shard_hits += np.bincount(batch["shards"], minlength=3)
            slot_hits += np.bincount(ids, minlength=400)
        rows = shard_hits.sum()
        assert chi_square(shard_hits, rows * np.array(sizes) / 400) < bound(2)
        assert chi_square(slot_hits, np.full(400, rows / 400)) < bound(399)
        # the bound is not loose enough to pass a wrong split: equal shares per shard fail it
        assert chi_square(shard_hits, np.full(3, rows / 3)) > 100 * bound(2)


def test_life_cycle_flush_reopen_and_batches(cluster, tmp_path):
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    sharded = ShardedReplay.create(paths, 100, fields=FIELDS, seed=0)
    assert fill(sharded, 0, range(10)) == 10
    assert ray.get(sharded.writer(1).add.remote(*[x[0] for x in steps([99])])) == 1
    assert sharded.flush() == [10, 1]
    with sharded.batches(32, prefetch=2, count=3) as batches:
        got = list(batches)
    assert len(got) == 3 and all(len(b["shards"]) == 32 for b in got)
    sharded.close()
    sharded.close()  # idempotent
    with pytest.raises(Exception, match="closed"):
        sharded.sample(4)
    for path, n in zip(paths, (10, 1)):
        with DiskReplay.open(path, mode="r") as buf:
            assert buf.size == n
    with ShardedReplay.open(paths) as again:  # attach to what is there
        assert again.sizes() == [10, 1]
        assert set(again.sample(8)["actions"]) <= set(range(10)) | {99}
    with ShardedReplay.create(paths, 100, fields=FIELDS) as resumed:  # create resumes existing stores
        assert resumed.sizes() == [10, 1]


def test_actors_read_beside_an_in_process_writer(cluster, tmp_path):
    path = str(tmp_path / "local")
    with DiskReplay.create(path, 50, fields=FIELDS) as buf:
        with ShardedReplay.open([path], mode="r") as sharded:
            with pytest.raises(EmptyStoreError):
                sharded.sample(4)
            for t in range(5):
                buf.add(*[x[0] for x in steps([t])])
            assert sharded.sizes() == [5]
            assert set(sharded.sample(16)["actions"]) <= set(range(5))


# ---------------------------------------------------------------------- bad input
def test_prioritized_shards_are_refused_until_sampling_honours_them(cluster, tmp_path):
    """Issue 36 item 5: a prioritized ShardedReplay would sample uniformly (no weights, no
    update_priorities): refused, at create before any store is made, at open as it attaches."""
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    with pytest.raises(InvalidArgumentError, match="samples its shards uniformly"):
        ShardedReplay.create(paths, 100, fields=FIELDS, prioritized=True)
    assert not any(os.path.exists(p) for p in paths)
    with DiskReplay.create(paths[0], 100, fields=FIELDS, prioritized=True) as buf:
        buf.add(np.zeros(2, np.int64), 1, 1.0, np.ones(2, np.int64), False)
    with DiskReplay.create(paths[1], 100, fields=FIELDS) as buf:
        buf.add(np.zeros(2, np.int64), 1, 1.0, np.ones(2, np.int64), False)
    with pytest.raises(InvalidArgumentError, match="a prioritized store"):
        ShardedReplay.open(paths)
    with DiskReplay.open(paths[0], mode="r") as buf:  # left as it was
        assert buf.prioritized and buf.seen_size == 1


def test_bad_input_is_refused_and_leaves_nothing_half_created(cluster, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with pytest.raises(DuplicateShardError, match="same store"):
        ShardedReplay.create([a, str(tmp_path / "x" / ".." / "a")], 10, fields=FIELDS)
    with pytest.raises(UnknownNodeError, match="not live nodes"):
        ShardedReplay.create([a], 10, nodes=["ab" * 28], fields=FIELDS)
    with pytest.raises(InvalidArgumentError, match="one node id"):
        ShardedReplay.create([a], 10, nodes=[None, None], fields=FIELDS)
    for bad in ([], a, [""], [3]):
        with pytest.raises(InvalidArgumentError):
            ShardedReplay.create(bad, 10, fields=FIELDS)
    assert not os.path.exists(a)
    # shard b exists with other fields: the new shard a is removed again, b is left as it was
    other = dict(FIELDS, states=((3,), "float32"))
    DiskReplay.create(b, 10, fields=other).close()
    with pytest.raises(ShardMismatchError, match="fields"):
        ShardedReplay.create([a, b], 10, fields=FIELDS)
    assert not os.path.exists(a)
    with DiskReplay.open(b, mode="r") as buf:
        assert buf.fields["states"][0] == (3,)
    with pytest.raises(StoreMismatchError, match="max_size 10"):
        ShardedReplay.create([b], 20, fields=other)
    with pytest.raises(Exception) as info:
        ShardedReplay.open([str(tmp_path / "missing")])
    assert "missing" in str(info.value)


def test_bad_calls_on_a_sharded_replay(cluster, tmp_path):
    with ShardedReplay.create([str(tmp_path / "a"), str(tmp_path / "b")], 10, fields=FIELDS) as sharded:
        with pytest.raises(EmptyStoreError, match="every answering shard is empty"):
            sharded.sample(4)
        for bad in (2, -1, True, "0"):
            with pytest.raises(InvalidArgumentError):
                sharded.writer(bad)
        with pytest.raises(InvalidArgumentError):
            sharded.sample(0)
        states, actions, rewards, next_states, dones = steps(range(3))
        with pytest.raises(InvalidArgumentError, match="same leading step axis"):
            ray.get(sharded.writer(0).add_many.remote(states, actions[:2], rewards, next_states, dones))
        assert sharded.sizes() == [0, 0]  # nothing of the refused call was written


def test_import_diskreplay_does_not_import_ray():
    import subprocess
    code = "import sys, diskreplay, diskreplay.errors; print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


# ---------------------------------------------------------------------- shards that die
@ray.remote(num_cpus=0)
def write_until_stopped(writer, start, steps_max):
    """An env runner on the shard's node: one step per call; returns the ids acknowledged
    (every add that returned) when the shard dies under it or after steps_max steps."""
    acked = []
    for t in range(start, start + steps_max):
        try:
            ray.get(writer.add.remote(*[x[0] for x in steps([t])]))
        except ray.exceptions.RayActorError:
            break
        acked.append(t)
    return acked


def wait_for(predicate, timeout=30.0):
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stored_ids(buf_or_rows):
    return set(np.asarray(buf_or_rows["actions"]).tolist())


@pytest.mark.parametrize("how", ["ray.kill", "kill -9"])
def test_a_killed_shard_is_left_out_then_rejoins_with_every_acknowledged_transition(cluster, tmp_path, how):
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    with ShardedReplay.create(paths, 5000, fields=FIELDS, seed=3) as sharded:
        fill(sharded, 1, range(100_000, 100_200))
        victim = sharded.writer(0)
        pid = ray.get(victim.pid.remote())
        runner = write_until_stopped.remote(victim, 0, 4000)
        assert wait_for(lambda: sharded.sizes()[0] >= 50)
        if how == "ray.kill":
            ray.kill(victim, no_restart=False)  # Ray restarts it (max_restarts=-1)
        else:
            os.kill(pid, 9)
        acked = ray.get(runner, timeout=60)
        assert 50 <= len(acked) < 4000 and acked == list(range(len(acked)))
        # sampling goes on while the shard restarts; each batch comes from the shards that answer
        for _ in range(20):
            batch = sharded.sample(64)
            assert len(batch["shards"]) == 64
        # Ray's restart reopens the store (a new process) with every acknowledged transition
        assert wait_for(lambda: sharded.sizes()[0] is not None)
        assert ray.get(victim.pid.remote()) != pid
        size = sharded.sizes()[0]
        assert size in (len(acked), len(acked) + 1)  # + the add in flight, if its commit landed
        assert set(acked) <= stored_ids(ray.get(victim.get.remote(np.arange(size))))
        # and brings it back into sampling, in proportion to its size
        hits = np.zeros(2)
        for _ in range(20):
            hits += np.bincount(sharded.sample(256)["shards"], minlength=2)
        assert chi_square(hits, hits.sum() * np.array([size, 200]) / (size + 200)) < bound(1)
        assert sharded.unavailable == set()


def test_a_shard_that_stays_dead_is_left_out_and_reported(cluster, tmp_path):
    from diskreplay.errors import ShardUnavailableError, ShardUnavailableWarning
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    sharded = ShardedReplay.create(paths, 100, fields=FIELDS, seed=4)
    fill(sharded, 0, range(30))
    fill(sharded, 1, range(1000, 1010))
    pid = ray.get(sharded.writer(0).pid.remote())
    ray.kill(sharded.writer(0), no_restart=True)
    with pytest.warns(ShardUnavailableWarning, match=r"shards \[0\]"):
        batch = sharded.sample(128)
    assert (batch["shards"] == 1).all() and sharded.unavailable == {0}  # renormalized over shard 1
    assert sharded.sizes() == [None, 10]
    ray.kill(sharded.writer(1), no_restart=True)
    with pytest.raises(ShardUnavailableError, match="none of the 2 shards answered"), \
            pytest.warns(ShardUnavailableWarning, match=r"shards \[1\]"):
        sharded.sample(8)
    sharded.close()  # closing around dead shards works
    assert wait_for(lambda: not process_exists(pid))  # ray.kill returns before the process is gone
    with pytest.warns(RecoveryWarning, match="nothing was lost"), DiskReplay.open(paths[0]) as buf:  # the dead shard's store recovers every acknowledged add
        assert buf.size == 30 and stored_ids(buf.get(np.arange(30))) == set(range(30))


# ---------------------------------------------------------------------- rows never pass the driver
class DriverBytes:
    """A stub on the driver's side of Ray's transport: counts the bytes the driver process
    serializes (arguments, puts) and deserializes (results, gets) while active."""

    def __enter__(self):
        from ray._private.serialization import SerializationContext
        self.sent = self.received = 0
        self._cls, self._ser, self._de = SerializationContext, SerializationContext.serialize, \
            SerializationContext.deserialize_objects
        stub = self

        def serialize(ctx, value):
            out = stub._ser(ctx, value)
            stub.sent += out.total_bytes
            return out

        def deserialize_objects(ctx, objects, refs, *rest):
            stub.received += sum(0 if data is None else len(data) for data, *_ in objects)
            return stub._de(ctx, objects, refs, *rest)

        SerializationContext.serialize, SerializationContext.deserialize_objects = serialize, deserialize_objects
        return self

    def __exit__(self, *exc):
        self._cls.serialize, self._cls.deserialize_objects = self._ser, self._de


WIDE = dict(FIELDS, states=((256,), "float32"))


@ray.remote(num_cpus=0)
def run_env(writer, first, steps_total, chunk):
    """An env runner: makes its rows here and sends them straight to its shard, chunk steps a call."""
    for start in range(first, first + steps_total, chunk):
        ids = np.arange(start, start + chunk)
        states = np.repeat(ids[:, None], 256, axis=1).astype(np.float32)
        seen = ray.get(writer.add_many.remote(states, ids, ids.astype(np.float32), states + 1,
                                              np.zeros(chunk, bool)))
    return seen


def test_writers_on_the_shard_node_send_no_rows_through_the_driver(cluster, tmp_path):
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    with ShardedReplay.create(paths, 4000, fields=WIDE, nodes=[ray.get_runtime_context().get_node_id()] * 2) \
            as sharded:
        row_bytes = 2 * 256 * 4  # a state and a next state per step, each 1 KiB
        with DriverBytes() as driver:
            seen = ray.get([run_env.options(scheduling_strategy=ray.util.scheduling_strategies.
                                            NodeAffinitySchedulingStrategy(node, soft=False))
                           .remote(sharded.writer(i), 0, 2000, 100) for i, node in enumerate(sharded.nodes)])
        assert seen == [2000, 2000] and sharded.sizes() == [2000, 2000]
        moved = 2 * 2000 * row_bytes  # 8 MiB of rows reached the shards
        assert driver.sent + driver.received < moved / 100, (driver.sent, driver.received)
        # the stub sees rows that do go through the driver: the same adds made from here
        states = np.zeros((100, 256), np.float32)
        with DriverBytes() as control:
            ray.get(sharded.writer(0).add_many.remote(states, np.arange(100), np.zeros(100, np.float32),
                                                      states, np.zeros(100, bool)))
        assert control.sent >= 100 * row_bytes


# ---------------------------------------------------------------------- full shards (no size probes)
def test_full_shards_of_different_sizes_are_sampled_uniformly_and_a_dead_one_left_out(cluster, tmp_path):
    from diskreplay.errors import ShardUnavailableWarning
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    DiskReplay.create(paths[0], 60, fields=FIELDS).close()
    DiskReplay.create(paths[1], 180, fields=FIELDS).close()
    # shard 0 holds 60 slots, shard 1 holds 180: both wrap, so each stays full from here on
    with ShardedReplay.open(paths, seed=6) as sharded:
        fill(sharded, 0, range(0, 100))        # ids 40..99 remain
        fill(sharded, 1, range(1000, 1250))    # ids 1070..1249 remain
        assert sharded.sizes() == [60, 180]
        hits = np.zeros(2)
        seen = set()
        for _ in range(60):
            batch = sharded.sample(256)
            hits += np.bincount(batch["shards"], minlength=2)
            seen |= set(batch["actions"].tolist())
        assert chi_square(hits, hits.sum() * np.array([60, 180]) / 240) < bound(1)
        assert seen == set(range(40, 100)) | set(range(1070, 1250))
        pid = ray.get(sharded.writer(0).pid.remote())
        ray.kill(sharded.writer(0), no_restart=True)
        assert wait_for(lambda: not process_exists(pid))
        with pytest.warns(ShardUnavailableWarning, match=r"shards \[0\]"):
            batch = sharded.sample(64)
        assert (batch["shards"] == 1).all() and sharded.unavailable == {0}
