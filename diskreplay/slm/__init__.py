"""A drop-in for SLM-Lab's ``Replay`` memory, backed by a diskreplay store.

Two SLM-Lab interfaces are supported, in one class that picks by what it is given:

- **v4** (SLM-Lab 4.0 to 4.2, the 2019 ``Replay`` this project calls the seed):
  ``DiskReplay(memory_spec, body)``, ``update(state, action, reward, next_state, done)``,
  ``add_experience(state, action, reward, next_state, done)``; the env is ``body.env``
  and the algorithm ``body.agent.algorithm``.
- **v5** (SLM-Lab 5.x): ``DiskReplay(memory_spec, agent)``,
  ``update(state, action, reward, next_state, done, terminated, truncated)`` and
  ``add_experience(*, state, ..., terminated, truncated)``; the env is ``agent.env`` and
  the algorithm ``agent.algorithm``. ``terminated`` and ``truncated`` are stored as the
  fields ``terminateds`` and ``truncateds``; CER follows v5's rule (``apply_cer``).

``DiskReplay(spec, x)`` is a :class:`DiskReplayV4` when ``x`` has an ``agent`` attribute
(a v4 body) and a :class:`DiskReplayV5` otherwise (a v5 agent, whose ``algorithm`` does
not exist yet while its memory is built); construct either class directly to choose.

    "memory": {"name": "DiskReplay", "batch_size": 32, "max_size": 1e6, "use_cer": false,
               "path": "runs/pong.replay", "backend": "memmap", "seed": 0,
               "fields": {"states": [[4, 84, 84], "uint8"], "rewards": [[], "float32"]}}

A ``path`` that holds a store is resumed (contents, counters, sampler); one that
disagrees with the spec is refused with :class:`StoreMismatchError`. SLM-Lab itself is not
imported: the body or agent only needs ``env.is_venv``, ``env.num_envs`` and an
algorithm with ``training_start_step``, ``training_frequency`` and ``to_train``. README.md,
"SLM-Lab drop-in", has the details and what differs from SLM-Lab's own ``Replay``.

The package's modules: ``memory`` (the classes above and ``interface_for``), ``spec`` (the
memory spec and opening or creating its store), ``fields`` (field declarations, dtypes and
converting transitions), ``partialstep`` (transitions buffered until a whole env step is
there), ``slotviews`` (the read-only views ``SlotView`` and ``NextStateView``) and
``arguments`` (the methods' arguments, checked).
"""
from __future__ import annotations

from ..errors import (InterfaceMismatchError, MemorySpecError, PartialStepWarning, ReadOnlyViewError,
                      SlotIndexError, StoreMismatchError)
from .memory import DiskReplay, DiskReplayV4, DiskReplayV5, interface_for
from .prioritized import DiskPrioritizedReplay, DiskPrioritizedReplayV4, DiskPrioritizedReplayV5
from .slotviews import NextStateView, SlotView

__all__ = ["DiskReplay", "DiskReplayV4", "DiskReplayV5", "DiskPrioritizedReplay", "DiskPrioritizedReplayV4",
           "DiskPrioritizedReplayV5", "InterfaceMismatchError", "MemorySpecError",
           "PartialStepWarning", "ReadOnlyViewError", "SlotIndexError", "StoreMismatchError",
           "interface_for", "SlotView", "NextStateView"]
