"""Readers in forked children (issue 35 item 1): a reader inherited by a forked process
(a PyTorch DataLoader worker, a multiprocessing pool) maps the store afresh there and keeps
reading correct rows beside a live writer; a writer inherited by one refuses to be used."""
import os

import numpy as np
import pytest

from diskreplay import DiskReplay, ForkedStoreError


def row(t: int) -> np.ndarray:
    return np.full(3, t, np.float32)


def add(buf, t: int) -> None:
    buf.add(row(t), t, float(t), row(t + 1), False)


def row_problems(batch: dict) -> list[str]:
    """Each row of these stores is one transition t: states t, action t, next states t + 1."""
    t = batch["actions"]
    problems = []
    if not (batch["states"] == t[:, None]).all():
        problems.append("states")
    if not (batch["next_states"] == t[:, None] + 1).all():
        problems.append("next_states")
    if not (batch["rewards"] == t).all():
        problems.append("rewards")
    return problems


def in_child(work) -> str:
    """Run ``work()`` in a forked child; its result (a string) or its exception's name."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            out = str(work())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = f"{type(exc).__name__}: {exc}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_a_forked_reader_reads_correct_rows_beside_a_live_writer(tmp_path, backend, prioritized):
    path = tmp_path / "s"
    writer = DiskReplay.create(path, 40, backend=backend, prioritized=prioritized)
    for t in range(30):
        add(writer, t)
    reader = DiskReplay.open(path, mode="r")
    reader.sample(4)  # used in the parent first: its mappings exist before the fork

    def work():
        problems, seen = [], []
        for _ in range(20):
            batch = reader.sample(8)
            problems += row_problems(batch)
            got = reader.get(np.arange(reader.size))
            problems += row_problems(got)
            seen.append(reader.seen_size)
        return f"{sorted(set(problems))} {seen[0]} {seen[-1]}"

    for t in range(30, 60):  # the writer goes on between the children
        add(writer, t)
        if t % 10 == 0:
            assert in_child(work).startswith("[] "), t
    writer.flush()
    out = in_child(work)
    assert out == "[] 60 60"
    batch = reader.get(np.arange(reader.size))  # the parent's reader is untouched by its children
    assert reader.seen_size == 60 and row_problems(batch) == []
    reader.close()
    writer.close()


def test_a_forked_writer_refuses_everything_but_close_and_the_parent_goes_on(tmp_path, backend):
    path = tmp_path / "s"
    writer = DiskReplay.create(path, 40, backend=backend)
    for t in range(10):
        add(writer, t)
    fast_add = writer.add  # a reference to the fast add, taken before the fork

    def work():
        out = []
        for name, call in [("add", lambda: add(writer, 99)), ("fast add", lambda: fast_add(row(98), 98, 98.0, row(99), False)),
                           ("flush", writer.flush), ("sample", lambda: writer.sample(2)), ("info", lambda: writer.size)]:
            try:
                call()
                out.append(f"{name}:returned")
            except ForkedStoreError as exc:
                assert "forked child" in str(exc) and "mode='r'" in str(exc)
                out.append(f"{name}:forked")
        writer.close()
        with DiskReplay.open(path, mode="r") as reader:  # what the message says to do
            out.append(f"reader:{reader.seen_size}")
        return " ".join(out)

    assert in_child(work) == "add:forked fast add:forked flush:forked sample:forked info:forked reader:10"
    for t in range(10, 50):  # the parent's writer, its lock and its counters are its own
        add(writer, t)
    assert not writer.closed and writer.seen_size == 50
    writer.close()
    with DiskReplay.open(path, mode="r+") as again:
        assert again.seen_size == 50 and row_problems(again.get(np.arange(40))) == []
