"""Side data a store may carry beside its rows, each behind the ``Part`` protocol
(:mod:`diskreplay.parts.base`): the jump ring, frame stacks and priorities.

:data:`PARTS` is the one list of them; the directory, create, open, verify and the
reserved names loop over it. A new part is one module here plus its contract tests
(``tests/features/test_parts.py``)."""
from __future__ import annotations

from .base import Geometry, Part
from .jumps import Jumps
from .priorities.files import PrioritiesPart
from .stacks.ring import Stacks

PARTS: tuple[type[Part], ...] = (Jumps, Stacks, PrioritiesPart)


def parts_of(g: Geometry) -> list[type[Part]]:
    """The parts a store of geometry ``g`` has, in :data:`PARTS` order."""
    return [part for part in PARTS if part.wanted(g)]


def part_names() -> tuple[str, ...]:
    """Every file name any part may own."""
    return tuple(name for part in PARTS for name in part.names)


__all__ = ["Geometry", "PARTS", "Part", "part_names", "parts_of"]
