"""The SLM-Lab drop-in, with stub body objects (no SLM-Lab import)."""
from types import SimpleNamespace

import numpy as np
import pytest

from diskreplay import InvalidArgumentError
from diskreplay.slm import DiskReplay as SLMReplay
from model import ReplayModel


def make_body(num_envs=1, training_start_step=3, training_frequency=2):
    algorithm = SimpleNamespace(to_train=0, training_start_step=training_start_step,
                                training_frequency=training_frequency)
    env = SimpleNamespace(is_venv=num_envs > 1, num_envs=num_envs)
    return SimpleNamespace(env=env, agent=SimpleNamespace(algorithm=algorithm))


def spec(path, **kw):
    return {"name": "Replay", "batch_size": 4, "max_size": 1e1, "use_cer": False, "path": str(path), **kw}


def seed_to_train(seen_sizes_heads, start, freq):
    """The seed's rule replayed over (seen_size, head) after each transition."""
    flags = []
    to_train = 0
    for seen_size, head in seen_sizes_heads:
        to_train = to_train or (seen_size > start and head % freq == 0)
        flags.append(bool(to_train))
    return flags


@pytest.mark.parametrize("backend", ["memmap", "hdf5"])
def test_single_env_drop_in(tmp_path, backend):
    body = make_body()
    memory = SLMReplay(spec(tmp_path / "m", backend=backend, use_cer=True), body)
    assert memory.max_size == 10 and memory.size == 0 and memory.head == -1
    model = ReplayModel(10, 1)
    for t in range(1, 14):
        s, ns = np.full(4, t, np.float32), np.full(4, t + 1, np.float32)
        memory.update(s, t % 2, 1.0, ns, t % 5 == 0)
        model.add(s, np.int64(t % 2), np.float32(1.0), ns, t % 5 == 0)
    assert (memory.size, memory.seen_size, memory.head) == (10, 13, 2)
    batch = memory.sample()
    assert batch["states"].shape == (4, 4) and memory.batch_idxs[-1] == memory.head
    want = model.get(memory.batch_idxs)
    for key in want:
        np.testing.assert_array_equal(batch[key], want[key], err_msg=key)
    memory.reset()
    assert (memory.size, memory.head, memory.seen_size) == (0, -1, 13)
    memory.close()


def test_to_train_rule_matches_the_seed(tmp_path):
    body = make_body(training_start_step=4, training_frequency=3)
    memory = SLMReplay(spec(tmp_path / "m"), body)
    got, pairs = [], []
    for t in range(1, 12):
        memory.update(np.zeros(2, np.float32), 0, 0.0, np.zeros(2, np.float32), False)
        got.append(bool(body.agent.algorithm.to_train))
        pairs.append((memory.seen_size, memory.head))
    assert got == seed_to_train(pairs, 4, 3)
    assert got.index(True) == 6  # first at seen_size 7 > 4 with head 6 % 3 == 0
    memory.close()


def test_vector_env_drop_in_and_resume(tmp_path):
    body = make_body(num_envs=3, training_start_step=0, training_frequency=4)
    memory = SLMReplay(spec(tmp_path / "m", max_size=9), body)
    model = ReplayModel(9, 3)
    for k in range(5):
        ts = np.arange(3 * k + 1, 3 * k + 4)
        states = [np.full(2, t, np.float32) for t in ts]  # lists of per-env arrays, as venvs give
        next_states = [np.full(2, t + 0.5, np.float32) for t in ts]
        memory.update(states, ts, ts * 1.0, next_states, ts % 2 == 0)
        model.add(np.stack(states), ts, (ts * 1.0).astype(np.float32), np.stack(next_states), ts % 2 == 0)
    assert (memory.size, memory.seen_size, memory.head) == (9, 15, 5)
    assert body.agent.algorithm.to_train  # head 4 hit training_frequency
    memory.close()
    reopened = SLMReplay(spec(tmp_path / "m", max_size=9), make_body(num_envs=3))
    assert (reopened.size, reopened.seen_size, reopened.head) == (9, 15, 5)
    got = reopened.store.get(np.arange(9))
    want = model.get(np.arange(9))
    for key in want:
        np.testing.assert_array_equal(got[key], want[key].astype(got[key].dtype), err_msg=key)
    reopened.close()
    with pytest.raises(InvalidArgumentError, match="3 envs"):
        SLMReplay(spec(tmp_path / "m", max_size=9), make_body(num_envs=2))


def test_spec_without_path_is_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="path"):
        SLMReplay({"batch_size": 4, "max_size": 10}, make_body())
