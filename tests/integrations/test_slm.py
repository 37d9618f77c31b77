"""The SLM-Lab drop-in (diskreplay.slm) against SLM-Lab's memory contract, with stub objects.

SLM-Lab is not imported. ``SeedReference`` restates the seed's documented behaviour
(shared/seed/replay.py.txt: ``[None] * max_size`` lists, ``head``, ``size``, ``seen_size``,
a ``deque(maxlen=num_envs)`` of next states, the ``to_train`` rule) with the corrections the
drop-in makes (dtypes kept; a next state is the state of the same env's next transition,
wrap-around included), one transition at a time. v4 is the seed's interface
``(memory_spec, body)``; v5 is SLM-Lab 5's ``(memory_spec, agent)`` with terminated/truncated.
"""
import os
import subprocess
import sys
import textwrap
import warnings
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from diskreplay import DiskReplay as Store
from diskreplay.errors import (DiskReplayError, EmptyStoreError, InterfaceMismatchError, MemorySpecError,
                               PartialStepWarning, ReadOnlyViewError, RecoveryWarning, SchemaMismatchError,
                               SlotIndexError, StoreExistsError, StoreMismatchError)
from diskreplay.slm import DiskReplay, DiskReplayV4, DiskReplayV5
import slm_stubs
from slm_stubs import (V5_EXTRAS, args_of, kwargs_of, make_agent, make_algorithm, make_body, make_env, spec, step,
                       transition)

CORE = ("states", "actions", "rewards", "dones")
DTYPES = {"states": np.float32, "actions": np.int64, "rewards": np.float32, "dones": np.bool_,
          "terminateds": np.bool_, "truncateds": np.bool_}


# ---------------------------------------------------------------------- reference
class SeedReference:
    def __init__(self, max_size, num_envs, fields=CORE, use_cer=False):
        self.max_size, self.num_envs, self.fields, self.use_cer = max_size, num_envs, fields, use_cer
        self.seen_size = 0
        self.reset()

    def reset(self):
        self.slots = {k: [None] * self.max_size for k in self.fields}
        self.owner = [None] * self.max_size  # position in epoch of each slot's transition
        self.epoch = []
        self.size, self.head = 0, -1
        self.ns_buffer = deque(maxlen=self.num_envs)

    def add(self, tr):
        self.head = (self.head + 1) % self.max_size
        for k in self.fields:
            self.slots[k][self.head] = np.asarray(tr[k], DTYPES[k])
        self.owner[self.head] = len(self.epoch)
        self.epoch.append(tr)
        self.ns_buffer.append(tr["next_states"])
        self.size = min(self.size + 1, self.max_size)
        self.seen_size += 1

    def next_state(self, slot):
        """Exact, as diskreplay gives it (where the seed returns the state of the env's next
        transition, which differs after an episode ends)."""
        return self.epoch[self.owner[slot]]["next_states"]

    def get(self, idxs):
        batch = {k: np.stack([self.slots[k][i] for i in idxs]) for k in self.fields}
        batch["next_states"] = np.stack([self.next_state(i) for i in idxs])
        return batch


def train_flag(algorithm, seen_size, head):
    """SLM-Lab's rule (v4 and v5 alike), evaluated after one transition."""
    algorithm.to_train = algorithm.to_train or (
        seen_size > algorithm.training_start_step and head % algorithm.training_frequency == 0)


def assert_like_reference(memory, ref):
    assert (memory.size, memory.head, memory.seen_size) == (ref.size, ref.head, ref.seen_size)
    for k in ref.fields:
        view = getattr(memory, k)
        assert len(view) == ref.max_size
        got = list(view)
        for slot, (value, want) in enumerate(zip(got, ref.slots[k])):
            if want is None:
                assert value is None, (k, slot)
            else:
                assert value.dtype == DTYPES[k], (k, value.dtype)
                np.testing.assert_array_equal(value, want, err_msg=f"{k}[{slot}]")
    assert len(memory.ns_buffer) == len(ref.ns_buffer)
    for got, want in zip(memory.ns_buffer, ref.ns_buffer):
        np.testing.assert_array_equal(got, want)


