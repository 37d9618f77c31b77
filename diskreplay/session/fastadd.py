"""The fast adds: ``add`` specialised for a store's fields (the four core fields and any
extra ones), built by ``Writer.bind_add`` as closures over the writer's arrays and
counter words. Extra fields cost a name check and a value rule each (``_extras_rule``),
not a trip through the general path.

Each call takes the session's mutex, does cheap checks on cached shapes, dtypes, types
and value ranges, then the commit protocol of ``counters.begin_step`` / ``commit_step``
written inline (a call per step would cost a measurable share of an add). Anything the
checks do not accept (so every value is known to store exactly before the first row is
touched), a step that wraps the ring end or is due for a flush (``WriteState.due``; early work
due, ``Flusher.work_early``, is handed over here and the add goes on), a step whose states
differ in any byte from the next states the previous step gave (a jump: the general path
records it in the jump ring, ``jumps.py``; this one byte comparison is all a fast add
pays for exact next states), a writer that is no longer ``live``, and a call made while
a flush, reset or general add of this thread is running (``busy``: from a signal
handler) go through the general path. An exception
part-way (Ctrl-C, a signal handler's ``sys.exit``) settles the step (``Writer.settle``)
before it propagates.

The fast paths (each falls back to ``Writer.add``, the general path; all of them are proven
byte-identical to it by one state machine over every store kind,
``tests/features/test_commit_paths.py``, whose kind and ``kernel`` draw are named here):

=========================  ===================================================  ==========================
path                       applies when (beside the checks above)               equivalence draw
=========================  ===================================================  ==========================
``fast_add``               one env, no frame stack                              plain, extras, priorities
``fast_vector_add``        a vector env, no frame stack; the step does not      plain, extras, priorities
                           wrap the ring end
``_rows.step`` (C)         as ``fast_vector_add``, no extra fields, ``_rows``   plain, priorities with
                           built (not ``DISKREPLAY_PURE``), C-contiguous        ``kernel=True``
                           inputs (else the Python body above)
``fast_stack_add``         one env of a frame-stack store; the previous step's  stacks
                           next state overlapped its state (no base to record)
``fast_stack_vector_add``  a vector env of a frame-stack store; every env's     stacks
                           stack continues; the step does not wrap the ring end
=========================  ===================================================  ==========================

The inline commits are plain numpy stores and rely on x86-64 TSO for a live reader to see
``intent``, the rows, then ``seen`` and the check word in that order (FORMAT.md, "Memory
ordering"); ``_rows.step`` fences and stores them with release semantics itself.
"""
from __future__ import annotations

import numpy as np

from ..format.counters import W_CHECK, W_INTENT, W_SEEN
from ..parts.jumps import SMALL_BYTES, same_bytes
from ..core.schema import FieldSpec, float_bounds

from .. import native


def step_kernel():
    """``_rows.step``, or None where ``_rows`` is not built or DISKREPLAY_PURE is set (the
    vector add then writes its fields with numpy); looked up when a fast add is bound, so
    ``native.turned_off("rows")`` binds the Python body."""
    return None if native.rows is None else native.rows.step


def early(ws, flusher, t_end: int) -> bool:
    """For a step past ``ws.due`` that ends at ``t_end``: hand over the early work that is due
    (``Flusher.work_early``: it only posts jobs) so the add stays on its fast path. False
    (take the general path) if a flush is due instead, or the store closed meanwhile (a
    signal handler)."""
    if t_end > ws.flush_before:
        return False
    flusher.work_early()
    return ws.live


