"""diskreplay.stats from Python: running moments, episode returns, histograms.

The episode store has 2 envs and 7 steps (transitions 1..14, env e adds transitions
2 * step + e + 1). env 0 earns 1 a step and is done at steps 2 and 5; env 1 earns 10 a step
and is done at step 3. So env 0's episodes are steps 0-2 (return 3, ends at transition 5)
and 3-5 (return 3, transition 11); env 1's is steps 0-3 (return 40, transition 8).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from diskreplay import DiskReplay, EmptyStoreError
from diskreplay.stats import Episodes, RunningStats, bin_edges, compute_stats, histograms
from kernels import IMPLS, implementation

STEPS = 7
DONE_STEPS = ({2, 5}, {3})
REWARDS = (1.0, 10.0)
FIELDS = {"states": ((2,), "float32"), "actions": ((), "int64"), "rewards": ((), "float32"),
          "dones": ((), "bool")}


def episode_store(path, backend, max_size):
    with DiskReplay.create(path, max_size, num_envs=2, backend=backend, seed=0, fields=FIELDS) as buf:
        for step in range(STEPS):
            ts = np.array([2 * step + 1, 2 * step + 2])
            states = np.repeat(ts[:, None].astype(np.float32), 2, 1)
            buf.add(states, ts, np.array(REWARDS, np.float32), states + 2,
                    np.array([step in DONE_STEPS[0], step in DONE_STEPS[1]]))
    return path


def test_running_stats_match_numpy():
    rng = np.random.default_rng(0)
    blocks = [rng.normal(3, 2, size=(n, 3)).astype(np.float32) for n in (1, 7, 50, 0, 13)]
    blocks[2][4, 1] = np.nan
    blocks[1][0, 0] = np.inf
    s = RunningStats()
    for b in blocks:
        s.update(b)
    x = np.concatenate([b.reshape(-1) for b in blocks]).astype(np.float64)
    finite = x[np.isfinite(x)]
    d = s.as_dict()
    assert d["count"] == finite.size and d["nonfinite"] == 2
    assert d["min"] == finite.min() and d["max"] == finite.max()
    assert d["mean"] == pytest.approx(finite.mean()) and d["std"] == pytest.approx(finite.std())
    ints = RunningStats()
    ints.update(np.arange(5))
    assert ints.as_dict() == {"count": 5, "min": 0.0, "max": 4.0, "mean": 2.0, "std": pytest.approx(2 ** 0.5),
                              "nonfinite": 0}
    # The same keys whatever the data: nothing finite yet, or nothing at all.
    assert RunningStats().as_dict() == {"count": 0, "min": None, "max": None, "mean": None, "std": None,
                                        "nonfinite": 0}


def test_episodes_follow_each_env():
    ep = Episodes(2, starts_complete=False)
    ep.update(np.array([1, 2, 3, 4]), np.array([0, 1, 0, 1]), [1, 2, 3, 4], [True, False, True, True])
    # env 0: its first done closes an episode that began before the range, the second is complete.
    assert ep.returns == [(3, 0, 3.0)]
    assert ep.as_dict()["dones_per_env"] == [2, 1]


def test_compute_stats_of_a_store_that_kept_everything(tmp_path, backend):
    path = episode_store(tmp_path / "all.replay", backend, max_size=100)
    calls = []
    with DiskReplay.open(path, mode="r") as buf:
        d = compute_stats(buf, progress=lambda done, total: calls.append((done, total)), keep_returns=True)
    assert (d["size"], d["seen_size"], d["skipped_overwritten"], d["dones"]) == (14, 14, 0, 3)
    ep = d["episodes"]
    assert ep["returns"] == [(5, 0, 3.0), (8, 1, 40.0), (11, 0, 3.0)]
    assert ep["dones_per_env"] == [2, 1] and ep["complete_episodes_per_env"] == [2, 1]
    assert (ep["complete_episodes"], ep["return_min"], ep["return_max"]) == (3, 3.0, 40.0)
    assert ep["return_mean"] == pytest.approx(46 / 3)
    ts = np.arange(1, 15, dtype=np.float64)
    assert d["fields"]["actions"]["mean"] == pytest.approx(ts.mean())
    assert d["fields"]["actions"]["std"] == pytest.approx(ts.std())
    assert d["fields"]["states"]["count"] == 28
    assert d["fields"]["rewards"]["mean"] == pytest.approx(5.5)
    assert d["fields"]["dones"]["mean"] == pytest.approx(3 / 14)
    assert calls[-1] == (14, 14)
    with DiskReplay.open(path, mode="r") as buf:
        assert "returns" not in compute_stats(buf)["episodes"]


def test_compute_stats_counts_only_episodes_that_start_in_the_store(tmp_path, backend):
    # max_size 10 keeps transitions 5..14 (steps 2..6): env 0's done at step 2 closes an
    # episode whose start was evicted; its next one (steps 3-5) is complete.
    path = episode_store(tmp_path / "wrapped.replay", backend, max_size=10)
    with DiskReplay.open(path, mode="r") as buf:
        d = compute_stats(buf, keep_returns=True)
    assert (d["size"], d["seen_size"], d["dones"]) == (10, 14, 3)
    ep = d["episodes"]
    assert ep["returns"] == [(11, 0, 3.0)]  # env 1's only episode began at step 0
    assert ep["dones_per_env"] == [2, 1] and ep["complete_episodes_per_env"] == [1, 0]
    assert d["fields"]["actions"]["min"] == 5 and d["fields"]["actions"]["max"] == 14


def test_compute_stats_of_stores_without_transitions(tmp_path):
    with DiskReplay.create(tmp_path / "e.replay", 4, seed=0, fields=FIELDS) as buf:
        d = compute_stats(buf)
        assert d["size"] == 0 and d["fields"]["rewards"]["count"] == 0
        assert d["episodes"]["complete_episodes"] == 0 and d["episodes"]["return_mean"] is None
    with DiskReplay.create(tmp_path / "u.replay", 4, seed=0) as buf:  # fields not declared yet: as empty
        d = compute_stats(buf)
        assert (d["size"], d["fields"], d["episodes"]["complete_episodes"]) == (0, {}, 0)
        with pytest.raises(EmptyStoreError):
            histograms(buf, {"rewards": (0.0, 1.0)})


def test_histograms(tmp_path, backend):
    path = episode_store(tmp_path / "h.replay", backend, max_size=100)
    with DiskReplay.open(path, mode="r") as buf:
        stats = compute_stats(buf)
        ranges = {name: (s["min"], s["max"]) for name, s in stats["fields"].items()}
        hists = histograms(buf, dict(ranges, rewards=(1.0, 1.0)), bins=4)
        assert histograms(buf, {"actions": (None, None)}) == {}  # a field without finite values
    counts, edges = hists["actions"]  # int64 1..14 near 4 bins: 7 of 2 whole values, centred on integers
    assert edges.tolist() == [0.5, 2.5, 4.5, 6.5, 8.5, 10.5, 12.5, 14.5] and counts.tolist() == [2] * 7
    counts, edges = hists["dones"]  # bool: one bin per value
    assert edges.tolist() == [-0.5, 0.5, 1.5] and counts.tolist() == [11, 3]
    counts, edges = hists["rewards"]  # an empty range is widened to one unit
    assert edges[0] == 0.5 and edges[-1] == 1.5 and counts.sum() == 7


def test_integer_bins_never_alias():
    # uint8 0..255 in 50 float bins would give some bins 6 values and others 5; bins 6 wide
    # leave the last one 4 values (a dip no data has): 64 bins of 4, every one full.
    edges = bin_edges(0, 255, integer=True)
    assert len(edges) - 1 == 64 and np.all(np.diff(edges) == 4) and edges[0] == -0.5 and edges[-1] == 255.5
    assert np.histogram(np.arange(256), edges)[0].tolist() == [4] * 64
    for lo, hi in ((-128, 127), (0, 65535), (0, 99), (1, 14)):
        counts = np.histogram(np.arange(lo, hi + 1), bin_edges(lo, hi, integer=True))[0]
        assert len(set(counts.tolist())) == 1 and 25 <= len(counts) <= 100 or hi == 14, (lo, hi, counts)
    edges = bin_edges(0, 250, integer=True)  # 251 values, a prime: no width divides them
    assert len(edges) - 1 == 42 and np.all(np.diff(edges) == 6)
    assert bin_edges(3, 7, integer=True).tolist() == [2.5, 3.5, 4.5, 5.5, 6.5, 7.5]
    assert bin_edges(0.0, 1.0, integer=False, bins=4).tolist() == [0, 0.25, 0.5, 0.75, 1]


def test_infinities_of_both_signs_in_one_episode_warn_nothing(tmp_path):
    with DiskReplay.create(tmp_path / "inf.replay", 20, seed=0, fields=FIELDS) as buf:
        for t, r in enumerate([np.inf, -np.inf, 1.0, 2.0]):
            buf.add(np.zeros(2, np.float32), t, np.float32(r), np.zeros(2, np.float32), t in (1, 3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a RuntimeWarning would reach the CLI's stderr
            ep = compute_stats(buf)["episodes"]
    assert (ep["complete_episodes"], ep["finite_returns"], ep["nonfinite_returns"]) == (2, 1, 1)
    assert ep["return_mean"] == 3.0


def test_returns_over_finite_episodes(tmp_path):
    with DiskReplay.create(tmp_path / "nan.replay", 20, seed=0, fields=FIELDS) as buf:
        rewards = [1.0, np.nan, 2.0, 3.0, 4.0, np.inf, 5.0]
        dones = [False, True, False, True, True, False, True]   # episodes: nan, 5, 4, inf
        for t, (r, d) in enumerate(zip(rewards, dones)):
            buf.add(np.zeros(2, np.float32), t, np.float32(r), np.zeros(2, np.float32), d)
        with np.errstate(all="raise"), warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing leaks to stderr
            d = compute_stats(buf)
    ep = d["episodes"]
    assert (ep["complete_episodes"], ep["finite_returns"], ep["nonfinite_returns"]) == (4, 2, 2)
    assert (ep["return_mean"], ep["return_min"], ep["return_max"]) == (4.5, 4.0, 5.0)
    assert d["fields"]["rewards"]["nonfinite"] == 2 and d["fields"]["rewards"]["max"] == 5.0
    assert d["fields"]["actions"]["nonfinite"] == 0


def test_stats_of_a_range_and_across_a_gap(tmp_path, backend):
    path = episode_store(tmp_path / "r.replay", backend, max_size=100)
    with DiskReplay.open(path, mode="r") as buf:
        d = compute_stats(buf, start=-4)
        assert (d["size"], d["start"], d["stop"]) == (4, 10, 14)
        assert d["fields"]["actions"]["min"] == 11 and d["dones"] == 1
        assert d["episodes"]["complete_episodes"] == 0  # no episode starts inside the last 4
        d = compute_stats(buf, start=-1000, stop=6)
        assert (d["size"], d["episodes"]["return_min"]) == (6, 3.0)
    # Episodes across skipped transitions are not complete.
    ep = Episodes(1, starts_complete=True)
    ep.update(np.array([1, 2]), np.array([0, 0]), [1, 1], [False, True])
    ep.update(np.array([3, 4]), np.array([0, 0]), [1, 1], [False, False])
    ep.update(np.array([7, 8]), np.array([0, 0]), [1, 1], [False, True])
    assert ep.returns == [(2, 0, 2.0)]


def test_episode_ends_rule():
    from diskreplay.core.episodes import episode_ends
    batch = {"dones": np.array([True, False, False, False]), "truncateds": np.array([False, True, False, False])}
    assert episode_ends(batch).tolist() == [True, True, False, False]
    assert episode_ends(batch, jumps=np.array([0, 0, 1, 0], bool)).tolist() == [True, True, True, False]
    assert episode_ends({"dones": np.zeros((2, 3), bool)}).tolist() == [False, False]


def test_truncations_end_episodes_in_stats(tmp_path, backend):
    # Gymnasium's convention: dones = terminated, a time limit in the bool field truncateds.
    fields = dict(FIELDS, truncateds=((), "bool"))
    with DiskReplay.create(tmp_path / "t.replay", 100, backend=backend, fields=fields) as buf:
        for step, (terminated, truncated) in enumerate([(0, 0), (0, 1), (0, 0), (1, 0), (0, 0)]):
            s = np.full(2, step, np.float32)
            buf.add(s, step, 1.0, s + 1, bool(terminated), truncateds=bool(truncated))
        d = compute_stats(buf, keep_returns=True)
    assert d["dones"] == 1
    # steps 0-1 end at the truncation (transition 2), steps 2-3 at the termination
    assert d["episodes"]["returns"] == [(2, 0, 2.0), (4, 0, 2.0)]
    assert d["episodes"]["dones_per_env"] == [2]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tally", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "int8", "bool", "int16", "uint16"])
def test_small_integer_stats_are_exact(dtype, tally, impl, monkeypatch):
    """One- and two-byte integers and bools are summed as integers (or tallied, a count per
    value, a chunk of elements at a time), exactly, by the C kernels (a skip where they are
    absent) and by numpy."""
    from diskreplay import smallints

    with implementation("scan", impl):
        monkeypatch.setattr(smallints, "_TALLY_CHUNK", 7)
        monkeypatch.setattr(smallints, "_PIECE", 7)
        rng = np.random.default_rng(1)
        info = np.iinfo(dtype) if dtype != "bool" else None
        lo, hi = (0, 2) if info is None else (info.min, info.max + 1)
        blocks = [rng.integers(lo, hi, size=(n, 3, 2)).astype(dtype) for n in (5, 0, 40, 1)]
        s = RunningStats(tally=tally)
        for b in blocks:
            s.update(b[:, ::2] if b.size else b)  # a strided view too
        x = np.concatenate([(b[:, ::2] if b.size else b).reshape(-1) for b in blocks]).astype(np.float64)
        d = s.as_dict()
        assert (s.tally is not None) == tally and d["count"] == x.size and d["nonfinite"] == 0
        assert (d["min"], d["max"]) == (x.min(), x.max())
        assert d["mean"] == pytest.approx(x.mean(), rel=1e-12) and d["std"] == pytest.approx(x.std(), rel=1e-9)
        if tally:
            values, counts = s.values()
            assert values.tolist() == sorted(set(x.tolist())) and counts.sum() == x.size
        s.update(np.array([0.5, np.nan]))  # floats after small ints: merged
        both = np.concatenate([x, [0.5]])
        d = s.as_dict()
        assert (d["count"], d["nonfinite"]) == (both.size, 1) and d["mean"] == pytest.approx(both.mean(), rel=1e-12)
        assert d["std"] == pytest.approx(both.std(), rel=1e-9)


def test_frames_are_tallied_and_binned_without_a_second_read(tmp_path, backend, monkeypatch):
    fields = {"states": ((3, 4), "uint8"), "actions": ((), "int16"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    rng = np.random.default_rng(2)
    with DiskReplay.create(tmp_path / "f.replay", 300, num_envs=2, backend=backend, fields=fields) as buf:
        for _ in range(200):  # the ring wraps: chronological blocks span two runs of slots
            s = rng.integers(0, 256, (2, 3, 4)).astype(np.uint8)
            buf.add(s, rng.integers(-5, 5, 2).astype(np.int16), rng.normal(size=2).astype(np.float32), s,
                    rng.random(2) < 0.05)
    reads = []
    real_get = DiskReplay.get

    def spy(self, idxs, **kw):
        reads.append(kw.get("fields"))
        return real_get(self, idxs, **kw)

    with DiskReplay.open(tmp_path / "f.replay", mode="r") as buf:
        everything = real_get(buf, np.arange(300))
        monkeypatch.setattr(DiskReplay, "get", spy)
        stats = compute_stats(buf, keep_tallies=True)
        assert reads and all(f is not None and "next_states" not in f for f in reads)  # never next states
        assert set(stats["tallies"]) == {"states", "actions", "dones"}
        ranges = {name: (s["min"], s["max"]) for name, s in stats["fields"].items()}
        reads.clear()
        hists = histograms(buf, ranges, tallies=stats["tallies"])
        assert reads and all(list(f) == ["rewards"] for f in reads)  # only the float field is read again
        unread = histograms(buf, ranges)
    for name in ranges:
        assert hists[name][0].tolist() == unread[name][0].tolist()
    states = everything["states"].astype(np.float64)
    assert stats["fields"]["states"]["mean"] == pytest.approx(states.mean(), rel=1e-12)
    assert stats["fields"]["states"]["std"] == pytest.approx(states.std(), rel=1e-9)
    assert stats["fields"]["actions"]["min"] == everything["actions"].min()