def assert_batch(memory, batch, ref, batch_size):
    assert list(batch) == memory.data_keys
    idxs = memory.batch_idxs
    assert idxs.shape == (batch_size,) and ((0 <= idxs) & (idxs < ref.size)).all()
    want = ref.get(idxs)
    for k in want:
        assert batch[k].shape[0] == batch_size
        np.testing.assert_array_equal(batch[k], want[k].astype(batch[k].dtype), err_msg=k)
        if k != "next_states":
            assert batch[k].dtype == DTYPES[k]


def close_expecting(memory, dropped: int):
    """Close, checking that exactly a partial step of ``dropped`` transitions is dropped, with a warning."""
    if dropped:
        with pytest.warns(PartialStepWarning, match=f"dropped {dropped} transition"):
            memory.close()
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PartialStepWarning)
            memory.close()


# ---------------------------------------------------------------------- the seed's contract (v4)
@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("use_cer", [False, True])
def test_add_experience_one_at_a_time_follows_the_seed(tmp_path, backend, num_envs, use_cer):
    body = make_body(num_envs, training_start_step=4, training_frequency=3)
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, use_cer=use_cer), body)
    assert isinstance(memory, DiskReplayV4) and memory.slm_version == "v4"
    ref = SeedReference(7, num_envs, use_cer=use_cer)
    flag = make_algorithm(training_start_step=4, training_frequency=3)
    assert_like_reference(memory, ref)
    assert memory.states[0] is None and len(memory.ns_buffer) == 0
    for t in range(1, 19):  # wraps the ring of 7 twice; partial steps of 3 along the way
        tr = transition(t)
        memory.add_experience(*args_of(tr, "v4"))  # SLM-Lab's SIL passes the values positionally
        ref.add(tr)
        train_flag(flag, ref.seen_size, ref.head)
        assert bool(body.agent.algorithm.to_train) == bool(flag.to_train), t
        assert_like_reference(memory, ref)
        assert memory.store.seen_size == t - t % num_envs  # whole steps only reach the store
        if t % 4 in (0, 2):  # t = 2: the first step of 3 envs is still incomplete
            batch = memory.sample()
            assert_batch(memory, batch, ref, 4)
            if use_cer:
                assert memory.batch_idxs[-1] == ref.head
    memory.close()


@pytest.mark.parametrize("num_envs", [1, 3])
def test_update_adds_whole_steps_as_the_seed_loops_over_envs(tmp_path, backend, num_envs):
    body = make_body(num_envs, training_start_step=2, training_frequency=4)
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, max_size=9), body)
    ref = SeedReference(9, num_envs)
    flag = make_algorithm(training_start_step=2, training_frequency=4)
    t = 1
    for _ in range(7):
        ts = list(range(t, t + num_envs))
        memory.update(*(args_of(transition(t), "v4") if num_envs == 1 else step(ts)))
        for x in ts:
            ref.add(transition(x))
            train_flag(flag, ref.seen_size, ref.head)
        assert bool(body.agent.algorithm.to_train) == bool(flag.to_train)
        body.agent.algorithm.to_train = flag.to_train = 0  # the algorithm resets it after training
        t += num_envs
        assert_like_reference(memory, ref)
    assert_batch(memory, memory.sample(), ref, 4)
    memory.close()


def test_update_and_add_experience_mix_in_a_vector_env(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_body(3))
    ref = SeedReference(7, 3)
    memory.add_experience(*args_of(transition(1), "v4"))  # a partial step, then whole ones
    ref.add(transition(1))
    for t in (2, 5, 8):
        memory.update(*step([t, t + 1, t + 2]))
        for x in (t, t + 1, t + 2):
            ref.add(transition(x))
        assert_like_reference(memory, ref)
    assert memory.store.seen_size == 9 and memory.seen_size == 10
    assert_batch(memory, memory.sample(), ref, 4)
    close_expecting(memory, 1)


