"""Frame stacks: a store created with ``frame_stack=k`` keeps one frame per transition.

Its states are stacks of the ``k`` newest frames, ``(k, *frame)``, newest last (what
Gymnasium's ``FrameStackObservation`` gives). Consecutive states of one env share
``k - 1`` frames, so the ``states`` rows hold only each state's newest frame, and a
stack is rebuilt from the frames of the env's previous transitions ``t, t - n, ...``
(``n`` = ``num_envs``). Exactness rests on three rules:

* **Bases.** Where a state does not continue its env's previous state (the first state of
  an episode, anything that does not overlap by ``k - 1`` frames, the first step after
  ``create``, ``reset`` or an open), the whole state is written to the *stack ring*, a
  second ring of the jump ring's kind (``jumps.JumpRing``: ``stack_records.npy`` holds
  transition numbers, ``stack_states.npy`` the sparse whole stacks), counted by word
  ``W_STACKS`` of ``meta.bin`` and the checkpoint's ``stacks``. A rebuild walks back
  from ``t`` at most ``k - 1`` transitions and stops at the first base.
  ``add`` decides "continues" from what it holds: the previous step's state ``s`` and
  next state ``s'`` of env ``e`` overlap (``s'[:-1] == s[1:]``, remembered from that add)
  and this step's state equals ``s'`` (the jump check already compares those bytes).
* **The tail.** A live stack may need frames of transitions the ring overwrote (up to
  ``k - 1`` per env). Before a step overwrites a slot, the frame it holds is copied to
  ``stack_tail.npy``, a ring of ``reserve_rows + (k + 1) * n`` frames indexed by
  transition number: larger than what the undo reserve lets happen between two flushes,
  so after a power cut the tail still holds every frame the checkpoint's state needs.
* **The window.** Lookups search the newest ``max_size + k * n`` records of the stack ring
  (a base the ring overwrote may still start a live stack); its capacity adds
  ``reserve_rows`` of room, as the jump ring's does.

Next states follow the existing rule (``ns_buffer`` for the newest step, the jump ring's
whole stacks at autoresets, else the next transition's state, rebuilt as a stack).
"""
from __future__ import annotations

import numbers
import os

import numpy as np

from ...errors import CorruptStoreError, InvalidArgumentError
from ..jumps import JumpRing, create_jump_files, memcmp
from ...disk.npyfile import create_npy, open_npy
from ...core.roworder import SLOT_ORDER, SlotOrder
from ...core.schema import FieldSpec
from ...format.counters import W_STACKS
from ..base import Checks, Geometry, OpenPart, Part, Step, npy_bytes

STACK_RECORDS_FILE = "stack_records.npy"
STACK_STATES_FILE = "stack_states.npy"
STACK_TAIL_FILE = "stack_tail.npy"
STACK_FILES = (STACK_RECORDS_FILE, STACK_STATES_FILE, STACK_TAIL_FILE)


# ---------------------------------------------------------------------- arguments and shapes
def check_frame_stack(k) -> int | None:
    """``create``'s ``frame_stack``: None, or an integer of at least 2."""
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise InvalidArgumentError(f"frame_stack must be an integer >= 2 (the frames per state) or None, got {k!r}")
    if k < 2:
        raise InvalidArgumentError(
            f"frame_stack must be at least 2 (a stack of {int(k)} frame(s) has nothing to share), got {int(k)}; "
            "leave it out to store whole states")
    return int(k)


def frame_spec(states: FieldSpec, k: int, error=InvalidArgumentError) -> FieldSpec:
    """The spec of one frame of ``states`` (shape ``(k, *frame)``), or ``error`` saying why
    these states cannot be stacks of ``k`` frames."""
    shape = tuple(states.shape)
    if not shape:
        raise error(f"frame_stack={k} needs states with a leading frame axis of length {k}, "
                    f"but states are scalars (shape ()); leave frame_stack out for these states")
    if shape[0] != k:
        size = "larger than" if k > shape[0] else "not"
        raise error(f"frame_stack={k} is {size} the first axis of states {shape} (its length is {shape[0]}); "
                    f"states must have shape ({k}, *frame), the newest frame last")
    return FieldSpec("states", shape[1:], states.dtype)


def stack_spec(frame: FieldSpec, k: int) -> FieldSpec:
    """The spec of a whole state: ``k`` frames."""
    return FieldSpec("states", (k,) + tuple(frame.shape), frame.dtype)


def record_window(max_size: int, num_envs: int, k: int) -> int:
    return max_size + k * num_envs


def tail_rows(num_envs: int, k: int, reserve_rows: int) -> int:
    return reserve_rows + (k + 1) * num_envs


