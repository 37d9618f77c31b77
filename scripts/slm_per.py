"""A faithful in-RAM port of SLM-Lab's ``PrioritizedReplay`` (v4, 2019: ``slm_lab/agent/memory/
prioritized.py``), for the W5 benchmark and the drop-in's tests only.

Jaromír Janisch's binary ``SumTree`` (a Python loop per level, ``_propagate`` adding the
change), one ``random.uniform(0, total)`` and one ``tree.get`` per index, priorities
``(error + epsilon) ** alpha`` kept per slot and in the tree, new transitions added with
``error=100000``, ``update_priorities(errors)`` for the last batch. On top of the seed's
``Replay`` port (``seed_replay.py``). SLM-Lab's quirk is kept: with ``use_cer`` the last
index becomes ``head`` but the tree leaf updated by ``update_priorities`` stays the one
sampled. No SLM-Lab import; the library never imports this file.
"""
from __future__ import annotations

import random

import numpy as np

from seed_replay import SeedReplay  # scripts/, this file's directory, is on sys.path


class SumTree:
    write = 0

    def __init__(self, capacity):
        self.capacity = capacity
        self.tree = np.zeros(2 * capacity - 1)
        self.indices = np.zeros(capacity)

    def _propagate(self, idx, change):
        while idx != 0:
            idx = (idx - 1) // 2
            self.tree[idx] += change

    def _retrieve(self, idx, s):
        tree = self.tree
        tree_len = len(tree)
        while True:
            left = 2 * idx + 1
            if left >= tree_len:
                return idx
            if s <= tree[left]:
                idx = left
            else:
                s -= tree[left]
                idx = left + 1

    def total(self):
        return self.tree[0]

    def add(self, p, index):
        idx = self.write + self.capacity - 1
        self.indices[self.write] = index
        self.update(idx, p)
        self.write += 1
        if self.write >= self.capacity:
            self.write = 0

    def update(self, idx, p):
        change = p - self.tree[idx]
        self.tree[idx] = p
        self._propagate(idx, change)

    def get(self, s):
        assert s <= self.total()
        idx = self._retrieve(0, s)
        index_idx = idx - self.capacity + 1
        return (idx, self.tree[idx], self.indices[index_idx])


class SLMPrioritizedReplay(SeedReplay):
    def __init__(self, max_size: int, batch_size: int, alpha: float, epsilon: float, num_envs: int = 1,
                 use_cer: bool = False):
        super().__init__(max_size, batch_size, num_envs, use_cer)
        self.epsilon = np.full((1,), epsilon)
        self.alpha = np.full((1,), alpha)
        self.data_keys = ["states", "actions", "rewards", "next_states", "dones", "priorities"]
        self.reset()

    def reset(self):
        super().reset()
        self.tree = SumTree(self.max_size)

    def add_experience(self, state, action, reward, next_state, done, error=100000):
        super().add_experience(state, action, reward, next_state, done)
        priority = self.get_priority(error)
        self.priorities[self.head] = priority
        self.tree.add(priority, self.head)

    def get_priority(self, error):
        return np.power(error + self.epsilon, self.alpha).squeeze()

    def sample_idxs(self, batch_size):
        batch_idxs = np.zeros(batch_size)
        tree_idxs = np.zeros(batch_size, dtype=int)
        for i in range(batch_size):
            s = random.uniform(0, self.tree.total())
            (tree_idx, p, idx) = self.tree.get(s)
            batch_idxs[i] = idx
            tree_idxs[i] = tree_idx
        batch_idxs = np.asarray(batch_idxs).astype(int)
        self.tree_idxs = tree_idxs
        if self.use_cer:
            batch_idxs[-1] = self.head
        return batch_idxs

    def update_priorities(self, errors):
        priorities = self.get_priority(errors)
        assert len(priorities) == self.batch_idxs.size
        for idx, p in zip(self.batch_idxs, priorities):
            self.priorities[idx] = p
        for p, i in zip(priorities, self.tree_idxs):
            self.tree.update(i, p)
