"""Frame-stacked envs for the frame-stack tests (``tests/features/test_frame_stack.py``) and the
fast paths' equivalence machine (``tests/features/test_commit_paths.py``)."""
from __future__ import annotations

import numpy as np


class Envs:
    """``num_envs`` frame-stacked envs with random episode ends, first states padded with
    zeros or with the first frame, and now and then a state that does not overlap."""

    def __init__(self, num_envs: int, k: int, frame: tuple, rng: np.random.Generator):
        self.n, self.k, self.frame, self.rng = num_envs, k, frame, rng
        self.cur = [self.first_state() for _ in range(num_envs)]

    def new_frame(self):
        return self.rng.integers(0, 2, (1,) + self.frame).astype(np.uint8)  # two values: coincidences

    def first_state(self):
        f = self.new_frame()
        pad = f if self.rng.random() < 0.5 else np.zeros_like(f)
        return np.concatenate([np.repeat(pad, self.k - 1, axis=0), f])

    def step(self, end_prob: float, odd_prob: float):
        states, nexts, dones = [], [], []
        for e in range(self.n):
            s = self.cur[e]
            if self.rng.random() < odd_prob:  # a state that does not continue the last one
                s = self.rng.integers(0, 2, (self.k,) + self.frame).astype(np.uint8)
            ns = np.concatenate([s[1:], self.new_frame()])
            if self.rng.random() < odd_prob:  # a next state that does not overlap its state
                ns = self.rng.integers(0, 2, (self.k,) + self.frame).astype(np.uint8)
            done = self.rng.random() < end_prob
            self.cur[e] = self.first_state() if done else ns
            states.append(s), nexts.append(ns), dones.append(done)
        if self.n == 1:
            return states[0], 0, 0.5, nexts[0], dones[0]
        return (np.stack(states), np.arange(self.n), np.full(self.n, 0.5, np.float32), np.stack(nexts),
                np.array(dones))
