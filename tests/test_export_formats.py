"""The community's formats: ``export --format d4rl`` read back with plain h5py and
``--format minari`` loaded with ``minari.load_dataset``, compared with the store
transition by transition and episode by episode; anonymous memory while exporting a
store too large to materialize; bad input, from Python and from the command line.

Stores hold random episodes (dones, a ``truncateds`` field) over 1-3 envs and wrap;
autoreset jumps (next states that are not the next row's state) come from an in-memory
store with exact next states (the read API is all the exporters use).
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from diskreplay import (DiskReplay, EmptyStoreError, InvalidArgumentError, MissingDependencyError,
                        OutputExistsError, ring)
from diskreplay.chrono import ChronoReader
from diskreplay.cli.main import main
from diskreplay.export import export_store
from diskreplay.export_d4rl import write_d4rl
from diskreplay.views import snapshot

FIELDS = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool"), "truncateds": ((), "bool"), "log_probs": ((3,), "float64")}
KEYS = ("states", "actions", "rewards", "next_states", "dones", "truncateds", "log_probs")
MAX_SIZE = 30


def random_steps(rng, steps: int, num_envs: int, jumps: bool = False) -> list[dict]:
    """Env steps with a leading env axis; states are [env, k], k counting each env's
    observations; with ``jumps`` some episode ends are unmarked autoresets."""
    k = np.zeros(num_envs)
    out = []
    for _ in range(steps):
        state = np.stack([np.arange(num_envs), k], axis=1).astype(np.float32)
        k = k + 1
        nxt = np.stack([np.arange(num_envs), k], axis=1).astype(np.float32)
        if jumps:
            k = k + 1000 * (rng.random(num_envs) < 0.15)
        out.append({"states": state, "actions": rng.integers(0, 9, num_envs),
                    "rewards": rng.normal(size=num_envs).astype(np.float32), "next_states": nxt,
                    "dones": rng.random(num_envs) < 0.12, "truncateds": rng.random(num_envs) < 0.1,
                    "log_probs": rng.normal(size=(num_envs, 3))})
    return out


def make_store(path, backend, num_envs: int, seed: int, steps: int = 40) -> str:
    rng = np.random.default_rng(seed)
    one = (lambda x: x[0]) if num_envs == 1 else (lambda x: x)
    with DiskReplay.create(path, MAX_SIZE, num_envs=num_envs, backend=backend, seed=0, fields=FIELDS) as buf:
        for s in random_steps(rng, steps, num_envs):
            buf.add(one(s["states"]), one(s["actions"]), one(s["rewards"]), one(s["next_states"]),
                    one(s["dones"]), truncateds=one(s["truncateds"]), log_probs=one(s["log_probs"]))
    return str(path)


class ModelStore:
    """The read API over in-memory transitions whose next states are exact (autoreset jumps kept)."""

    backend = "model"
    path = "model.replay"
    fields = FIELDS

    def __init__(self, steps: list[dict], num_envs: int):
        self.rows = [{key: np.asarray(v[e]) for key, v in s.items()} for s in steps for e in range(num_envs)]
        self.max_size, self.num_envs = MAX_SIZE, num_envs
        self.seen_size = len(self.rows)
        self.size = min(MAX_SIZE, len(self.rows))
        self.head = ring.ring_head(self.seen_size, 0, MAX_SIZE)

    def get(self, slots) -> dict:
        held = self.rows[len(self.rows) - self.size:]
        by_slot = {(len(self.rows) - self.size + i) % MAX_SIZE: r for i, r in enumerate(held)}
        return {key: np.stack([by_slot[int(s)][key] for s in slots]) for key in KEYS}


def expected_d4rl(buf) -> dict:
    """What the D4RL file must hold, computed from the store's own reads: per env, oldest
    first; timeouts = truncateds, or (not terminal) where the next state is not the env's
    next row's state or the env's rows end."""
    snap = snapshot(buf)
    batch = buf.get(snap.slots(0, snap.size))
    envs = snap.env(np.arange(snap.size))
    want = {k: [] for k in ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations",
                            "infos/truncateds", "infos/log_probs")}
    for e in range(buf.num_envs):
        sel = np.flatnonzero(envs == e)
        term, trunc = batch["dones"][sel], batch["truncateds"][sel]
        for k, i in enumerate(sel):
            last = k == len(sel) - 1
            cut = last or not np.array_equal(batch["states"][sel[k + 1]], batch["next_states"][i])
            want["observations"].append(batch["states"][i])
            want["next_observations"].append(batch["next_states"][i])
            want["actions"].append(batch["actions"][i])
            want["rewards"].append(batch["rewards"][i])
            want["terminals"].append(term[k])
            want["timeouts"].append(trunc[k] or (cut and not term[k]))
            want["infos/truncateds"].append(trunc[k])
            want["infos/log_probs"].append(batch["log_probs"][i])
    return {k: np.array(v) for k, v in want.items()}


def read_h5(out) -> dict:
    got = {}
    with h5py.File(out, "r") as f:
        f.visititems(lambda name, obj: got.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return got


def assert_d4rl(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key in ("observations", "next_observations", "rewards"):
        assert got[key].dtype == np.float32, key
    for key in ("terminals", "timeouts"):
        assert got[key].dtype == np.bool_ and got[key].ndim == 1, key
    assert got["rewards"].ndim == 1 and got["actions"].dtype == np.int64
    for key, value in want.items():
        assert got[key].shape == value.shape and np.array_equal(got[key], value), key


@pytest.mark.parametrize("num_envs", [1, 2, 3])
def test_d4rl_file_holds_the_store_per_env(tmp_path, backend, num_envs):
    path = make_store(tmp_path / "s.replay", backend, num_envs, seed=num_envs)
    out = tmp_path / "d4rl.h5"
    with DiskReplay.open(path, mode="r") as buf:
        assert buf.seen_size > MAX_SIZE  # wrapped
        result = export_store(buf, out, fmt="d4rl")
        want = expected_d4rl(buf)
    assert result == {"rows": MAX_SIZE, "skipped_overwritten": 0, "format": "d4rl"}
    got = read_h5(out)
    assert_d4rl(got, want)
    assert got["infos/truncateds"].any() and got["terminals"].any()
    with h5py.File(out, "r") as f:
        env_rows = list(f.attrs["env_rows"])
        assert f.attrs["seen_size"] == 40 * num_envs
    assert sorted(env_rows) == sorted(len(range(e, MAX_SIZE, num_envs)) for e in range(num_envs))
    ends = np.cumsum(env_rows) - 1  # every env's stream ends an episode, so loaders never join two
    assert (got["terminals"] | got["timeouts"])[ends].all()


@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("rows", [1, 4, 1000])
def test_d4rl_timeouts_at_autoreset_jumps_across_block_edges(tmp_path, num_envs, rows):
    store = ModelStore(random_steps(np.random.default_rng(5), 40, num_envs, jumps=True), num_envs)
    out = str(tmp_path / "j.h5")
    assert write_d4rl(store, ChronoReader(store, rows=rows), out) == MAX_SIZE
    want = expected_d4rl(store)
    jumps_unmarked = want["timeouts"] & ~want["infos/truncateds"] & ~want["terminals"]
    assert jumps_unmarked.sum() > num_envs  # jumps occur besides the streams' ends
    assert_d4rl(read_h5(out), want)


def test_d4rl_of_a_range_and_of_an_empty_store(tmp_path, backend):
    path = make_store(tmp_path / "s.replay", backend, 2, seed=9)
    with DiskReplay.open(path, mode="r") as buf:
        export_store(buf, tmp_path / "r.h5", fmt="d4rl", start=-7)
        snap = snapshot(buf)
        batch = buf.get(snap.slots(snap.size - 7, snap.size))
    got = read_h5(tmp_path / "r.h5")
    order = np.argsort(snapshot_envs := (np.arange(MAX_SIZE - 7, MAX_SIZE) + snap.first - 1) % 2, kind="stable")
    assert np.array_equal(got["actions"], batch["actions"][order]) and len(snapshot_envs) == 7
    with DiskReplay.create(tmp_path / "e.replay", 8, backend=backend, seed=0, fields=FIELDS) as buf:
        assert export_store(buf, tmp_path / "e.h5", fmt="d4rl")["rows"] == 0
    assert read_h5(tmp_path / "e.h5")["observations"].shape == (0, 2)


# ---------------------------------------------------------------- minari
def load_minari(root, dataset_id, monkeypatch):
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return list(minari.load_dataset(dataset_id).iterate_episodes())


def assert_episode(got, want) -> None:
    steps = len(want["actions"])
    assert got.observations.shape == (steps + 1, 2) and np.array_equal(got.observations, want["states"])
    assert np.array_equal(got.actions, want["actions"]) and np.array_equal(got.rewards, want["rewards"])
    assert got.terminations.dtype == np.bool_ and np.array_equal(got.terminations, want["dones"])
    truncations = want["truncateds"].copy()
    truncations[-1] |= not want["dones"][-1]  # an end without termination, or the data's end
    assert np.array_equal(got.truncations, truncations)
    assert np.array_equal(got.infos["log_probs"], want["log_probs"])


@pytest.mark.parametrize("num_envs", [1, 3])
def test_minari_dataset_holds_the_stores_episodes(tmp_path, backend, num_envs, monkeypatch):
    path = make_store(tmp_path / "cart.replay", backend, num_envs, seed=20 + num_envs)
    root = tmp_path / "datasets"
    with DiskReplay.open(path, mode="r") as buf:
        result = export_store(buf, root, fmt="minari")
        episodes = list(buf.episodes())
        everything = export_store(buf, root, fmt="minari", dataset_id="all-v1", include_incomplete=True)
    complete = [e for e in episodes if e["complete"]]
    assert 0 < len(complete) < len(episodes)  # the ring cut some
    assert result == {"rows": sum(len(e["actions"]) for e in complete), "episodes": len(complete),
                      "skipped_incomplete": len(episodes) - len(complete), "skipped_overwritten": 0,
                      "format": "minari", "dataset_id": "cart-v0", "path": str(root / "cart-v0")}
    got = load_minari(root, "cart-v0", monkeypatch)
    assert len(got) == len(complete)
    for g, w in zip(got, complete):
        assert_episode(g, w)
    assert everything["episodes"] == len(episodes) and everything["rows"] == MAX_SIZE
    for g, w in zip(load_minari(root, "all-v1", monkeypatch), episodes):
        assert_episode(g, w)
    assert sorted(os.listdir(root)) == ["all-v1", "cart-v0"]  # no staging directory left


def test_minari_overwrite_replaces_only_with_overwrite(tmp_path, monkeypatch):
    path = make_store(tmp_path / "s.replay", "memmap", 2, seed=3)
    root = tmp_path / "datasets"
    with DiskReplay.open(path, mode="r") as buf:
        first = export_store(buf, root, fmt="minari", stop=12, overwrite=False)
        with pytest.raises(OutputExistsError, match="overwrite"):
            export_store(buf, root, fmt="minari", overwrite=False)
        assert len(load_minari(root, "s-v0", monkeypatch)) == first["episodes"]
        second = export_store(buf, root, fmt="minari", overwrite=True)
    assert second["episodes"] > first["episodes"]
    assert len(load_minari(root, "s-v0", monkeypatch)) == second["episodes"]
    assert sorted(os.listdir(root)) == ["s-v0"]
