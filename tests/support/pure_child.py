"""One seeded run of stores for ``tests/unit/test_pure.py``: run once with the C kernels and once
with ``DISKREPLAY_PURE=1``, each must leave the same bytes and draw the same indices.

``python pure_child.py OUT`` creates, fills (past a wrap, with autoreset jumps and flushes),
samples and closes, in ``OUT``: a uniform store per backend (frames, flags: the row CRCs, the
CRC join and the vector fast add's step of ``_rows``; ``compute_stats``: ``_scan``), a
prioritized store per backend (``_sumtree``) and a frame-stack store per backend; then
writes ``OUT/run.json``: ``implementations()``, every batch's indices (and weights) and the
statistics.
"""
import json
import os
import sys

import numpy as np

from diskreplay import DiskReplay, native
from diskreplay.stats import compute_stats

BACKENDS = ("memmap", "hdf5")
FIELDS = {"states": ((6, 5), "uint8"), "actions": ((), "int16"), "rewards": ((), "float32"),
          "dones": ((), "bool")}


def chained_steps(rng, num_envs, count, state_shape, jump=0.2):
    """Steps whose states are the previous next states (the fast adds) but for autoreset jumps."""
    obs = rng.integers(0, 256, (num_envs,) + state_shape).astype(np.uint8)
    for _ in range(count):
        nxt = rng.integers(0, 256, (num_envs,) + state_shape).astype(np.uint8)
        yield (obs, rng.integers(-300, 300, num_envs).astype(np.int16), rng.normal(size=num_envs).astype(np.float32),
               nxt, rng.random(num_envs) < 0.1)
        jumps = rng.random(num_envs) < jump
        obs = np.where(jumps.reshape((-1,) + (1,) * len(state_shape)),
                       rng.integers(0, 256, nxt.shape).astype(np.uint8), nxt)


def uniform(path, backend, out):
    rng = np.random.default_rng(1)
    with DiskReplay.create(path, 60, num_envs=3, backend=backend, seed=11, flush_every=7, fields=FIELDS) as buf:
        for i, step in enumerate(chained_steps(rng, 3, 45, (6, 5))):
            buf.add(*step)
            if i % 9 == 4:
                out.append(buf.sample(16)["actions"].tolist() + buf.batch_idxs.tolist())
        buf.flush()
        out.append(buf.sample(32)["actions"].tolist() + buf.batch_idxs.tolist())
    with DiskReplay.open(path, mode="r") as buf:
        return compute_stats(buf, keep_returns=True, keep_tallies=True)


def prioritized(path, backend, out):
    rng = np.random.default_rng(2)
    with DiskReplay.create(path, 40, num_envs=2, backend=backend, seed=12, prioritized=True, alpha=0.7,
                           fields=FIELDS) as buf:
        for i, step in enumerate(chained_steps(rng, 2, 30, (6, 5))):
            buf.add(*step)
            if i >= 5:
                batch = buf.sample(8, beta=0.5)
                out.append(buf.batch_idxs.tolist() + batch["weights"].tolist())
                buf.update_priorities(buf.batch_idxs, rng.integers(0, 9, 8).astype(float))
    with DiskReplay.open(path) as buf:  # a reopened store rebuilds its tree: the same draws again
        buf.sample(8, beta=0.5)
        out.append(buf.batch_idxs.tolist())


def frame_stack(path, backend, out):
    rng = np.random.default_rng(3)
    k, frame = 4, (5, 4)
    with DiskReplay.create(path, 30, num_envs=2, backend=backend, seed=13, frame_stack=k, flush_every=5) as buf:
        stacks = rng.integers(0, 256, (2, k) + frame).astype(np.uint8)
        for i in range(40):
            nxt = np.concatenate([stacks[:, 1:], rng.integers(0, 256, (2, 1) + frame).astype(np.uint8)], axis=1)
            buf.add(stacks, rng.integers(0, 5, 2), rng.normal(size=2).astype(np.float32), nxt,
                    rng.random(2) < 0.1)
            stacks = nxt if i % 11 != 10 else rng.integers(0, 256, nxt.shape).astype(np.uint8)  # a new base
            if i % 8 == 7:
                out.append(buf.batch_idxs.tolist() if buf.sample(8) is not None else [])
        batch = buf.sample(16)
        out.append(buf.batch_idxs.tolist() + [int(batch["states"].sum()), int(batch["next_states"].sum())])


def main(out_dir):
    run = {"implementations": native.implementations(), "batches": {}, "stats": {}}
    for backend in BACKENDS:
        for name, make in (("uniform", uniform), ("prioritized", prioritized), ("frames", frame_stack)):
            store = f"{name}-{backend}"
            batches = run["batches"][store] = []
            stats = make(os.path.join(out_dir, store), backend, batches)
            if stats is not None:
                stats.pop("tallies")
                run["stats"][store] = stats
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump(run, f, default=repr)


if __name__ == "__main__":
    main(sys.argv[1])