def fast_add(w):
    """``add`` for one env: cheap checks, a row store per field, one commit
    (``counters.begin_step`` and ``commit_step`` written inline)."""
    specs = w.fields
    shape, dtype = specs["states"].shape, specs["states"].dtype
    (a_types, a_lo, a_hi), (r_types, r_lo, r_hi), (d_types, d_lo, d_hi) = (
        _fast_scalar_rule(specs[name]) for name in ("actions", "rewards", "dones"))
    states, actions, rewards, dones = _core_arrays(w)
    extras_ok, extra_arrays = _extras_rule(w, ()), _extra_arrays(w)
    has_extras = bool(extra_arrays)
    ns_rows = w.views["ns_rows"] = w.data.ns[:, 0]  # made read-only with the arrays at close
    ns_pair = (ns_rows[0], ns_rows[1])  # the previous step's next state is ns_pair[seen & 1]
    small, same = specs["states"].row_bytes <= SMALL_BYTES, same_bytes(ns_pair, specs["states"].row_bytes)
    words = w.words
    key = w.key
    max_size = w.max_size
    mutex = w.mutex
    settle = w.settle
    ndarray = np.ndarray
    general = w.add
    ws, flusher = w.ws, w.flusher  # all an add reads per call: the WriteState

    def add(state, action, reward, next_state, done, **extra):
        with mutex:
            if (ws.busy is not None or not ws.live or (extra or has_extras) and not extras_ok(extra)
                    or type(state) is not ndarray or state.shape != shape
                    or state.dtype != dtype or type(next_state) is not ndarray or next_state.shape != shape
                    or next_state.dtype != dtype or type(action) not in a_types or not a_lo <= action <= a_hi
                    or type(reward) not in r_types or not r_lo <= reward <= r_hi
                    or type(done) not in d_types or not d_lo <= done <= d_hi):
                return general(state, action, reward, next_state, done, extra)
            seen = ws.seen
            t = seen + 1
            if t > ws.due and not early(ws, flusher, t):
                return general(state, action, reward, next_state, done, extra)
            if t > ws.due or (state.tobytes() != ns_pair[seen & 1].tobytes() if small
                                      else not same(state, seen & 1)):
                return general(state, action, reward, next_state, done, extra)
            try:
                words[W_INTENT] = t
                slot = (seen - ws.base) % max_size
                states[slot] = state
                actions[slot] = action
                rewards[slot] = reward
                dones[slot] = done
                if has_extras:
                    for name, arr in extra_arrays:
                        arr[slot] = extra[name]
                ns_rows[t & 1] = next_state
                words[W_SEEN] = t
                words[W_CHECK] = t ^ key
                ws.seen = t
            except BaseException:
                settle()
                raise

    return add


