"""``diskreplay plot`` for many envs: one series of returns with a rolling mean and a band
(not a line per env, which cross each other), integer fields in bins of whole values, and
frames binned from the tally of the statistics pass (no second read)."""
from __future__ import annotations

import numpy as np
import pytest

from diskreplay import DiskReplay
from diskreplay.cli.plot import load_pyplot, plot_store, rolling

matplotlib = pytest.importorskip("matplotlib")


def test_rolling_mean_and_band():
    mean, std = rolling(np.array([1.0, 3.0, 1.0, 3.0, 5.0]), 2)
    assert mean.tolist() == [2.0, 2.0, 2.0, 4.0] and std.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_plot_of_eight_envs_is_one_series_with_a_band(tmp_path, monkeypatch):
    fields = {"states": ((2, 2), "uint8"), "actions": ((), "int64"), "rewards": ((), "float32"),
              "dones": ((), "bool")}
    rng = np.random.default_rng(0)
    path = tmp_path / "eight.replay"
    with DiskReplay.create(path, 4000, num_envs=8, fields=fields) as buf:
        for step in range(500):
            buf.add(rng.integers(0, 256, (8, 2, 2)).astype(np.uint8), rng.integers(0, 3, 8),
                    np.full(8, 1.0, np.float32) * np.arange(8), rng.integers(0, 256, (8, 2, 2)).astype(np.uint8),
                    rng.random(8) < 0.1)
    plt = load_pyplot()
    figures = []
    monkeypatch.setattr(plt, "close", lambda *a: figures.append(plt.gcf()) if not a or a[0] != "all" else None)
    with DiskReplay.open(path, mode="r") as buf:
        result = plot_store(buf, str(tmp_path / "p.png"), plt)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    fig = figures[-1]
    returns_ax = fig.axes[0]
    labels = [line.get_label() for line in returns_ax.lines]
    assert len(returns_ax.lines) == 2 and labels[0] == "episode return" and "rolling mean" in labels[1]
    assert returns_ax.collections  # the band of one standard deviation
    assert len(returns_ax.lines[0].get_xdata()) == result["episodes"] > 100
    hist = {ax.get_title(): ax for ax in fig.axes[1:]}
    assert set(hist) == {"states", "actions", "rewards", "dones"}
    widths = {round(p.get_width(), 9) for p in hist["states"].patches}
    assert widths == {4.0}  # uint8 0..255: 64 bins of 4 whole values, never 5.1, none short
    assert {round(p.get_width(), 9) for p in hist["actions"].patches} == {1.0}
    assert sum(p.get_height() for p in hist["states"].patches) == 4000 * 4