@pytest.mark.parametrize("num_envs", [1, 3])
def test_reset_empties_the_views_as_the_seed_does(tmp_path, backend, num_envs):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_body(num_envs))
    ref = SeedReference(7, num_envs)
    for t in range(1, 10):
        memory.add_experience(*args_of(transition(t), "v4"))
        ref.add(transition(t))
    memory.reset()
    ref.reset()
    assert (memory.size, memory.head, memory.seen_size) == (0, -1, 9)
    for k in CORE:
        assert getattr(memory, k)[0] is None and all(v is None for v in getattr(memory, k))
    assert len(memory.ns_buffer) == 0
    assert_like_reference(memory, ref)
    with pytest.raises(EmptyStoreError):
        memory.sample()
    for t in range(10, 15):  # filling starts again at slot 0
        memory.add_experience(*args_of(transition(t), "v4"))
        ref.add(transition(t))
        assert_like_reference(memory, ref)
    assert memory.seen_size == 14
    close_expecting(memory, 5 % num_envs)


def test_views_read_like_the_seeds_lists(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_body())
    for t in range(1, 5):
        memory.add_experience(*args_of(transition(t), "v4"))
    view = memory.states
    assert len(view) == 7
    np.testing.assert_array_equal(view[memory.head], [4, 4])
    assert view[3].dtype == np.float32 and memory.actions[0].dtype == np.int64
    assert memory.actions[0] == 1 and memory.rewards[1] == 1.0 and not memory.dones[2]
    assert view[4] is None and view[6] is None  # at or past size
    assert view[-1] is None and view[-7] is not None  # negative indices count from max_size
    np.testing.assert_array_equal(view[-4], [4, 4])
    got = view[2:6]
    assert isinstance(got, list) and got[2] is None and got[3] is None
    np.testing.assert_array_equal(got[0], [3, 3])
    assert memory.actions[::-1][:4] == [None, None, None, 4]
    filled = view[np.array([3, 0, 3])]  # as SLM-Lab's util.batch_get(states, idxs) reads it
    assert filled.dtype == np.float32 and filled.shape == (3, 2)
    np.testing.assert_array_equal(filled[:, 0], [4, 1, 4])
    np.testing.assert_array_equal(memory.actions[[0, 1]], [1, 2])
    mixed = memory.actions[[0, 5]]
    assert mixed.dtype == object and mixed[0] == 1 and mixed[1] is None
    assert memory.states[np.array([], dtype=np.int64)].shape == (0, 2)
    assert memory.data_keys == ["states", "actions", "rewards", "next_states", "dones"]
    np.testing.assert_array_equal(memory.ns_buffer[0], [4.5, 4.5])
    np.testing.assert_array_equal(memory.ns_buffer[-1], [4.5, 4.5])
    memory.close()


def test_the_seeds_attributes(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, max_size=1e1, batch_size=32.0, use_cer=True),
                        make_body(3))
    assert (memory.max_size, memory.batch_size, memory.use_cer, memory.is_episodic) == (10, 32, True, False)
    assert memory.ns_idx_offset == 3 and memory.batch_idxs is None and memory.backend == backend
    assert memory.memory_spec["path"] == str(tmp_path / "m") and memory.body.env.num_envs == 3
    memory.batch_size = 2  # SLM-Lab's tests set it
    memory.update(*step([1, 2, 3]))
    assert memory.sample()["states"].shape == (2, 2) and memory.batch_idxs[-1] == memory.head == 2
    with pytest.raises(MemorySpecError, match="fixed"):
        memory.max_size = 20
    with pytest.raises(MemorySpecError, match="fixed"):
        memory.use_cer = False
    memory.close()


