"""diskreplay.gym on real Gymnasium: CartPole-v1 under a short ``TimeLimit`` (so that episodes
end both ways, terminated and truncated), in ``SyncVectorEnv`` s of every autoreset mode and
as a single env. The test keeps what the env gave it, episode by episode, and compares the
store with that: ``episodes()``, and every slot's state and next state.

Tests named ``*final_observation*`` check the next state of an episode's last transition (the
final observation, not the next episode's first); they need exact next states in the core
(issue 15 item 1).
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from diskreplay import (DiskReplay, EnvProtocolError, InvalidArgumentError, NotAStoreError, PartialStepWarning,
                        ReadOnlyError, StoreMismatchError)
from diskreplay.gym import RecordTransitions, RecordVectorTransitions

LIMIT = 15           # TimeLimit of every env: random CartPole episodes end either way around it
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * np.pi / 360  # CartPole terminates beyond these


def cartpole(limit: int = LIMIT) -> gym.Env:
    env = gym.make("CartPole-v1", max_episode_steps=limit)
    assert any(isinstance(w, gym.wrappers.TimeLimit) for w in _chain(env))
    return env


def _chain(env):
    while env is not None:
        yield env
        env = getattr(env, "env", None)


def vector(num_envs: int, mode, limits=None) -> gym.vector.SyncVectorEnv:
    limits = limits or [LIMIT] * num_envs
    return gym.vector.SyncVectorEnv([lambda k=k: cartpole(k) for k in limits], autoreset_mode=mode)


class Seen:
    """What the env gave, per env: episodes of ``states`` (T + 1 rows, the last the true
    next observation), ``actions``, ``rewards``, ``terminated``, ``truncated``."""

    def __init__(self, num_envs: int):
        self.episodes = [[] for _ in range(num_envs)]

    def start(self, env: int, obs) -> None:
        self.episodes[env].append({"states": [np.array(obs)], "actions": [], "rewards": [], "terminated": [],
                                   "truncated": []})

    def step(self, env: int, action, reward, next_obs, terminated, truncated) -> None:
        ep = self.episodes[env][-1]
        ep["states"].append(np.array(next_obs))
        ep["actions"].append(action)
        ep["rewards"].append(reward)
        ep["terminated"].append(bool(terminated))
        ep["truncated"].append(bool(truncated))

    def transitions(self, env: int) -> list[tuple]:
        """``(state, action, reward, next_state, terminated, truncated)`` of env ``env``, in order."""
        out = []
        for ep in self.episodes[env]:
            for t in range(len(ep["actions"])):
                out.append((ep["states"][t], ep["actions"][t], ep["rewards"][t], ep["states"][t + 1],
                            ep["terminated"][t], ep["truncated"][t]))
        return out


def collect(envs, mode, steps: int, seed: int = 0) -> Seen:
    """Random actions for ``steps`` vector steps, keeping what the env gave as the test sees it."""
    n = envs.num_envs
    seen = Seen(n)
    obs, _ = envs.reset(seed=seed)
    envs.action_space.seed(seed)
    for e in range(n):
        seen.start(e, obs[e])
    resetting = np.zeros(n, bool)
    for _ in range(steps):
        actions = envs.action_space.sample()
        obs, rewards, terms, truncs, infos = envs.step(actions)
        ended = terms | truncs
        for e in range(n):
            if resetting[e]:  # NEXT_STEP: this step only reset env e
                assert rewards[e] == 0 and not ended[e]
                seen.start(e, obs[e])
                continue
            final = infos["final_obs"][e] if mode == AutoresetMode.SAME_STEP and ended[e] else obs[e]
            seen.step(e, actions[e], rewards[e], final, terms[e], truncs[e])
            if mode == AutoresetMode.SAME_STEP and ended[e]:
                seen.start(e, obs[e])
        if mode == AutoresetMode.NEXT_STEP:
            resetting = ended
        elif mode == AutoresetMode.DISABLED and ended.any():
            obs, _ = envs.reset(options={"reset_mask": ended.copy()})
            for e in np.flatnonzero(ended):
                seen.start(e, obs[e])
    return seen


def stored_episodes(store: DiskReplay) -> dict[int, list[dict]]:
    by_env = defaultdict(list)
    for ep in store.episodes():
        by_env[ep["env"]].append(ep)
    return by_env


def assert_episodes_match(store: DiskReplay, seen: Seen, *, final: bool) -> int:
    """The store's episodes are those the test saw (the last of an env may be cut short:
    transitions still pending, or the episode still running); ``final``: their last state
    (the final observation) too. Returns the number of ended episodes compared."""
    ended = 0
    stored = stored_episodes(store)
    for env, want in enumerate(seen.episodes):
        got = stored[env]
        assert 1 <= len(got) <= len(want)
        for k, ep in enumerate(got):
            w, length = want[k], len(ep["actions"])
            if k < len(got) - 1:
                assert ep["complete"] and length == len(w["actions"]), (env, k)
            assert length <= len(w["actions"])
            np.testing.assert_array_equal(ep["states"][:length], np.array(w["states"][:length]))
            np.testing.assert_array_equal(ep["actions"], np.array(w["actions"][:length]))
            np.testing.assert_array_equal(ep["rewards"], np.array(w["rewards"][:length], np.float32))
            np.testing.assert_array_equal(ep["dones"], w["terminated"][:length])
            np.testing.assert_array_equal(ep["truncateds"], w["truncated"][:length])
            if ep["complete"]:
                ended += 1
                last = ep["states"][length]
                if final:
                    np.testing.assert_array_equal(last, w["states"][length])
                    if ep["dones"][-1]:  # a real final observation: CartPole fell or left the track
                        assert abs(last[0]) > X_LIMIT or abs(last[2]) > THETA_LIMIT
                    else:
                        assert ep["truncateds"][-1] and length == LIMIT
    return ended


def assert_slots_match(store: DiskReplay, seen: Seen, *, ends: bool) -> None:
    """Slot ``t * num_envs + e`` holds env ``e``'s transition ``t``: its state, and as next
    state the observation the env gave for that step; ``ends``: at episode ends (the final
    observation) too, else only inside episodes."""
    n = store.num_envs
    batch = store.get(np.arange(store.size))
    per_env = store.size // n
    assert store.size == n * per_env
    checked = 0
    for e in range(n):
        for t, (state, action, reward, next_obs, term, trunc) in enumerate(seen.transitions(e)[:per_env]):
            slot = t * n + e
            np.testing.assert_array_equal(batch["states"][slot], state)
            assert batch["actions"][slot] == action and batch["rewards"][slot] == np.float32(reward)
            assert (bool(batch["dones"][slot]), bool(batch["truncateds"][slot])) == (term, trunc)
            if ends or not (term or trunc):
                np.testing.assert_array_equal(batch["next_states"][slot], next_obs, err_msg=f"env {e} step {t}")
                checked += bool(term or trunc)
    assert not ends or checked > 0


@pytest.fixture
def recorded(tmp_path, backend, request):
    """A 3-env SyncVectorEnv of the mode ``request.param`` recorded for 120 steps."""
    mode = request.param
    envs = RecordVectorTransitions(vector(3, mode), tmp_path / "c.replay", 1_000, backend=backend, seed=0)
    seen = collect(envs, mode, 120)
    yield envs, seen
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialStepWarning)
        envs.close()


@pytest.mark.parametrize("recorded", MODES, indirect=True, ids=lambda m: m.name)
def test_vector_episodes_are_those_the_env_gave(recorded):
    envs, seen = recorded
    store = envs.store
    counts = [len(seen.transitions(e)) for e in range(3)]
    # Whole steps only: each env's transitions beyond the fewest any env made are pending.
    assert store.seen_size == 3 * min(counts) and envs.pending == sum(counts) - 3 * min(counts)
    assert assert_episodes_match(store, seen, final=False) >= 12
    assert sum(bool(ep["dones"][-1]) for ep in store.episodes()) > 0  # both ends occurred
    assert sum(bool(ep["truncateds"][-1]) for ep in store.episodes()) > 0


@pytest.mark.parametrize("recorded", MODES, indirect=True, ids=lambda m: m.name)
def test_vector_next_states_inside_episodes_are_the_next_observations(recorded):
    envs, seen = recorded
    assert_slots_match(envs.store, seen, ends=False)


def spy_on_adds(store: DiskReplay) -> list[tuple]:
    """Every ``add`` call's arguments, copied, as the store receives them."""
    calls, add = [], store.add

    def spy(state, action, reward, next_state, done, **extra):
        calls.append(tuple(np.array(x, copy=True) for x in (state, action, reward, next_state, done,
                                                            extra["truncateds"])))
        return add(state, action, reward, next_state, done, **extra)

    store.add = spy
    return calls


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_vector_adds_get_the_true_next_observations(tmp_path, mode):
    """What the wrapper hands to ``add``, final observations included, whatever the store
    later derives from it: each env's transitions in order, one whole step per call."""
    envs = RecordVectorTransitions(vector(3, mode), tmp_path / "a.replay", 1_000)
    calls = spy_on_adds(envs.store)
    seen = collect(envs, mode, 120)
    ends = 0
    for e in range(3):
        for t, want in enumerate(seen.transitions(e)[:len(calls)]):
            got = [part[e] for part in calls[t]]
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
            ends += bool(want[4] or want[5])
    assert ends >= 12 and len(calls) == envs.store.seen_size // 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialStepWarning)
        envs.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_vector_env_of_one_sub_env_is_recorded(tmp_path, mode):
    """``gym.make_vec``'s default is one sub-env: its steps go to a store of one env, each
    transition the one the env gave (issue 36 item 3)."""
    envs = RecordVectorTransitions(gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync",
                                                vector_kwargs={"autoreset_mode": mode}), tmp_path / "a.replay", 1_000)
    seen = collect(envs, mode, 150)
    buf = envs.store
    want = seen.transitions(0)[:buf.seen_size]
    assert buf.num_envs == 1 and buf.seen_size == len(want) >= 140 - 10 * (mode == AutoresetMode.NEXT_STEP)
    got = buf.get(np.arange(buf.size))
    for t, (s, a, r, ns, term, trunc) in enumerate(want):
        np.testing.assert_array_equal(got["states"][t], s)
        np.testing.assert_array_equal(got["next_states"][t], ns)
        assert got["actions"][t] == a and got["rewards"][t] == r and got["dones"][t] == term
    envs.close()


