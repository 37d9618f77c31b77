"""Gymnasium: wrappers that write every step into a store as it happens (a dataset collector
for offline RL). ``RecordTransitions`` wraps one env, ``RecordVectorTransitions`` a vector env.

    envs = gymnasium.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    envs = RecordVectorTransitions(envs, "runs/cartpole.replay", max_size=100_000)

Each transition is stored as README.md ("Gymnasium") tells users to store one by hand:
``dones`` is ``terminated`` (the bootstrapping mask), the bool field ``truncateds`` is
``truncated`` (episodes.py ends episodes at either), and the next state is the true next
observation, the final one at an episode end, never the next episode's first.

Vector envs reset their sub-envs themselves, in one of Gymnasium's autoreset modes (read
from ``env.metadata["autoreset_mode"]``):

- ``NEXT_STEP`` (Gymnasium 1.x's default): the step after an episode end only resets that
  env; it returns the reset observation and is no transition. The store adds one whole step
  of ``num_envs`` transitions at a time (env ``e``'s k-th transition at step k), so the
  transitions of envs that did not skip wait in memory (``pending``) until every env has
  one: at most one per episode end that another env had and they did not.
- ``SAME_STEP`` (Gymnasium 0.29's behaviour): the ended env is reset in the same step, its
  final observation is in ``infos["final_obs"]`` (or 0.29's ``"final_observation"``, which
  vector envs written for 0.29 still use: pass ``autoreset_mode=SAME_STEP`` for them).
- ``DISABLED``: the caller resets ended envs with ``reset(options={"reset_mask": ...})``.

Importing this module imports gymnasium (>= 1.1, which has ``AutoresetMode``).
"""
from __future__ import annotations

import os
import warnings
from collections import deque

import gymnasium
import numpy as np

from .envspaces import check_store, open_or_create, space_field
from .core.episodes import TRUNCATION_FIELD
from .errors import EnvProtocolError, InvalidArgumentError, PartialStepWarning, ReadOnlyError
from .store import DiskReplay

NEXT_STEP, SAME_STEP, DISABLED = "NextStep", "SameStep", "Disabled"  # gymnasium.vector.AutoresetMode values
# Where a same-step autoreset puts the final observations: Gymnasium 1.x, then 0.29.
FINAL_OBS_KEYS = ("final_obs", "final_observation")


def transition_fields(observation_space, action_space, holder: str) -> dict:
    """The store's fields for transitions of an env with these (single-env) spaces."""
    return {"states": space_field(observation_space, "observation", holder),
            "actions": space_field(action_space, "action", holder),
            "rewards": ((), np.dtype(np.float32)), "dones": ((), np.dtype(bool)),
            TRUNCATION_FIELD: ((), np.dtype(bool))}


def _stored_action(action, shape: tuple, holder: str):
    """The action as the store keeps it, checked before the env steps: as given when its
    shape is the action space's; reshaped when it holds as many numbers (a scalar for a
    ``Box((1,))``, which the env takes too); else ``EnvProtocolError``, nothing stepped."""
    arr = np.asarray(action)
    if arr.shape == tuple(shape):
        return action
    if arr.size == int(np.prod(shape)) and arr.dtype.kind in "biuf":
        return arr.reshape(shape)
    raise EnvProtocolError(f"{holder}: the action {action!r} has shape {arr.shape}, the action space's is "
                           f"{tuple(shape)}; the env was not stepped")


def _store_for(path, fields: dict, num_envs: int, max_size, options: dict, holder: str) -> tuple[DiskReplay, bool]:
    """``(store, owned)``: an open ``DiskReplay`` given as ``path`` (checked, not owned), or
    the store at ``path`` resumed or created (owned: the wrapper closes it)."""
    if isinstance(path, DiskReplay):
        if path.mode != "r+":
            raise ReadOnlyError(f"{holder} writes to its store, but {path.path} is open read-only (mode='r')")
        check_store(path, fields, num_envs, max_size, asker=holder)
        return path, False
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"{holder} needs a store path or an open DiskReplay, got {path!r}")
    return open_or_create(path, fields, num_envs, max_size, asker=holder, **options), True


class _Recording:
    """What both wrappers share: the store, ``flush`` and closing it with the env."""

    store: DiskReplay
    _owned: bool

    def flush(self) -> None:
        """Make every stored transition survive a power cut (``DiskReplay.flush``)."""
        self.store.flush()

    def _close_store(self) -> None:
        if self._owned and not self.store.closed:
            self.store.close()


def _autoreset_wrapped(env) -> bool:
    """Whether ``env`` is inside Gymnasium 1.x's ``Autoreset`` wrapper (next-step autoreset)."""
    autoreset = getattr(gymnasium.wrappers, "Autoreset", None)
    while autoreset is not None and env is not None:
        if isinstance(env, autoreset):
            return True
        env = getattr(env, "env", None)
    return False