def test_the_seeds_dtype_trap_is_avoided_by_declaring_fields(tmp_path, backend):
    inferred = DiskReplay(spec(tmp_path / "a", backend=backend), make_body())
    inferred.add_experience(np.zeros(2, np.float32), 0, 0, np.zeros(2, np.float32), False)
    assert inferred.rewards[0].dtype == np.int64  # a first reward of 0 makes rewards int64 ...
    with pytest.raises(SchemaMismatchError):
        inferred.add_experience(np.zeros(2, np.float32), 0, 0.5, np.zeros(2, np.float32), False)
    inferred.close()
    declared = DiskReplay(spec(tmp_path / "b", backend=backend, fields={"rewards": [[], "float32"]}), make_body(3))
    for t in range(3):  # ... unless declared: here through the buffered partial step too
        declared.add_experience(np.zeros(2, np.float32), 0, 0, np.zeros(2, np.float32), False)
        assert declared.rewards[t].dtype == np.float32
    declared.add_experience(np.zeros(2, np.float32), 0, 0.5, np.zeros(2, np.float32), False)
    assert declared.store.fields["rewards"] == ((), np.dtype(np.float32)) and declared.rewards[3] == 0.5
    close_expecting(declared, 1)
    frames = {"states": [[2], "uint8"], "actions": [[], "int64"], "rewards": {"shape": [], "dtype": "float32"},
              "dones": [[], "bool"]}
    full = DiskReplay(spec(tmp_path / "c", backend=backend, fields=frames), make_body())
    assert full.store.fields["states"] == ((2,), np.dtype(np.uint8))  # complete: the store is preallocated
    full.add_experience(np.full(2, 200, np.uint8), 1, 1.0, np.full(2, 201, np.uint8), True)
    assert full.states[0].dtype == np.uint8 and full.ns_buffer[0][0] == 201  # dtypes kept, no float16
    full.close()


def test_close_drops_a_partial_step_with_a_warning(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_body(3))
    for t in range(1, 6):
        memory.add_experience(*args_of(transition(t), "v4"))
    with pytest.warns(PartialStepWarning, match="2 transition"):
        memory.close()
    reopened = DiskReplay(spec(tmp_path / "m", backend=backend), make_body(3))
    assert (reopened.size, reopened.seen_size, reopened.head) == (3, 3, 2)
    assert reopened.states[3] is None
    reopened.close()


