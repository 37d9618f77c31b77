"""diskreplay.sb3.DiskReplayBuffer on the real Stable-Baselines3: trained with DQN and SAC,
its contents compared with SB3's own ReplayBuffer fed the same calls."""
from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from diskreplay import DiskReplay, EnvProtocolError, InvalidArgumentError, NotAStoreError, SchemaMismatchError, StoreLockedError, StoreMismatchError, StoreNotFoundError
from diskreplay.sb3 import DiskReplayBuffer
from old_finals import contents as old_finals_contents, write_old_finals

torch.set_num_threads(1)  # small networks: threads only fight over the shared cores


class Twinned(DiskReplayBuffer):
    """A DiskReplayBuffer that also feeds SB3's own ReplayBuffer every add it gets."""

    def __init__(self, buffer_size, observation_space, action_space, **kwargs):
        super().__init__(buffer_size, observation_space, action_space, **kwargs)
        self.twin = ReplayBuffer(buffer_size, observation_space, action_space, device=kwargs.get("device", "cpu"),
                                 n_envs=kwargs.get("n_envs", 1), handle_timeout_termination=True)

    def add(self, *args):
        self.twin.add(*copy.deepcopy(args))
        super().add(*args)


def short_cartpole(n_envs: int, seed: int = 0):
    """CartPole-v1 cut at 15 steps, so that episodes end both terminated and truncated."""
    return make_vec_env("CartPole-v1", n_envs=n_envs, seed=seed, env_kwargs={"max_episode_steps": 15})


def assert_same_contents(buf: DiskReplayBuffer, twin: ReplayBuffer) -> None:
    assert (buf.pos, buf.full, buf.size()) == (twin.pos, twin.full, twin.size())
    ours = buf.arrays()
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        theirs = getattr(twin, name)
        assert ours[name].shape == theirs.shape and ours[name].dtype == theirs.dtype, name
        np.testing.assert_array_equal(ours[name], theirs, err_msg=name)


@pytest.mark.parametrize("n_envs", [1, 4])
def test_dqn_trains_and_holds_what_sb3s_buffer_holds(tmp_path, backend, n_envs):
    env = short_cartpole(n_envs)
    model = DQN("MlpPolicy", env, buffer_size=1000, learning_starts=100, seed=0, device="cpu",
                exploration_final_eps=0.5,  # a greedy untrained policy may never reach the time limit
                replay_buffer_class=Twinned, replay_buffer_kwargs={"path": tmp_path / "dqn.replay", "backend": backend})
    model.learn(2000)
    buf = model.replay_buffer
    assert buf.full and buf.store.seen_size >= 2000 and buf.store.backend == backend
    twin = buf.twin
    assert twin.timeouts.any() and (twin.dones * (1 - twin.timeouts)).any()  # both kinds of episode end
    assert_same_contents(buf, twin)


