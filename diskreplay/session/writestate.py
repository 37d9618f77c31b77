"""``WriteState``: what an add reads and writes on every call, in one small object.

The writer, its flusher (``flushing.py``) and the fast adds (``fastadd.py``) share one
``WriteState`` for the writer's whole life: a fast add binds it once and per call reads
nothing of the writer but it, so the writer's other state can move without touching the
hot path. The writer's ``seen``, ``base``, ``live``, ``busy``, ``overlap``, ``due`` and
``flush_before`` are this object's.
"""
from __future__ import annotations

import operator


class WriteState:
    """``seen``, ``base``: the ring's counters as this writer holds them (``seen`` catches up
    with ``meta.bin`` at each commit). ``due``: the transition past which an add takes the
    general path, which flushes (``flush_before``) or hands over early work. ``live``: adds
    may write (False once closed or after a failed sync). ``busy``: the frame of a running
    add, flush or reset, so that a call from a signal handler inside it is recognised.
    ``overlap``: frame stacks, which envs' last step advanced their stack by one frame
    (None: unknown, the next step records bases)."""

    __slots__ = ("seen", "base", "due", "flush_before", "live", "busy", "overlap")

    def __init__(self):
        self.seen = self.base = 0
        self.due = self.flush_before = 1 << 62
        self.live = False
        self.busy = None
        self.overlap = None


def _delegate(name: str) -> property:
    def set(self, value):
        setattr(self.ws, name, value)

    # attrgetter: the read in C (sample and update_priorities read seen and base often)
    return property(operator.attrgetter(f"ws.{name}"), set, doc=f"``self.ws.{name}`` (``WriteState``)")


def delegated(cls):
    """Class decorator: ``cls``'s attributes named like ``WriteState``'s are ``self.ws``'s."""
    for name in WriteState.__slots__:
        setattr(cls, name, _delegate(name))
    return cls