def test_a_crash_loses_only_the_buffered_partial_step(tmp_path, backend):
    """A writer killed (os._exit, no close) after 2 whole steps and 2 more transitions."""
    child = textwrap.dedent(f"""
        import os
        from diskreplay.slm import DiskReplay
        from slm_stubs import args_of, make_body, spec, transition
        memory = DiskReplay(spec({str(tmp_path / "m")!r}, backend={backend!r}), make_body(3))
        for t in range(1, 9):
            memory.add_experience(*args_of(transition(t), "v4"))
        assert (memory.size, memory.seen_size) == (7, 8)
        os._exit(0)
        """)
    support = os.path.dirname(os.path.abspath(slm_stubs.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [support, os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", child], check=True, timeout=120, env=env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_body(3))
    ref = SeedReference(7, 3)
    for t in range(1, 7):
        ref.add(transition(t))
    assert_like_reference(memory, ref)  # transitions 7 and 8 were only in the crashed process
    close_expecting(memory, 0)


# ---------------------------------------------------------------------- SLM-Lab's own memory tests, restated
@pytest.mark.parametrize("version", ["v4", "v5"])
def test_slm_labs_memory_test_sequence(tmp_path, backend, version):
    """The checks of SLM-Lab's test/agent/memory/test_replay_memory.py on one memory
    reused across them (its fixture is session-scoped), each starting with reset()."""
    extras = V5_EXTRAS if version == "v5" else ()
    owner = make_body() if version == "v4" else make_agent()
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, max_size=10), owner)
    experiences = [transition(t, extras) for t in range(1, 9)]

    def add(tr):
        if version == "v4":
            memory.add_experience(*args_of(tr, "v4"))
        else:
            memory.add_experience(**kwargs_of(tr, "v5"))

    memory.reset()  # init
    assert memory.size == 0 and all(len(getattr(memory, k)) == memory.max_size for k in CORE)
    memory.reset()  # add_experience
    add(experiences[0])
    assert memory.size == 1 and memory.head == 0
    assert np.array_equal(memory.states[memory.head], experiences[0]["states"])
    assert memory.actions[memory.head] == experiences[0]["actions"]
    assert memory.rewards[memory.head] == experiences[0]["rewards"]
    assert np.array_equal(memory.ns_buffer[0], experiences[0]["next_states"])
    assert memory.dones[memory.head] == experiences[0]["dones"]
    memory.reset()  # wrap
    for num_added, tr in enumerate(experiences, 1):
        add(tr)
        assert memory.size == min(memory.max_size, num_added)
        assert memory.head == (num_added - 1) % memory.max_size
    memory.reset()  # sample
    for tr in experiences:
        add(tr)
    memory.batch_size = 2
    batch = memory.sample()
    assert batch["states"].shape == (2, owner.state_dim) and batch["next_states"].shape == (2, owner.state_dim)
    assert batch["actions"].shape == batch["rewards"].shape == batch["dones"].shape == (2,)
    memory.reset()  # sample changes
    for tr in experiences:
        add(tr)
    memory.sample()
    old = memory.batch_idxs.tolist()
    changed = 0
    for _ in range(5):
        memory.sample()
        changed += memory.batch_idxs.tolist() != old
        old = memory.batch_idxs.tolist()
    assert changed >= 3  # SLM-Lab marks its version flaky; 8 slots, 2 draws a batch
    memory.reset()
    for tr in experiences[:2]:
        add(tr)
    memory.reset()
    assert memory.head == -1 and memory.size == 0 and len(memory.ns_buffer) == 0
    assert memory.states[0] is None and memory.actions[0] is None
    assert memory.rewards[0] is None and memory.dones[0] is None
    memory.close()


# ---------------------------------------------------------------------- v5's interface
@pytest.mark.parametrize("num_envs", [1, 3])
def test_v5_update_stores_and_samples_terminated_and_truncated(tmp_path, backend, num_envs):
    agent = SimpleNamespace(env=make_env(num_envs))  # v5 builds the memory before agent.algorithm
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), agent)
    assert isinstance(memory, DiskReplayV5) and memory.slm_version == "v5" and memory.agent is agent
    agent.algorithm = make_algorithm(training_start_step=2, training_frequency=3)
    assert memory.data_keys == ["states", "actions", "rewards", "next_states", "dones",
                                "terminateds", "truncateds"]
    ref = SeedReference(7, num_envs, fields=CORE + V5_EXTRAS)
    flag = make_algorithm(training_start_step=2, training_frequency=3)
    t = 1
    for _ in range(6):
        ts = list(range(t, t + num_envs))
        if num_envs == 1:
            memory.update(**kwargs_of(transition(t, V5_EXTRAS), "v5"))  # as v5's Agent.update calls it
        else:
            memory.update(*step(ts, V5_EXTRAS))
        for x in ts:
            ref.add(transition(x, V5_EXTRAS))
            train_flag(flag, ref.seen_size, ref.head)
        assert bool(agent.algorithm.to_train) == bool(flag.to_train)
        t += num_envs
        assert_like_reference(memory, ref)
    assert memory.store.fields["terminateds"] == ((), np.dtype(bool))
    assert memory.store.fields["truncateds"] == ((), np.dtype(bool))
    batch = memory.sample()
    assert_batch(memory, batch, ref, 4)
    assert batch["terminateds"].dtype == batch["truncateds"].dtype == np.bool_
    memory.close()


@pytest.mark.parametrize("num_envs", [1, 3])
def test_v5_add_experience_by_keyword_as_sil_does(tmp_path, backend, num_envs):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, use_cer=True), make_agent(num_envs))
    ref = SeedReference(7, num_envs, fields=CORE + V5_EXTRAS)
    for t in range(1, 12):
        memory.add_experience(**kwargs_of(transition(t, V5_EXTRAS), "v5"))
        ref.add(transition(t, V5_EXTRAS))
        assert_like_reference(memory, ref)
    assert_batch(memory, memory.sample(), ref, 4)
    close_expecting(memory, 11 % num_envs)


