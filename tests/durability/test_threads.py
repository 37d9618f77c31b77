"""One store shared by threads (issue 13): every public operation holds the store's mutex,
so an actor thread adding and a learner thread sampling (directly, or through ``batches()``
with an ``add`` reference taken before it started) never see a torn row, and two adding
threads lose no step. Rows are self-describing: every field of transition ``t`` says ``t``."""
import threading
import time

import numpy as np
import pytest

from interrupt_common import PATHS, create, step

DURATION = 1.5  # seconds per test and backend


def _assert_rows_whole(batch, name):
    n = PATHS[name][0]["num_envs"]
    t = batch["actions"]
    assert np.all(batch["states"] == t[:, None].astype(np.float32))
    assert np.all(batch["rewards"] == (t / 4).astype(np.float32))
    assert np.all(batch["dones"] == (t % 5 == 0))
    assert np.all(batch["next_states"] == (t + n)[:, None].astype(np.float32))
    if "costs" in batch:
        assert np.all(batch["costs"] == t * 1.5)


def _actor(add, name, stop, errors, n):
    try:
        t = 1
        while not stop.is_set():
            args, extra = step(name, t)
            add(*args, **extra)
            t += n
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)


@pytest.mark.parametrize("name", ["fast-single", "fast-vector", "general-extras"])
@pytest.mark.parametrize("via", ["sample", "batches"])
def test_actor_and_learner_threads_never_see_a_torn_row(tmp_path, backend, name, via):
    with create(tmp_path / "s", name, backend) as buf:
        n = buf.num_envs
        add = buf.add  # taken before batches() starts: must be as safe as the method
        args, extra = step(name, 1)
        add(*args, **extra)
        stop, errors = threading.Event(), []
        actor = threading.Thread(target=_actor, args=(add, name, stop, errors, n))
        # The actor restarts the chain from t=1 at a store that has 1 step: keep one chain.
        buf.reset()
        actor.start()
        batches = 0
        deadline = time.monotonic() + DURATION
        try:
            while buf.size == 0:
                time.sleep(0.001)
            if via == "sample":
                while time.monotonic() < deadline:
                    _assert_rows_whole(buf.sample(32), name)
                    batches += 1
            else:
                with buf.batches(32, prefetch=2) as it:
                    for batch in it:
                        _assert_rows_whole(batch, name)
                        batches += 1
                        if time.monotonic() > deadline:
                            break
        finally:
            stop.set()
            actor.join()
        assert not errors, errors
        assert batches > 50 and buf.seen_size > 50 * n


@pytest.mark.parametrize("name", ["fast-single", "fast-vector", "general-extras"])
def test_two_adding_threads_lose_nothing(tmp_path, backend, name):
    per_thread = 3000
    with create(tmp_path / "s", name, backend) as buf:
        n = buf.num_envs
        errors = []

        def adder(offset):
            try:
                for i in range(per_thread):
                    args, extra = step(name, 1 + (offset + 2 * i) * n)
                    buf.add(*args, **extra)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=adder, args=(k,)) for k in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert buf.seen_size == 2 * per_thread * n
        # Every row whole (next states aside: the two threads' steps interleave).
        batch = buf.get(np.arange(buf.size))
        t = batch["actions"]
        assert np.all(batch["states"] == t[:, None].astype(np.float32))
        assert np.all(batch["rewards"] == (t / 4).astype(np.float32))
        # Each step's transitions stay together, env-major, and no step appears twice.
        seen, m = buf.seen_size, buf.max_size
        chrono = t[(np.arange(seen - buf.size, seen)) % m]  # oldest first (no reset: base 0)
        steps = chrono[buf.size % n:].reshape(-1, n)  # whole steps only
        assert np.all(steps == steps[:, :1] + np.arange(n))
        assert len(np.unique(steps[:, 0])) == len(steps)
