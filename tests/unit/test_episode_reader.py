"""buf.episodes() and EpisodeReader against a plain Python model of the transitions added.

Random stores (1-3 envs, random dones and truncations, wrapping rings, random block sizes)
on every backend; autoreset jumps on an in-memory store with exact next states (the read
API is all the reader uses); a live writer overtaking the read; bad input.
"""
from __future__ import annotations

import numpy as np
import pytest

from diskreplay import DiskReplay, InvalidArgumentError, StoreClosedError
from diskreplay.episodereader import EpisodeReader
from diskreplay.core import ring

FIELDS = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool"), "truncateds": ((), "bool"), "log_probs": ((3,), "float64")}
DATA_KEYS = ("states", "actions", "rewards", "dones", "truncateds", "log_probs")


def random_steps(rng, steps: int, num_envs: int, jumps: bool = False) -> list[dict]:
    """Env steps (arrays with a leading env axis). States are [env, k] with k counting each
    env's observations; with ``jumps``, some episode ends are unmarked autoresets."""
    k = np.zeros(num_envs)
    out = []
    for _ in range(steps):
        state = np.stack([np.arange(num_envs), k], axis=1).astype(np.float32)
        k = k + 1
        dones = rng.random(num_envs) < 0.15
        truncs = rng.random(num_envs) < 0.1
        nxt = np.stack([np.arange(num_envs), k], axis=1).astype(np.float32)
        if jumps:
            jump = rng.random(num_envs) < 0.15
            k = k + 1000 * jump  # the next row's state is not this next state
        out.append({"states": state, "actions": rng.integers(0, 9, num_envs), "rewards":
                    rng.normal(size=num_envs).astype(np.float32), "next_states": nxt, "dones": dones,
                    "truncateds": truncs, "log_probs": rng.normal(size=(num_envs, 3))})
    return out


def add_step(buf, s: dict) -> None:
    """One env step into ``buf`` (without the env axis when the store has one env)."""
    one = (lambda x: x[0]) if buf.num_envs == 1 else (lambda x: x)
    buf.add(one(s["states"]), one(s["actions"]), one(s["rewards"]), one(s["next_states"]), one(s["dones"]),
            truncateds=one(s["truncateds"]), log_probs=one(s["log_probs"]))


def transitions(steps: list[dict]) -> list[dict]:
    """One dict per transition (env-major), with ``t`` (1-based) and ``env``."""
    rows = []
    for step in steps:
        for e in range(len(step["dones"])):
            rows.append({key: np.asarray(value[e]) for key, value in step.items()} | {"t": len(rows) + 1, "env": e})
    return rows


def model_episodes(rows: list[dict], held: int, num_envs: int, max_size: int) -> list[dict]:
    """The episodes of the newest ``held`` transitions, per env oldest first."""
    kept = rows[len(rows) - held:]
    eps = []
    for env in range(num_envs):
        mine = [r for r in kept if r["env"] == env]
        cur, started = [], bool(mine) and mine[0]["t"] <= num_envs
        for i, r in enumerate(mine):
            cur.append(r)
            nxt = mine[i + 1] if i + 1 < len(mine) else None
            jump = nxt is not None and not np.array_equal(r["next_states"], nxt["states"])
            if r["dones"] or r["truncateds"] or jump:
                eps.append((env, cur, started and True))
                cur, started = [], True
        if cur:
            eps.append((env, cur, False))
    return [{"env": env, "rows": cur, "complete": complete, "last": cur[-1]["t"]} for env, cur, complete in eps]


def assert_matches(got: dict, want: dict, max_size: int) -> None:
    rows = want["rows"]
    assert got["env"] == want["env"] and got["complete"] == want["complete"]
    assert got["slots"].tolist() == [(r["t"] - 1) % max_size for r in rows]
    expect_states = np.stack([r["states"] for r in rows] + [rows[-1]["next_states"]])
    np.testing.assert_array_equal(got["states"], expect_states)
    for key in DATA_KEYS[1:]:
        np.testing.assert_array_equal(got[key], np.stack([r[key] for r in rows]), err_msg=key)
    assert set(got) == set(DATA_KEYS) | {"env", "slots", "complete"}


