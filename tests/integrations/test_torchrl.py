"""diskreplay.torchrl.DiskReplayStorage on the real TorchRL: filled by a collector on a
Gymnasium env, compared with LazyTensorStorage fed the same data."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector  # TorchRL 0.14's name for SyncDataCollector
from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs import GymEnv, SerialEnv

from diskreplay import DiskReplay, InvalidArgumentError, NotAStoreError, SchemaMismatchError, StoreMismatchError
from diskreplay.torchrl import DiskReplayStorage
from old_finals import contents as old_finals_contents, write_old_finals

torch.set_num_threads(1)


def batches(n_envs: int, frames: int, per_batch: int = 50, seed: int = 0):
    """What a collector yields on CartPole-v1 (``n_envs`` envs in a SerialEnv), flattened to transitions."""
    env = GymEnv("CartPole-v1") if n_envs == 1 else SerialEnv(n_envs, lambda: GymEnv("CartPole-v1"))
    env.set_seed(seed)
    collector = Collector(env, None, frames_per_batch=per_batch, total_frames=frames)
    try:
        for data in collector:
            yield data.reshape(-1).clone()
    finally:
        collector.shutdown()


def assert_same(a: TensorDict, b: TensorDict) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    assert a.batch_size == b.batch_size
    for key in b.keys(True, True):
        x, y = a[key], b[key]
        assert (x.shape, x.dtype) == (y.shape, y.dtype), key
        assert torch.equal(x, y), key


def twin_buffers(path, max_size: int, sampler=RandomSampler, **kwargs):
    ours = ReplayBuffer(storage=DiskReplayStorage(path, max_size, **kwargs), sampler=sampler(), batch_size=16)
    theirs = ReplayBuffer(storage=LazyTensorStorage(max_size), sampler=sampler(), batch_size=16)
    return ours, theirs


@pytest.mark.parametrize("n_envs", [1, 2])
def test_collector_data_comes_back_as_lazytensorstorage_gives_it(tmp_path, backend, n_envs):
    ours, theirs = twin_buffers(tmp_path / "rb.replay", 170, backend=backend)
    for data in batches(n_envs, 400):  # wraps the ring twice; episode ends and interleaved envs
        ours.extend(data)
        theirs.extend(data)
    assert len(ours) == len(theirs) == 170 and ours.storage.store.backend == backend
    everything = list(range(170))
    assert_same(ours.storage.get(everything), theirs.storage.get(everything))
    assert_same(ours.storage[5], theirs.storage[5])
    assert_same(ours.storage[10:20], theirs.storage[10:20])
    for seed in range(3):
        torch.manual_seed(seed)
        mine = ours.sample()
        torch.manual_seed(seed)
        assert_same(mine, theirs.sample())
    # the true next observations come from the store alone (its jump ring), no side store beside it
    expected = theirs.storage.get(everything)[("next", "observation")].numpy()
    with DiskReplay.open(tmp_path / "rb.replay", mode="r") as store:
        rows = store.get(np.arange(170), fields=("next_states", "jumps"))
        older = np.arange(170) != store.head  # the newest's next state is the ns_buffer's, no jump yet
    np.testing.assert_array_equal(rows["next_states"], expected)
    ends = theirs.storage.get(everything)[("next", "done")].numpy().reshape(-1)
    assert ends.any() and rows["jumps"][ends & older].all()
    assert os.listdir(tmp_path) == ["rb.replay"]


def transitions(start: int, stop: int, ends) -> TensorDict:
    """Hand-made rows ``t = start .. stop - 1``: observation ``t``, next observation ``t + 1``,
    or ``1000 + t`` where the episode ends at ``t`` (the next row starts from ``t + 1``)."""
    t = torch.arange(start, stop)
    done = torch.tensor([int(i) in ends for i in t]).unsqueeze(-1)
    obs = t.float().unsqueeze(-1).repeat(1, 4)
    return TensorDict({"observation": obs, "action": t % 2,
                       "next": {"observation": torch.where(done, 1000 + obs, obs + 1),
                                "reward": torch.ones(len(t), 1), "done": done, "terminated": done}},
                      batch_size=[len(t)])


def test_final_observations_come_back_as_next_observations_after_a_reopen(tmp_path):
    """The true final observation of an episode end is its row's ("next", "observation")
    after the storage is closed and reopened (no kill), before and after the next rows;
    the last row before the close ends an episode."""
    path = tmp_path / "rb.replay"
    ends = {4, 11, 19, 27}
    rb = ReplayBuffer(storage=DiskReplayStorage(path, 50), sampler=RandomSampler(), batch_size=64)
    rb.extend(transitions(0, 20, ends))
    rb.storage.close()
    for stop in (20, 30):  # reopened as it was, then after rows that start elsewhere
        rb = ReplayBuffer(storage=DiskReplayStorage(path, 50), sampler=RandomSampler(), batch_size=64)
        if stop > 20:
            rb.extend(transitions(20, stop, ends))
        assert_same(rb.storage.get(list(range(stop))), transitions(0, stop, ends))
        sample = rb.sample()
        t = sample["observation"][:, 0].long()
        assert sum(int(i) in ends for i in t) > 0
        assert_same(sample, transitions(0, stop, ends)[t])
        older = [i for i in sorted(ends) if i < stop - 1]  # the newest row's next state is the ns_buffer's
        assert rb.storage.store.get(older, fields="jumps")["jumps"].all()
        rb.storage.close()


def test_an_old_finals_side_store_beside_the_store_is_ignored(tmp_path):
    """A storage that a version up to 497696e wrote kept next observations in ``<path>.finals``
    too: it opens, its next observations come from the store's jump ring, not from that side
    store (whose states here are wrong), and the side store is neither read, changed nor removed."""
    path = tmp_path / "rb.replay"
    data = list(batches(1, 200))
    ours, theirs = twin_buffers(path, 150)
    for batch in data[:2]:
        ours.extend(batch)
        theirs.extend(batch)
    ours.storage.close()
    assert os.listdir(tmp_path) == ["rb.replay"]  # this version keeps none
    # rows for every transition number added, as the old code's get() looked every row up
    side = write_old_finals(path, [(number, np.full(4, -7.0)) for number in range(1, 101)])
    before = old_finals_contents(side)
    resumed = ReplayBuffer(storage=DiskReplayStorage(path, 150), sampler=RandomSampler(), batch_size=16)
    assert_same(resumed.storage.get(list(range(100))), theirs.storage.get(list(range(100))))
    for batch in data[2:]:  # wraps the ring: transitions 51 .. 200 are held
        resumed.extend(batch)
        theirs.extend(batch)
    everything = list(range(150))
    assert_same(resumed.storage.get(everything), theirs.storage.get(everything))
    torch.manual_seed(0)
    mine = resumed.sample()
    torch.manual_seed(0)
    assert_same(mine, theirs.sample())
    done = theirs.storage.get(everything)[("next", "done")].numpy().reshape(-1)
    older = done & (np.arange(150) != resumed.storage.store.head)
    assert older.any() and resumed.storage.store.get(np.flatnonzero(older), fields="jumps")["jumps"].all()
    resumed.storage.close()
    assert old_finals_contents(side) == before


def test_a_reopened_storage_resumes_where_it_stopped(tmp_path):
    path = tmp_path / "rb.replay"
    data = list(batches(1, 300))
    ours, theirs = twin_buffers(path, 120)
    for batch in data[:3]:
        ours.extend(batch)
        theirs.extend(batch)
    ours.storage.close()  # as a crashed or finished run leaves it
    resumed = ReplayBuffer(storage=DiskReplayStorage(path, 120), sampler=RandomSampler(), batch_size=16)
    assert len(resumed) == 120
    for batch in data[3:]:
        resumed.extend(batch)
        theirs.extend(batch)
    assert_same(resumed.storage.get(list(range(120))), theirs.storage.get(list(range(120))))
    resumed.storage.close()


def test_a_storage_and_its_replay_buffer_pickle_by_path(tmp_path):
    """TorchRL's storages pickle, so that a ReplayBuffer crosses process boundaries (issue 36
    item 2): a DiskReplayStorage pickles as its path; unpickled while its writer holds the store
    it reads beside it (writes refused), unpickled once the writer closed it, it writes."""
    import pickle
    from diskreplay import ReadOnlyError
    path = tmp_path / "rb.replay"
    rb = ReplayBuffer(storage=DiskReplayStorage(path, 50), sampler=RandomSampler(), batch_size=8)
    rb.extend(transitions(0, 30, ends={9, 19}))
    blob = pickle.dumps(rb)
    assert len(blob) < 20_000  # the rows are not in it
    reader = pickle.loads(blob)  # beside the live writer
    assert reader.storage.store.mode == "r" and len(reader) == 30
    assert_same(reader.storage.get(list(range(30))), rb.storage.get(list(range(30))))
    with pytest.raises(ReadOnlyError):
        reader.storage.set(30, transitions(30, 31, ends=set())[0])
    assert len(reader.sample()) == 8
    reader.storage.close()
    rb.storage.close()
    writer = pickle.loads(blob)  # nobody holds it now: the writer
    assert writer.storage.store.mode == "r+"
    writer.extend(transitions(30, 40, ends=set()))
    assert len(writer) == 40
    np.testing.assert_array_equal(writer.storage.get(list(range(40)))["observation"][:, 0].numpy(), np.arange(40))
    writer.storage.close()


def test_dumps_loads_and_state_dict_hold_a_reference(tmp_path):
    path = tmp_path / "rb.replay"
    rb = ReplayBuffer(storage=DiskReplayStorage(path, 2000), sampler=RandomSampler(), batch_size=16)
    for batch in batches(1, 1000, per_batch=250):
        rb.extend(batch)
    before = rb.storage.get(list(range(1000)))
    rb.dumps(tmp_path / "ckpt")
    dumped = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / "ckpt") for f in fs)
    assert dumped < 8192  # the 1000 transitions themselves are ~40 KB
    state = rb.state_dict()
    rb.storage.close()
    loaded = ReplayBuffer(storage=DiskReplayStorage(tmp_path / "elsewhere.replay", 2000), sampler=RandomSampler(),
                          batch_size=16)
    loaded.loads(tmp_path / "ckpt")
    assert len(loaded) == 1000 and loaded.storage.path == os.path.abspath(path)
    assert_same(loaded.storage.get(list(range(1000))), before)
    loaded.storage.close()
    again = ReplayBuffer(storage=DiskReplayStorage(tmp_path / "third.replay", 2000), sampler=RandomSampler(),
                         batch_size=16)
    again.load_state_dict(state)
    assert len(again) == 1000
    again.extend(before[:10])  # the writer's cursor follows the store
    assert len(again) == 1010
    again.storage.close()


# PrioritizedSampler needs torchrl's C++ extension, which the torchrl 0.14.1 wheel cannot load
# with torch 2.13.0 ("SumSegmentTreeFp32 is not available"), whatever the storage.
@pytest.mark.parametrize("sampler", [SamplerWithoutReplacement])
def test_other_samplers_drive_it(tmp_path, sampler):
    ours, theirs = twin_buffers(tmp_path / "rb.replay", 150, sampler=sampler)
    for batch in batches(1, 200):
        ours.extend(batch)
        theirs.extend(batch)
    for seed in range(3):
        torch.manual_seed(seed)
        mine = ours.sample()
        torch.manual_seed(seed)
        assert_same(mine, theirs.sample())
    ours.storage.close()


# ---------------------------------------------------------------------- bad input
def test_bad_input_is_refused_and_leaves_the_store_as_it_was(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("not a store")
    with pytest.raises(NotAStoreError):
        DiskReplayStorage(tmp_path / "notes", 10)
    DiskReplay.create(tmp_path / "small.replay", 10).close()
    with pytest.raises(StoreMismatchError, match="max_size 10"):
        DiskReplayStorage(tmp_path / "small.replay", 20)
    data = next(batches(1, 50))
    rb = ReplayBuffer(storage=DiskReplayStorage(tmp_path / "rb.replay", 100), batch_size=4)
    rb.extend(data[:10])
    wrong = data[:5].clone()
    wrong["observation"] = torch.zeros(5, 3)
    wrong["next", "observation"] = torch.zeros(5, 3)
    with pytest.raises(StoreMismatchError, match=r"'observation'.*\(4,\) float32.*\(3,\) float32"):
        rb.extend(wrong)
    with pytest.raises(SchemaMismatchError, match="'action'"):
        rb.extend(data[:5].exclude("action"))
    with pytest.raises(InvalidArgumentError, match="appends only"):
        rb.storage[3] = data[0]
    assert len(rb) == 10 and rb.storage.store.seen_size == 10
    assert_same(rb.storage.get(list(range(10))), data[:10])
    rb.storage.close()


def test_two_storages_of_one_path_in_one_process_are_refused(tmp_path):
    """Issue 35 item 8: a second DiskReplayStorage of the same path in this process meets
    the writer lock as it would in another process; the first goes on."""
    from diskreplay import StoreLockedError
    path = tmp_path / "rb.replay"
    rb = ReplayBuffer(storage=DiskReplayStorage(path, 50), sampler=RandomSampler(), batch_size=8)
    rb.extend(transitions(0, 10, {4}))
    with pytest.raises(StoreLockedError, match="this process"):
        ReplayBuffer(storage=DiskReplayStorage(path, 50), sampler=RandomSampler(), batch_size=8).extend(
            transitions(10, 12, set()))
    rb.extend(transitions(10, 20, {11}))
    assert_same(rb.storage.get(list(range(20))), transitions(0, 20, {4, 11}))
    rb.storage.close()
