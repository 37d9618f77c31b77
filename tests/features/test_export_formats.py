"""The community's formats: ``export --format d4rl`` read back with plain h5py and
``--format minari`` loaded with ``minari.load_dataset``, compared with the store
transition by transition and episode by episode; anonymous memory while exporting a
store too large to materialize; bad input, from Python and from the command line.

Stores hold random episodes (dones, a ``truncateds`` field) over 1-3 envs and wrap;
autoreset jumps (next states that are not the next row's state) come from an in-memory
store with exact next states (the read API is all the exporters use).
"""
from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from diskreplay import DiskReplay, EmptyStoreError, InvalidArgumentError, OutputExistsError

from diskreplay.core import ring
from diskreplay.chrono import ChronoReader
from diskreplay.cli.main import main
from diskreplay.export import export_store
from diskreplay.export.d4rl import write_d4rl
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


@pytest.mark.parametrize("state_dtype,want_dtype", [("uint8", "uint8"), ("int16", "int16"), ("bool", "bool"),
                                                    ("float64", "float32"), ("float16", "float32")])
def test_d4rl_observations_keep_integer_dtypes_floats_become_float32(tmp_path, state_dtype, want_dtype):
    """Integer frames stay integers, as D4RL-Atari keeps uint8 frames (D4RL's loaders check
    keys and shapes and cast observations to float32 themselves); floats are float32."""
    fields = {"states": ((2, 3), state_dtype), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 2 if state_dtype == "bool" else 250, (41, 2, 2, 3)).astype(state_dtype)
    with DiskReplay.create(tmp_path / "f.replay", MAX_SIZE, num_envs=2, fields=fields) as buf:
        for k in range(40):
            buf.add(frames[k], rng.integers(0, 4, 2), np.ones(2, np.float32), frames[k + 1], np.zeros(2, bool))
        export_store(buf, tmp_path / "f.h5", fmt="d4rl")
        batch = buf.get(snapshot(buf).slots(0, MAX_SIZE))
    got = read_h5(tmp_path / "f.h5")
    per_env = np.concatenate([np.arange(e, MAX_SIZE, 2) for e in range(2)])  # env 0's rows first
    for key, field in (("observations", "states"), ("next_observations", "next_states")):
        assert got[key].dtype == np.dtype(want_dtype) and got[key].shape == (MAX_SIZE, 2, 3), key
        assert np.array_equal(got[key], batch[field][per_env].astype(want_dtype)), key
        # what D4RL's qlearning_dataset does to each observation
        assert np.array_equal(got[key].astype(np.float32), batch[field][per_env].astype(np.float32)), key


def test_d4rl_beside_a_live_writer_that_laps_the_read(tmp_path, backend):
    """Rows the writer overwrites mid-read are left out and the per-env regions closed up:
    every row in the file is one the writer added, each env's rows in order, and the row
    before a gap ends its trajectory."""
    num_envs = 2
    steps = random_steps(np.random.default_rng(11), 200, num_envs)
    for i, s in enumerate(steps):
        s["actions"] = 1 + num_envs * i + np.arange(num_envs)  # the transition number
    added = {int(t): {k: v[e] for k, v in s.items()} for s in steps for e, t in enumerate(s["actions"])}
    writer = DiskReplay.create(tmp_path / "live.replay", MAX_SIZE, num_envs=num_envs, backend=backend, fields=FIELDS)
    progress = iter(steps)

    def add_step(*_):
        s = next(progress)
        writer.add(s["states"], s["actions"], s["rewards"], s["next_states"], s["dones"],
                   truncateds=s["truncateds"], log_probs=s["log_probs"])

    for _ in range(20):
        add_step()
    out = str(tmp_path / "live.h5")
    with DiskReplay.open(tmp_path / "live.replay", mode="r") as buf:
        reader = ChronoReader(buf, rows=4, progress=lambda *a: [add_step() for _ in range(3)])
        rows = write_d4rl(buf, reader, out)
    writer.close()
    got = read_h5(out)
    assert reader.skipped > 0 and rows == MAX_SIZE - reader.skipped == len(got["actions"])
    start = 0
    with h5py.File(out, "r") as f:
        env_rows = list(f.attrs["env_rows"])
    for e, count in enumerate(env_rows):
        t = got["actions"][start:start + count]
        assert (t % num_envs == (e + 1) % num_envs).all() and (np.diff(t) > 0).all()
        for i, ti in enumerate(t):
            want = added[int(ti)]
            assert np.array_equal(got["observations"][start + i], want["states"])
            assert got["terminals"][start + i] == want["dones"]
            gap = i + 1 == count or t[i + 1] != ti + num_envs
            if gap:
                assert got["terminals"][start + i] or got["timeouts"][start + i]
        start += count