def per_env(eps: list[dict]) -> dict:
    out = {}
    for ep in eps:
        out.setdefault(ep["env"], []).append(ep)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_episodes_equal_the_model(tmp_path, backend, seed):
    rng = np.random.default_rng(seed)
    num_envs = 1 + seed % 3
    max_size = int(rng.integers(5, 40)) * num_envs
    steps = random_steps(rng, int(rng.integers(1, 3 * max_size // num_envs)), num_envs)
    path = tmp_path / "e.replay"
    with DiskReplay.create(path, max_size, num_envs=num_envs, backend=backend, fields=FIELDS) as buf:
        for s in steps:
            add_step(buf, s)
    rows = transitions(steps)
    with DiskReplay.open(path, mode="r") as buf:
        want = model_episodes(rows, buf.size, num_envs, max_size)
        for rows_per_block in (None, 1, int(rng.integers(2, 7))):
            reader = EpisodeReader(buf, rows=rows_per_block)
            got = list(reader)
            assert per_env([e.data for e in got]).keys() == per_env(want).keys()
            for env, eps in per_env(want).items():
                mine = [e for e in got if e.env == env]
                assert len(mine) == len(eps)
                for g, w in zip(mine, eps):
                    assert_matches(g.data, w, max_size)
                    assert (g.first, g.last, g.length) == (w["rows"][0]["t"], w["last"], len(w["rows"]))
                    assert g.ret == pytest.approx(sum(float(r["rewards"]) for r in w["rows"]))
            for env in range(num_envs):
                only = list(buf.episodes(env=env))
                assert [len(e["slots"]) for e in only] == [len(w["rows"]) for w in want if w["env"] == env]


class ModelStore:
    """The read API over in-memory transitions with exact next states, as the store's
    ``get`` returns them once every next state is exact (issue 15, item 1)."""

    def __init__(self, rows: list[dict], max_size: int, num_envs: int):
        self.rows, self.max_size, self.num_envs = rows, max_size, num_envs
        self.seen_size = len(rows)
        self.size = min(max_size, len(rows))
        self.head = ring.ring_head(self.seen_size, 0, max_size)
        self.fields = FIELDS
        self.path = "model"

    def get(self, slots) -> dict:
        by_slot = {(r["t"] - 1) % self.max_size: r for r in self.rows[len(self.rows) - self.size:]}
        picked = [by_slot[int(s)] for s in slots]
        return {key: np.stack([r[key] for r in picked]) for key in DATA_KEYS + ("next_states",)}


@pytest.mark.parametrize("seed", range(4))
def test_autoreset_jumps_end_episodes(seed):
    rng = np.random.default_rng(100 + seed)
    num_envs, max_size = 1 + seed % 3, 30
    rows = transitions(random_steps(rng, 25, num_envs, jumps=True))
    store = ModelStore(rows, max_size, num_envs)
    want = model_episodes(rows, store.size, num_envs, max_size)
    assert any(not (r["dones"] or r["truncateds"]) for w in want for r in w["rows"][-1:])  # jumps occur
    for rows_per_block in (1, 4, 1000):
        got = [e.data for e in EpisodeReader(store, rows=rows_per_block)]
        for env, eps in per_env(want).items():
            mine = [e for e in got if e["env"] == env]
            assert len(mine) == len(eps)
            for g, w in zip(mine, eps):
                assert_matches(g, w, max_size)


def test_episodes_beside_a_live_writer(tmp_path, backend):
    rng = np.random.default_rng(7)
    num_envs, max_size = 2, 40
    steps = random_steps(rng, 200, num_envs)
    path = tmp_path / "live.replay"
    writer = DiskReplay.create(path, max_size, num_envs=num_envs, backend=backend, fields=FIELDS)

    def add(s):
        add_step(writer, s)

    for s in steps[:30]:
        add(s)
    rows = transitions(steps)
    by_t = {r["t"]: r for r in rows}
    with DiskReplay.open(path, mode="r") as reader_buf:
        reader = EpisodeReader(reader_buf, rows=4)
        got, added = [], 30
        for ep in reader:
            got.append(ep)
            for s in steps[added:added + 3]:  # the writer laps the reader
                add(s)
            added += 3
        assert reader.skipped > 0
    writer.close()
    assert got
    for ep in got:
        t = np.arange(ep.first, ep.last + 1, num_envs)
        want = {"rows": [by_t[int(x)] for x in t], "env": ep.env, "last": ep.last}
        # Consecutive rows of one env, each as added; none torn, none newer than the snapshot.
        want["complete"] = ep.data["complete"]
        assert_matches(ep.data, want, max_size)
        if ep.complete:
            prev = by_t.get(ep.first - num_envs)
            assert prev is None or prev["dones"] or prev["truncateds"]
            assert want["rows"][-1]["dones"] or want["rows"][-1]["truncateds"]
            assert not any(r["dones"] or r["truncateds"] for r in want["rows"][:-1])


def test_episodes_bad_input_and_empty_stores(tmp_path, backend):
    path = tmp_path / "b.replay"
    with DiskReplay.create(path, 10, num_envs=2, backend=backend) as buf:
        assert list(buf.episodes()) == []
        buf.add(np.zeros((2, 3)), np.zeros(2), np.zeros(2), np.ones((2, 3)), np.array([True, False]))
        for env in (2, -1, True, 1.0, "0"):
            with pytest.raises(InvalidArgumentError, match=r"env must be an integer in \[0, 2\)"):
                buf.episodes(env=env)
        eps = list(buf.episodes())
        assert [(e["env"], e["complete"], len(e["states"])) for e in eps] == [(0, True, 2), (1, False, 2)]
    with pytest.raises(StoreClosedError):
        buf.episodes()
    with DiskReplay.create(tmp_path / "declared.replay", 10, backend=backend, fields=FIELDS) as buf:
        assert list(buf.episodes()) == []
