"""Prefetcher: batches prepared ahead by one thread, in the order direct calls give."""
import threading
import time

import numpy as np
import pytest

from diskreplay import DiskReplay
from diskreplay.errors import InvalidArgumentError
from diskreplay.prefetch import Prefetcher


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
