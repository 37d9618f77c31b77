"""Side data a store may carry beside its rows, each behind the ``Part`` protocol
(:mod:`diskreplay.parts.base`): the jump ring, frame stacks and priorities.

:data:`PARTS` is the one list of them; the directory, create, open, verify and the
reserved names loop over it. A new part is one module here plus its contract tests
(``tests/features/test_parts.py``)."""
from __future__ import annotations

from .base import Geometry, Part
from .jumps import Jumps
from .priorities.files import PrioritiesPart
from .rows import Rows
from .stacks.decode import StackedRows
from .stacks.ring import Stacks

PARTS: tuple[type[Part], ...] = (Jumps, Stacks, PrioritiesPart)


def parts_of(g: Geometry) -> list[type[Part]]:
    """The parts a store of geometry ``g`` has, in :data:`PARTS` order."""
    return [part for part in PARTS if part.wanted(g)]


def part_names() -> tuple[str, ...]:
    """Every file name any part may own."""
    return tuple(name for part in PARTS for name in part.names)


def rows_for(data, gatherer, num_envs: int, max_size: int) -> Rows:
    """The ``Rows`` a session reads the opened store ``data`` (``DataFiles``) through."""
    jumps, stacks = data.parts.get(Jumps.name), data.parts.get(Stacks.name)
    if stacks is not None:
        return StackedRows(gatherer, jumps, stacks, num_envs, max_size)
    return Rows(gatherer, jumps, num_envs, max_size)


__all__ = ["Geometry", "PARTS", "Part", "Rows", "part_names", "parts_of", "rows_for"]
