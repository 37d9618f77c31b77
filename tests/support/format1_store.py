"""The format 1 stores in ``tests/data/format1-<backend>`` (no jump ring): made by diskreplay at
commit 336a1e4 (the last of format 1) with this script, so that tests read and upgrade stores
written by that code, not imitations of them:

    PYTHONPATH=<a checkout of 336a1e4> python tests/support/format1_store.py tests/data

Two envs, 7 slots, 6 steps (the ring wrapped); every third step of env 1 starts from a fresh
state (an autoreset): format 1 returned the next row's state there, format 2 keeps that.
"""
import os
import sys

import numpy as np

FIELDS = {"states": ((3,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"), "dones": ((), "bool")}


def steps():
    """``(state, action, reward, next_state, done)`` of each step, as added."""
    out = []
    obs = np.zeros((2, 3), np.float32)
    for k in range(6):
        next_obs = obs + np.float32(1 + k)
        out.append((obs.copy(), np.array([k, -k]), np.float32([k / 2, k / 4]), next_obs.copy(),
                    np.array([False, k % 3 == 2])))
        obs = next_obs.copy()
        if k % 3 == 2:
            obs[1] = np.float32(-100 - k)  # env 1 autoresets
    return out


def main(root):
    from diskreplay import DiskReplay
    for backend in ("memmap", "hdf5"):
        with DiskReplay.create(os.path.join(root, f"format1-{backend}"), 7, num_envs=2, backend=backend, seed=3,
                               fields=FIELDS, overwrite=True) as buf:
            for step in steps():
                buf.add(*step)


if __name__ == "__main__":
    main(sys.argv[1])
