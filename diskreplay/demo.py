"""A small end-to-end run: ``python -m diskreplay.demo [PATH]``.

Fills a store from a tiny built-in environment (a noisy 1-D walk with 4 envs), samples
it, closes it, reopens it and samples again, printing what it does.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from . import DiskReplay


class RandomWalkEnv:
    """``num_envs`` walkers on a line; an episode ends at |x| >= 5 or after 50 steps."""

    def __init__(self, num_envs: int, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.num_envs = num_envs
        self.x = np.zeros(num_envs, np.float32)
        self.t = np.zeros(num_envs, np.int64)

    def observe(self) -> np.ndarray:
        return np.stack([self.x, self.t.astype(np.float32)], axis=1)

    def step(self, action: np.ndarray):
        """``(next_state, reward, done)``; an env whose episode ended is reset after its
        final state is observed (an autoreset: ``observe()`` then gives the new start)."""
        self.x += np.where(action == 1, 1.0, -1.0).astype(np.float32) + self.rng.normal(0, 0.1, self.num_envs).astype(np.float32)
        self.t += 1
        done = (np.abs(self.x) >= 5) | (self.t >= 50)
        reward = np.where(done, -1.0, 0.1).astype(np.float32)
        next_state = self.observe()
        self.x[done] = 0
        self.t[done] = 0
        return next_state, reward, done


def short(values) -> list:
    """float32 values as they would print as float32 (0.1, not 0.10000000149011612), 4 digits."""
    return [float(f"{v:.4g}") for v in np.asarray(values, np.float64).reshape(-1).tolist()]


def run(path: str, steps: int = 500, num_envs: int = 4, backend: str = "memmap") -> None:
    env = RandomWalkEnv(num_envs)
    print(f"creating {path} (backend={backend}, max_size=1000, num_envs={num_envs})")
    with DiskReplay.create(path, 1000, num_envs=num_envs, backend=backend, batch_size=8,
                           seed=0, overwrite=True) as buf:
        state = env.observe()
        for _ in range(steps):
            action = env.rng.integers(0, 2, num_envs)
            next_state, reward, done = env.step(action)
            buf.add(state, action, reward, next_state, done)  # next_state: the true final one at an end
            state = env.observe()  # where an episode ended, the new episode's first state
        print(f"added {steps} steps: size={buf.size} seen_size={buf.seen_size} head={buf.head} (the ring wrapped)")
        batch = buf.sample()
        print(f"sampled slots {buf.batch_idxs.tolist()}")
        print(f"  rewards {short(batch['rewards'])}, dones {batch['dones'].astype(int).tolist()}")
    print("closed; reopening")
    with DiskReplay.open(path) as buf:
        print(f"reopened: size={buf.size} seen_size={buf.seen_size} head={buf.head}")
        buf.sample()
        print(f"sampled slots {buf.batch_idxs.tolist()} (the sampler stream continues where it stopped)")
        newest = buf.get([buf.head])
        print(f"newest transition: state={short(newest['states'][0])} next_state={short(newest['next_states'][0])}")
    print(f"inspect it with: diskreplay info {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default=os.path.join(tempfile.gettempdir(), "diskreplay-demo.replay"))
    parser.add_argument("--backend", default="memmap", choices=["memmap", "hdf5"])
    args = parser.parse_args(argv)
    run(args.path, backend=args.backend)


if __name__ == "__main__":
    main()