def create_stack_files(directory: str, frame: FieldSpec, k: int, max_size: int, num_envs: int,
                       reserve_rows: int) -> None:
    capacity = record_window(max_size, num_envs, k) + reserve_rows
    create_jump_files(directory, stack_spec(frame, k), capacity, names=(STACK_RECORDS_FILE, STACK_STATES_FILE))
    create_npy(os.path.join(directory, STACK_TAIL_FILE), (tail_rows(num_envs, k, reserve_rows),) + frame.shape,
               frame.dtype)


def overlaps(states: np.ndarray, next_states: np.ndarray) -> np.ndarray:
    """A bool per env: whether ``next_states[e][:-1]`` equals ``states[e][1:]`` byte for byte
    (the env advanced its stack by one frame)."""
    n = len(states)
    a = np.ascontiguousarray(next_states[:, :-1]).reshape(n, -1).view(np.uint8)
    b = np.ascontiguousarray(states[:, 1:]).reshape(n, -1).view(np.uint8)
    return (a == b).all(axis=1)


def overlap_rule(num_envs: int, k: int, frame_bytes: int):
    """``overlaps(states, next_states)`` as a function for the fast add: ``memcmp`` of each
    env's ``k - 1`` shared frames where both arrays are C-contiguous, else ``overlaps``."""
    shared, row = (k - 1) * frame_bytes, k * frame_bytes
    if memcmp is None or not shared:
        return overlaps

    def rule(states, next_states):
        if not (states.flags.c_contiguous and next_states.flags.c_contiguous):
            return overlaps(states, next_states)
        a, b = states.ctypes.data + frame_bytes, next_states.ctypes.data
        return np.array([memcmp(a + e * row, b + e * row, shared) == 0 for e in range(num_envs)])
    return rule


