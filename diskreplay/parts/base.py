"""The ``Part`` protocol: data a store keeps beside its rows, declared in one place.

A part is a class (what it declares about a store: whether the store has it, its files,
the bytes they can ever take, its counter word and checkpoint field) and the object its
``open`` returns (what it does while the store is open: at least ``sync``, ``close`` and
``mapped_files``). The store's directory, create's free-space check, the reserved field
names, ``verify``'s file checks and the data files' open and close loop over
:data:`diskreplay.parts.PARTS` and never name a part. Every hook is a no-op by default; a
part overrides what it needs.

``Geometry`` is what a part's files follow from: the backend, the fields (``states`` one
frame in a frame-stack store), ``max_size``, ``num_envs``, the undo reserve, ``frame_stack``,
whether the store is prioritized and its format version. Both ``create`` (from its
arguments) and an open store (from ``store.json``) build one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..backends import Backend, get_backend
from ..core.schema import FieldSpec


@dataclass(frozen=True)
class Geometry:
    backend: Backend
    specs: dict  # name -> FieldSpec; a frame-stack store's "states" is one frame
    max_size: int
    num_envs: int
    reserve_rows: int
    frame_stack: int | None = None
    prioritized: bool = False
    format_version: int | None = None  # None: a store being created (the newest format)
    desc: dict | None = field(default=None, compare=False, repr=False)  # an open store's store.json

    @property
    def states(self) -> FieldSpec:
        """A whole state as the ``ns_buffer`` and the jump ring hold it (k frames in a frame-stack store)."""
        frame = self.specs["states"]
        if not self.frame_stack:
            return frame
        return FieldSpec("states", (self.frame_stack,) + tuple(frame.shape), frame.dtype)

    @classmethod
    def of(cls, desc: dict, prioritized: bool) -> "Geometry":
        """The geometry of an existing store with fields, from its description."""
        return cls(get_backend(desc["backend"]), desc["fields"], desc["max_size"], desc["num_envs"], desc["reserve_rows"],
                   desc.get("frame_stack"), prioritized, desc.get("format_version"), desc)


class Part:
    """Side data of a store. Override what the part needs; the defaults declare nothing."""
    name: str = ""
    names: tuple = ()           # every file name the part may ever own (the directory's own names)
    word: int | None = None     # its count word in meta.bin, or None
    header: str | None = None   # its field in the checkpoint header, or None
    since: int | None = None    # the format version that brought it, where a writer adds it to older stores
    gives: str = ""             # what it gives readers, for the message that asks a reader to reopen

    @classmethod
    def wanted(cls, g: Geometry) -> bool:
        """Does a store of this geometry have the part."""
        return False

    @classmethod
    def files(cls, g: Geometry) -> list[str]:
        """Its files in a store of this geometry (names in the store directory)."""
        return []

    @classmethod
    def npy_files(cls, g: Geometry) -> dict[str, tuple[tuple, np.dtype]]:
        """Its ``.npy`` files and their (shape, dtype), for ``verify``'s header and size checks."""
        return {}

    @classmethod
    def bytes_needed(cls, g: Geometry) -> int:
        """The bytes its files can ever take on disk (sparse files at their full size):
        create's free-space check counts them, so an accepted store never outgrows it.
        Its ``datasets`` are counted with the backend's, not here."""
        return 0

    @classmethod
    def datasets(cls, g: Geometry) -> dict[str, FieldSpec]:
        """Datasets it keeps in the backend beside the fields (created with them)."""
        return {}

    @classmethod
    def create(cls, directory: str, g: Geometry) -> None:
        """Make its files (the backend made its datasets)."""

    @classmethod
    def open(cls, directory: str, g: Geometry, writable: bool, storage=None):
        """Its open object (``storage``: the store's opened rows, for parts that read row orders)."""
        return None

    @classmethod
    def check(cls, c: "Checks") -> None:
        """``verify``'s checks of the part, read-only and safe beside a live writer: by default
        the headers and sizes of its ``.npy`` files; problems go to ``c.report``."""
        c.npy_files(cls)


@dataclass
class Checks:
    """What ``verify`` gives each part's ``check``: the store (``directory``, its description
    ``desc`` and geometry ``g``), the live counters read once (``seen``, ``base`` and the
    words, all None where they cannot be trusted), the report, and ``found``, where a part
    leaves results a later part checks against (the jump ring's transitions for the stack
    ring's bases; parts are checked in ``PARTS`` order)."""
    directory: str
    desc: dict
    g: Geometry
    seen: int | None
    base: int | None
    words: object  # a copy of meta.bin's words, or None
    report: object  # verify.VerifyReport: problem(), notes, checked, count()
    check_npy: object  # check_npy(path, shape, dtype) -> data offset, or None (reported)
    word_now: object  # word_now(index) -> that word of meta.bin as it is now (has a live writer moved it?)
    found: dict = field(default_factory=dict)

    def npy_files(self, part) -> dict:
        """Headers and sizes of ``part``'s ``.npy`` files: each file's data offset, or None (reported)."""
        return {name: self.check_npy(os.path.join(self.directory, name), shape, dtype)
                for name, (shape, dtype) in part.npy_files(self.g).items()}


