"""The part contract's durability half (the other: ``tests/features/test_parts.py``), one class
every part subclasses, run for each part on every backend:

* a writer killed with SIGKILL at random instants leaves a store that recovers with every
  acknowledged step, verifies, and serves the same data to every reader;
* power-cut images (the disk keeps only what was synced, and any subset of the rest) reopen
  to a state the writer flushed, with the part's data of that flush;
* an exception at every line of the part's own code during a step and a flush, then
  ``close()`` and a reopen: the store serves either what it served before the step or what
  it served after it, never a mix, and verifies.

A new part subclasses ``PartDurability``, names its store kind (``tests/support/stores.py``)
and, when its data is not covered by ``crash_common``'s workload, its power-cut workload."""
from __future__ import annotations

import inspect
import os
import random
import shutil
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

import paths
import test_power_loss as power
import test_prioritized_crash as prio_power
from line_injector import LineInjector
from stores import MAX_SIZE, NUM_ENVS, fill, make_store, step_ops

from diskreplay import DiskReplay, RecoveryWarning
from diskreplay.parts import PARTS
from diskreplay.parts.jumps import Jumps
from diskreplay.parts.priorities.files import PrioritiesPart
from diskreplay.parts.stacks.ring import Stacks
from diskreplay.verify import verify_store

CHILD = os.path.join(paths.SUPPORT, "part_child.py")
PARTS_DIR = os.path.dirname(inspect.getsourcefile(Jumps))


def served(buf) -> dict:
    """What a store serves readers: its counters and every row, the part's keys included."""
    return {"counters": np.array([buf.seen_size, buf.size, buf.head]), **buf.get(np.arange(buf.size))}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def reopened(path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        with DiskReplay.open(path) as buf:  # recovery, as the next trainer's open
            pass
    with DiskReplay.open(path, mode="r") as buf:
        return served(buf)


class PartDurability:
    part: type = None
    kind: str = ""

    def code_files(self) -> list[str]:
        """The part's own source: its module, or its folder's modules when it has a folder."""
        src = inspect.getsourcefile(self.part)
        folder = os.path.dirname(src)
        if folder == PARTS_DIR:
            return [src]
        return [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py")]

    def power_cut(self, tmp_path, monkeypatch, backend, rng) -> tuple[int, list]:
        """(images opened, violations) of power-cut images of a store of this part's kind."""
        rec = power.run_workload(str(tmp_path / "src.replay"), backend, NUM_ENVS, rng, monkeypatch,
                                 **self.power_options)
        assert rec.flushed > 37  # flushes happened while the ring wrapped
        return power.check_images(rec, tmp_path, rng, monkeypatch)

    power_options: dict = {}

    # ------------------------------------------------------------------ the contract
    def test_sigkill_at_random_instants_leaves_a_store_that_recovers(self, tmp_path, backend):
        """A child adds until killed at a random instant; reopening recovers every step it
        acknowledged, verify finds nothing, and the part serves what a fresh reopen does."""
        path, rng, acked = tmp_path / "killed.replay", random.Random(self.kind), 0
        for _ in range(4):
            child = subprocess.Popen([sys.executable, CHILD, self.kind, backend, str(path)],
                                     stdout=subprocess.PIPE, text=True)
            try:
                # wait for the child's first acknowledgement (a slow machine only waits longer),
                # then let it write a random few steps more
                for _ in range(1 + rng.randrange(40)):
                    line = child.stdout.readline()
                    assert line, "the child stopped before it was killed"
                    acked = max(acked, int(line))
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RecoveryWarning)
                with DiskReplay.open(path) as buf:
                    assert buf.seen_size >= acked
            report = verify_store(path)
            assert report.ok, report.problems
            with DiskReplay.open(path, mode="r") as a, DiskReplay.open(path, mode="r") as b:
                assert same(served(a), served(b))
        assert acked > MAX_SIZE  # the kills came while the rings wrapped

    def test_power_cut_images_reopen_to_a_flushed_state(self, tmp_path, monkeypatch, backend):
        rng = random.Random(f"{self.kind}-{backend}")
        images, violations = self.power_cut(tmp_path, monkeypatch, backend, rng)
        assert images >= 20 * power.IMAGES_PER_CRASH
        assert violations == [], violations[:10]

    def test_an_exception_at_every_line_of_its_code_then_close_and_reopen(self, tmp_path, backend):
        """A step (an add, and on a prioritized store a priority update) and a flush, cut
        short at every line the part's own code runs; the same object is then closed, and
        the store serves what it served after one of the operations that returned, or the
        one cut short."""
        base = tmp_path / "base.replay"
        with make_store(self.kind, backend, path=base) as buf:
            start = fill(buf, int(1.5 * MAX_SIZE / NUM_ENVS))  # wrapped: the step overwrites

        def ops(buf):
            return step_ops(buf, start) + [buf.flush]

        def run(buf, k):
            for op in ops(buf)[:k]:
                op()

        states = []  # what the store serves after each prefix of the operations
        with DiskReplay.open(base, mode="r") as buf:
            count = len(step_ops(buf, start)) + 1
        for k in range(count + 1):
            path = tmp_path / f"ref-{k}.replay"
            shutil.copytree(base, path)
            with DiskReplay.open(path) as buf:
                run(buf, k)
            states.append(reopened(path))
        assert not same(states[0], states[-1])
        probe_path = tmp_path / "probe.replay"
        shutil.copytree(base, probe_path)
        probe = LineInjector(files=self.code_files())
        with DiskReplay.open(probe_path) as buf:
            probe.run(lambda: run(buf, count))
        assert probe.lines > 5, probe.functions  # the step runs the part's code
        for at in range(1, probe.lines + 1):
            path = tmp_path / f"at-{at}.replay"
            shutil.copytree(base, path)
            buf = DiskReplay.open(path)
            with pytest.raises(KeyboardInterrupt):
                LineInjector(at, files=self.code_files()).run(lambda: run(buf, count))
                raise KeyboardInterrupt  # the line count is exact: never reached
            buf.close()
            got = reopened(path)
            assert any(same(got, state) for state in states), f"line {at}: not a state between operations"
            report = verify_store(path)
            assert report.ok, (at, report.problems)
            shutil.rmtree(path)


class TestJumps(PartDurability):
    part, kind = Jumps, "jumps"


class TestStacks(PartDurability):
    part, kind = Stacks, "stacks"
    power_options = {"frame_stack": 4, "max_size": 38}  # a multiple of NUM_ENVS: frames env-major


class TestPriorities(PartDurability):
    part, kind = PrioritiesPart, "priorities"

    def power_cut(self, tmp_path, monkeypatch, backend, rng):
        rec = prio_power.run_prio_workload(str(tmp_path / "src.replay"), backend, rng, monkeypatch)
        return prio_power.check_prio_images(rec, tmp_path, rng, monkeypatch)


def test_every_part_has_a_durability_class():
    covered = {cls.part for cls in PartDurability.__subclasses__()}
    assert covered == set(PARTS), f"parts without durability tests: {set(PARTS) - covered}"
