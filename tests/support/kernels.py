"""Kernel tests run against every implementation present: the C kernel where it is built
and in use (a skip saying why otherwise: not built, or DISKREPLAY_PURE=1), and its pure
twin always (``native.turned_off``, in the same process).

    @pytest.mark.parametrize("impl", IMPLS)
    def test_x(impl):
        with implementation("scan", impl):
            ...
"""
from __future__ import annotations

import contextlib

import pytest

from diskreplay import native

IMPLS = ["C", "pure"]


def c_kernel(name: str):
    """The C module of kernel group ``name``, or a skip saying why it is absent."""
    why = native.missing(name)
    if why is not None:
        pytest.skip(f"the {name} C kernel is {why}")
    return getattr(native, name)


def implementation(name: str, impl: str):
    """A context in which kernel group ``name`` is ``impl``: ``"C"`` (skips where absent)
    or ``"pure"`` (its twin)."""
    if impl == "C":
        c_kernel(name)
        return contextlib.nullcontext()
    assert impl == "pure", impl
    return native.turned_off(name)
