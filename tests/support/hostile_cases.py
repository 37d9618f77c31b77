"""The ways the corruption test garbles each file of a store, with what ``open`` may answer.

An answer is a label: ``ok`` (opened, no RecoveryWarning, contents as before), ``recover``
(opened with a RecoveryWarning, contents as before: "recovers from the previous good
metadata when provably safe and says so"), ``damaged`` (opened; the damage is in row data
that only ``verify`` can see, and ``verify`` reports it) or the class name of the
DiskReplayError raised. Anything else (a foreign exception, a signal) always fails.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from diskreplay.format.counters import (W_BASE, W_BOOT, W_CHECK, W_CLEAN, W_DRAWS, W_INTENT, W_KEY, W_MAGIC,
                                 W_RESETS, W_SEEN, W_VERSION)

CORRUPT = frozenset({"CorruptStoreError"})
OK = frozenset({"ok"})
ANY_FILE = "<any store file>"  # the message may name whichever file shows the inconsistency
SMALL_FILES = ("store.json", "meta.bin", "checkpoint.bin", "ns_buffer.npy", "rowsums.npy", "jumps.npy", "jump_states.npy",
               "lock")
DATA_FILES = {"memmap": ("states.npy", "actions.npy", "rewards.npy", "dones.npy", "log_probs.npy"),
              "hdf5": ("data.h5",)}


@dataclass
class Case:
    file: str
    how: str
    garble: Callable[[str], None]  # called with the file's path
    r: frozenset
    rw: frozenset
    names: tuple = ()  # the message names one of these (default: the file itself)
    sizes: bool = False  # the message also gives the file's size and the expected size
    xfail: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.file}-{self.how}"


# ---------------------------------------------------------------- generic garblings

def _rewrite(fn):
    def garble(path):
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(fn(data))
    return garble


def _garbage(data: bytes) -> bytes:
    rng = random.Random(len(data))
    return bytes(rng.randrange(256) for _ in range(max(len(data), 64)))


def _missing(path):
    os.unlink(path)


def _directory(path):
    os.unlink(path)
    os.mkdir(path)
    with open(os.path.join(path, "something"), "wb") as f:
        f.write(b"x")


GENERIC = {
    "emptied": _rewrite(lambda d: b""),
    "half": _rewrite(lambda d: d[: len(d) // 2]),
    "truncated": _rewrite(lambda d: d[:-3]),
    "garbage": _rewrite(_garbage),
    "longer": _rewrite(lambda d: d + bytes(4096)),
    "missing": _missing,
    "directory": _directory,
}


# ---------------------------------------------------------------- store.json

def _json_edit(fn):
    def garble(path):
        with open(path) as f:
            d = json.load(f)
        d = fn(d)
        with open(path, "w") as f:
            f.write(d if isinstance(d, str) else json.dumps(d))
    return garble


def _set(key, value):
    def fn(d):
        d[key] = value
        return d
    return _json_edit(fn)


def _drop(key):
    def fn(d):
        del d[key]
        return d
    return _json_edit(fn)


def _set_field(name, key, value):
    def fn(d):
        d["fields"][name][key] = value
        return d
    return _json_edit(fn)


def _fields(fn2):
    def fn(d):
        fn2(d["fields"])
        return d
    return _json_edit(fn)


def _json_text(fn):
    def garble(path):
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(fn(data))
    return garble


def _store_json_cases(backend: str) -> list[Case]:
    other = {"memmap": "hdf5", "hdf5": "memmap"}[backend]
    c = []

    def add(how, garble, r=CORRUPT, rw=None, names=("store.json",), xfail=None):
        c.append(Case("store.json", how, garble, r, r if rw is None else rw, names, xfail=xfail))

    unsupported = frozenset({"UnsupportedFormatError"})
    add("top-level-list", _json_edit(lambda d: []))
    add("top-level-null", _json_edit(lambda d: None))
    add("top-level-string", _json_edit(lambda d: "a diskreplay store"))
    add("format-other", _set("format", "zarr"))
    add("format-missing", _drop("format"))
    add("format_version-4", _set("format_version", 4), unsupported)
    add("format_version-3", _set("format_version", 3))  # 3 is only for env-major frame stacks
    add("format_version-huge", _set("format_version", 10 ** 30), unsupported)
    add("format_version-string", _set("format_version", "1"))
    add("format_version-float", _set("format_version", 1.0))
    add("format_version-bool", _set("format_version", True))
    add("format_version-zero", _set("format_version", 0))
    add("format_version-negative", _set("format_version", -1))
    add("format_version-missing", _drop("format_version"))
    add("backend-unknown", _set("backend", "tape"))
    add("backend-swapped", _set("backend", other), names=(ANY_FILE,))
    add("max_size-negative", _set("max_size", -7))
    add("max_size-zero", _set("max_size", 0))
    add("max_size-string", _set("max_size", "7"))
    add("max_size-float", _set("max_size", 7.0))
    add("max_size-null", _set("max_size", None))
    add("max_size-bool", _set("max_size", True))
    add("max_size-nan", _json_text(lambda t: t.replace(b'"max_size": 7', b'"max_size": NaN')))
    # head >= max_size / size > max_size: the data files hold 7 rows, the description claims fewer
    add("max_size-smaller-than-data", _set("max_size", 5), names=(ANY_FILE,))
    add("max_size-larger-than-data", _set("max_size", 9), names=(ANY_FILE,))
    add("max_size-huge", _set("max_size", 10 ** 20), names=(ANY_FILE,))
    add("num_envs-zero", _set("num_envs", 0))
    add("num_envs-negative", _set("num_envs", -2))
    add("num_envs-above-max_size", _set("num_envs", 8))
    add("num_envs-float", _set("num_envs", 2.0))
    add("num_envs-changed", _set("num_envs", 1), names=(ANY_FILE,))
    add("batch_size-zero", _set("batch_size", 0))
    add("batch_size-string", _set("batch_size", "4"))
    add("use_cer-string", _set("use_cer", "yes"))
    add("use_cer-int", _set("use_cer", 1))
    add("seed_entropy-letters", _set("seed_entropy", "abc"))
    add("seed_entropy-int", _set("seed_entropy", 3))
    add("seed_entropy-negative", _set("seed_entropy", "-3"))
    add("seed_entropy-empty", _set("seed_entropy", ""))
    add("seed_entropy-superscript-digit", _set("seed_entropy", "\u00b2"))
    add("reserve_rows-zero", _set("reserve_rows", 0))
    add("reserve_rows-huge", _set("reserve_rows", 10 ** 9))
    add("reserve_rows-missing", _drop("reserve_rows"))
    add("reserve_rows-changed", _set("reserve_rows", 3), names=(ANY_FILE,))
    add("flush_every-zero", _set("flush_every", 0))
    add("flush_every-string", _set("flush_every", "10"))
    add("fields-list", _set("fields", []))
    add("fields-null-but-data", _set("fields", None), names=(ANY_FILE,))
    add("fields-missing-states", _fields(lambda f: f.pop("states")))
    add("fields-states-shape-disagrees", _set_field("states", "shape", [5]), names=(ANY_FILE,))
    add("fields-states-rank-disagrees", _set_field("states", "shape", [3, 1]), names=(ANY_FILE,))
    add("fields-shape-negative", _set_field("states", "shape", [-3]))
    add("fields-shape-huge", _set_field("states", "shape", [2 ** 70]), names=(ANY_FILE,))
    add("fields-shape-fraction", _set_field("states", "shape", [3.5]))
    add("fields-shape-string", _set_field("states", "shape", "3"))
    add("fields-shape-infinity", _json_text(lambda t: t.replace(b'"shape": [\n        3\n      ]',
                                                                 b'"shape": [Infinity]', 1)))
    add("fields-dtype-disagrees", _set_field("states", "dtype", "<f8"), names=(ANY_FILE,))
    add("fields-dtype-missing", _fields(lambda f: f["states"].pop("dtype")), names=(ANY_FILE,))
    add("fields-dtype-complex", _set_field("states", "dtype", "<c8"))
    add("fields-dtype-object", _set_field("states", "dtype", "|O"))
    add("fields-dtype-unicode", _set_field("states", "dtype", "<U3"))
    add("fields-dtype-unknown", _set_field("states", "dtype", "float17"))
    add("fields-dtype-number", _set_field("states", "dtype", 5))
    add("fields-dtype-bad-record", _set_field("states", "dtype",
                                              {"names": ["a"], "formats": ["<f4"], "offsets": [-1]}))
    add("fields-extra-without-data", _fields(lambda f: f.update(foo={"shape": [], "dtype": "<f4"})),
        names=(ANY_FILE,))
    add("fields-extra-dropped", _fields(lambda f: f.pop("log_probs")), names=(ANY_FILE,))
    add("fields-reserved-name", _fields(lambda f: f.update(next_states=f["states"])))
    add("fields-bad-name", _fields(lambda f: f.update(_x={"shape": [], "dtype": "<f4"})))
    add("deeply-nested", _json_text(lambda t: b"[" * 100000 + b"]" * 100000))
    add("utf8-bom", _json_text(lambda t: b"\xef\xbb\xbf" + t))
    add("unknown-extra-key", _set("comment", "added by hand"), OK)
    return c


# ---------------------------------------------------------------- meta.bin

def _meta_edit(fix_check=True, **words):
    names = {"magic": W_MAGIC, "version": W_VERSION, "seen": W_SEEN, "check": W_CHECK, "intent": W_INTENT,
             "base": W_BASE, "draws": W_DRAWS, "boot": W_BOOT, "clean": W_CLEAN, "resets": W_RESETS}

    def garble(path):
        with open(path, "rb") as f:
            w = np.frombuffer(f.read(), np.int64).copy()
        for name, value in words.items():
            w[names[name]] = value(w) if callable(value) else value
        if "intent" not in words and "seen" in words:
            w[W_INTENT] = w[W_SEEN]
        if fix_check:
            w[W_CHECK] = int(w[W_SEEN]) ^ int(w[W_KEY])
        with open(path, "wb") as f:
            f.write(w.tobytes())
    return garble


def _meta_cases() -> list[Case]:
    rw = frozenset({"CorruptStoreError", "recover"})
    c = []

    def add(how, garble, r=CORRUPT, rw=rw, xfail=None):
        c.append(Case("meta.bin", how, garble, r, rw, xfail=xfail))

    add("bad-magic", _meta_edit(magic=12345))
    add("newer-record-version", _meta_edit(version=2), rw=rw | {"UnsupportedFormatError"},
        r=CORRUPT | {"UnsupportedFormatError"})
    add("check-word-wrong", _meta_edit(fix_check=False, check=lambda w: w[W_CHECK] ^ 1))
    add("seen-negative", _meta_edit(seen=-2))
    add("seen-not-a-multiple-of-num_envs", _meta_edit(seen=lambda w: w[W_SEEN] + 1))
    add("base-above-seen", _meta_edit(base=lambda w: w[W_SEEN] + 2))  # size < 0, seen_size < size
    add("base-negative", _meta_edit(base=-2))
    add("draws-negative", _meta_edit(draws=-1))
    add("resets-negative", _meta_edit(resets=-1))
    add("in-flight-marker-wrong", _meta_edit(intent=lambda w: w[W_SEEN] + 5))
    lying = ("library bug: a cleanly closed record (clean=1) whose seen_size disagrees with the newest "
             "checkpoint, which close() wrote with the same seen_size, is trusted silently")
    add("seen-ahead-of-the-data", _meta_edit(seen=lambda w: w[W_SEEN] + 2))
    add("seen-behind-the-data", _meta_edit(seen=lambda w: w[W_SEEN] - 2))
    # Not clean and written in another boot: a power cut. Readers and the writer use the checkpoint.
    add("power-cut-before-close", _meta_edit(clean=0, boot=0x1234567), r=OK, rw=frozenset({"recover"}))
    return c


# ---------------------------------------------------------------- checkpoint.bin

def _flip(offset_fn):
    def fn(data):
        b = bytearray(data)
        b[offset_fn(len(b))] ^= 0xFF
        return bytes(b)
    return _rewrite(fn)


def _checkpoint_cases() -> list[Case]:
    half = lambda n: n // 2  # noqa: E731 - the start of slot 1
    c = []
    # A clean store does not need its checkpoint to be read; the writer may refuse or rebuild it.
    ok_or_corrupt = frozenset({"ok", "CorruptStoreError"})
    c.append(Case("checkpoint.bin", "slot0-header-flipped", _flip(lambda n: 20), OK, OK))
    c.append(Case("checkpoint.bin", "slot1-header-flipped", _flip(lambda n: half(n) + 20), OK, OK))
    c.append(Case("checkpoint.bin", "slot1-body-flipped", _flip(lambda n: half(n) + 4096 + 8), OK, OK))
    c.append(Case("checkpoint.bin", "both-slots-flipped",
                  lambda p: (_flip(lambda n: 20)(p), _flip(lambda n: half(n) + 20)(p)),
                  ok_or_corrupt, ok_or_corrupt | {"recover"}))
    return c


def _hdf5_cases() -> list[Case]:
    import h5py

    def drop_dataset(path):
        with h5py.File(path, "r+") as f:
            del f["actions"]

    def foreign_hdf5(path):
        os.unlink(path)
        with h5py.File(path, "w") as f:
            f["something"] = np.arange(10)

    def chunked(path):
        with h5py.File(path, "r+") as f:
            data = f["rewards"][...]
            del f["rewards"]
            f.create_dataset("rewards", data=data, chunks=(1,), compression="gzip")

    return [Case("data.h5", "dataset-missing", drop_dataset, CORRUPT, CORRUPT),
            Case("data.h5", "foreign-hdf5-file", foreign_hdf5, CORRUPT, CORRUPT),
            Case("data.h5", "dataset-chunked-compressed", chunked, CORRUPT, CORRUPT)]


def _row_data_garbage(backend: str, name: str):
    """Overwrite the last 8 bytes of the ``states`` rows, leaving every header alone."""
    def garble(path):
        if backend == "hdf5":
            import h5py

            with h5py.File(path, "r") as f:
                d = f["states"]
                end = d.id.get_offset() + d.id.get_storage_size()
        else:
            end = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(end - 8)
            f.write(b"\xde\xad\xbe\xef" * 2)
    return garble


def cases(backend: str) -> list[Case]:
    out: list[Case] = []
    dir_errors = frozenset({"CorruptStoreError", "StoreIOError", "StorePermissionError"})
    for name in SMALL_FILES + DATA_FILES[backend]:
        is_data = name in DATA_FILES[backend] or name.endswith(".npy")
        for how, garble in GENERIC.items():
            if name == "store.json" and how in ("longer", "truncated"):
                continue  # store.json has no fixed length; trailing junk is "garbage"
            r = rw = CORRUPT
            names = (name,)
            sizes = is_data and how in ("truncated", "longer")
            xfail = None
            if how == "directory":
                r = rw = dir_errors
            if name == "store.json" and how == "missing":
                # Without store.json but with meta.bin a store looks half-created (or half-replaced).
                r = rw = frozenset({"IncompleteStoreError", "CorruptStoreError"})
                names = ("store.json", "<store>")
            if name == "meta.bin" and how != "directory":
                rw = rw | {"recover"}
            if name == "checkpoint.bin":
                r = r | {"ok"}
                rw = rw | {"recover"}
            if name == "lock":
                r = OK
                rw = OK if how != "directory" else dir_errors
            out.append(Case(name, how, garble, r, rw, names, sizes=sizes, xfail=xfail))
    out += _store_json_cases(backend)
    out += _meta_cases()
    out += _checkpoint_cases()
    data_file = DATA_FILES[backend][0]
    damaged = frozenset({"damaged", "CorruptStoreError"})
    out.append(Case(data_file, "row-data-garbage", _row_data_garbage(backend, data_file), damaged, damaged))
    if backend == "hdf5":
        out += _hdf5_cases()
    return out


def rmtree_quiet(path):
    shutil.rmtree(path, ignore_errors=True)
