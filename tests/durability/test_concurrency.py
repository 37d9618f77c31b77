"""One writer, live readers, the writer lock, and a full disk at create."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import crash_reader
from crash_common import add_step, crash_fields, row_problems, store_problems
from crash_harness import CHILD, Acks

from diskreplay import DiskReplay
from diskreplay.backends import BACKENDS
from diskreplay.errors import InsufficientSpaceError, StoreLockedError

READER = os.path.abspath(crash_reader.__file__)


def _wait_ready(acks: Acks, child) -> int:
    t0 = time.monotonic()
    while True:
        for line in acks.new_lines():
            if line.startswith("ready "):
                return int(line.split()[1])
        if child.poll() is not None or time.monotonic() - t0 > 120:
            raise AssertionError(f"child never became ready (exit {child.poll()})")
        time.sleep(0.005)


@pytest.mark.parametrize("backend", BACKENDS)
def test_writer_and_two_readers_see_no_torn_rows(tmp_path, backend):
    store = str(tmp_path / "live.replay")
    with DiskReplay.create(store, 37, num_envs=4, backend=backend, fields=crash_fields(), seed=3) as buf:
        add_step(buf, 1)
    acks = Acks(str(tmp_path / "acks.txt"))
    acks.reset()
    writer = subprocess.Popen([sys.executable, CHILD, store, "--acks", acks.path, "--duration", "9",
                               "--flush-prob", "0.01", "--seed", "5"], stdout=subprocess.DEVNULL)
    try:
        _wait_ready(acks, writer)
        readers = [subprocess.Popen([sys.executable, READER, store, "--duration", "8", "--seed", str(i)],
                                    stdout=subprocess.PIPE) for i in range(2)]
        reports = [json.loads(r.communicate(timeout=120)[0].decode().strip().splitlines()[-1]) for r in readers]
        assert [r.returncode for r in readers] == [0, 0]
        assert writer.wait(timeout=120) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    for rep in reports:
        assert rep["bad"] == [], rep["bad"][:5]
        assert rep["rows"] > 1000 and rep["batches"] > 100
    done = [line for line in acks.new_lines() if line.startswith("done ")]
    final = int(done[-1].split()[1])
    assert max(rep["max_seen"] for rep in reports) <= final
    with DiskReplay.open(store, mode="r+") as buf:
        assert store_problems(buf, min_seen=final, max_seen=final) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_writer_refused_and_lock_gone_after_kill9(tmp_path, backend):
    store = str(tmp_path / "locked.replay")
    with DiskReplay.create(store, 37, backend=backend, fields=crash_fields()) as buf:
        for t in range(1, 11):
            add_step(buf, t)
    acks = Acks(str(tmp_path / "acks.txt"))
    acks.reset()
    holder = subprocess.Popen([sys.executable, CHILD, store, "--acks", acks.path, "--hold"])
    try:
        assert _wait_ready(acks, holder) == 10
        with pytest.raises(StoreLockedError) as info:
            DiskReplay.open(store, mode="r+")
        assert os.path.abspath(store) in str(info.value) or store in str(info.value)
        with pytest.raises(StoreLockedError) as info:
            DiskReplay.create(store, 37, backend=backend, fields=crash_fields(), overwrite=True)
        assert os.path.abspath(store) in str(info.value) or store in str(info.value)
        with DiskReplay.open(store, mode="r") as reader:  # readers take no lock
            assert reader.seen_size == 10
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with DiskReplay.open(store, mode="r+") as buf:
        assert store_problems(buf, min_seen=10, max_seen=10) == []
        add_step(buf, 11)
    with DiskReplay.open(store, mode="r+") as buf:
        assert buf.seen_size == 11


@pytest.mark.parametrize("backend", BACKENDS)
def test_reader_of_a_dead_writers_store_checks_the_checkpoint_once_per_record(tmp_path, backend, monkeypatch):
    """A reader applies recovery virtually while the writer is dead; the checkpoint is read
    and checked once per state of the counter record, not once per sample."""
    store = str(tmp_path / "dead.replay")
    with DiskReplay.create(store, 37, backend=backend, fields=crash_fields()) as buf:
        for t in range(1, 11):
            add_step(buf, t)
    acks = Acks(str(tmp_path / "acks.txt"))

    def hold_and_kill():
        acks.reset()
        holder = subprocess.Popen([sys.executable, CHILD, store, "--acks", acks.path, "--hold"])
        try:
            assert _wait_ready(acks, holder) == 10
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()

    hold_and_kill()
    with DiskReplay.open(store, mode="r") as reader:
        calls = []
        newest = reader._session.data.ckfile.newest
        monkeypatch.setattr(reader._session.data.ckfile, "newest", lambda: calls.append(1) or newest())
        first = [reader.sample(8) for _ in range(20)]
        assert len(calls) == 0  # open() read it; the record has not changed since
        hold_and_kill()  # a new writer recovered and died: a new record (new key)
        reader._session._alive_at = -1.0  # ask /proc/locks again now rather than after its 0.2 s
        later = [reader.sample(8) for _ in range(5)]
        assert len(calls) == 1 and reader.seen_size == 10
        for batch in first + later:
            assert row_problems(batch, np.asarray(batch["actions"], np.int64), 1, None) == []
        monkeypatch.undo()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_writer_view_follows_a_new_checkpoint_with_the_same_counters(tmp_path, backend, monkeypatch):
    """A flush rewrites the checkpoint without changing seen/intent/base/draws/resets; a
    reader that takes the writer for dead must not keep the view of the old checkpoint."""
    import diskreplay.session.reader as reader_module

    store = str(tmp_path / "s.replay")
    writer = DiskReplay.create(store, 37, backend=backend, fields=crash_fields())
    for t in range(1, 6):
        add_step(writer, t)
    monkeypatch.setattr(reader_module, "writer_alive", lambda directory: False)
    with DiskReplay.open(store, mode="r") as reader:
        calls = []
        newest = reader._session.data.ckfile.newest
        monkeypatch.setattr(reader._session.data.ckfile, "newest", lambda: calls.append(1) or newest())
        reader.sample(4)
        assert calls == []  # nothing changed since open()
        writer.flush()  # same counters, a new checkpoint
        reader._session._alive_at = -1.0
        reader.sample(4)
        assert calls == [1] and reader._session.view.checkpoint.generation == newest().generation
    writer.close()


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip() or res.returncode})")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_full_at_create(small_tmpfs, backend):
    free_before = _free(small_tmpfs)
    big = os.path.join(small_tmpfs, "big.replay")
    fields = crash_fields((1024,))  # 4 KiB rows: 16 MiB of states alone
    with pytest.raises(InsufficientSpaceError) as info:
        DiskReplay.create(big, 4096, backend=backend, fields=fields)
    msg = str(info.value)
    assert "needs" in msg and "free" in msg, msg
    assert any(ch.isdigit() for ch in msg)
    assert not os.path.exists(big)
    assert _free(small_tmpfs) == free_before
    # A store that fits is filled well past the wrap without a crash.
    fits = os.path.join(small_tmpfs, "fits.replay")
    m = 1500
    with DiskReplay.create(fits, m, num_envs=4, backend=backend, fields=crash_fields((128,))) as buf:
        seen = 0
        while seen < 3 * m:
            add_step(buf, seen + 1)
            seen += 4
            if seen % 400 == 0:
                buf.flush()
    with DiskReplay.open(fits, mode="r+") as buf:
        assert store_problems(buf, min_seen=seen, max_seen=seen) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_full_at_create_in_existing_dir_leaves_it_empty(small_tmpfs, backend):
    existing = os.path.join(small_tmpfs, "existing")
    os.mkdir(existing)
    with pytest.raises(InsufficientSpaceError):
        DiskReplay.create(existing, 4096, backend=backend, fields=crash_fields((1024,)))
    assert os.listdir(existing) == []
