"""Prefetcher: batches prepared ahead by one thread, in the order direct calls give."""
import threading
import time

import numpy as np
import pytest

from diskreplay import DiskReplay
from diskreplay.errors import InvalidArgumentError
from diskreplay.core.prefetch import Prefetcher


def test_prefetcher_gives_the_direct_batches_in_order(tmp_path):
    def build(name):
        buf = DiskReplay.create(tmp_path / name, 50, seed=7)
        for t in range(60):
            buf.add(np.full(4, t, np.float32), t % 2, float(t), np.full(4, t + 1, np.float32), False)
        return buf

    direct = build("a")
    expected = [(direct.sample(8), direct.batch_idxs.copy()) for _ in range(20)]
    direct.close()
    buf = build("b")
    got = []
    with Prefetcher(lambda: (buf.sample(8), buf.batch_idxs.copy()), prefetch=3) as batches:
        for _ in range(20):
            got.append(next(batches))
    assert batches.closed
    for (g, gi), (e, ei) in zip(got, expected):
        np.testing.assert_array_equal(gi, ei)
        for key in e:
            np.testing.assert_array_equal(g[key], e[key], err_msg=key)
    buf.close()


def test_prefetcher_stays_ahead_and_closes_cleanly():
    calls = []

    def slow():
        calls.append(threading.current_thread().name)
        time.sleep(0.01)
        return len(calls)

    p = Prefetcher(slow, prefetch=2)
    assert next(p) == 1 and next(p) == 2
    time.sleep(0.1)  # the producer fills its queue (2 ahead) plus one batch in hand, then waits
    assert 3 <= len(calls) <= 5
    p.close()
    p.close()  # idempotent
    assert not p._thread.is_alive()
    with pytest.raises(StopIteration):
        next(p)
    assert set(calls) == {"diskreplay-prefetch"}  # one thread calls sample_fn, so the order is fixed


def test_prefetcher_count_and_errors():
    assert list(Prefetcher(iter(range(100)).__next__, prefetch=2, count=5)) == [0, 1, 2, 3, 4]
    items = iter([1, 2])
    p = Prefetcher(lambda: next(items), prefetch=4)
    assert next(p) == 1 and next(p) == 2
    with pytest.raises(StopIteration):  # the error of the third call, raised in the consumer
        next(p)
    assert not p._thread.is_alive()

    def boom():
        raise KeyError("no data")

    with Prefetcher(boom) as p:
        with pytest.raises(KeyError):
            next(p)
        with pytest.raises(StopIteration):
            next(p)
    with pytest.raises(ValueError):
        Prefetcher(boom, prefetch=0)


def test_bad_prefetch_and_count_are_invalid_argument_errors(tmp_path):
    for kwargs in (dict(prefetch=0), dict(prefetch=-2), dict(prefetch=1.5), dict(prefetch="2"), dict(prefetch=None),
                   dict(count=-1), dict(count=2.5), dict(count="3")):
        with pytest.raises(InvalidArgumentError):
            Prefetcher(lambda: 1, **kwargs)
    assert list(Prefetcher(lambda: 1, prefetch=2.0, count=3.0)) == [1, 1, 1]  # integral floats, as every count
    with DiskReplay.create(tmp_path / "s", 10, seed=1) as buf:
        for t in range(4):
            buf.add(np.full(4, t, np.float32), t % 2, float(t), np.full(4, t + 1, np.float32), False)
        with pytest.raises(InvalidArgumentError):
            buf.batches(prefetch=0)
        buf.add(np.full(4, 4, np.float32), 0, 4.0, np.full(4, 5, np.float32), False)  # add is not left locked
        assert buf.seen_size == 5


FRAMES = {"states": ((4, 64, 64), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool")}


def test_peek_draws_what_the_next_draw_gives_and_moves_nothing():
    from diskreplay.core.ring import Sampler

    a, b = Sampler(11), Sampler(11)
    for size in (1, 7, 1000):
        peeked = a.peek_idxs(size, 16, False, 3)
        assert a.draws == b.draws
        np.testing.assert_array_equal(peeked, a.sample_idxs(size, 16, False, 3))
        np.testing.assert_array_equal(peeked, b.sample_idxs(size, 16, False, 3))
    assert a.peek_idxs(9, 4, True, 5)[-1] == 5


def test_batches_read_the_next_batch_ahead_on_the_cold_path_and_draw_the_same(tmp_path, monkeypatch):
    """A cold store's batches() announces each batch's reads and then the next batch's
    (the sampler's next draw, peeked): the same batches, in the same order, as direct
    sample() calls on a twin store, and the sampler ends where those calls leave it."""
    from diskreplay.backends import gather

    def build(name):
        rng = np.random.default_rng(0)
        buf = DiskReplay.create(tmp_path / name, 64, num_envs=2, seed=5, fields=FRAMES)
        frames = rng.integers(0, 255, (41, 2, 4, 64, 64), dtype=np.uint8)
        for t in range(40):
            buf.add(frames[t], np.array([t, t]), np.array([t, -t], np.float32), frames[t + 1], np.zeros(2, bool))
        buf.flush()
        return buf

    direct = build("a")
    direct._session.gatherer.probe_streak = 0  # cold, as after a probe miss
    expected = [(direct.sample(8), direct.batch_idxs.copy()) for _ in range(6)]
    direct.close()
    announced = []
    real = gather.Gatherer.announce
    monkeypatch.setattr(gather.Gatherer, "announce",
                        lambda self, idxs, head: announced.append(np.array(idxs)) or real(self, idxs, head))
    buf = build("b")
    buf._session.gatherer.probe_streak = 0
    with buf.batches(8, prefetch=1, count=6) as batches:
        got = list(batches)
    assert len(got) == 6
    for g, (e, ei) in zip(got, expected):
        for key in e:
            np.testing.assert_array_equal(g[key], e[key], err_msg=key)
    # each batch announced itself, then the next one's draw
    assert len(announced) == 12
    for k, (_, ei) in enumerate(expected):
        np.testing.assert_array_equal(announced[2 * k], ei)
        if k + 1 < len(expected):
            np.testing.assert_array_equal(announced[2 * k + 1], expected[k + 1][1])
    assert buf._session.sampler.draws == 6 * 8
    buf.close()


def test_a_warm_store_reads_nothing_ahead(tmp_path, monkeypatch):
    from diskreplay.backends import gather

    buf = DiskReplay.create(tmp_path / "w", 16, seed=1, fields=FRAMES)
    frame = np.zeros((4, 64, 64), np.uint8)
    for t in range(10):
        buf.add(frame, t, 0.0, frame, False)
    hinted = []
    monkeypatch.setattr(gather, "will_need", lambda *a: hinted.append(a))
    with buf.batches(4, count=3) as batches:
        assert len(list(batches)) == 3
    assert hinted == []  # a fresh store is taken as in RAM until a probe finds a row cold
    buf.close()
