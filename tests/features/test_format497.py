"""Stores written by 497696e (the last commit before the house move of issue 34) open,
recover, sample, take adds and verify with the current code exactly as that code did: the
stores and that code's answers are fixtures (``tests/data/format497``, made by
``tests/support/make_format497.py`` running 497696e); the current code runs the same
procedure (``make_format497.answers``) on a copy and must give the same answers, and
converts each store to the other backend and back with the same rows."""
from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import pytest

import paths
from make_format497 import answers, digest

from diskreplay import DiskReplay
from diskreplay.format.counters import W_CLEAN
from diskreplay.testing import counter_words
from diskreplay.verify import verify_store

ROOT = os.path.join(paths.DATA, "format497")
with open(os.path.join(ROOT, "expected.json")) as f:
    EXPECTED = json.load(f)
STORES = sorted(EXPECTED["stores"])


def copy_of(tmp_path, name) -> str:
    path = str(tmp_path / name)
    shutil.copytree(os.path.join(ROOT, name), path)
    return path


def test_every_kind_and_backend_is_kept():
    kinds = {(r["kind"], r["backend"]) for r in EXPECTED["stores"].values()}
    assert len(kinds) == 12 and {b for _, b in kinds} == {"memmap", "hdf5"}
    assert EXPECTED["commit"] == "497696e"


@pytest.mark.parametrize("name", STORES)
def test_the_current_code_answers_as_497696e_did(tmp_path, name):
    want = EXPECTED["stores"][name]
    got = answers(copy_of(tmp_path, name), want["kind"])
    for stage in ("reader", "writer", "after_adds", "verify"):
        assert got[stage] == want[stage], f"{name}: {stage}"


@pytest.mark.parametrize("name", STORES)
def test_a_converted_store_keeps_the_rows_both_ways(tmp_path, name):
    want = EXPECTED["stores"][name]
    path = copy_of(tmp_path, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the killed store's recovery says so
        DiskReplay.open(path).close()
    other = "hdf5" if want["backend"] == "memmap" else "memmap"
    there, back = str(tmp_path / "there"), str(tmp_path / "back")
    DiskReplay.convert(path, there, backend=other)
    DiskReplay.convert(there, back, backend=want["backend"])
    for converted in (there, back):
        with DiskReplay.open(converted, mode="r") as buf:
            assert [buf.seen_size, buf.size, buf.head] == want["writer"]["counters"]
            assert digest(buf.get(np.arange(buf.size))) == want["writer"]["rows"]
        assert verify_store(converted).ok


def test_the_fixtures_themselves_are_never_written():
    """Opening happens on copies: the kept killed stores are still as the kill left them
    (never closed, so every open of a copy runs the current code's recovery)."""
    for name in STORES:
        if EXPECTED["stores"][name]["kind"] == "killed":
            with DiskReplay.open(os.path.join(ROOT, name), mode="r") as ro:
                assert counter_words(ro)[W_CLEAN] == 0 and ro.seen_size >= EXPECTED["stores"][name]["acknowledged"]
