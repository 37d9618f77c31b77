"""A trivially correct in-memory model of the seed's Replay, with the wrap-around fix
and exact next states.

It keeps every transition in a list in the order added and answers "what is in slot
i" from that list, so it shares none of the store's slot arithmetic. Its next state
of a transition is always the ``next_state`` given to ``add`` for it (issue 15: next
states are exact). A transition is a *jump* when that next state is not, byte for byte,
the state of the same env's next transition (``num_envs`` later) in the list: an episode
end by autoreset, which ends n-step chains as a done does.
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
        return self.row_at(self.slot_position(slot))

    def row_at(self, pos: int) -> dict:
        """The transition at ``epoch[pos]`` as ``get`` returns it: its next state is the given one."""
        row = dict(self.epoch[pos])
        row["next_states"] = row.pop("given_next_state")
        return row

    def is_jump(self, pos: int) -> bool:
        """Whether ``epoch[pos]``'s given next state is not the state of its env's next
        transition (only known once that transition was added)."""
        later = pos + self.num_envs
        return later < len(self.epoch) and (
            np.asarray(self.epoch[pos]["given_next_state"]).tobytes() != np.asarray(self.epoch[later]["states"]).tobytes())

    def get(self, idxs) -> dict:
        rows = [self.row(int(i)) for i in idxs]
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    def number_of(self, pos: int) -> int:
        """Transition number (1-based, as ``seen_size`` counts) of ``epoch[pos]``."""
        return self.seen_size - len(self.epoch) + pos + 1

    def nstep_row(self, slot: int, n_step: int, gamma: float, jumped=frozenset()) -> dict:
        """The n-step transition at ``slot``, one successor at a time: up to ``n_step``
        transitions of its env (``num_envs`` apart, only those added), stopping after one
        with ``dones`` or ``truncateds`` set, that is a jump (``is_jump``), or whose number
        is in ``jumped`` (jumps a test makes the store report)."""
        pos = self.slot_position(slot)
        first = self.epoch[pos]
        total, m, last = 0.0, 0, pos
        for j in range(n_step):
            p = pos + j * self.num_envs
            if p >= len(self.epoch):
                break
            step = self.epoch[p]
            total = total + gamma ** j * np.asarray(step["rewards"], np.float64)
            m, last = m + 1, p
            if (np.any(step["dones"]) or np.any(step.get("truncateds", False)) or self.is_jump(p)
                    or self.number_of(p) in jumped):
                break
        row = self.row_at(last)
        row["states"], row["actions"] = first["states"], first["actions"]
        reward_dtype = np.asarray(first["rewards"]).dtype
        row["rewards"] = np.asarray(total).astype(reward_dtype if reward_dtype.kind == "f" else np.float32)
        row["discounts"] = np.float32(gamma ** m)
        return row

    def nstep_get(self, idxs, n_step: int, gamma: float, jumped=frozenset()) -> dict:
        rows = [self.nstep_row(int(i), n_step, gamma, jumped) for i in idxs]
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
