"""The store the README's command-line examples describe: max_size 10, 2 envs, wrapped.

8 steps add transitions 1..16, of which 7..16 remain. Transition t has states [t, t, t],
actions t, rewards t/2, log_probs -t, next state [t+2]*3 (the state of the same env's next
transition) and is done for t in DONES. Transition t lives in slot (t - 1) % 10 and belongs
to env (t - 1) % 2. Used by tests/cli/test_cli.py and tests/docs/test_readme.py.
"""
import numpy as np

from diskreplay import DiskReplay

DONES = {5, 10, 11, 14, 15}
MAX_SIZE, NUM_ENVS, STEPS = 10, 2, 8
FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool"), "log_probs": ((), "float32")}


def make_store(path, backend="memmap"):
    with DiskReplay.create(path, MAX_SIZE, num_envs=NUM_ENVS, backend=backend, seed=0, fields=FIELDS) as buf:
        for step in range(STEPS):
            ts = np.arange(1 + NUM_ENVS * step, 1 + NUM_ENVS * (step + 1))
            col = ts[:, None].astype(np.float32)
            buf.add(np.repeat(col, 3, 1), ts, (ts / 2).astype(np.float32), np.repeat(col + NUM_ENVS, 3, 1),
                    np.isin(ts, sorted(DONES)), log_probs=-ts.astype(np.float32))
    return path
