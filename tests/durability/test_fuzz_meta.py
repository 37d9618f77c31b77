"""Fuzzing the metadata parsers (issue 7): store.json, the meta.bin record and a checkpoint
slot, with arbitrary bytes and arbitrary JSON. Each either returns or raises a
DiskReplayError; nothing else may escape."""
from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from diskreplay import DiskReplay, DiskReplayError
from diskreplay.format.checkpoint import HEADER_BYTES, CheckpointFile, CheckpointLayout
from diskreplay.format.counters import (COUNTERS_BYTES, MAGIC, NWORDS, W_CHECK, W_INTENT, W_KEY,
                                 W_MAGIC, W_SEEN, W_VERSION, Counters)
from diskreplay.format.description import parse_description, read_description
from hostile_common import build_store, file_bytes, snapshot

FUZZ = settings(max_examples=1000, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.large_base_example])
FUZZ_OPEN = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.large_base_example])

json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-3, 10)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
                | st.sampled_from(["1", "7", "\u00b2", "memmap", "hdf5", "<f4", "|b1", "float32", "O"]))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=12)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("fuzz") / "store")
    build_store(d, "memmap")
    return d


@pytest.fixture(scope="module")
def valid_description(store_dir):
    with open(os.path.join(store_dir, "store.json"), "rb") as f:
        return json.loads(f.read())


def _parse(raw: bytes):
    try:
        parse_description(raw, "store.json")
    except DiskReplayError as exc:
        assert "store.json" in str(exc)


# ---------------------------------------------------------------- store.json

@FUZZ
@given(raw=st.binary(max_size=2000))
def test_parse_description_arbitrary_bytes(raw):
    _parse(raw)


@FUZZ
@given(value=json_values)
def test_parse_description_arbitrary_json(value):
    _parse(json.dumps(value).encode())
    if isinstance(value, dict):  # past the first checks
        _parse(json.dumps({**value, "format": "diskreplay", "format_version": 1}).encode())


_TOP_KEYS = ["format", "format_version", "backend", "max_size", "num_envs", "batch_size", "use_cer",
             "fields", "seed_entropy", "reserve_rows", "flush_every"]
_FIELD_KEYS = ["shape", "dtype"]
_mutation = st.tuples(
    st.sampled_from(_TOP_KEYS + [f"fields.{f}" for f in ("states", "actions", "log_probs")]
                    + [f"fields.states.{k}" for k in _FIELD_KEYS] + [f"fields.dones.{k}" for k in _FIELD_KEYS]),
    st.booleans(),  # delete instead of set
    json_values)


def _mutate(desc: dict, mutations) -> dict:
    d = json.loads(json.dumps(desc))
    for key, delete, value in mutations:
        *parents, last = key.split(".")
        node = d
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if delete:
            node.pop(last, None)
        else:
            node[last] = value
    return d


KNOWN_PARSER_BUGS = ("library bug: parse_description lets ValueError, OverflowError and SyntaxError escape "
                     "(see the examples)")


@FUZZ
@given(mutations=st.lists(_mutation, min_size=1, max_size=4))
@example(mutations=[("seed_entropy", False, "\u00b2")])  # isdigit() but not int()-able
@example(mutations=[("fields.states.shape", False, [float("inf")])])  # int(inf): OverflowError
@example(mutations=[("fields.states.dtype", False, {"names": ["a"], "formats": ["<f4"], "offsets": [-1]})])
@example(mutations=[("fields.states.dtype", False, "01f4")])  # numpy raises SyntaxError
def test_parse_description_mutated_valid_description(valid_description, mutations):
    _parse(json.dumps(_mutate(valid_description, mutations)).encode())


@FUZZ
@given(anchor=st.sampled_from([b"", b'"<f4"', b'"max_size"', b'"fields"']), pos=st.integers(0, 10_000),
       junk=st.binary(min_size=1, max_size=8), op=st.sampled_from(["cut", "replace", "insert"]))
