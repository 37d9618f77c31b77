"""``diskreplay.slm.DiskPrioritizedReplay`` against ``scripts/slm_per.py``, a faithful port of
SLM-Lab's ``PrioritizedReplay``: the same priorities per slot after adds, explicit errors,
updates of the last batch and wrap; draws with the port's distribution; both interfaces."""
from __future__ import annotations

import importlib.util
import os
import random
import sys

import numpy as np
import pytest

from diskreplay.errors import InvalidPriorityError, MemorySpecError, StoreMismatchError
from diskreplay.slm import DiskPrioritizedReplay, DiskPrioritizedReplayV4, DiskPrioritizedReplayV5
from slm_stubs import args_of, kwargs_of, make_agent, make_body, spec, transition
import paths

ROOT = paths.ROOT


def _load_script(name):
    if name not in sys.modules:  # scripts are files, not a package: loaded from their path
        loader = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
    return sys.modules[name]


_load_script("seed_replay")
SLMPrioritizedReplay = _load_script("slm_per").SLMPrioritizedReplay


def per_spec(path, **kw):
    return spec(path, name="PrioritizedReplay", alpha=0.6, epsilon=0.01, **kw)


def owner_for(version):
    return make_body() if version == "v4" else make_agent()


def add(memory, t, version, error=None):
    tr = transition(t, ("terminateds",) if version == "v5" else ())
    if error is None:
        memory.update(*args_of(tr, version))
    elif version == "v4":
        memory.add_experience(*args_of(tr, version), error)
    else:
        memory.add_experience(**kwargs_of(tr, version), error=error)
    return tr


def port_add(port, tr, error=None):
    args = (tr["states"], np.int64(tr["actions"]), tr["rewards"], tr["next_states"], tr["dones"])
    if error is None:
        port.add_experience(*args)
    else:
        port.add_experience(*args, error=error)


def stored(memory):
    return memory.store.get(np.arange(memory.size))["priorities"]


@pytest.mark.parametrize("version", ["v4", "v5"])
def test_priorities_follow_the_port_through_adds_updates_and_wrap(tmp_path, backend, version):
    memory = DiskPrioritizedReplay(per_spec(tmp_path / "m", backend=backend, max_size=7, batch_size=5),
                                   owner_for(version))
    assert isinstance(memory, DiskPrioritizedReplayV4 if version == "v4" else DiskPrioritizedReplayV5)
    port = SLMPrioritizedReplay(7, 5, alpha=0.6, epsilon=0.01)
    rng = np.random.default_rng(3)
    for t in range(1, 13):
        error = None if t % 3 else float(rng.random() * 4)
        port_add(port, add(memory, t, version, error), error)
        np.testing.assert_allclose(stored(memory), np.array(port.priorities[:port.size], np.float64), rtol=1e-12)
        if t >= 4:
            batch = memory.sample()
            assert list(batch) == memory.data_keys and memory.data_keys[-1] == "priorities"
            np.testing.assert_array_equal(batch["priorities"], stored(memory)[memory.batch_idxs])
            port.batch_idxs = memory.batch_idxs.copy()
            port.tree_idxs = memory.batch_idxs + port.tree.capacity - 1  # the leaves of those slots
            errors = rng.random(5) * 3
            memory.update_priorities(errors)
            port.update_priorities(errors)
            np.testing.assert_allclose(stored(memory), np.array(port.priorities[:port.size], np.float64),
                                       rtol=1e-12)
            np.testing.assert_allclose(port.tree.tree[-7:][:port.size], np.array(port.priorities[:port.size], np.float64),
                                       rtol=1e-12)
    batch = memory.sample()
    np.testing.assert_array_equal(batch["actions"], np.array(port.actions)[memory.batch_idxs])
    memory.close()


def test_draws_have_the_ports_distribution(tmp_path):
    memory = DiskPrioritizedReplay(per_spec(tmp_path / "m", max_size=20, batch_size=200), make_body())
    port = SLMPrioritizedReplay(20, 200, alpha=0.6, epsilon=0.01)
    errors = np.linspace(0, 30, 25)
    for t in range(1, 26):
        port_add(port, add(memory, t, "v4", errors[t - 1]), errors[t - 1])
    p = stored(memory)
    random.seed(1)
    ours = np.zeros(20)
    theirs = np.zeros(20)
    for _ in range(100):
        memory.sample()
        ours += np.bincount(memory.batch_idxs, minlength=20)
        theirs += np.bincount(port.sample_idxs(200), minlength=20)
    for counts in (ours, theirs):
        expected = counts.sum() * p / p.sum()
        chi = float(((counts - expected) ** 2 / expected).sum())
        assert chi < 19 + 8 * np.sqrt(38), chi
    memory.close()


def test_spec_keys_resume_and_mismatch(tmp_path):
    path = tmp_path / "m"
    memory = DiskPrioritizedReplay(per_spec(path), make_body())
    add(memory, 1, "v4")
    memory.close()
    again = DiskPrioritizedReplay(per_spec(path), make_body())
    assert again.size == 1 and again.store.prioritized and (again.alpha, again.epsilon) == (0.6, 0.01)
    again.close()
    with pytest.raises(StoreMismatchError, match="alpha"):
        DiskPrioritizedReplay(spec(path, alpha=0.5, epsilon=0.01), make_body())
    with pytest.raises(MemorySpecError, match="alpha"):
        DiskPrioritizedReplay(spec(tmp_path / "n", alpha=-1), make_body())


def test_a_bad_error_is_refused_before_the_transition_is_added(tmp_path):
    memory = DiskPrioritizedReplay(per_spec(tmp_path / "m"), make_agent())
    add(memory, 1, "v5")
    for bad in (-1.0, float("nan"), "x"):
        with pytest.raises(InvalidPriorityError):
            add(memory, 2, "v5", error=bad)
        assert memory.size == 1
    memory.sample()
    with pytest.raises(InvalidPriorityError):
        memory.update_priorities([1.0, 2.0])  # batch_size is 4
    memory.close()


def test_vector_env_steps_get_the_default_error(tmp_path):
    from slm_stubs import step

    memory = DiskPrioritizedReplay(per_spec(tmp_path / "m", max_size=9), make_body(num_envs=3))
    memory.update(*step([1, 2, 3]))
    np.testing.assert_allclose(stored(memory), np.full(3, (100000 + 0.01) ** 0.6), rtol=1e-12)
    for t in (4, 5):
        memory.add_experience(*args_of(transition(t), "v4"), float(t))
    assert memory.store.size == 3 and memory.size == 5  # a partial step is buffered
    memory.sample()
    assert memory.batch_idxs.max() < 3
    memory.add_experience(*args_of(transition(6), "v4"), 6.0)
    np.testing.assert_allclose(stored(memory)[3:], (np.array([4.0, 5.0, 6.0]) + 0.01) ** 0.6, rtol=1e-12)
    memory.close()