def test_a_range_and_an_empty_store(tmp_path, backend, monkeypatch):
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
        assert export_store(buf, tmp_path / "datasets", fmt="minari")["episodes"] == 0
    assert read_h5(tmp_path / "e.h5")["observations"].shape == (0, 2)
    assert load_minari(tmp_path / "datasets", "e-v0", monkeypatch) == []


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


# ---------------------------------------------------------------- memory
BIG_ROWS, BIG_STATE, BIG_ENVS = 56_000, 512, 64  # 2 KiB states: 109 MiB of states, 219 MiB with next states
ANON_BOUND = 100 << 20  # what an export may add to anonymous memory (a block of rows is 16 MiB)

# Run in a fresh interpreter, so that no earlier test's heap hides what the export allocates:
# the peak of RssAnon (sampled every millisecond by a thread) minus its value before the export.
MEASURE = """
import sys, threading, time
from diskreplay import DiskReplay
from diskreplay.export import export_store

def rss_anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("RssAnon:"))

path, out, fmt = sys.argv[1:]
with DiskReplay.open(path, mode="r") as buf:
    import h5py, minari  # imported before the baseline: their modules are not the export's memory
    base = peak = rss_anon()
    done = threading.Event()
    def watch():
        global peak
        while not done.is_set():
            peak = max(peak, rss_anon())
            time.sleep(0.001)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        rows = export_store(buf, out, fmt=fmt)["rows"]
    finally:
        done.set()
        watcher.join()
print(rows, max(peak, rss_anon()) - base)
"""