@example(anchor=b'"<f4"', pos=1, junk=b"01", op="insert")  # dtype "01<f4": numpy raises SyntaxError
def test_parse_description_damaged_bytes_of_a_valid_description(valid_description, anchor, pos, junk, op):
    raw = json.dumps(valid_description, indent=2).encode()
    pos = (raw.find(anchor) + pos) % len(raw)
    if op == "cut":
        raw = raw[:pos]
    elif op == "replace":
        raw = raw[:pos] + junk + raw[pos + len(junk):]
    else:
        raw = raw[:pos] + junk + raw[pos:]
    _parse(raw)


# ---------------------------------------------------------------- meta.bin

def _words_page(words, tail: bytes) -> bytes:
    page = np.frombuffer(tail.ljust(COUNTERS_BYTES, b"\0")[:COUNTERS_BYTES], np.int64).copy()
    page[:NWORDS] = [(w + (1 << 63)) % (1 << 64) - (1 << 63) for w in words]  # wrap to int64
    return page.tobytes()


int64s = st.integers(-(1 << 63), (1 << 63) - 1)
small = st.integers(-3, 40)


@st.composite
def counter_pages(draw):
    """Pages near a valid record: right magic and version mostly, check word often consistent."""
    words = [draw(int64s | small) for _ in range(NWORDS)]
    if draw(st.booleans()):
        words[W_MAGIC] = MAGIC
    if draw(st.booleans()):
        words[W_VERSION] = 1
    if draw(st.booleans()):
        words[W_CHECK] = words[W_SEEN] ^ words[W_KEY]
    if draw(st.booleans()):
        words[W_INTENT] = words[W_SEEN] + draw(st.sampled_from([0, 1, 2, 3]))
    return _words_page(words, draw(st.binary(max_size=64)))


@pytest.fixture(scope="module")
def meta_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("meta"))


def _check_counters(meta_dir, page, num_envs):
    with open(os.path.join(meta_dir, "meta.bin"), "wb") as f:
        f.write(page)
    counters = Counters(meta_dir, writable=False)
    try:
        problem = counters.problem(num_envs)
        assert problem is None or isinstance(problem, str)
        if problem is None:
            counters.snapshot()
    finally:
        counters.close()


@FUZZ
@given(page=st.binary(min_size=COUNTERS_BYTES, max_size=COUNTERS_BYTES), num_envs=st.integers(1, 8))
def test_counters_problem_arbitrary_pages(meta_dir, page, num_envs):
    _check_counters(meta_dir, page, num_envs)


@FUZZ
@given(page=counter_pages(), num_envs=st.integers(1, 8))
def test_counters_problem_near_valid_pages(meta_dir, page, num_envs):
    _check_counters(meta_dir, page, num_envs)


@FUZZ
@given(size=st.integers(0, 3 * COUNTERS_BYTES))
def test_counters_of_the_wrong_size(meta_dir, size):
    with open(os.path.join(meta_dir, "meta.bin"), "wb") as f:
        f.write(bytes(size))
    try:
        Counters(meta_dir, writable=False).close()
    except DiskReplayError as exc:
        assert "meta.bin" in str(exc)
    else:
        assert size == COUNTERS_BYTES


# ---------------------------------------------------------------- checkpoint.bin

_HEADER = struct.Struct("<8sII9QII")
uint64s = st.integers(0, (1 << 64) - 1)


@pytest.fixture(scope="module")
def ck_dir(tmp_path_factory, store_dir):
    d = str(tmp_path_factory.mktemp("ck") / "store")
    shutil.copytree(store_dir, d)
    return d


def _layout(directory):
    desc = read_description(directory)
    return CheckpointLayout(desc["fields"], desc["num_envs"], desc["reserve_rows"])