@pytest.mark.parametrize("num_envs", [1, 3])
def test_v5_cer_replaces_the_last_indices_by_the_new_transitions(tmp_path, backend, num_envs):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, use_cer=True, batch_size=3, max_size=8),
                        make_agent(num_envs))
    ref = SeedReference(8, num_envs, fields=CORE + V5_EXTRAS)
    last = -1  # v5's last_sample_head, restated
    t = 1
    for added in (1, 2, 5, 0, 2, 9, 3, 0, 1):
        for _ in range(added):
            memory.add_experience(**kwargs_of(transition(t, V5_EXTRAS), "v5"))
            ref.add(transition(t, V5_EXTRAS))
            t += 1
        if ref.size == 0:
            continue
        batch = memory.sample()
        num_new = min((ref.head - last) % 8, 3, ref.size)
        if num_new:
            np.testing.assert_array_equal(memory.batch_idxs[3 - num_new:], (last + 1 + np.arange(num_new)) % 8)
            last = (last + num_new) % 8
        assert memory.last_sample_head == last
        assert_batch(memory, batch, ref, 3)
    assert memory.apply_cer(np.array([0, 0, 0])).tolist() == [0, 0, 0]  # nothing new since the last sample
    memory.reset()
    assert memory.last_sample_head == -1
    memory.close()


def test_v5_without_cer_samples_uniformly_from_the_stores_stream(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, seed=11), make_agent())
    twin = Store.create(tmp_path / "twin", 7, backend=backend, seed=11)
    for t in range(1, 10):
        memory.update(*args_of(transition(t, V5_EXTRAS), "v5"))
        tr = transition(t, V5_EXTRAS)
        twin.add(tr["states"], tr["actions"], tr["rewards"], tr["next_states"], tr["dones"],
                 terminateds=tr["terminateds"], truncateds=tr["truncateds"])
    for _ in range(3):
        memory.sample()
        twin.sample(4)
        np.testing.assert_array_equal(memory.batch_idxs, twin.batch_idxs)
    memory.close()
    twin.close()


def test_the_version_is_chosen_by_what_is_passed_or_by_class(tmp_path):
    assert type(DiskReplay(spec(tmp_path / "a"), make_body())) is DiskReplayV4
    assert type(DiskReplay(spec(tmp_path / "b"), make_agent())) is DiskReplayV5
    assert type(DiskReplayV5(spec(tmp_path / "c"), make_agent())) is DiskReplayV5
    with pytest.raises(InterfaceMismatchError, match="v4's body"):
        DiskReplay(spec(tmp_path / "d"), object())


# ---------------------------------------------------------------------- resuming
def run_ops(memory, ops, version, extras, num_envs):
    """Apply ('add', t) / ('sample',) ops; return what each sample gave."""
    out = []
    for op in ops:
        if op[0] == "add":
            tr = transition(op[1], extras)
            memory.add_experience(*args_of(tr, version))
        else:
            batch = memory.sample()
            out.append((memory.batch_idxs.copy(), batch))
    return out


@pytest.mark.parametrize("version,num_envs,use_cer", [("v4", 1, True), ("v4", 3, True), ("v4", 3, False),
                                                     ("v5", 1, True), ("v5", 3, True), ("v5", 3, False)])
def test_reopening_resumes_views_counters_and_the_sample_stream(tmp_path, backend, version, num_envs, use_cer):
    extras = V5_EXTRAS if version == "v5" else ()
    make = make_body if version == "v4" else make_agent
    kw = dict(backend=backend, use_cer=use_cer, seed=7, max_size=10)
    # v5's CER cursor is not in the store: a reopened memory starts it at the head, which is
    # where it was here (the last sample came after no more than batch_size new transitions).
    first = [("add", t) for t in range(1, 13)] + [("sample",)] * 2
    first += [("add", t) for t in range(13, 16)] + [("sample",)]
    then = [("add", t) for t in range(16, 31)]
    then += [("sample",), ("add", 31), ("add", 32), ("add", 33), ("sample",)] * 2
    control = DiskReplay(spec(tmp_path / "control", **kw), make(num_envs))
    want = run_ops(control, first + then, version, extras, num_envs)
    memory = DiskReplay(spec(tmp_path / "m", **kw), make(num_envs))
    got = run_ops(memory, first, version, extras, num_envs)
    counters = (memory.size, memory.seen_size, memory.head)
    if version == "v5" and use_cer:
        assert memory.last_sample_head == memory.head
    memory.close()
    memory = DiskReplay(spec(tmp_path / "m", **kw), make(num_envs))  # the same spec, the same path
    assert (memory.size, memory.seen_size, memory.head) == counters
    if version == "v5" and use_cer:
        assert memory.last_sample_head == memory.head
    got += run_ops(memory, then, version, extras, num_envs)
    assert len(got) == len(want)
    for (gi, gb), (wi, wb) in zip(got, want):
        np.testing.assert_array_equal(gi, wi)
        for k in wb:
            np.testing.assert_array_equal(gb[k], wb[k], err_msg=k)
    assert (memory.size, memory.seen_size, memory.head) == (control.size, control.seen_size, control.head)
    for k in CORE + extras:
        assert all((a is None and b is None) or np.array_equal(a, b)
                   for a, b in zip(getattr(memory, k), getattr(control, k)))
    assert all(np.array_equal(a, b) for a, b in zip(memory.ns_buffer, control.ns_buffer))
    memory.close()
    control.close()