def test_samples_have_sb3s_types_and_the_sampled_rows_values(tmp_path):
    env = short_cartpole(2)
    model = DQN("MlpPolicy", env, buffer_size=600, learning_starts=50, seed=1, device="cpu",
                replay_buffer_class=Twinned, replay_buffer_kwargs={"path": tmp_path / "dqn.replay"})
    model.learn(400)
    buf, twin = model.replay_buffer, model.replay_buffer.twin
    ours, theirs = buf.sample(64), twin.sample(64)
    assert type(ours) is type(theirs)
    for a, b in zip(ours, theirs):
        if b is None:
            assert a is None
            continue
        assert isinstance(a, torch.Tensor) and (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
    rows, envs = np.divmod(buf.store.batch_idxs, 2)
    np.testing.assert_array_equal(ours.observations.numpy(), twin.observations[rows, envs])
    np.testing.assert_array_equal(ours.next_observations.numpy(), twin.next_observations[rows, envs])
    np.testing.assert_array_equal(ours.actions.numpy(), twin.actions[rows, envs])
    np.testing.assert_array_equal(ours.rewards.numpy()[:, 0], twin.rewards[rows, envs])
    np.testing.assert_array_equal(ours.dones.numpy()[:, 0], twin.dones[rows, envs] * (1 - twin.timeouts[rows, envs]))


def test_vecnormalize_is_applied_as_sb3_applies_it(tmp_path):
    env = VecNormalize(short_cartpole(1), norm_obs=True, norm_reward=True)
    model = DQN("MlpPolicy", env, buffer_size=500, learning_starts=50, seed=2, device="cpu",
                replay_buffer_class=Twinned, replay_buffer_kwargs={"path": tmp_path / "dqn.replay"})
    model.learn(300)
    buf = model.replay_buffer
    inds = np.arange(0, 300, 7)
    for a, b in zip(buf._get_samples(inds, env), buf.twin._get_samples(inds, env)):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sac_on_pendulum_with_box_actions(tmp_path):
    model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=1000, learning_starts=100, batch_size=64, seed=0,
                device="cpu", replay_buffer_class=Twinned, replay_buffer_kwargs={"path": tmp_path / "sac.replay"})
    model.learn(250)
    buf = model.replay_buffer
    assert buf.store.seen_size == 250 and buf.store.fields["actions"] == ((1,), np.dtype(np.float32))
    assert_same_contents(buf, buf.twin)
    sample = buf.sample(16)
    assert sample.actions.dtype == torch.float32 and sample.actions.shape == (16, 1)


def test_save_and_load_replay_buffer_write_a_reference_not_a_copy(tmp_path):
    path = tmp_path / "dqn.replay"
    model = DQN("MlpPolicy", short_cartpole(1), buffer_size=5000, learning_starts=100, seed=3, device="cpu",
                replay_buffer_class=DiskReplayBuffer, replay_buffer_kwargs={"path": path})
    model.learn(2000)
    before = model.replay_buffer.arrays()
    pkl = tmp_path / "buffer.pkl"
    model.save_replay_buffer(pkl)
    assert os.path.getsize(pkl) < 4096  # 2000 transitions of 4 float32 states would be ~70 KB
    # One writer per store in a process too (issue 35 item 8): loading while the model's
    # buffer holds the store is refused, saying what to do, and changes nothing.
    with pytest.raises(StoreLockedError, match="model.replay_buffer.close()"):
        model.load_replay_buffer(pkl)
    assert model.replay_buffer.store.seen_size == 2000 and not model.replay_buffer.store.closed
    # After the store is closed (as after a crash), loading reopens it.
    model.replay_buffer.close()
    model.load_replay_buffer(pkl)
    loaded = model.replay_buffer
    assert isinstance(loaded, DiskReplayBuffer) and not loaded.store.closed
    after = loaded.arrays()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    model.learn(200, reset_num_timesteps=False)  # and training goes on with it
    assert loaded.store.seen_size == 2200


def test_loading_a_buffer_whose_store_is_gone_is_an_error(tmp_path):
    """A saved DiskReplayBuffer refers to its store; loading it where the store is not (deleted,
    another machine) raises StoreNotFoundError and creates nothing there (issue 36 item 1)."""
    import pickle
    import shutil
    path = tmp_path / "gone.replay"
    buf = _filled(path)
    saved = pickle.dumps(buf)
    buf.close()
    shutil.rmtree(path)
    with pytest.raises(StoreNotFoundError, match="copy the store to that path"):
        pickle.loads(saved)
    assert not os.path.exists(path)


def _filled(path, seed=7) -> DiskReplayBuffer:
    env = gym.make("CartPole-v1")
    buf = DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", path=path, seed=seed)
    obs = np.zeros((1, 4), np.float32)
    for i in range(30):
        done = i % 10 == 9  # an episode end: its next observation is not the next step's observation
        buf.add(obs + i, obs + i + 1 + 100 * done, np.array([i % 2]), np.array([1.0]), np.array([done]),
                [{"TimeLimit.truncated": i == 19}])
    return buf