class OneTorque(gym.Env):
    """An env whose action space is Box((1,)) and which takes a scalar as well (as many
    continuous-control envs do, through np.clip and float)."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps, self.last_u = 0, None
        return np.zeros(2, np.float32), {}

    def step(self, u):
        self.last_u = float(np.clip(np.asarray(u, np.float32).reshape(-1)[0], -1, 1))
        self.steps += 1
        return np.full(2, self.steps, np.float32), self.last_u, False, False, {}


def test_a_scalar_action_for_a_box_of_one_is_stored_and_a_wrong_one_refused_before_the_step(tmp_path):
    """The env takes a scalar for its Box((1,)) (issue 36 item 3): the wrapper stores it in
    the space's shape, and refuses an action the store cannot hold before the env steps."""
    env = RecordTransitions(OneTorque(), tmp_path / "p.replay", 100)
    env.reset(seed=0)
    env.step(0.5)
    env.step(np.array([-1.0], np.float32))
    with pytest.raises(EnvProtocolError, match="the env was not stepped"):
        env.step(np.zeros(3, np.float32))
    assert env.unwrapped.steps == 2 and env.unwrapped.last_u == -1.0  # the refused action never reached it
    got = env.store.get([0, 1])["actions"]
    assert got.shape == (2, 1) and got[:, 0].tolist() == [0.5, -1.0]
    env.close()