def test_v5_cer_cursor_restarts_at_the_head_on_reopen(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, use_cer=True), make_agent())
    for t in range(1, 6):
        memory.add_experience(**kwargs_of(transition(t, V5_EXTRAS), "v5"))
    memory.sample()
    memory.add_experience(**kwargs_of(transition(6, V5_EXTRAS), "v5"))
    memory.close()
    memory = DiskReplay(spec(tmp_path / "m", backend=backend, use_cer=True), make_agent())
    assert memory.last_sample_head == memory.head == 5  # transition 6 counts as replayed once
    memory.close()


def test_reopening_refuses_a_spec_the_store_disagrees_with(tmp_path, backend):
    other = "hdf5" if backend == "memmap" else "memmap"
    path = tmp_path / "m"
    memory = DiskReplay(spec(path, backend=backend, use_cer=True, max_size=10,
                             fields={"rewards": [[], "float32"]}), make_body(2))
    memory.update(*step([1, 2]))
    memory.close()
    cases = [({"max_size": 20}, make_body(2), "max_size: the store has 10, the memory spec says 20"),
             ({"use_cer": False}, make_body(2), "use_cer: the store has True, the memory spec says False"),
             ({"backend": other}, make_body(2),
              f"backend: the store is '{backend}', the memory spec says '{other}'"),
             ({}, make_body(3), "num_envs: the store holds steps of 2 envs, the body's env has 3"),
             ({"fields": {"rewards": [[], "float64"]}}, make_body(2),
              "the store has shape () float32, the memory spec says shape () float64"),
             ({}, make_agent(2), "fields: the store has states, actions, rewards, dones, a v5 memory stores")]
    for change, owner, message in cases:
        with pytest.raises(StoreMismatchError) as info:
            DiskReplay(spec(path, **{"backend": backend, "use_cer": True, "max_size": 10, **change}), owner)
        assert message in str(info.value), str(info.value)
        assert "fixed when it is created" in str(info.value)
    # The store was closed by each refusal (no lock left); keys the spec leaves out take the store's.
    loose = {"batch_size": 4, "max_size": 10, "path": str(path)}
    memory = DiskReplay(loose, make_body(2))
    assert memory.use_cer is True and memory.backend == backend and memory.seen_size == 2
    memory.close()


