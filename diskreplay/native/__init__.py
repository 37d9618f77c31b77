"""The C kernels, imported here and nowhere else; ``DISKREPLAY_PURE=1`` turns them all off.

Each name is the extension module, or None where it was not built (no compiler at install:
the extensions are optional) or where the environment asks for the pure path. Every user
has a numpy or Python twin with the same results and takes it when its kernel is None:

- ``rows`` (``_rows.c``): the flush's row CRCs (``format.rowsums``), the CRC join
  (``format.crcjoin``) and the vector fast add's commit (``session.fastadd``);
- ``sumtree`` (``_sumtree.c``): the binary sum tree (``parts.priorities.native_tree``);
- ``scan`` (``_scan.c``): exact statistics of small integers (``smallints``).

The switch is read once, at import: set it before the process imports diskreplay.

Both implementations in one process (what the kernel tests compare): ``missing(name)``
says why a kernel is None (a test skips its C case with it), and ``turned_off(*names)``
makes kernels None for a block, as the switch would. The users look their kernel up here
when they use it (``rowsums``, ``smallints``, ``tree.new_tree``) or when a fast add is
bound (``fastadd``), so they take the twin inside the block; ``crcjoin.join`` is chosen at
import (``crcjoin.join_python`` is its twin, callable directly).
"""
from __future__ import annotations

import contextlib
import os

__all__ = ["KERNELS", "PURE", "implementations", "missing", "rows", "scan", "sumtree", "turned_off"]

PURE = os.environ.get("DISKREPLAY_PURE", "") not in ("", "0")
KERNELS = ("rows", "scan", "sumtree")

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
_BUILT = {name: globals()[name] is not None for name in KERNELS}  # at import, before any turned_off


def implementations() -> dict:
    """Which implementation each kernel group uses: ``"C"`` or ``"python"``."""
    return {name: "python" if globals()[name] is None else "C" for name in KERNELS}


def missing(name: str) -> str | None:
    """Why kernel group ``name`` is None: ``"turned off by DISKREPLAY_PURE=1"``, ``"not
    built"`` or ``"turned off by turned_off()"``; None while its C module is in use."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel group {name!r}, expected one of {KERNELS}")
    if globals()[name] is not None:
        return None
    if PURE:
        return "turned off by DISKREPLAY_PURE=1"
    return "turned off by turned_off()" if _BUILT[name] else "not built"


@contextlib.contextmanager
def turned_off(*names: str):
    """Kernel groups ``names`` (all when none is named) are None inside the block, as under
    ``DISKREPLAY_PURE=1``, then restored. For tests, which run the twins beside the C
    kernels in one process; not for threads that use the kernels meanwhile."""
    names = names or KERNELS
    for name in names:
        if name not in KERNELS:
            raise ValueError(f"unknown kernel group {name!r}, expected one of {KERNELS}")
    saved = {name: globals()[name] for name in names}
    try:
        globals().update(dict.fromkeys(names))
        yield
    finally:
        globals().update(saved)