class FrameStacks(OpenPart):
    """The opened stack files of a frame-stack store (see the module docstring)."""

    def __init__(self, directory: str, frame: FieldSpec, k: int, max_size: int, num_envs: int,
                 reserve_rows: int, writable: bool, order: SlotOrder = SLOT_ORDER):
        """``order``: which row of the ``states`` field holds a slot (``roworder.py``)."""
        self.k, self.num_envs, self.max_size = k, num_envs, max_size
        self.order = order
        self.frame = frame
        self.tail_file = None
        self.records = JumpRing(directory, stack_spec(frame, k), max_size, reserve_rows, writable,
                                names=(STACK_RECORDS_FILE, STACK_STATES_FILE),
                                window=record_window(max_size, num_envs, k))
        try:
            self.rows = tail_rows(num_envs, k, reserve_rows)
            self.tail_file, self.tail, _ = open_npy(os.path.join(directory, STACK_TAIL_FILE),
                                                    (self.rows,) + frame.shape, frame.dtype, writable)
        except BaseException:
            self.close()
            raise

    def overlap_rule(self, num_envs: int):
        return overlap_rule(num_envs, self.k, self.frame.row_bytes)

    @property
    def room(self) -> int:
        return self.records.room

    @property
    def mapped_files(self) -> list:
        return [f for f in (self.records.file, self.tail_file) if f is not None]

    # ------------------------------------------------------------------ writing
    def save_tail(self, frames: np.ndarray, seen: int, base: int) -> None:
        """Before the step after ``seen`` overwrites slots: copy the frames they hold (of
        transitions ``seen - max_size + 1 ...``, those after ``base``) into the tail.
        ``frames``: the ``states`` field's rows, in the file's order (``self.order``)."""
        m, n = self.max_size, self.num_envs
        first = max(seen - m, base) + 1
        last = seen + n - m
        if first > last:
            return
        vs = np.arange(first, last + 1, dtype=np.int64)
        self.tail[(vs - 1) % self.rows] = frames[self.order.rows((vs - base - 1) % m)]

    def append(self, count: int, ts, states: np.ndarray) -> int:
        return self.records.append(count, ts, states)

    def plan_step(self, step: Step) -> int:
        """The step's bases (``step.bases``): envs whose state does not continue their
        previous state by one frame (a jump, ``step.jumped``, or no overlap), whose whole
        states the stack ring records. ``ws.overlap`` is unknown until the step commits."""
        ws = step.ws
        overlap, ws.overlap = ws.overlap, None
        continues = ~overlap if overlap is not None and step.seen > step.base else True
        step.bases = step.jumped | continues
        return int(np.count_nonzero(step.bases))

    def before_rows(self, step: Step) -> None:
        """Save the frames the step overwrites into the tail; the ring stores each state's last frame."""
        step.states = state = step.values[0]
        self.save_tail(step.rows[0], step.seen, step.base)
        step.values = [state[:, -1]] + step.values[1:]

    def after_rows(self, step: Step, words) -> int:
        bases = step.bases
        if not bases.any():
            return self.count
        count = self.append(self.count, step.seen + 1 + np.flatnonzero(bases), step.states[bases])
        self.record(words, count)
        return count

    def after_commit(self, step: Step) -> None:
        step.ws.overlap = overlaps(step.states, step.values[-1])

    def copy_into(self, other: "FrameStacks", count: int, seen: int, base: int, num_envs: int) -> int:
        """The stack ring's records in its lookup window (whole states that live stacks may
        start from), and the tail of overwritten frames, row for row."""
        ts, ks = self.records.window_records(count, 0, seen)
        copied = self.records.copy_records(other.records, ts, ks)
        other.tail[:] = self.tail
        return copied

    def sync(self) -> None:
        self.records.sync()
        self.tail_file.sync()

    # ------------------------------------------------------------------ reading
    def snapshot(self, words, seen: int, num_envs: int, view) -> int:
        if view is not None:
            return view.stacks
        return self.committed(int(words[W_STACKS]), seen)

    def kept(self, words, seen: int, intent: int, num_envs: int, count: int) -> bool:
        """The stack ring's records (fewer than its room written since the snapshot) and the
        tail (whose rows are rewritten only ``room`` transitions after the snapshot's oldest
        frames died) are still those of the snapshot."""
        return int(words[W_STACKS]) + num_envs - count <= self.room and intent - seen <= self.room

    def committed(self, count: int, seen: int) -> int:
        """``count`` less records of an uncommitted step (bases of transitions after ``seen``)."""
        return self.records.committed(count, seen, self.num_envs, newest=seen)

    def plan(self, ts: np.ndarray, base: int, count: int):
        """What rebuilding the states of transitions ``ts`` (each after ``base``) reads:
        ``(chain, slots, found, ks)``, the transitions ``t - (k-1)*n, ..., t - n, t`` of each,
        their slots, and which of them have a whole state among the first ``count`` records
        of the stack ring (those rows are announced to the kernel now)."""
        k, n, m = self.k, self.num_envs, self.max_size
        chain = np.asarray(ts, np.int64)[:, None] - np.arange(k - 1, -1, -1, dtype=np.int64) * n
        found, ks = self.records.find(chain.ravel(), count)
        if found.any():
            self.records.will_need(ks[found])
        return chain, (chain - base - 1) % m, found.reshape(chain.shape), ks.reshape(chain.shape)

    def finish(self, plan, frames: np.ndarray, seen: int, base: int) -> np.ndarray:
        """The whole states of a ``plan``, given ``frames``, the ring's rows at its slots
        (``patch`` on the rows whose chains need it)."""
        chain, _, found, ks = plan
        k = self.k
        out = frames.reshape(chain.shape + self.frame.shape)
        oldest_live = max(seen - self.max_size, base)
        if not len(chain) or not found.any() and int(chain[:, 0].min()) > oldest_live:
            return out  # the common case: every frame in the ring, no base in any chain
        newest = np.where(found.any(axis=1), k - 1 - found[:, ::-1].argmax(axis=1), -1)  # a row's newest base
        rows = np.flatnonzero((newest >= 0) | (chain[:, 0] <= oldest_live))
        pos = newest[rows]
        for i, p, rec, first in zip(rows.tolist(), pos.tolist(), ks[rows, np.maximum(pos, 0)].tolist(),
                                    chain[rows, 0].tolist()):
            self.patch(out[i], first, p, rec, seen, base)
        return out

    def patch(self, out: np.ndarray, first: int, p: int, rec: int, seen: int, base: int) -> None:
        """Make ``out`` the stack of transitions ``first, first + n, ..., first + (k-1)n``
        (``n`` = ``num_envs``), given the ring's frames there, where ``p`` is the position
        of its newest base (-1: none) and ``rec`` that base's stack-ring record: the base's
        whole state gives the frames up to its own (one positioned read of its last ``p + 1``
        frames); frames after it that the ring overwrote come from the tail."""
        k, n = self.k, self.num_envs
        if p >= 0:
            self.records.read_into(rec, out[:p + 1], k - 1 - p)
        oldest_live = max(seen - self.max_size, base)
        for j in range(p + 1, k):
            u = first + j * n
            if u > oldest_live:
                break  # chains ascend: the rest is in the ring
            if u <= max(base, seen - self.max_size - self.rows + n):  # older frames are in no file
                raise CorruptStoreError("a frame stack needs a frame that neither the ring, the stack ring nor "
                                        "the tail holds; the stack files are damaged")
            out[j] = self.tail[(u - 1) % self.rows]

    def chain_slots(self, slots: np.ndarray) -> np.ndarray:
        """Every slot a rebuild of the states at ``slots`` and of their next states may read
        (for a reader's check that a live writer did not rewrite them meanwhile)."""
        slots = np.asarray(slots, np.int64)
        back = np.arange(-1, self.k, dtype=np.int64) * self.num_envs
        return ((slots[:, None] - back[None, :]) % self.max_size).ravel()

    def close(self) -> None:
        self.tail = None
        if self.tail_file is not None:
            self.tail_file.close()
            self.tail_file = None
        if getattr(self, "records", None) is not None:
            self.records.close()
            self.records = None