@pytest.mark.parametrize("recorded", MODES, indirect=True, ids=lambda m: m.name)
def test_vector_final_observation_is_the_next_state_of_every_episode_end(recorded):
    envs, seen = recorded
    assert_slots_match(envs.store, seen, ends=True)


@pytest.mark.parametrize("recorded", MODES, indirect=True, ids=lambda m: m.name)
def test_vector_final_observation_ends_each_episode_of_episodes(recorded):
    envs, seen = recorded
    assert_episodes_match(envs.store, seen, final=True)


def test_async_vector_envs_are_recorded_the_same(tmp_path):
    """AsyncVectorEnv (sub-envs in processes, observations through shared memory)."""
    env = gym.vector.AsyncVectorEnv([lambda: cartpole() for _ in range(2)], autoreset_mode=AutoresetMode.NEXT_STEP)
    envs = RecordVectorTransitions(env, tmp_path / "a.replay", 1_000)
    seen = collect(envs, AutoresetMode.NEXT_STEP, 80)
    assert assert_episodes_match(envs.store, seen, final=False) >= 6
    assert_slots_match(envs.store, seen, ends=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialStepWarning)
        envs.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=lambda m: m.name)
def test_the_cli_lists_the_episodes_the_env_gave(tmp_path, mode):
    """``diskreplay episodes`` and ``stats`` cut the recorded store where the env's episodes ended."""
    import json

    from click.testing import CliRunner

    from diskreplay.cli.main import main

    path = tmp_path / "c.replay"
    envs = RecordVectorTransitions(vector(2, mode), path, 1_000)
    seen = collect(envs, mode, 100)
    stored = envs.store.seen_size // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialStepWarning)
        envs.close()
    want = []
    for e in range(2):
        done = 0
        for ep in seen.episodes[e]:
            length = min(len(ep["actions"]), stored - done)
            if length <= 0:
                break
            ended = length == len(ep["actions"]) and (ep["terminated"][-1] or ep["truncated"][-1])
            want.append((e, length, float(sum(ep["rewards"][:length])), ended))
            done += length
    r = CliRunner().invoke(main, ["episodes", str(path), "--json"])
    assert r.exit_code == 0, r.output
    got = sorted((ep["env"], ep["length"], ep["return"], ep["complete"]) for ep in json.loads(r.output))
    assert got == sorted(want) and sum(w[3] for w in want) >= 8
    r = CliRunner().invoke(main, ["stats", str(path), "--json"])
    assert json.loads(r.output)["episodes"]["complete_episodes"] == sum(w[3] for w in want)