def test_an_existing_store_resumes_and_sampling_continues(tmp_path):
    uninterrupted = _filled(tmp_path / "a.replay")
    for _ in range(2):
        uninterrupted.sample(5)
    expected = uninterrupted.sample(5)
    buf = _filled(tmp_path / "b.replay")
    contents = buf.arrays()
    for _ in range(2):
        buf.sample(5)
    state = pickle.dumps(buf)
    buf.close()
    resumed = pickle.loads(state)  # as load_replay_buffer in a new process
    assert resumed.pos == 30 and not resumed.full
    for name, arr in resumed.arrays().items():
        np.testing.assert_array_equal(arr, contents[name])
    for a, b in zip(resumed.sample(5), expected):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the episode ends keep their own next observations, not the next episode's first
    assert contents["next_observations"][9, 0, 0] == 110 and contents["observations"][10, 0, 0] == 10
    assert contents["dones"][9, 0] == 1 and contents["timeouts"][19, 0] == 1
    resumed.close()
    env = gym.make("CartPole-v1")
    again = DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", path=tmp_path / "b.replay")
    assert again.size() == 30
    again.close()


def _step(i: int, n_envs: int = 2):
    """Step ``i`` of ``n_envs`` hand-made envs: env ``e`` is at ``10 * i + e``; its episode ends
    at step ``i`` when ``(i + e) % 4 == 3`` (a timeout when also ``i % 8 == 7 - e``), and its
    final observation ``1000 + 10 * i + e`` is not the next step's observation."""
    obs = np.repeat(10 * i + np.arange(n_envs, dtype=np.float32)[:, None], 4, axis=1)
    done = (i + np.arange(n_envs)) % 4 == 3
    next_obs = np.where(done[:, None], 1000 + obs, obs + 10)
    infos = [{"TimeLimit.truncated": bool(done[e] and i % 8 == 7 - e)} for e in range(n_envs)]
    return obs, next_obs, np.arange(n_envs)[:, None] % 2, np.ones(n_envs, np.float32), done, infos


def test_final_observations_come_back_as_next_observations_after_a_reopen(tmp_path):
    """The true final observation of an episode end, passed to add, is the row's next
    observation after the buffer is closed and reopened (no kill), before and after the
    next step; the last step before the close ends an episode."""
    env = gym.make("CartPole-v1")
    path = tmp_path / "b.replay"
    twin = ReplayBuffer(100, env.observation_space, env.action_space, device="cpu", n_envs=2)
    buf = DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", n_envs=2, path=path, seed=3)
    for i in range(12):  # step 11 ends env 0's episode
        twin.add(*copy.deepcopy(_step(i)))
        buf.add(*_step(i))
    assert _step(11)[4][0]
    buf.close()
    for more in (0, 5):  # reopened as it was, then after steps whose observations jump
        buf = DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", n_envs=2, path=path)
        for i in range(12, 12 + more):
            twin.add(*copy.deepcopy(_step(i)))
            buf.add(*_step(i))
        assert_same_contents(buf, twin)
        ends = np.flatnonzero(twin.dones[:buf.pos].reshape(-1))
        np.testing.assert_array_equal(buf.arrays()["next_observations"].reshape(-1, 4)[ends, 0],
                                      1000 + twin.observations.reshape(-1, 4)[ends, 0])
        np.random.seed(more)  # SB3's _get_samples draws each row's env from numpy's global generator
        got = buf._get_samples(np.arange(buf.pos)).next_observations.numpy()
        np.random.seed(more)
        envs = np.random.randint(0, 2, size=buf.pos)
        np.testing.assert_array_equal(got, twin.next_observations[np.arange(buf.pos), envs])
        sample = buf.sample(64)
        rows, envs = np.divmod(buf.store.batch_idxs, 2)
        assert twin.dones[rows, envs].any()
        np.testing.assert_array_equal(sample.next_observations.numpy(), twin.next_observations[rows, envs])
        # from the jump ring: every episode end but the newest step's (its next states are the ns_buffer's)
        older = ends[ends < buf.store.head + 1 - 2]
        assert len(older) and buf.store.get(older, fields="jumps")["jumps"].all()
        buf.close()


