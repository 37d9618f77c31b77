"""Where episodes end: the one rule shared by ``stats``, episode iteration, n-step returns
and the exports.

A transition ends its episode when

- its ``dones`` is set (Gymnasium's ``terminated``, or SLM-Lab's ``done``), or
- an extra bool field named ``truncateds`` exists and is set: a Gymnasium user stores a
  time limit as ``done=terminated`` plus ``truncateds=truncated`` (README, "Gymnasium"),
  so that ``dones`` stays the bootstrapping mask; SLM-Lab v5's drop-in stores the same
  field; or
- the store knows that its next state is not the next row's state of the same env
  (``jumps``: an autoreset the caller did not mark).

numpy only, no I/O: callers pass the rows they read.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

TRUNCATION_FIELD = "truncateds"


def _any_per_row(values, rows: int) -> np.ndarray:
    values = np.asarray(values)
    return values.reshape(rows, values.size // rows if rows else 0).any(axis=1)  # (0, -1) is no shape


def episode_ends(batch: Mapping[str, np.ndarray], jumps: np.ndarray | None = None) -> np.ndarray:
    """A bool per row of ``batch`` (a dict of fields, rows first): True where that
    transition ends its episode. ``jumps`` (bool per row, optional) marks rows whose next
    state the store holds as an exception to the next-row rule."""
    rows = len(batch["dones"])
    ends = _any_per_row(batch["dones"], rows)
    if TRUNCATION_FIELD in batch:
        ends |= _any_per_row(batch[TRUNCATION_FIELD], rows)
    if jumps is not None:
        ends |= np.asarray(jumps, bool).reshape(rows)
    return ends


__all__ = ["TRUNCATION_FIELD", "episode_ends"]