def test_next_step_transitions_wait_until_every_env_has_one(tmp_path):
    """Env 0 truncates every 3 steps and so skips a step every 4; env 1 never ends: env 1's
    transitions wait, and close() says how many it drops."""
    envs = RecordVectorTransitions(vector(2, AutoresetMode.NEXT_STEP, limits=[3, 500]), tmp_path / "w.replay", 100)
    envs.reset(seed=3)
    for step in range(1, 9):
        envs.step(np.array([step % 2, step % 2]))
    # env 0: steps 1-3, reset at 4, 5-7, reset at 8: 6 transitions; env 1: 8
    assert envs.store.seen_size == 12 and envs.pending == 2
    assert [len(ep["actions"]) for ep in envs.store.episodes(env=0)] == [3, 3]
    with pytest.warns(PartialStepWarning, match="2 transitions of envs \\[1\\]"):
        envs.close()
    with DiskReplay.open(tmp_path / "w.replay", mode="r") as store:
        assert store.seen_size == 12


class Renamed(gym.vector.VectorWrapper):
    """Gymnasium 0.29's same-step autoreset, on 1.x: the final observations under 0.29's keys."""

    def step(self, actions):
        out = self.env.step(actions)
        infos = {("final_observation" if k == "final_obs" else "_final_observation" if k == "_final_obs" else k): v
                 for k, v in out[4].items()}
        return (*out[:4], infos)


class Claims(gym.vector.VectorWrapper):
    """An env whose metadata claims an autoreset mode (or none: ``mode=None``)."""

    def __init__(self, env, mode):
        super().__init__(env)
        self.metadata = {k: v for k, v in env.metadata.items() if k != "autoreset_mode"}
        if mode is not None:
            self.metadata["autoreset_mode"] = mode