def _sealed_header(layout, slot, values, body_crc=0):
    """A slot header with the given 8 counters (generation, seen, base, draws, resets,
    reserve_first, reserve_count, flush time) and right magic, body length and checksums."""
    head = _HEADER.pack(b"DRCKPT01", 1, slot, *values, layout.body_bytes, body_crc, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


@FUZZ
@given(slot=st.integers(0, 1), raw=st.binary(min_size=_HEADER.size, max_size=_HEADER.size))
def test_checkpoint_slot_arbitrary_header_bytes(ck_dir, slot, raw):
    layout = _layout(ck_dir)
    ck = CheckpointFile(ck_dir, layout, writable=True)
    try:
        original = os.pread(ck.fd, _HEADER.size, layout.slot_offset(slot))
        os.pwrite(ck.fd, raw, layout.slot_offset(slot))
        try:
            got = ck.read_header(slot)
            assert got is None or got.slot == slot
            ck.newest()
        finally:
            os.pwrite(ck.fd, original, layout.slot_offset(slot))
    finally:
        ck.close()


@FUZZ
@given(slot=st.integers(0, 1), values=st.lists(uint64s | st.integers(0, 40), min_size=8, max_size=8))
def test_checkpoint_slot_sealed_header_with_arbitrary_values(ck_dir, slot, values):
    layout = _layout(ck_dir)
    ck = CheckpointFile(ck_dir, layout, writable=True)
    try:
        off = layout.slot_offset(slot)
        original = os.pread(ck.fd, _HEADER.size, off)
        body_crc = ck._body_crc(slot)
        os.pwrite(ck.fd, _sealed_header(layout, slot, values, body_crc=body_crc), off)
        try:
            got = ck.read_header(slot)
            assert got is None or got.slot == slot
        finally:
            os.pwrite(ck.fd, original, off)
    finally:
        ck.close()


# ---------------------------------------------------------------- whole opens

@pytest.fixture(scope="module")
def open_dir(tmp_path_factory, store_dir):
    d = str(tmp_path_factory.mktemp("open") / "store")
    shutil.copytree(store_dir, d)
    return d, file_bytes(d)


def _restore(directory, originals):
    for name in os.listdir(directory):
        if name not in originals:
            os.unlink(os.path.join(directory, name))
    for name, data in originals.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def _open_everything(directory, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with DiskReplay.open(directory, mode=mode) as buf:
                snapshot(buf, sample=mode == "r")
        except DiskReplayError:
            pass


@FUZZ_OPEN
@given(page=counter_pages() | st.binary(min_size=COUNTERS_BYTES, max_size=COUNTERS_BYTES),
       mode=st.sampled_from(["r", "r+"]))
def test_open_with_fuzzed_counters(open_dir, page, mode):
    directory, originals = open_dir
    try:
        with open(os.path.join(directory, "meta.bin"), "wb") as f:
            f.write(page)
        _open_everything(directory, mode)
    finally:
        _restore(directory, originals)


@FUZZ_OPEN
@given(values=st.lists(uint64s | st.integers(0, 40), min_size=8, max_size=8),
       mode=st.sampled_from(["r", "r+"]))
@example(values=[99, 12, 0, 1 << 63, 0, 13, 9, 0], mode="r+")  # draws >= 2**63
def test_open_falling_back_on_a_fuzzed_checkpoint(open_dir, values, mode):
    """meta.bin is garbage, so the writer (and a reader) must use the newest checkpoint,
    here one whose checksums hold but whose counters are arbitrary."""
    directory, originals = open_dir
    try:
        values = list(values)
        values[0] = max(values[0], 3)  # the newest generation
        layout = _layout(directory)
        ck = CheckpointFile(directory, layout, writable=True)
        try:
            ck_slot = values[0] % 2
            os.pwrite(ck.fd, _sealed_header(layout, ck_slot, values, body_crc=ck._body_crc(ck_slot)),
                      layout.slot_offset(ck_slot))
        finally:
            ck.close()
        with open(os.path.join(directory, "meta.bin"), "r+b") as f:
            f.write(b"\xff" * 8)  # bad magic
        _open_everything(directory, mode)
    finally:
        _restore(directory, originals)


def test_header_layout_matches_the_library():
    assert _HEADER.size <= HEADER_BYTES