@pytest.fixture(scope="module", params=["memmap", "hdf5"])
def big_store(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.replay"
    fields = {"states": ((BIG_STATE,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    with DiskReplay.create(path, BIG_ROWS, num_envs=BIG_ENVS, backend=request.param, seed=0, fields=fields) as buf:
        states = np.random.default_rng(0).normal(size=(BIG_ENVS, BIG_STATE)).astype(np.float32)
        for step in range(BIG_ROWS // BIG_ENVS):
            # Episodes of 100 steps, each step starting from the previous next states (rows
            # shifted): no autoreset jumps, which would end every episode after one step.
            next_states = np.roll(states, 1, axis=0)
            buf.add(states, np.full(BIG_ENVS, step), np.ones(BIG_ENVS, np.float32), next_states,
                    np.full(BIG_ENVS, step % 100 == 99))
            states = next_states
    return path


@pytest.mark.parametrize("fmt", ["npz", "hdf5", "d4rl", "minari"])
def test_exports_keep_anonymous_memory_flat(big_store, tmp_path, fmt):
    materialized = BIG_ROWS * BIG_STATE * 4 * 2
    assert materialized > 2 * ANON_BOUND  # holding the rows would break the bound
    out = tmp_path / ("datasets" if fmt == "minari" else f"big.{fmt}")
    p = subprocess.run([sys.executable, "-c", MEASURE, str(big_store), str(out), fmt], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows, grown = map(int, p.stdout.split())
    # minari leaves out the episodes the data's end cuts (the last BIG_ROWS // BIG_ENVS % 100 steps).
    assert rows == BIG_ROWS - (BIG_ENVS * (BIG_ROWS // BIG_ENVS % 100) if fmt == "minari" else 0)
    assert grown < ANON_BOUND, f"{fmt}: anonymous memory grew by {grown >> 20} MiB"


# ---------------------------------------------------------------- bad input
def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args], prog_name="diskreplay")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r


def test_bad_input_from_python(tmp_path, backend):
    path = make_store(tmp_path / "s.replay", backend, 2, seed=1)
    with DiskReplay.open(path, mode="r") as buf:
        for kwargs, error in (({"fmt": "parquet"}, "fmt must be one of"),
                              ({"fmt": "minari", "dataset_id": "a/b-v0"}, "dataset id must look like"),
                              ({"fmt": "minari", "dataset_id": "noversion"}, "dataset id must look like"),
                              ({"fmt": "d4rl", "dataset_id": "x-v0"}, "for the minari format"),
                              ({"fmt": "d4rl", "include_incomplete": True}, "for the minari format")):
            with pytest.raises(InvalidArgumentError, match=error):
                export_store(buf, tmp_path / "out", **kwargs)
        for fmt in ("d4rl", "minari"):
            with pytest.raises(InvalidArgumentError, match="inside the store"):
                export_store(buf, tmp_path / "s.replay" / "out", fmt=fmt)
        (tmp_path / "file").write_bytes(b"old")
        with pytest.raises(OutputExistsError, match="overwrite"):
            export_store(buf, tmp_path / "file", fmt="d4rl", overwrite=False)
        with pytest.raises(InvalidArgumentError, match="it is a file"):
            export_store(buf, tmp_path / "file", fmt="minari")
        with pytest.raises(InvalidArgumentError, match="is a directory"):
            export_store(buf, tmp_path, fmt="d4rl")
        with pytest.raises(InvalidArgumentError, match="does not exist"):
            export_store(buf, tmp_path / "missing" / "root", fmt="minari")
    assert (tmp_path / "file").read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["file", "s.replay"]  # nothing half-written left
    fields = dict(FIELDS, rewards=((2,), "float32"))
    with DiskReplay.create(tmp_path / "r2.replay", 4, backend=backend, seed=0, fields=fields) as buf:
        with pytest.raises(InvalidArgumentError, match="one reward per transition"):
            export_store(buf, tmp_path / "r2.h5", fmt="d4rl")
    with DiskReplay.create(tmp_path / "u.replay", 4, backend=backend, seed=0) as buf:
        for fmt in ("d4rl", "minari", "npz"):
            with pytest.raises(EmptyStoreError):
                export_store(buf, tmp_path / "u.out", fmt=fmt)
    assert not (tmp_path / "u.out").exists() and not (tmp_path / "r2.h5").exists()


def test_bad_input_from_the_command_line(tmp_path):
    path = make_store(tmp_path / "s.replay", "memmap", 2, seed=1)
    root = tmp_path / "datasets"
    r = cli("export", path, tmp_path / "o.h5", "--format", "parquet")
    assert r.exit_code == 2 and "parquet" in r.stderr
    r = cli("export", path, tmp_path / "s.replay" / "o.h5", "--format", "d4rl")
    assert r.exit_code == 2 and "inside the store" in r.stderr
    r = cli("export", path, root, "--format", "minari", "--dataset-id", "bad id")
    assert r.exit_code == 2 and "dataset id must look like" in r.stderr
    assert cli("export", path, tmp_path / "o.h5", "--format", "d4rl").exit_code == 0
    r = cli("export", path, tmp_path / "o.h5", "--format", "d4rl")
    assert r.exit_code == 1 and "--overwrite" in r.stderr
    assert cli("export", path, tmp_path / "o.h5", "--format", "d4rl", "--overwrite").exit_code == 0
    r = cli("export", path, root, "--format", "minari")
    assert r.exit_code == 0 and "s-v0" in r.stdout and "incomplete episodes" in r.stderr
    r = cli("export", path, root, "--format", "minari")
    assert r.exit_code == 1 and "--overwrite" in r.stderr and "overwrite=True" not in r.stderr
    assert cli("export", path, root, "--format", "minari", "--overwrite", "--include-incomplete").exit_code == 0
    with DiskReplay.create(tmp_path / "u.replay", 4, seed=0):
        pass
    r = cli("export", tmp_path / "u.replay", tmp_path / "u.h5", "--format", "d4rl")
    assert r.exit_code == 1 and "holds no transitions" in r.stderr and not (tmp_path / "u.h5").exists()


# A real import failure: a finder that refuses minari, installed before anything imports it.
BLOCK_MINARI = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "minari" or name.startswith("minari."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
from diskreplay.cli.main import main
sys.argv = ["diskreplay"] + sys.argv[1:]
main()
"""


def test_minari_missing_says_how_to_install_it(tmp_path):
    path = make_store(tmp_path / "s.replay", "memmap", 1, seed=2)
    p = subprocess.run([sys.executable, "-c", BLOCK_MINARI, "export", path, str(tmp_path / "root"), "--format",
                        "minari"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert "pip install 'diskreplay[minari]'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "root").exists()
    p = subprocess.run([sys.executable, "-c", BLOCK_MINARI, "export", path, str(tmp_path / "o.h5"), "--format",
                        "d4rl"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr  # the other formats never need it
