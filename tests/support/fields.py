"""Field specs and self-describing step values shared by the store tests."""
import numpy as np


def cartpole_fields(state_shape=(4,), state_dtype="float32"):
    return {"states": (state_shape, state_dtype), "actions": ((), "int64"),
            "rewards": ((), "float32"), "dones": ((), "bool")}


def step_values(t: int, num_envs: int = 1, state_shape=(4,), dtype=np.float32):
    """Self-describing values of the step whose first transition is number ``t`` (1-based)."""
    if num_envs == 1:
        return (np.full(state_shape, t, dtype), t, float(t) / 2, np.full(state_shape, t + 0.5, dtype), t % 7 == 0)
    ts = np.arange(t, t + num_envs)
    states = np.stack([np.full(state_shape, x, dtype) for x in ts])
    next_states = np.stack([np.full(state_shape, x + 0.5, dtype) for x in ts])
    return states, ts.astype(np.int64), (ts / 2).astype(np.float32), next_states, ts % 7 == 0