@pytest.mark.parametrize("declared", [True, False], ids=["metadata", "argument"])
def test_gymnasium_0_29_final_observation_key_is_read(tmp_path, declared):
    """Gymnasium 0.29's vector envs reset in the same step and put the final observation in
    ``infos["final_observation"]``; one written for 0.29 (no ``autoreset_mode`` metadata) is
    recorded with ``autoreset_mode=SAME_STEP``."""
    env = Renamed(vector(2, AutoresetMode.SAME_STEP))
    if not declared:
        env = Claims(env, None)
    envs = RecordVectorTransitions(env, tmp_path / "r.replay", 500,
                                   autoreset_mode=None if declared else AutoresetMode.SAME_STEP)
    seen = Seen(2)
    obs, _ = envs.reset(seed=1)
    envs.action_space.seed(1)
    for e in range(2):
        seen.start(e, obs[e])
    for _ in range(60):
        actions = envs.action_space.sample()
        obs, rewards, terms, truncs, infos = envs.step(actions)
        for e in range(2):
            ended = terms[e] or truncs[e]
            seen.step(e, actions[e], rewards[e], infos["final_observation"][e] if ended else obs[e], terms[e], truncs[e])
            if ended:
                seen.start(e, obs[e])
    assert "final_obs" not in infos and envs.store.seen_size == 120
    assert assert_episodes_match(envs.store, seen, final=False) >= 4
    assert_slots_match(envs.store, seen, ends=False)
    envs.close()


# ---------------------------------------------------------------------- one env
def collect_single(env, steps: int, *, autoreset: bool = False, seed: int = 0) -> Seen:
    seen = Seen(1)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    seen.start(0, obs)
    resetting = False
    for _ in range(steps):
        action = env.action_space.sample()
        obs, reward, term, trunc, _ = env.step(action)
        if resetting:
            seen.start(0, obs)
            resetting = False
            continue
        seen.step(0, action, reward, obs, term, trunc)
        if term or trunc:
            if autoreset:
                resetting = True
            else:
                obs, _ = env.reset()
                seen.start(0, obs)
    return seen


@pytest.mark.parametrize("autoreset", [False, True], ids=["reset", "Autoreset"])
def test_single_env_episodes_are_those_the_env_gave(tmp_path, backend, autoreset):
    base = gym.wrappers.Autoreset(cartpole()) if autoreset else cartpole()
    env = RecordTransitions(base, tmp_path / "s.replay", 500, backend=backend)
    seen = collect_single(env, 150, autoreset=autoreset)
    assert env.store.num_envs == 1 and env.store.seen_size == len(seen.transitions(0))
    assert assert_episodes_match(env.store, seen, final=False) >= 6
    assert_slots_match(env.store, seen, ends=False)
    env.close()


@pytest.mark.parametrize("autoreset", [False, True], ids=["reset", "Autoreset"])
def test_single_env_final_observation_is_stored(tmp_path, autoreset):
    base = gym.wrappers.Autoreset(cartpole()) if autoreset else cartpole()
    env = RecordTransitions(base, tmp_path / "s.replay", 500)
    seen = collect_single(env, 150, autoreset=autoreset)
    assert_episodes_match(env.store, seen, final=True)
    assert_slots_match(env.store, seen, ends=True)
    env.close()


@pytest.mark.parametrize("autoreset", [False, True], ids=["reset", "Autoreset"])
def test_single_env_adds_get_the_true_next_observations(tmp_path, autoreset):
    base = gym.wrappers.Autoreset(cartpole()) if autoreset else cartpole()
    env = RecordTransitions(base, tmp_path / "s.replay", 500)
    calls = spy_on_adds(env.store)
    seen = collect_single(env, 150, autoreset=autoreset)
    want = seen.transitions(0)
    assert len(calls) == len(want) and sum(t[4] or t[5] for t in want) >= 6
    for got, w in zip(calls, want):
        for g, x in zip(got, w):
            np.testing.assert_array_equal(g, x)
    env.close()