def _final_observation(info: dict):
    """The final observation a same-step autoreset left in ``info``, or None."""
    for key in FINAL_OBS_KEYS:
        if key in info:
            return info[key]
    return None


class RecordTransitions(gymnasium.Wrapper, _Recording):
    """Records every step of one env into the store at ``path`` (``num_envs=1``).

    ``path`` is a store directory: an existing store resumes (its fields must be those of
    the env's spaces: ``StoreMismatchError`` otherwise), else one of ``max_size`` slots is
    created (``backend``, ``seed``, ``flush_every`` as in ``DiskReplay.create``); or an open
    ``DiskReplay`` (mode ``"r+"``), which the wrapper then does not close. ``close()``
    closes the store it opened, then the env.

    A step after an episode end needs a ``reset()`` first (``EnvProtocolError``), unless the
    env autoresets: inside ``gymnasium.wrappers.Autoreset`` that step is the reset and is
    not stored; an autoreset that leaves ``final_observation`` in ``info`` (Gymnasium 0.29)
    gives that as the next state.
    """

    def __init__(self, env: gymnasium.Env, path, max_size: int | None = None, *, backend: str = "memmap",
                 seed: int | None = None, flush_every: int | None = None):
        if isinstance(env, gymnasium.vector.VectorEnv):
            raise EnvProtocolError(f"RecordTransitions wraps one env, got the vector env {env}; "
                                   "use RecordVectorTransitions")
        gymnasium.Wrapper.__init__(self, env)
        fields = transition_fields(env.observation_space, env.action_space, "RecordTransitions")
        self.store, self._owned = _store_for(path, fields, 1, max_size,
                                             {"backend": backend, "seed": seed, "flush_every": flush_every},
                                             "RecordTransitions")
        self._autoreset = _autoreset_wrapped(env)
        self._obs = None    # the observation the next step starts from (a copy), None when none
        self._ended = False  # the last step ended an episode and no reset followed

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._obs, self._ended = np.array(obs, copy=True), False
        return obs, info

    def step(self, action):
        if self._obs is None and not (self._ended and self._autoreset):
            raise EnvProtocolError("RecordTransitions: call reset() before step()"
                                   + (" (the last step ended the episode)" if self._ended else ""))
        stored = _stored_action(action, self.store.fields["actions"][0], "RecordTransitions")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._obs is None:  # Autoreset's step after an episode end: the reset, no transition
            self._obs, self._ended = np.array(obs, copy=True), False
            return obs, reward, terminated, truncated, info
        state, ended = self._obs, bool(terminated or truncated)
        final = _final_observation(info) if ended else None
        if final is not None:  # reset in this very step: obs is the next episode's first
            self._obs, self._ended = np.array(obs, copy=True), False
        else:
            self._obs, self._ended = (None, True) if ended else (np.array(obs, copy=True), False)
        self.store.add(state, stored, reward, obs if final is None else final, bool(terminated),
                       **{TRUNCATION_FIELD: bool(truncated)})
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        try:
            self._close_store()
        finally:
            self.env.close()


def _autoreset_mode(env, given) -> str:
    """The vector env's autoreset mode (an ``AutoresetMode`` value), or a clear refusal."""
    enum = gymnasium.vector.AutoresetMode  # Gymnasium >= 1.1 (the [gym] extra)
    declared = (env.metadata or {}).get("autoreset_mode")
    modes = []
    for where, mode in (("metadata['autoreset_mode']", declared), ("autoreset_mode", given)):
        if mode is None:
            continue
        try:
            modes.append(enum(mode.value if isinstance(mode, enum) else mode).value)
        except ValueError:
            raise EnvProtocolError(f"RecordVectorTransitions: {where} is {mode!r}, not a "
                                   f"gymnasium.vector.AutoresetMode ({', '.join(m.name for m in enum)})") from None
    if not modes:
        raise EnvProtocolError(
            f"RecordVectorTransitions: {env} has no metadata['autoreset_mode'], so how it resets ended envs is "
            "unknown; pass autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP (or SAME_STEP, DISABLED)")
    if len(set(modes)) > 1:
        raise EnvProtocolError(f"RecordVectorTransitions: autoreset_mode={given!r}, but the env's metadata "
                               f"says {declared!r}")
    return modes[0]


