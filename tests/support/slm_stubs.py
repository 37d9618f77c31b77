"""Stub SLM-Lab objects (v4 bodies, v5 agents) and transitions for the drop-in's tests and
their child processes; SLM-Lab itself is not imported."""
from types import SimpleNamespace

import numpy as np

V5_EXTRAS = ("terminateds", "truncateds")


def make_algorithm(training_start_step=3, training_frequency=2):
    return SimpleNamespace(to_train=0, training_start_step=training_start_step,
                           training_frequency=training_frequency)


def make_env(num_envs):
    return SimpleNamespace(is_venv=num_envs > 1, num_envs=num_envs)


def make_body(num_envs=1, **alg):
    """SLM-Lab v4's body: env at body.env, algorithm at body.agent.algorithm."""
    return SimpleNamespace(env=make_env(num_envs), agent=SimpleNamespace(algorithm=make_algorithm(**alg)),
                           state_dim=2)


def make_agent(num_envs=1, **alg):
    """SLM-Lab v5's agent: env at agent.env, algorithm at agent.algorithm."""
    return SimpleNamespace(env=make_env(num_envs), algorithm=make_algorithm(**alg), state_dim=2)


def spec(path, **kw):
    return {"name": "DiskReplay", "batch_size": 4, "max_size": 7, "use_cer": False, "path": str(path), **kw}


def transition(t: int, extras=()) -> dict:
    """Transition number t (1-based), every value telling t."""
    tr = {"states": np.full(2, t, np.float32), "actions": t, "rewards": t / 2,
          "next_states": np.full(2, t + 0.5, np.float32), "dones": t % 5 == 0}
    if "terminateds" in extras:
        tr["terminateds"] = t % 5 == 0
        tr["truncateds"] = t % 7 == 0
    return tr


def args_of(tr: dict, version: str) -> tuple:
    keys = ("states", "actions", "rewards", "next_states", "dones") + (V5_EXTRAS if version == "v5" else ())
    return tuple(tr[k] for k in keys)


def kwargs_of(tr: dict, version: str) -> dict:
    names = ("state", "action", "reward", "next_state", "done")
    names += ("terminated", "truncated") if version == "v5" else ()
    return dict(zip(names, args_of(tr, version)))


def step(ts, extras=()) -> tuple:
    """A vector-env step of the transitions ts: each argument with a leading env axis."""
    trs = [transition(t, extras) for t in ts]
    keys = ("states", "actions", "rewards", "next_states", "dones") + tuple(extras)
    return tuple(np.stack([np.asarray(tr[k]) for tr in trs]) if k.endswith("states") else [tr[k] for tr in trs]
                 for k in keys)
