"""A faithful in-RAM port of SLM-Lab's uniform ``Replay`` (the seed), for benchmarks only.

Lists of arrays, states cast to float16, ``batch_get`` as ``np.array(itemgetter(*idxs)(lst))``,
and the seed's ``sample_next_states`` with its wrap-around bug left in. No SLM-Lab import;
the library never imports this file.
"""
from __future__ import annotations

import operator
from collections import deque

import numpy as np


def batch_get(arr, idxs):
    """SLM-Lab's util.batch_get for lists."""
    return np.array(operator.itemgetter(*idxs)(arr))


def sample_next_states(head, max_size, ns_idx_offset, batch_idxs, states, ns_buffer):
    ns_batch_idxs = (batch_idxs + ns_idx_offset) % max_size
    ns_batch_idxs = ns_batch_idxs % max_size
    buffer_ns_locs = np.argwhere((head < ns_batch_idxs) & (ns_batch_idxs <= head + ns_idx_offset)).flatten()
    to_replace = buffer_ns_locs.size != 0
    if to_replace:
        buffer_idxs = ns_batch_idxs[buffer_ns_locs] - head - 1
        ns_batch_idxs[buffer_ns_locs] = 0
    ns_batch_idxs = ns_batch_idxs % max_size
    next_states = batch_get(states, ns_batch_idxs)
    if to_replace:
        buffer_ns = batch_get(ns_buffer, buffer_idxs)
        next_states[buffer_ns_locs] = buffer_ns
    return next_states


class SeedReplay:
    def __init__(self, max_size: int, batch_size: int, num_envs: int = 1, use_cer: bool = False):
        self.max_size = max_size
        self.batch_size = batch_size
        self.use_cer = use_cer
        self.is_venv = num_envs > 1
        self.ns_idx_offset = num_envs
        self.ns_buffer = deque(maxlen=self.ns_idx_offset)
        self.data_keys = ["states", "actions", "rewards", "next_states", "dones"]
        self.seen_size = 0
        self.reset()

    def reset(self):
        for k in self.data_keys:
            if k != "next_states":
                setattr(self, k, [None] * self.max_size)
        self.size = 0
        self.head = -1
        self.ns_buffer.clear()

    def update(self, state, action, reward, next_state, done):
        if self.is_venv:
            for sarsd in zip(state, action, reward, next_state, done):
                self.add_experience(*sarsd)
        else:
            self.add_experience(state, action, reward, next_state, done)

    def add_experience(self, state, action, reward, next_state, done):
        self.head = (self.head + 1) % self.max_size
        self.states[self.head] = state.astype(np.float16)
        self.actions[self.head] = action
        self.rewards[self.head] = reward
        self.ns_buffer.append(next_state.astype(np.float16))
        self.dones[self.head] = done
        if self.size < self.max_size:
            self.size += 1
        self.seen_size += 1

    def sample(self, batch_size=None):
        self.batch_idxs = self.sample_idxs(batch_size or self.batch_size)
        batch = {}
        for k in self.data_keys:
            if k == "next_states":
                batch[k] = sample_next_states(self.head, self.max_size, self.ns_idx_offset, self.batch_idxs,
                                              self.states, self.ns_buffer)
            else:
                batch[k] = batch_get(getattr(self, k), self.batch_idxs)
        return batch

    def sample_idxs(self, batch_size):
        batch_idxs = np.random.randint(self.size, size=batch_size)
        if self.use_cer:
            batch_idxs[-1] = self.head
        return batch_idxs