class SameStepAutoreset(gym.Wrapper):
    """Gymnasium 0.29's ``AutoResetWrapper``: resets in the ending step, the final observation in info."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            final, final_info = obs, info
            obs, info = self.env.reset()
            info = dict(info, final_observation=final, final_info=final_info)
        return obs, reward, terminated, truncated, info


def test_single_env_same_step_autoreset_gives_its_final_observation(tmp_path):
    env = RecordTransitions(SameStepAutoreset(cartpole()), tmp_path / "s.replay", 500)
    calls = spy_on_adds(env.store)
    seen = Seen(1)
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    seen.start(0, obs)
    for _ in range(100):
        action = env.action_space.sample()
        obs, reward, term, trunc, info = env.step(action)
        seen.step(0, action, reward, info["final_observation"] if term or trunc else obs, term, trunc)
        if term or trunc:
            seen.start(0, obs)
    want = seen.transitions(0)
    assert len(calls) == len(want) == 100 and sum(t[4] or t[5] for t in want) >= 5
    for got, w in zip(calls, want):
        for g, x in zip(got, w):
            np.testing.assert_array_equal(g, x)
    assert assert_episodes_match(env.store, seen, final=False) >= 5
    env.close()


def test_single_env_reset_mid_episode_final_observation_ends_the_episode(tmp_path):
    """An episode abandoned by ``reset()`` has no mark; the store ends it where its last next
    state (the last observation given) is not the next transition's state (the reset one)."""
    env = RecordTransitions(cartpole(limit=500), tmp_path / "m.replay", 100)
    obs, _ = env.reset(seed=0)
    given = [obs]
    for action in (0, 1, 0):
        given.append(env.step(action)[0])
    env.reset(seed=1)
    env.step(1)
    episodes = list(env.store.episodes())
    assert [len(ep["actions"]) for ep in episodes] == [3, 1]
    np.testing.assert_array_equal(episodes[0]["states"], np.array(given))
    assert not episodes[0]["dones"].any() and not episodes[0]["truncateds"].any()
    env.close()


def test_a_store_resumes_and_an_open_store_is_written_but_not_closed(tmp_path):
    path = tmp_path / "r.replay"
    env = RecordTransitions(cartpole(), path, 100)
    env.reset(seed=0)
    for _ in range(5):
        env.step(0)
    env.close()
    env = RecordTransitions(cartpole(), path)  # resumes: no max_size needed
    env.reset(seed=1)
    env.step(1)
    assert env.store.seen_size == 6
    env.close()
    with DiskReplay.open(path) as store:
        wrapped = RecordTransitions(cartpole(), store)
        wrapped.reset(seed=2)
        wrapped.step(0)
        wrapped.close()
        assert not store.closed and store.seen_size == 7


# ---------------------------------------------------------------------- bad input, refused when built
def test_a_vector_env_in_the_single_wrapper_and_the_reverse_are_refused(tmp_path):
    with pytest.raises(EnvProtocolError, match="use RecordVectorTransitions"):
        RecordTransitions(vector(2, AutoresetMode.NEXT_STEP), tmp_path / "v.replay", 10)
    with pytest.raises(EnvProtocolError, match="use RecordTransitions"):
        RecordVectorTransitions(cartpole(), tmp_path / "s.replay", 10)
    assert os.listdir(tmp_path) == []


def test_spaces_a_store_cannot_hold_are_refused(tmp_path):
    env = gym.wrappers.TransformObservation(
        cartpole(), lambda o: {"pos": o}, gym.spaces.Dict({"pos": cartpole().observation_space}))
    with pytest.raises(EnvProtocolError, match="Dict.*FlattenObservation"):
        RecordTransitions(env, tmp_path / "d.replay", 10)
    assert not os.path.exists(tmp_path / "d.replay")


