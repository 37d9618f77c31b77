"""A trivially correct in-memory model of the seed's Replay, with the wrap-around fix.

It keeps every transition in a list in the order added and answers "what is in slot
i" from that list, so it shares none of the store's slot arithmetic. Its next state
of a transition is the seed's: the state of the same env's next transition
(``num_envs`` later), or, for the newest ``num_envs``, the ``next_state`` given to add.
"""
from __future__ import annotations

import numpy as np


class ReplayModel:
    def __init__(self, max_size: int, num_envs: int):
        self.max_size = max_size
        self.num_envs = num_envs
        self.epoch = []  # transitions since the last reset, oldest first
        self.seen_size = 0

    @property
    def size(self) -> int:
        return min(len(self.epoch), self.max_size)

    @property
    def head(self) -> int:
        return (len(self.epoch) - 1) % self.max_size if self.epoch else -1

    def add(self, state, action, reward, next_state, done, **extra):
        """One env step: env-major transitions, as the seed's per-env loop."""
        n = self.num_envs
        for e in range(n):
            def pick(v):
                return np.asarray(v) if n == 1 else np.asarray(v)[e]
            row = {"states": pick(state).copy(), "actions": pick(action).copy(),
                   "rewards": pick(reward).copy(), "dones": pick(done).copy(),
                   "given_next_state": pick(next_state).copy()}
            for k, v in extra.items():
                row[k] = pick(v).copy()
            self.epoch.append(row)
            self.seen_size += 1

    def reset(self):
        self.epoch = []

    def slot_position(self, slot: int) -> int:
        """Index into ``epoch`` of the transition that slot ``slot`` holds."""
        count = len(self.epoch)
        if count <= self.max_size:
            return slot
        laps, rem = divmod(count, self.max_size)
        # The last ``rem`` slots written in the current lap are 0..rem-1.
        return (laps * self.max_size + slot) if slot < rem else ((laps - 1) * self.max_size + slot)

    def row(self, slot: int) -> dict:
        pos = self.slot_position(slot)
        row = dict(self.epoch[pos])
        later = pos + self.num_envs
        row["next_states"] = (self.epoch[later]["states"] if later < len(self.epoch)
                              else row["given_next_state"])
        del row["given_next_state"]
        return row

    def get(self, idxs) -> dict:
        rows = [self.row(int(i)) for i in idxs]
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