def test_a_path_holding_other_files_is_not_taken(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(StoreExistsError):
        DiskReplay(spec(tmp_path / "m"), make_body())
    memory = DiskReplay(spec(tmp_path / "new" / "deeper" / "m"), make_body())  # parents are made
    memory.close()


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("version", ["v4", "v5"])
def test_wrong_arity_for_the_version_in_use(tmp_path, version):
    memory = DiskReplay(spec(tmp_path / "m"), make_body() if version == "v4" else make_agent())
    tr = transition(1, V5_EXTRAS)
    other = "v5" if version == "v4" else "v4"
    with pytest.raises(InterfaceMismatchError) as info:
        memory.update(*args_of(tr, other))
    message = str(info.value)
    assert f"SLM-Lab {version}'s interface" in message and f"DiskReplay{other.upper()}" in message
    assert ("too many" if version == "v4" else "missing terminated, truncated") in message
    with pytest.raises(InterfaceMismatchError, match="missing"):
        memory.add_experience(*args_of(tr, "v4")[:3])
    with pytest.raises(InterfaceMismatchError, match="unexpected priority"):
        memory.add_experience(**kwargs_of(tr, version), priority=1.0)
    with pytest.raises(InterfaceMismatchError, match="state given twice"):
        memory.update(tr["states"], state=tr["states"])
    assert memory.size == 0
    memory.close()


@pytest.mark.parametrize("missing", ["path", "max_size", "batch_size"])
def test_a_spec_missing_a_required_key(tmp_path, missing):
    bad = spec(tmp_path / "m")
    del bad[missing]
    with pytest.raises(MemorySpecError, match=f"lacks '{missing}'.*needs 'path'"):
        DiskReplay(bad, make_body())
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("change,match", [
    ({"max_size": 1.5}, "'max_size' must be a whole number"), ({"max_size": 0}, "'max_size' must be"),
    ({"batch_size": "32"}, "'batch_size' must be"), ({"use_cer": 1}, "'use_cer' must be true or false"),
    ({"path": 3}, "'path' must be a path"), ({"backend": None}, "'backend' must be a name"),
    ({"fields": {"next_states": [[2], "float32"]}}, "stores states, actions, rewards, dones"),
    ({"fields": {"rewards": "float32"}}, r"must be \[shape, dtype\]"),
    ({"fields": {"rewards": [[-1], "float32"]}}, "a shape is a list of sizes"),
    ({"fields": {"rewards": [[], "str"]}}, "use a bool, integer or float dtype"),
    ({"fields": [("rewards", [[], "float32"])]}, "'fields' must map"),
])
def test_a_spec_with_a_bad_value(tmp_path, change, match):
    with pytest.raises(MemorySpecError, match=match):
        DiskReplay({**spec(tmp_path / "m"), **change}, make_body())


def test_views_refuse_assignment(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_agent(3))
    memory.update(*step([1, 2, 3], V5_EXTRAS))
    for name in CORE + V5_EXTRAS:
        with pytest.raises(ReadOnlyViewError, match="memory.update.*memory.add_experience"):
            getattr(memory, name)[0] = 1
        with pytest.raises(ReadOnlyViewError, match="read-only"):
            del getattr(memory, name)[0]
        with pytest.raises(ReadOnlyViewError, match="memory.update"):
            setattr(memory, name, [None] * 7)  # what the seed's reset does to its lists
    for attempt in (lambda: memory.ns_buffer.__setitem__(0, 1), lambda: memory.ns_buffer.append(1),
                    lambda: memory.ns_buffer.clear()):
        with pytest.raises(ReadOnlyViewError, match="memory.update"):
            attempt()
    assert memory.actions[0] == 1 and len(memory.ns_buffer) == 3
    memory.close()


def test_reading_a_view_past_max_size(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_body())
    memory.add_experience(*args_of(transition(1), "v4"))
    for key in (7, -8, [0, 7], np.array([-8])):
        with pytest.raises(SlotIndexError, match=r"use an index in \[-7, 7\)"):
            memory.states[key]
    with pytest.raises(SlotIndexError, match=r"\[-1, 1\)"):
        memory.ns_buffer[1]
    with pytest.raises(DiskReplayError, match="integers, slices or integer arrays"):
        memory.states["0"]
    with pytest.raises(DiskReplayError, match="boolean masks"):
        memory.states[np.ones(7, bool)]
    assert isinstance(SlotIndexError("x"), IndexError)
    memory.close()


def test_bad_values_in_a_buffered_step_are_refused_when_given(tmp_path, backend):
    memory = DiskReplay(spec(tmp_path / "m", backend=backend), make_body(3))
    memory.add_experience(*args_of(transition(1), "v4"))
    with pytest.raises(SchemaMismatchError, match="shape"):
        memory.add_experience(np.zeros(3, np.float32), 1, 1.0, np.zeros(2, np.float32), False)
    with pytest.raises(SchemaMismatchError, match="float data"):
        memory.add_experience(np.zeros(2, np.float32), 1.5, 1.0, np.zeros(2, np.float32), False)
    with pytest.raises(SchemaMismatchError, match="leading env axis of 3"):
        memory.update(*args_of(transition(2), "v4"))
    assert memory.size == 1 and memory.seen_size == 1
    close_expecting(memory, 1)