def test_paths_that_are_not_stores_are_refused_and_left_alone(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("not a store")
    with pytest.raises(NotAStoreError):
        RecordVectorTransitions(vector(2, AutoresetMode.NEXT_STEP), tmp_path / "notes", 10)
    assert os.listdir(tmp_path / "notes") == ["todo.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotAStoreError):
        RecordTransitions(cartpole(), tmp_path / "file", 10)
    with pytest.raises(InvalidArgumentError, match="max_size"):
        RecordTransitions(cartpole(), tmp_path / "new.replay")
    with pytest.raises(InvalidArgumentError, match="store path"):
        RecordTransitions(cartpole(), 42, 10)


def test_stores_that_do_not_match_the_env_are_refused_naming_both(tmp_path):
    DiskReplay.create(tmp_path / "o.replay", 10, fields={
        "states": ((4,), np.float64), "actions": ((), np.int64), "rewards": ((), np.float32),
        "dones": ((), bool), "truncateds": ((), bool)}).close()
    with pytest.raises(StoreMismatchError, match=r"states \(4,\) float64.*states \(4,\) float32"):
        RecordTransitions(cartpole(), tmp_path / "o.replay")
    DiskReplay.create(tmp_path / "t.replay", 10, fields={
        "states": ((4,), np.float32), "actions": ((), np.int64), "rewards": ((), np.float32),
        "dones": ((), bool)}).close()
    with pytest.raises(StoreMismatchError, match="truncateds"):
        RecordTransitions(cartpole(), tmp_path / "t.replay")
    RecordTransitions(cartpole(), tmp_path / "one.replay", 10).close()
    with pytest.raises(StoreMismatchError, match="num_envs 1.*n_envs 2"):
        RecordVectorTransitions(vector(2, AutoresetMode.NEXT_STEP), tmp_path / "one.replay")
    with pytest.raises(StoreMismatchError, match="max_size 10 with num_envs 1.*20 with n_envs 1"):
        RecordTransitions(cartpole(), tmp_path / "one.replay", 20)
    with DiskReplay.open(tmp_path / "one.replay", mode="r") as ro:
        with pytest.raises(ReadOnlyError):
            RecordTransitions(cartpole(), ro)
    with DiskReplay.open(tmp_path / "one.replay", mode="r") as ro:
        assert ro.seen_size == 0


def test_unknown_or_missing_autoreset_modes_are_refused(tmp_path):
    env = Claims(vector(2, AutoresetMode.NEXT_STEP), None)
    with pytest.raises(EnvProtocolError, match="no metadata\\['autoreset_mode'\\].*autoreset_mode="):
        RecordVectorTransitions(env, tmp_path / "m.replay", 10)
    envs = RecordVectorTransitions(env, tmp_path / "m.replay", 10, autoreset_mode=AutoresetMode.NEXT_STEP)
    envs.close()
    env = Claims(vector(2, AutoresetMode.NEXT_STEP), "Sometimes")
    with pytest.raises(EnvProtocolError, match="'Sometimes', not a gymnasium.vector.AutoresetMode"):
        RecordVectorTransitions(env, tmp_path / "m.replay", 10)
    with pytest.raises(EnvProtocolError, match="SAME_STEP.*says.*NEXT_STEP"):
        RecordVectorTransitions(vector(2, AutoresetMode.NEXT_STEP), tmp_path / "m.replay", 10,
                                autoreset_mode=AutoresetMode.SAME_STEP)


def test_steps_that_break_the_protocol_are_refused_and_store_nothing(tmp_path):
    envs = RecordVectorTransitions(vector(2, AutoresetMode.NEXT_STEP), tmp_path / "v.replay", 100)
    with pytest.raises(EnvProtocolError, match="reset\\(\\) before step\\(\\)"):
        envs.step(np.array([0, 1]))
    envs.close()
    env = RecordTransitions(cartpole(limit=2), tmp_path / "s.replay", 100)
    env.reset(seed=0)
    env.step(0)
    assert env.step(0)[3]  # truncated
    with pytest.raises(EnvProtocolError, match="reset\\(\\) before step\\(\\).*ended"):
        env.step(0)
    assert env.store.seen_size == 2
    env.close()

    class Stripped(gym.vector.VectorWrapper):  # a same-step autoreset that loses its final observations
        def step(self, actions):
            out = self.env.step(actions)
            return (*out[:4], {k: v for k, v in out[4].items() if "final" not in k})

    envs = RecordVectorTransitions(Stripped(vector(2, AutoresetMode.SAME_STEP, limits=[2, 2])), tmp_path / "x.replay", 100)
    envs.reset(seed=0)
    envs.step(np.array([0, 0]))
    with pytest.raises(EnvProtocolError, match="no final_obs or final_observation"):
        envs.step(np.array([0, 0]))
    assert envs.store.seen_size == 2
    envs.close()

    # A same-step env whose metadata claims NEXT_STEP: found at its first episode end.
    envs = RecordVectorTransitions(Claims(vector(2, AutoresetMode.SAME_STEP, limits=[2, 2]), AutoresetMode.NEXT_STEP),
                                   tmp_path / "y.replay", 100)
    envs.reset(seed=0)
    envs.step(np.array([0, 0]))
    with pytest.raises(EnvProtocolError, match="infos hold final observations"):
        envs.step(np.array([0, 0]))
    assert envs.store.seen_size == 2
    envs.close()


def test_importing_diskreplay_does_not_import_gymnasium():
    code = "import sys, diskreplay; print('gymnasium' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