class RecordVectorTransitions(gymnasium.vector.VectorWrapper, _Recording):
    """Records every step of a vector env of ``num_envs`` sub-envs into the store at ``path``
    (``num_envs`` of them; ``path``, ``max_size`` and the options as in ``RecordTransitions``).

    The autoreset mode is read from ``env.metadata["autoreset_mode"]`` (``autoreset_mode=``
    for an env that lacks it); an unknown or missing one is refused (``EnvProtocolError``).
    ``pending`` counts transitions held in memory until every env has one for the next
    store step (next-step autoreset only); ``close()`` drops them with a ``PartialStepWarning``.
    """

    def __init__(self, env, path, max_size: int | None = None, *, backend: str = "memmap",
                 seed: int | None = None, flush_every: int | None = None, autoreset_mode=None):
        if not isinstance(env, gymnasium.vector.VectorEnv):
            raise EnvProtocolError(f"RecordVectorTransitions wraps a gymnasium.vector.VectorEnv, got {env}; "
                                   "use RecordTransitions for one env")
        gymnasium.vector.VectorWrapper.__init__(self, env)
        self._mode = _autoreset_mode(env, autoreset_mode)
        n = self.n = int(env.num_envs)
        fields = transition_fields(env.single_observation_space, env.single_action_space, "RecordVectorTransitions")
        self.store, self._owned = _store_for(path, fields, n, max_size,
                                             {"backend": backend, "seed": seed, "flush_every": flush_every},
                                             "RecordVectorTransitions")
        self._obs = None                    # (n, *obs) each env's current observation (a copy)
        self._resetting = np.zeros(n, bool)  # NEXT_STEP: this env's next step is its reset
        self._queues = [deque() for _ in range(n)]  # per env: transitions waiting for a whole step

    @property
    def pending(self) -> int:
        """Transitions taken but not yet in the store (waiting for the other envs' next one)."""
        return sum(len(q) for q in self._queues)

    def reset(self, *, seed=None, options: dict | None = None):
        mask = None if options is None else options.get("reset_mask")  # SyncVectorEnv pops it: read first
        obs, infos = self.env.reset(seed=seed, options=options)
        if mask is None or self._obs is None:
            self._obs = np.array(obs, copy=True)
            self._resetting[:] = False
        else:
            mask = np.asarray(mask, bool)
            self._obs[mask] = obs[mask]
            self._resetting[mask] = False
        return obs, infos

    def step(self, actions):
        if self._obs is None:
            raise EnvProtocolError("RecordVectorTransitions: call reset() before step()")
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        terminations, truncations = np.asarray(terminations, bool), np.asarray(truncations, bool)
        ended = terminations | truncations
        next_states = obs
        if self._mode == SAME_STEP and ended.any():
            finals = _final_observation(infos)
            if finals is None:
                raise EnvProtocolError(
                    "RecordVectorTransitions: an env ended in a same-step autoreset but infos holds no "
                    f"{' or '.join(FINAL_OBS_KEYS)}; is the env's autoreset_mode right?")
            next_states = np.array(obs, copy=True)
            for i in np.flatnonzero(ended):
                next_states[i] = finals[i]
        elif ended.any() and any(key in infos for key in FINAL_OBS_KEYS):
            raise EnvProtocolError(
                f"RecordVectorTransitions: the env's autoreset mode is {self._mode}, but its infos hold final "
                "observations as a same-step autoreset leaves them; pass autoreset_mode=AutoresetMode.SAME_STEP")
        states, made = self._obs, ~self._resetting
        # The next step starts from these observations (after a same-step reset, the new episode's first).
        self._obs = np.array(obs, copy=True)
        if self._mode == NEXT_STEP:
            self._resetting = ended & made
        actions = np.asarray(actions)
        step = (states, actions, np.asarray(rewards), next_states, terminations, truncations)
        if made.all() and not self.pending:
            self._add(*step)
        else:
            for i in np.flatnonzero(made):
                self._queues[i].append(tuple(np.array(part[i], copy=True) for part in step))
            while all(self._queues):
                self._add(*(np.stack(part) for part in zip(*(q.popleft() for q in self._queues))))
        return obs, rewards, terminations, truncations, infos

    def _add(self, states, actions, rewards, next_states, terminations, truncations) -> None:
        if self.n == 1:  # a store of one env takes a step without the env axis (gym.make_vec's default)
            states, actions, rewards, next_states, terminations, truncations = (
                part[0] for part in (states, actions, rewards, next_states, terminations, truncations))
        self.store.add(states, actions, rewards, next_states, terminations, **{TRUNCATION_FIELD: truncations})

    def close(self, **kwargs) -> None:
        try:
            if self.pending:
                waiting = [i for i, q in enumerate(self._queues) if q]
                warnings.warn(f"RecordVectorTransitions: {self.pending} transitions of envs {waiting} were waiting "
                              "for the other envs' next transition (a next-step autoreset skips one step per "
                              "episode end) and were not stored", PartialStepWarning, stacklevel=2)
            for q in self._queues:
                q.clear()
            self._close_store()
        finally:
            self.env.close(**kwargs)


__all__ = ["RecordTransitions", "RecordVectorTransitions", "transition_fields"]
