"""n-step returns at sample time: the arguments, the chains of successors and the returns.

Transition ``t`` of env ``e`` is followed in its env by ``t + num_envs``, ``t + 2 *
num_envs``, ... An n-step row for ``t`` includes up to ``n_step`` of these transitions:
only those already added (newer transitions are always still in the ring), and none after
the first that ends its episode (``episodes.episode_ends``: dones, ``truncateds``,
next-state jumps). With ``m`` transitions included the row holds

- ``states``, ``actions``: those of ``t``;
- ``rewards``: ``sum(gamma ** j * rewards[t + j * num_envs] for j < m)``, accumulated in
  float64 and returned in the reward field's dtype when it is a float dtype, else float32
  (a discounted sum of integer rewards is not an integer);
- ``next_states``, ``dones`` and every extra field: those of the last transition included;
- ``discounts``: ``gamma ** m`` (float32), the factor of the bootstrap value, so that
  ``target = rewards + discounts * (1 - dones) * V(next_states)``.

``nstep_batch`` reads rows only through the ``gather`` and ``jumps`` callables it is given
(the session's consistent reads), so this module does no I/O itself.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

from . import ring
from .episodes import TRUNCATION_FIELD, episode_ends
from ..errors import InvalidArgumentError, NStepTooLargeError
from .schema import CORE_FIELDS, check_count

DISCOUNTS = "discounts"


def max_n_step(max_size: int, num_envs: int) -> int:
    """The largest ``n_step`` whose chains fit in the ring: ``n`` transitions of one env
    span ``(n - 1) * num_envs + 1`` slots."""
    return (max_size - 1) // num_envs + 1


def check_n_step(n_step, gamma, max_size: int, num_envs: int) -> tuple[int, float]:
    """``(n_step, gamma)`` as an int and a float, or an ``InvalidArgumentError`` saying why not
    (``NStepTooLargeError`` when the store is too small for chains of ``n_step``)."""
    n_step = check_count("n_step", n_step)  # the one rule for counts: integers and integral floats
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real):
        raise InvalidArgumentError(f"gamma must be a number in [0, 1], got {gamma!r}")
    gamma = float(gamma)
    if math.isnan(gamma) or not 0.0 <= gamma <= 1.0:
        raise InvalidArgumentError(f"gamma must be a number in [0, 1], got {gamma!r}")
    limit = max_n_step(max_size, num_envs)
    if n_step > limit:
        raise NStepTooLargeError(
            f"n_step={n_step} needs {(n_step - 1) * num_envs + 1} slots for the chain of one env "
            f"((n_step - 1) * num_envs + 1), but the store holds max_size={max_size} with num_envs={num_envs}: "
            f"use n_step <= {limit}, or a store with a larger max_size")
    return n_step, gamma


def chains(idxs: np.ndarray, n_step: int, seen: int, base: int, max_size: int,
           num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, added)``, both ``(len(idxs), n_step)``: column ``j`` holds the slot of the
    ``j``-th successor of each row's transition in its env (column 0 is ``idxs``), and
    whether that successor was already added (a prefix of each row is)."""
    first = ring.transition_of_slots(idxs, seen, base, max_size)
    transitions = first[:, None] + np.arange(n_step, dtype=np.int64) * num_envs
    return ring.slot_of(transitions, base, max_size), transitions <= seen


def included(ends: np.ndarray, added: np.ndarray) -> np.ndarray:
    """``m`` per row: the transitions included, up to and with the first episode end,
    among those already added (``ends`` and ``added`` are ``(rows, n_step)`` bools)."""
    n_step = ends.shape[1]
    stops = ends & added
    until_end = np.where(stops.any(axis=1), stops.argmax(axis=1) + 1, n_step)
    return np.minimum(until_end, added.sum(axis=1))


def returns(rewards: np.ndarray, m: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted sums of the first ``m`` of each row's rewards (``rewards`` is
    ``(rows, n_step, *shape)``), in float64, in order ``j = 0, 1, ...``."""
    total = np.zeros((rewards.shape[0],) + rewards.shape[2:], np.float64)
    for j in range(rewards.shape[1]):
        inside = (j < m).reshape((-1,) + (1,) * (rewards.ndim - 2))
        total += np.where(inside, (gamma ** j) * rewards[:, j].astype(np.float64), 0.0)
    return total


def return_dtype(reward_dtype: np.dtype) -> np.dtype:
    """Float reward fields keep their dtype; integer and bool ones give float32."""
    return reward_dtype if reward_dtype.kind == "f" else np.dtype(np.float32)


def nstep_batch(idxs: np.ndarray, gather: Callable, jumps: Callable[[np.ndarray], np.ndarray], *, seen: int,
                base: int, max_size: int, num_envs: int, n_step: int, gamma: float,
                fields: dict) -> tuple[dict, np.ndarray]:
    """The n-step batch for the slots ``idxs`` (``n_step > 1``) and every slot it read.

    ``gather(slots, names=None)`` returns the rows at ``slots`` (every field and
    ``next_states``, or only ``names``); ``jumps(slots)`` is a bool per slot, True where
    the store recorded that slot's next state as an exception (an unmarked episode end)."""
    batch = gather(idxs)
    rows = len(idxs)
    slots, added = chains(idxs, n_step, seen, base, max_size, num_envs)
    end_fields = ("rewards", "dones") + ((TRUNCATION_FIELD,) if TRUNCATION_FIELD in fields else ())
    later = slots[:, 1:][added[:, 1:]]  # the successors already added, row-major
    successors = gather(later, end_fields) if len(later) else None
    # Every (row, step) of the chain, step 0 from ``batch``; steps not yet added stay zero.
    chain = {}
    for name in end_fields:
        full = np.zeros((rows, n_step) + batch[name].shape[1:], batch[name].dtype)
        full[:, 0] = batch[name]
        if successors is not None:
            full[:, 1:][added[:, 1:]] = successors[name]
        chain[name] = full
    flat_jumps = np.zeros((rows, n_step), bool)
    flat_jumps[added] = jumps(slots[added])
    ends = episode_ends({name: v.reshape((rows * n_step,) + v.shape[2:]) for name, v in chain.items()},
                        flat_jumps.reshape(-1)).reshape(rows, n_step)
    m = included(ends, added)
    batch["rewards"] = returns(chain["rewards"], m, gamma).astype(return_dtype(fields["rewards"].dtype))
    discounts = np.array([gamma ** j for j in range(n_step + 1)], np.float64)
    batch[DISCOUNTS] = discounts[m].astype(np.float32)
    moved = m > 1
    last = slots[np.arange(rows), m - 1][moved]
    if len(last):
        from_last = ("next_states", "dones") + tuple(name for name in fields if name not in CORE_FIELDS)
        tail = gather(last, from_last)
        for name in from_last:
            batch[name][moved] = tail[name]
    return batch, np.concatenate([idxs, later])


__all__ = ["DISCOUNTS", "check_n_step", "chains", "included", "max_n_step", "nstep_batch", "return_dtype",
           "returns"]