class Stacks(Part):
    """Frame stacks as a part: the stack ring and the tail of a ``frame_stack=k`` store."""
    name = "stacks"
    names = STACK_FILES
    word = W_STACKS
    header = "stacks"

    @classmethod
    def wanted(cls, g: Geometry) -> bool:
        return bool(g.frame_stack)

    @classmethod
    def files(cls, g: Geometry) -> list[str]:
        return list(cls.names)

    @classmethod
    def npy_files(cls, g: Geometry) -> dict:
        frame, k = g.specs["states"], g.frame_stack
        capacity = record_window(g.max_size, g.num_envs, k) + g.reserve_rows
        return {STACK_RECORDS_FILE: ((capacity,), np.dtype(np.int64)),
                STACK_STATES_FILE: ((capacity,) + stack_spec(frame, k).shape, frame.dtype),
                STACK_TAIL_FILE: ((tail_rows(g.num_envs, k, g.reserve_rows),) + frame.shape, frame.dtype)}

    @classmethod
    def bytes_needed(cls, g: Geometry) -> int:
        # stack_states.npy is sparse, but over the ring's laps every row of it gets written
        return sum(npy_bytes(shape, dtype) for shape, dtype in cls.npy_files(g).values())

    @classmethod
    def create(cls, directory: str, g: Geometry) -> None:
        create_stack_files(directory, g.specs["states"], g.frame_stack, g.max_size, g.num_envs, g.reserve_rows)

    @classmethod
    def open(cls, directory: str, g: Geometry, writable: bool, storage=None) -> "FrameStacks":
        return FrameStacks(directory, g.specs["states"], g.frame_stack, g.max_size, g.num_envs, g.reserve_rows,
                           writable, storage.order("states"))

    @classmethod
    def check(cls, c: Checks) -> None:
        """Its files, and that every jump's next transition of the same env (``t + num_envs``)
        in the ring is a base: a batch searches the jump ring only at bases (``decode.py``)."""
        offset = c.npy_files(cls)[STACK_RECORDS_FILE]
        jumped = c.found.get("jumped")
        if offset is None or jumped is None:
            return
        n, m = c.g.num_envs, c.g.max_size
        stacks, window = int(c.words[W_STACKS]), record_window(m, n, c.g.frame_stack)
        capacity, path = window + c.g.reserve_rows, os.path.join(c.directory, STACK_RECORDS_FILE)
        needs = jumped[(jumped + n > max(c.base, c.seen - m)) & (jumped + n <= c.seen)] + n
        records = np.fromfile(path, "<i8", count=capacity, offset=offset)
        missing = needs[~np.isin(needs, records[np.arange(max(0, stacks - window), stacks) % capacity])]
        c.report.checked["jump_bases"] = len(needs)
        if not len(missing):
            return
        if c.word_now(W_STACKS) != stacks:  # a live writer recorded bases meanwhile, over the oldest read
            c.report.notes.append(f"{STACK_RECORDS_FILE}: jump bases not checked, a live writer kept recording bases")
            return
        c.report.problem(f"{path}: {len(missing)} transition(s) after an autoreset jump are not bases (first: "
                         f"{int(missing[0])}); their stacks may be rebuilt from the wrong frames")


__all__ = ["Stacks", "STACK_FILES", "STACK_RECORDS_FILE", "STACK_STATES_FILE", "STACK_TAIL_FILE", "FrameStacks",
           "check_frame_stack", "create_stack_files", "frame_spec", "overlap_rule", "overlaps", "record_window",
           "stack_spec", "state_spec", "tail_rows"]


def state_spec(specs, frame_stack: int | None) -> FieldSpec:
    """The spec of one whole state: the ``states`` rows, or ``frame_stack`` of them."""
    return stack_spec(specs["states"], frame_stack) if frame_stack else specs["states"]
