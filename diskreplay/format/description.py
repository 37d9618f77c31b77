"""``store.json``: the static description of a store, written once atomically."""
from __future__ import annotations

import json
import os
import time

from ..errors import CorruptStoreError, InvalidArgumentError, UnsupportedFormatError
from ..disk.fsutil import atomic_write, io_error
from ..core.roworder import ENV_MAJOR, LAYOUT_KEY, frames_layout
from ..core.schema import fields_from_json

FORMAT_VERSION = 3  # the newest this code reads and writes
JUMPS_VERSION = 2  # the jump ring: every store this code writes has it
MAX_SLOTS = 1 << 40
DESCRIPTION_FILE = "store.json"


def version_of(layout: str | None) -> int:
    """The format version a store with frames ``layout`` gets: 3 for env-major frames, so that a
    diskreplay that knows only version 2 refuses the store instead of reading its frames in
    slot order; 2 for every other store (they read the same as before)."""
    return FORMAT_VERSION if layout == ENV_MAJOR else JUMPS_VERSION


def new_description(*, backend, max_size, num_envs, batch_size, use_cer, fields, entropy,
                    reserve_rows, flush_every, frame_stack=None) -> dict:
    """``frame_stack`` (an int) adds the key ``frame_stack``; ``fields`` then holds one frame
    as ``states`` (the rows stored), and other stores' descriptions stay as they were; with
    ``max_size % num_envs == 0`` also ``frames_layout`` (``roworder.py``: the frames env-major)."""
    extra = {} if frame_stack is None else {"frame_stack": frame_stack}
    layout = frames_layout(frame_stack, max_size, num_envs)
    if layout:
        extra[LAYOUT_KEY] = layout
    return {
        "format": "diskreplay",
        "format_version": version_of(layout),
        "backend": backend,
        "max_size": max_size,
        "num_envs": num_envs,
        "batch_size": batch_size,
        "use_cer": use_cer,
        "fields": None if fields is None else {n: s.to_json() for n, s in fields.items()},
        "seed_entropy": str(entropy),
        "reserve_rows": reserve_rows,
        "flush_every": flush_every,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }


def write_description(directory: str, description: dict) -> None:
    atomic_write(os.path.join(directory, DESCRIPTION_FILE),
                 (json.dumps(description, indent=2) + "\n").encode())


def read_description(directory: str, backends=None) -> dict:
    """Parse and validate ``store.json``; the result has ``fields`` as FieldSpecs (or None).
    ``backends``: the backend names a store may name (callers pass ``backends.BACKENDS``;
    this module stays below the backends)."""
    path = os.path.join(directory, DESCRIPTION_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except OSError as exc:
        raise io_error(f"reading {path}", exc) from exc
    return parse_description(raw, path, backends)


def parse_description(raw: bytes, path: str = DESCRIPTION_FILE, backends=None) -> dict:
    """Validate the bytes of a description; every problem is a CorruptStoreError naming ``path``."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptStoreError(f"{path} is not valid JSON ({exc}); the store description is damaged") from exc
    if not isinstance(d, dict) or d.get("format") != "diskreplay":
        raise CorruptStoreError(f"{path} is not a diskreplay store description")
    version = d.get("format_version")
    if not _is_int(version) or version < 1:
        raise CorruptStoreError(f"{path}: format_version is {version!r}, expected a positive integer")
    if version > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path}: the store has format_version {version}, this diskreplay reads up to "
            f"{FORMAT_VERSION}; upgrade diskreplay to open it")

    def need(key, check, what):
        value = d.get(key)
        if not check(value):
            raise CorruptStoreError(f"{path}: {key} is {value!r}, expected {what}")
        return value

    if backends is None:
        need("backend", lambda v: isinstance(v, str) and v != "", "a backend name")
    else:
        need("backend", lambda v: v in backends, f"one of {tuple(backends)}")
    max_size = need("max_size", lambda v: _is_int(v) and 1 <= v <= MAX_SLOTS, f"an integer in [1, {MAX_SLOTS}]")
    num_envs = need("num_envs", lambda v: _is_int(v) and 1 <= v <= max_size, f"an integer in [1, {max_size}]")
    need("batch_size", lambda v: _is_int(v) and 1 <= v <= MAX_SLOTS, f"an integer in [1, {MAX_SLOTS}]")
    need("use_cer", lambda v: isinstance(v, bool), "true or false")
    need("seed_entropy", lambda v: isinstance(v, str) and 0 < len(v) <= 200 and v.isascii() and v.isdigit(),
         "a decimal string")
    need("flush_every", lambda v: v is None or (_is_int(v) and v >= 1), "null or an integer >= 1")
    need("frame_stack", lambda v: v is None or (_is_int(v) and 2 <= v <= 1 << 20), "absent or an integer >= 2")
    need(LAYOUT_KEY, lambda v: v is None or v == ENV_MAJOR and d.get("frame_stack") and max_size % num_envs == 0,
         f"absent or {ENV_MAJOR!r} (a frame-stack store whose max_size is a multiple of num_envs)")
    if (version == FORMAT_VERSION) != (d.get(LAYOUT_KEY) == ENV_MAJOR):
        raise CorruptStoreError(f"{path}: format_version {version} with {LAYOUT_KEY} {d.get(LAYOUT_KEY)!r}: "
                                f"version {FORMAT_VERSION} is exactly the stores with {ENV_MAJOR!r} frames")
    out = dict(d)  # "frame_stack" and "frames_layout" only where written: read them with out.get(key)
    if d.get("fields") is None:
        out["fields"] = None
        out["reserve_rows"] = None
    else:
        try:
            out["fields"] = fields_from_json(d["fields"])
        except InvalidArgumentError as exc:
            raise CorruptStoreError(f"{path}: fields are invalid: {exc}") from exc
        need("reserve_rows", lambda v: _is_int(v) and num_envs <= v <= max_size,
             f"an integer in [{num_envs}, {max_size}]")
    out["seed_entropy"] = int(d["seed_entropy"])
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