def test_an_old_finals_side_store_beside_the_buffer_is_ignored(tmp_path):
    """A buffer that a version up to 497696e wrote kept final observations in ``<path>.finals``
    too: it opens, its next observations come from the store's jump ring, not from that side
    store (whose states here are wrong), and the side store is neither read, changed nor removed."""
    path = tmp_path / "b.replay"
    _filled(path).close()
    assert os.listdir(tmp_path) == ["b.replay"]  # this version keeps none
    # the rows the old code wrote: each episode end's transition number (rows 9, 19, 29)
    side = write_old_finals(path, [(number, np.full(4, -7.0)) for number in (10, 20, 30)])
    before = old_finals_contents(side)
    env = gym.make("CartPole-v1")
    buf = DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", path=path)
    expected = np.arange(1, 31) + 100 * (np.arange(30) % 10 == 9)  # 110, 120, 130 at the ends
    np.testing.assert_array_equal(buf.arrays()["next_observations"][:30, 0, 0], expected)
    np.testing.assert_array_equal(buf._get_samples(np.array([9, 19, 29, 3])).next_observations.numpy()[:, 0],
                                  [110, 120, 130, 4])
    buf.add(np.full((1, 4), 500.0), np.full((1, 4), 501.0), np.array([0]), np.array([1.0]), np.array([False]), [{}])
    assert buf.arrays()["next_observations"][29, 0, 0] == 130  # now a jump: the new step starts elsewhere
    assert buf.store.get(np.array([9, 19, 29]), fields="jumps")["jumps"].all()
    buf.close()
    with DiskReplay.open(path, mode="r") as store:  # the store alone has them
        np.testing.assert_array_equal(store.get(np.array([9, 19, 29]), fields="next_states")["next_states"][:, 0],
                                      [110, 120, 130])
    assert old_finals_contents(side) == before


def test_optimize_memory_usage_with_timeouts_is_accepted(tmp_path):
    model = DQN("MlpPolicy", short_cartpole(1), buffer_size=500, learning_starts=50, seed=4, device="cpu",
                optimize_memory_usage=True, replay_buffer_class=DiskReplayBuffer,
                replay_buffer_kwargs={"path": tmp_path / "opt.replay", "handle_timeout_termination": True})
    model.learn(200)
    assert model.replay_buffer.optimize_memory_usage and model.replay_buffer.store.seen_size == 200


def test_infos_as_sb3s_own_buffer_takes_them(tmp_path):
    """A list of dicts (SB3's VecEnv), a Gymnasium vector env's infos dict (CleanRL's loop passes
    that), an empty dict; with handle_timeout_termination off, infos is not read at all, as in
    SB3's ReplayBuffer (issue 36 item 1)."""
    env = gym.make("CartPole-v1")
    obs = np.zeros((2, 4), np.float32)
    step = (obs, obs + 1, np.array([[0], [1]]), np.ones(2, np.float32), np.array([False, True]))
    buf = DiskReplayBuffer(10, env.observation_space, env.action_space, device="cpu", n_envs=2,
                           path=tmp_path / "a.replay")
    try:
        buf.add(*step, [{"TimeLimit.truncated": True}, {}])
        buf.add(*step, {"TimeLimit.truncated": np.array([True, True]), "_TimeLimit.truncated": np.array([False, True])})
        buf.add(*step, {})
        with pytest.raises(SchemaMismatchError, match="infos"):
            buf.add(*step, [{}])  # a list must have one dict per env
        assert buf.store.get([0, 1, 2, 3, 4, 5])["timeouts"].tolist() == [True, False, False, True, False, False]
    finally:
        buf.close()
    buf = DiskReplayBuffer(10, env.observation_space, env.action_space, device="cpu", n_envs=2,
                           path=tmp_path / "b.replay", handle_timeout_termination=False)
    try:
        buf.add(*step, {"episode": {"r": np.ones(2)}})  # CleanRL: handle_timeout_termination=False
        buf.add(*step, [{}])
        assert buf.store.seen_size == 4 and not buf.store.get([0, 1, 2, 3])["timeouts"].any()
    finally:
        buf.close()


