"""The ``Sampler`` protocol (``diskreplay.parts.sampling``): the one choice between uniform and
prioritized draws, and what each promises the session."""
import numpy as np

from diskreplay import DiskReplay
from diskreplay.core import ring
from diskreplay.parts.sampling import PrioritizedSampler, UniformSampler, sampler_for
from fields import cartpole_fields, step_values


def test_uniform_draws_are_the_streams_and_peek_does_not_move_it():
    s = sampler_for(ring.Sampler(7), None, lambda: None)
    assert isinstance(s, UniformSampler)
    ahead = s.peek(10, 5, True, 3)
    assert s.draws == 0
    idxs, weights = s.draw(10, 5, True, 3, beta=0.4)
    np.testing.assert_array_equal(idxs, ahead)
    np.testing.assert_array_equal(idxs, ring.Sampler(7).sample_idxs(10, 5, True, 3))
    assert weights is None and s.draws == 5 and idxs[-1] == 3 and s.keys(idxs) == {}


def test_a_prioritized_store_draws_through_its_sampler_and_a_reopen_resumes_the_stream(tmp_path, backend):
    path = tmp_path / "p.replay"
    with DiskReplay.create(path, 20, backend=backend, fields=cartpole_fields(), prioritized=True, seed=3) as buf:
        for t in range(1, 26):
            buf.add(*step_values(t))
        buf.update_priorities(np.arange(20), np.arange(20.0))
        sampler = buf._session.sampler
        assert isinstance(sampler, PrioritizedSampler) and sampler.peek(20, 4, False, 0) is None
        buf.sample()
        draws = sampler.draws
        assert draws > 0
        nxt = buf.sample()
    with DiskReplay.open(path) as buf:
        assert buf._session.sampler.draws >= draws
    with DiskReplay.open(path, mode="r") as reader:
        assert isinstance(reader._session.sampler, PrioritizedSampler)
        assert "priorities" in reader.get([0, 1]) and "weights" in nxt


def test_a_store_whose_fields_come_with_the_first_add_gets_its_priorities_then(tmp_path):
    with DiskReplay.create(tmp_path / "lazy.replay", 10, prioritized=True, seed=1) as buf:
        assert isinstance(buf._session.sampler, UniformSampler)  # no priorities yet: no fields
        buf.add(np.zeros(2, np.float32), 0, 0.0, np.zeros(2, np.float32), False)
        assert isinstance(buf._session.sampler, PrioritizedSampler)
        assert "weights" in buf.sample(batch_size=1)
