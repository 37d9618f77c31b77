"""The C kernels, imported here and nowhere else; ``DISKREPLAY_PURE=1`` turns them all off.

Each name is the extension module, or None where it was not built (no compiler at install:
the extensions are optional) or where the environment asks for the pure path. Every user
has a numpy or Python twin with the same results and takes it when its kernel is None:

- ``rows`` (``_rows.c``): the flush's row CRCs (``format.rowsums``), the CRC join
  (``format.crcjoin``) and the vector fast add's commit (``session.fastadd``);
- ``sumtree`` (``_sumtree.c``): the binary sum tree (``parts.priorities.native_tree``);
- ``scan`` (``_scan.c``): exact statistics of small integers (``smallints``).

The switch is read once, at import: set it before the process imports diskreplay.
"""
from __future__ import annotations

import os

__all__ = ["PURE", "implementations", "rows", "scan", "sumtree"]

PURE = os.environ.get("DISKREPLAY_PURE", "") not in ("", "0")

rows = scan = sumtree = None
if not PURE:
    try:
        from . import _rows as rows
    except ImportError:  # not built
        rows = None
    try:
        from . import _scan as scan
    except ImportError:
        scan = None
    try:
        from . import _sumtree as sumtree
    except ImportError:
        sumtree = None


def implementations() -> dict:
    """Which implementation each kernel group uses: ``"C"`` or ``"python"``."""
    return {name: "python" if mod is None else "C"
            for name, mod in (("rows", rows), ("scan", scan), ("sumtree", sumtree))}