def fast_vector_add(w):
    """``add`` for a vector env: exact-dtype arrays go straight to one slice write per field
    (or, where ``_rows`` is built, to its ``step``: the checks of the ring position, the
    compare, the row copies and the commit in one C call; ``step_plan``).

    The checks compare tuples of the cached shapes and dtypes (a tuple compares its items
    by identity first, so the same dtype objects cost no ``==``); exact dtypes need no value checks."""
    n = w.num_envs
    specs = w.fields
    (s_shape, s_dt), (a_shape, a_dt), (r_shape, r_dt), (d_shape, d_dt) = (
        ((n,) + specs[name].shape, specs[name].dtype) for name in ("states", "actions", "rewards", "dones"))
    shapes, dtypes = (s_shape, s_shape, a_shape, r_shape, d_shape), (s_dt, s_dt, a_dt, r_dt, d_dt)
    states, actions, rewards, dones = _core_arrays(w)
    extras_ok, extra_arrays = _extras_rule(w, (n,)), _extra_arrays(w)
    has_extras = bool(extra_arrays)
    ns = w.data.ns
    ns_pair = (ns[0], ns[1])  # the previous step's next states are ns_pair[(seen // n) & 1]
    step_bytes = n * specs["states"].row_bytes
    small, same = step_bytes <= SMALL_BYTES, same_bytes(ns_pair, step_bytes)
    words = w.words
    key = w.key
    max_size = w.max_size
    mutex = w.mutex
    settle = w.settle
    ndarray = np.ndarray
    general = w.add
    ws, flusher = w.ws, w.flusher  # all an add reads per call: the WriteState
    plan = step_plan(w) if not has_extras else None
    kernel = step_kernel() if plan is not None else None

    def add(state, action, reward, next_state, done, **extra):
        with mutex:
            if (ws.busy is not None or not ws.live or (extra or has_extras) and not extras_ok(extra)
                    or type(state) is not ndarray or type(next_state) is not ndarray
                    or type(action) is not ndarray or type(reward) is not ndarray or type(done) is not ndarray
                    or (state.shape, next_state.shape, action.shape, reward.shape, done.shape) != shapes
                    or (state.dtype, next_state.dtype, action.dtype, reward.dtype, done.dtype) != dtypes):
                return general(state, action, reward, next_state, done, extra)
            seen = ws.seen
            if seen + n > ws.due and not early(ws, flusher, seen + n):
                return general(state, action, reward, next_state, done, extra)
            if kernel is not None:  # one C call: no signal handler runs in the middle of it
                try:
                    stepped = kernel(plan, words, seen, ws.base, ws.due, state, action, reward, done, next_state)
                    if stepped:
                        ws.seen = seen + n
                        return
                except BaseException:
                    settle()  # an exception after the step committed: seen catches up
                    raise
                if stepped is False:  # a flush or its early work due, the ring end, a jump
                    return general(state, action, reward, next_state, done, extra)
                # None: an input that is not C-contiguous, copied below
            t_end = seen + n
            start = (seen - ws.base) % max_size
            stop = start + n
            if stop > max_size or t_end > ws.due or (
                    state.tobytes() != ns_pair[(seen // n) & 1].tobytes() if small
                    else not same(state, (seen // n) & 1)):
                return general(state, action, reward, next_state, done, extra)
            try:
                words[W_INTENT] = t_end
                states[start:stop] = state
                actions[start:stop] = action
                rewards[start:stop] = reward
                dones[start:stop] = done
                if has_extras:
                    for name, arr in extra_arrays:
                        arr[start:stop] = extra[name]
                ns[(t_end // n) & 1] = next_state
                words[W_SEEN] = t_end
                words[W_CHECK] = t_end ^ key
                ws.seen = t_end
            except BaseException:
                settle()
                raise

    return add


def step_plan(w) -> bytes | None:
    """The plan of ``_rows.step`` for a vector store's four core fields (``_rows.c``: their
    row bytes and addresses, the ``ns_buffer`` areas', the counter words' indices and the
    check key), or None where ``_rows`` is not built or an array is not C-contiguous.
    The addresses stay valid while the arrays do: the fast add that holds the plan holds them."""
    arrays = _core_arrays(w) + [w.data.ns]
    if step_kernel() is None or not all(arr.flags.c_contiguous for arr in arrays + [w.words]):
        return None
    ns = w.data.ns
    head = [4, w.num_envs, w.max_size, w.key, ns[0].nbytes, ns[0].ctypes.data, ns[1].ctypes.data,
            W_INTENT, W_SEEN, W_CHECK]
    for arr in arrays[:4]:
        head += [arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)), arr.ctypes.data]
    return np.array(head, np.int64).tobytes()


def fast_stack_add(w):
    """``add`` for one env of a frame-stack store: ``fast_add``'s checks, then what
    ``fast_stack_vector_add`` does for one row (anything else goes through the general path)."""
    specs, st = w.fields, w.state_spec
    shape, dtype = st.shape, st.dtype
    (a_types, a_lo, a_hi), (r_types, r_lo, r_hi), (d_types, d_lo, d_hi) = (
        _fast_scalar_rule(specs[name]) for name in ("actions", "rewards", "dones"))
    states, actions, rewards, dones = _core_arrays(w)
    extras_ok, extra_arrays = _extras_rule(w, ()), _extra_arrays(w)
    has_extras = bool(extra_arrays)
    ns_rows = w.views["ns_rows"] = w.data.ns[:, 0]  # made read-only with the arrays at close
    ns_pair = (ns_rows[0], ns_rows[1])
    small, same = st.row_bytes <= SMALL_BYTES, same_bytes(ns_pair, st.row_bytes)
    stacks = w.data.stacks
    tail, tail_rows, overlap = stacks.tail, stacks.rows, stacks.overlap_rule(1)
    words, key, max_size, mutex, settle, general = w.words, w.key, w.max_size, w.mutex, w.settle, w.add
    ws, flusher = w.ws, w.flusher  # all an add reads per call: the WriteState
    ndarray = np.ndarray

    def add(state, action, reward, next_state, done, **extra):
        with mutex:
            if (ws.busy is not None or not ws.live or (extra or has_extras) and not extras_ok(extra)
                    or type(state) is not ndarray or state.shape != shape
                    or state.dtype != dtype or type(next_state) is not ndarray or next_state.shape != shape
                    or next_state.dtype != dtype or type(action) not in a_types or not a_lo <= action <= a_hi
                    or type(reward) not in r_types or not r_lo <= reward <= r_hi
                    or type(done) not in d_types or not d_lo <= done <= d_hi):
                return general(state, action, reward, next_state, done, extra)
            seen, base, previous = ws.seen, ws.base, ws.overlap
            t = seen + 1
            if t > ws.due and not early(ws, flusher, t):
                return general(state, action, reward, next_state, done, extra)
            if previous is None or not previous[0] or seen == base or t > ws.due or (
                    state.tobytes() != ns_pair[seen & 1].tobytes() if small else not same(state, seen & 1)):
                return general(state, action, reward, next_state, done, extra)
            overlaps = overlap(state[np.newaxis], next_state[np.newaxis])
            try:
                ws.overlap = None  # unknown until the step commits (as in Writer._write_step)
                words[W_INTENT] = t
                slot = (seen - base) % max_size
                if seen - base >= max_size:  # the ring is full: keep the frame this step overwrites
                    tail[(seen - max_size) % tail_rows] = states[slot]
                states[slot] = state[-1]
                actions[slot] = action
                rewards[slot] = reward
                dones[slot] = done
                if has_extras:
                    for name, arr in extra_arrays:
                        arr[slot] = extra[name]
                ns_rows[t & 1] = next_state
                words[W_SEEN] = t
                words[W_CHECK] = t ^ key
                ws.seen = t
                ws.overlap = overlaps
            except BaseException:
                settle()
                raise

    return add


def fast_stack_vector_add(w):
    """``add`` for a vector env of a frame-stack store (``framestack.py``), on the fast
    vector add's checks: the step continues every env's stack (its states are the previous
    step's next states, byte for byte, and those overlapped their states by ``k - 1``
    frames: no base to record), so it writes the frames the step overwrites to the tail,
    each state's newest frame as its row, the other fields and the next states, and
    remembers whether this step's next states overlap its states. Anything else (a base, a
    wrap of the ring end, a flush due, other input) goes through the general path."""
    n = w.num_envs
    specs, st = w.fields, w.state_spec
    s_shape, s_dt = (n,) + st.shape, st.dtype
    (a_shape, a_dt), (r_shape, r_dt), (d_shape, d_dt) = (
        ((n,) + specs[name].shape, specs[name].dtype) for name in ("actions", "rewards", "dones"))
    states, actions, rewards, dones = _core_arrays(w)
    extras_ok, extra_arrays = _extras_rule(w, (n,)), _extra_arrays(w)
    has_extras = bool(extra_arrays)
    ns = w.data.ns
    ns_pair = (ns[0], ns[1])
    step_bytes = n * st.row_bytes
    small, same = step_bytes <= SMALL_BYTES, same_bytes(ns_pair, step_bytes)
    stacks = w.data.stacks
    tail, tail_rows, overlap = stacks.tail, stacks.rows, stacks.overlap_rule(n)
    words, key, max_size, mutex, settle, general = w.words, w.key, w.max_size, w.mutex, w.settle, w.add
    ws, flusher = w.ws, w.flusher  # all an add reads per call: the WriteState
    ndarray = np.ndarray
    # Where the frames lie env-major (roworder.py), a step's rows are row start/n of each env's region.
    per_env = 0 if w.data.storage.order("states").identity else max_size // n

    def add(state, action, reward, next_state, done, **extra):
        with mutex:
            if (ws.busy is not None or not ws.live or (extra or has_extras) and not extras_ok(extra)
                    or type(state) is not ndarray or type(next_state) is not ndarray
                    or type(action) is not ndarray or type(reward) is not ndarray or type(done) is not ndarray
                    or state.shape != s_shape or next_state.shape != s_shape or action.shape != a_shape
                    or reward.shape != r_shape or done.shape != d_shape
                    or not (state.dtype is s_dt or state.dtype == s_dt)
                    or not (next_state.dtype is s_dt or next_state.dtype == s_dt)
                    or not (action.dtype is a_dt or action.dtype == a_dt)
                    or not (reward.dtype is r_dt or reward.dtype == r_dt)
                    or not (done.dtype is d_dt or done.dtype == d_dt)):
                return general(state, action, reward, next_state, done, extra)
            seen, base, previous = ws.seen, ws.base, ws.overlap
            t_end = seen + n
            if t_end > ws.due and not early(ws, flusher, t_end):
                return general(state, action, reward, next_state, done, extra)
            start = (seen - base) % max_size
            stop = start + n
            if previous is None or not previous.all() or seen == base or stop > max_size or t_end > ws.due \
                    or (state.tobytes() != ns_pair[(seen // n) & 1].tobytes() if small
                        else not same(state, (seen // n) & 1)):
                return general(state, action, reward, next_state, done, extra)
            overlaps = overlap(state, next_state)
            try:
                ws.overlap = None  # unknown until the step commits (as in Writer._write_step)
                words[W_INTENT] = t_end
                rows = slice(start // n, max_size, per_env) if per_env else slice(start, stop)
                if seen - base >= max_size:  # the ring is full: keep the frames this step overwrites
                    row = (seen - max_size) % tail_rows  # of transition seen - max_size + 1
                    if row + n <= tail_rows:
                        tail[row:row + n] = states[rows]
                    else:
                        stacks.save_tail(states, seen, base)
                states[rows] = state[:, -1]
                actions[start:stop] = action
                rewards[start:stop] = reward
                dones[start:stop] = done
                if has_extras:
                    for name, arr in extra_arrays:
                        arr[start:stop] = extra[name]
                ns[(t_end // n) & 1] = next_state
                words[W_SEEN] = t_end
                words[W_CHECK] = t_end ^ key
                ws.seen = t_end
                ws.overlap = overlaps
            except BaseException:
                settle()
                raise

    return add


def _core_arrays(w) -> list:
    by_name = dict(zip(w.fields, w.arrays))
    return [by_name[name] for name in ("states", "actions", "rewards", "dones")]


def _extra_arrays(w) -> list:
    by_name = dict(zip(w.fields, w.arrays))
    return [(name, by_name[name]) for name in w.extra_names]


def _extras_rule(w, lead: tuple):
    """``ok(extra)``: True when ``extra`` names exactly the store's extra fields and every
    value stores exactly as the general path would store it: for one env (``lead`` empty) a
    scalar within its rule or an array of the field's exact shape and dtype, for a vector
    env an array of shape ``(num_envs, *shape)`` and the exact dtype. Anything else (a
    missing or unknown name, a value to convert or refuse) goes to the general path."""
    names = frozenset(w.extra_names)
    rules = []
    for name in w.extra_names:
        spec = w.fields[name]
        if not lead and spec.shape == ():
            rules.append((name, *_fast_scalar_rule(spec)))
        else:
            rules.append((name, None, lead + spec.shape, spec.dtype))
    ndarray = np.ndarray

    def ok(extra) -> bool:
        if extra.keys() != names:
            return False
        for name, types, a, b in rules:
            value = extra[name]
            if types is None:
                if type(value) is not ndarray or value.shape != a or value.dtype != b:
                    return False
            elif type(value) not in types or not a <= value <= b:
                return False
        return True

    return ok


def _fast_scalar_rule(spec: FieldSpec):
    """``(types, lo, hi)``: a scalar of one of ``types`` within ``[lo, hi]`` stores exactly
    as the general path would store it (anything else goes there to be converted or refused)."""
    if spec.shape != ():
        return frozenset(), 0, -1
    dt = spec.dtype
    if dt.kind == "f":
        lo, hi = float_bounds(dt)
        return frozenset({float, int, bool, np.float64, np.float32, np.float16, dt.type}), lo, hi
    if dt.kind == "b":
        return frozenset({bool, np.bool_}), 0, 1
    info = np.iinfo(dt)
    return frozenset({dt.type, int}), int(info.min), int(info.max)