class Step:
    """One add as the parts see it (``Writer._write_step``, the general path; the fast adds
    take only steps that give no part a record). The writer fills ``values`` (the step's
    fields in field order, next states last; a part may replace them before the rows are
    written), ``seen`` and ``base`` (the ring before the step), ``num_envs``, ``previous``
    (the next states the previous step gave, from the ``ns_buffer``), ``rows`` (the open
    field arrays) and ``ws`` (the writer's ``WriteState``). Parts run in ``PARTS`` order and
    may leave results for later parts: the jump ring's ``jumped`` (which envs' states differ
    from ``previous``) is what the stack ring's bases start from."""

    __slots__ = ("values", "seen", "base", "num_envs", "previous", "rows", "ws", "jumped", "states", "bases")

    def __init__(self, values: list, seen: int, base: int, num_envs: int, previous, rows: list, ws):
        self.values, self.seen, self.base, self.num_envs = values, seen, base, num_envs
        self.previous, self.rows, self.ws = previous, rows, ws
        self.jumped = self.states = self.bases = None


class OpenPart:
    """A part's open object: what it does while the store is open. The sessions call every
    hook on every open part (``DataFiles.parts``) and never ask which part it is; each hook
    is a no-op here, and a part overrides what it needs.

    An add's general path calls, per part: ``plan_step`` (how many records the step will
    add, so that the writer flushes first where that passes ``limit``), ``before_rows``
    (after any flush, before the rows are written), ``after_rows`` (write the records and
    store the count word: the step is not yet committed) and ``after_commit``.

    A part with a counter word (``part.word``: the jump ring, the stack ring) counts the
    records it committed: ``count`` is that count in the session's snapshot, ``limit`` the
    count past which the writer flushes first (``reserve_rows`` records past the newest
    checkpoint's, ``Flusher.set_flush_limit``)."""

    part: type = None  # its Part class (set when the store's files are opened)
    count = 0
    limit = 1 << 62

    def plan_step(self, step: Step) -> int:
        """How many records ``step`` will add (0 for a part that does not count records)."""
        return 0

    def before_rows(self, step: Step) -> None:
        """Before ``step``'s rows are written over the oldest ones (and after any flush)."""

    def after_rows(self, step: Step, words) -> int:
        """``step``'s rows are written: write its records and store the new count in the
        counter word (``record``); returns that count, which the writer adopts once the step
        commits. A write error propagates (the writer settles the step and refuses writes)."""
        return self.count

    def after_commit(self, step: Step) -> None:
        """``step`` committed (its counts adopted)."""

    def record(self, words, count: int) -> None:
        """Store ``count`` in its counter word (a step's records, before the step commits)."""
        words[self.part.word] = count

    def snapshot(self, words, seen: int, num_envs: int, view) -> int:
        """A reader's committed count at ``seen`` (``view``: a dead writer's recovered view,
        or None), from ``meta.bin``'s ``words``."""
        return 0

    def kept(self, words, seen: int, intent: int, num_envs: int, count: int) -> bool:
        """Whether a read from the snapshot at ``seen`` (its count ``count``) may still trust
        this part's records, given the writer's ``words`` now and its step in flight ``intent``."""
        return True

    @property
    def mapped_files(self) -> list:
        """Its memory-mapped files (for tools that drop a process's mapped pages)."""
        return []

    def recover(self, seen: int, base: int, generation: int, from_checkpoint: bool) -> None:
        """The writer opened (or materialised) the store at ring state ``(seen, base)``, the
        newest checkpoint ``generation``; ``from_checkpoint``: recovery rolled back to it."""

    def checkpoint(self, generation: int, seen: int, base: int) -> None:
        """A flush is about to write checkpoint ``generation`` at ``(seen, base)``: make this
        part's state of that flush durable first (the header is the commit point)."""

    def undo_reset(self, generation: int) -> None:
        """A reset that did not become durable is undone: back to checkpoint ``generation``."""

    def copy_into(self, other: "OpenPart", count: int | None, seen: int, base: int, num_envs: int) -> int | None:
        """``convert``: copy what this part holds for the ring state ``(seen, base)`` (its
        ``count`` committed records, where it counts records) into ``other``, the same part
        of the new store, whose rows were copied slot for slot; returns ``other``'s record
        count (None: a part without a counter word)."""
        return None

    def sync(self) -> None:
        """Make its files durable (a flush, before the checkpoint)."""

    def close(self) -> None:
        """Release its files."""


def npy_bytes(shape: tuple, dtype) -> int:
    """A ``.npy`` file's bytes, its header page counted whole (headers are padded to 64 bytes;
    4096 is a bound that keeps the count simple)."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + 4096