# ---------------------------------------------------------------------- bad input, refused when built
def test_bad_spaces_and_paths_are_refused_when_the_buffer_is_built(tmp_path):
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    act = gym.spaces.Discrete(2)
    with pytest.raises(InvalidArgumentError, match="path"):
        DiskReplayBuffer(10, box, act, device="cpu")
    with pytest.raises(EnvProtocolError, match="FlattenObservation"):
        DiskReplayBuffer(10, gym.spaces.Dict({"a": box}), act, device="cpu", path=tmp_path / "dict.replay")
    with pytest.raises(EnvProtocolError, match="Text"):
        DiskReplayBuffer(10, gym.spaces.Text(5), act, device="cpu", path=tmp_path / "text.replay")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("not a store")
    with pytest.raises(NotAStoreError):
        DiskReplayBuffer(10, box, act, device="cpu", path=tmp_path / "notes")
    assert os.listdir(tmp_path / "notes") == ["todo.txt"]
    DiskReplay.create(tmp_path / "other.replay", 10, fields={"states": ((4,), np.uint8), "actions": ((1,), np.int64),
                      "rewards": ((), np.float32), "dones": ((), bool)}).close()
    with pytest.raises(StoreMismatchError, match=r"states \(4,\) uint8.*states \(3,\) float32"):
        DiskReplayBuffer(10, box, act, device="cpu", path=tmp_path / "other.replay")
    DiskReplayBuffer(10, box, act, device="cpu", path=tmp_path / "small.replay").close()
    with pytest.raises(StoreMismatchError, match="max_size 10 with num_envs 1.*20 with n_envs 1"):
        DiskReplayBuffer(20, box, act, device="cpu", path=tmp_path / "small.replay")


def test_bad_adds_raise_and_leave_the_store_as_it_was(tmp_path):
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    buf = DiskReplayBuffer(10, box, gym.spaces.Discrete(2), device="cpu", path=tmp_path / "b.replay")
    good = np.zeros((1, 3), np.float32)
    buf.add(good, good, np.array([1]), np.array([0.5]), np.array([False]), [{}])
    with pytest.raises(SchemaMismatchError, match=r"\(1, 3\)"):
        buf.add(np.zeros((1, 4)), good, np.array([1]), np.array([0.5]), np.array([False]), [{}])
    with pytest.raises(SchemaMismatchError, match="infos"):
        buf.add(good, good, np.array([1]), np.array([0.5]), np.array([False]), [])
    assert buf.store.seen_size == 1 and buf.size() == 1
    buf.close()


def test_importing_diskreplay_does_not_import_sb3_or_torch():
    code = "import sys, diskreplay; print(sorted(m for m in ('torch', 'stable_baselines3', 'gymnasium') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_two_buffers_of_one_path_in_one_process_are_refused_as_across_processes(tmp_path):
    """Issue 35 item 8: two models built with the same buffer path used to share one live
    store (each saw the other's transitions; closing one closed the other's)."""
    env = gym.make("CartPole-v1")
    first = DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", path=tmp_path / "b")
    with pytest.raises(StoreLockedError, match="this process"):
        DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", path=tmp_path / "b")
    with pytest.raises(StoreLockedError, match="this process"):
        DQN("MlpPolicy", short_cartpole(1), buffer_size=100, device="cpu",
            replay_buffer_class=DiskReplayBuffer, replay_buffer_kwargs={"path": tmp_path / "b"})
    obs = np.zeros((1, 4), np.float32)
    first.add(obs, obs + 1, np.array([0]), np.array([1.0]), np.array([False]), [{}])
    assert first.size() == 1 and not first.store.closed
    first.close()
    again = DiskReplayBuffer(100, env.observation_space, env.action_space, device="cpu", path=tmp_path / "b")
    assert again.size() == 1
    again.close()
