"""``diskreplay plot``: episode returns over time and per-field histograms, as an image.

The numbers come from :mod:`diskreplay.stats`; this module only draws them with matplotlib.
"""
from __future__ import annotations

import math
import os

import click
import numpy as np

from diskreplay import DiskReplay
from diskreplay.export import atomic_replace
from diskreplay.stats import compute_stats, histograms

INSTALL_HINT = ("plot needs matplotlib, which is not installed; install it with "
                "pip install 'diskreplay[plot]'")
ROLLING_POINTS = 50  # the rolling mean spans about 1/50 of the episodes shown


def load_pyplot():
    """matplotlib.pyplot on the Agg backend, or ImportError with how to install it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_format(out: str, plt) -> str:
    """The image format OUT's suffix names, refused (exit 2) when matplotlib cannot write it."""
    supported = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    suffix = os.path.splitext(out)[1].lower().lstrip(".")
    if suffix not in supported:
        raise click.BadParameter(f"cannot tell the image format from {out!r}; end it in one of "
                                 f"{', '.join('.' + k for k in sorted(supported))} (e.g. .png)", param_hint="OUT")
    return suffix


def rolling(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of each window of ``window`` consecutive values."""
    kernel = np.ones(window) / window
    mean = np.convolve(values, kernel, mode="valid")
    sq = np.convolve(values * values, kernel, mode="valid")
    return mean, np.sqrt(np.maximum(sq - mean * mean, 0.0))


def plot_store(buf: DiskReplay, out: str, plt, *, fmt: str = "png", start: int | None = None,
               stop: int | None = None) -> dict:
    """Draw the episode returns and a histogram of every field of the positions
    ``[start, stop)`` of ``buf`` into ``out`` (an image of format ``fmt``).

    Returns ``{"episodes", "histograms", "skipped_overwritten"}``."""
    stats = compute_stats(buf, keep_returns=True, keep_tallies=True, start=start, stop=stop)
    returns = [r for r in stats["episodes"]["returns"] if math.isfinite(r[2])]
    hists = histograms(buf, {name: (s["min"], s["max"]) for name, s in stats["fields"].items()},
                       start=stats["start"], stop=stats["stop"], tallies=stats["tallies"])
    names = list(hists)
    ncols = 2
    nrows = 1 + (len(names) + ncols - 1) // ncols
    fig = plt.figure(figsize=(10, 3.2 * nrows))
    ax = fig.add_subplot(nrows, 1, 1)
    if returns:
        ends = np.array([t for t, _, _ in returns], np.float64)
        rets = np.array([r for _, _, r in returns], np.float64)
        # Every env's episodes in one series, ordered by when they ended: with many envs,
        # per-env lines would cross each other; a rolling mean with a band does not.
        ax.plot(ends, rets, ".", markersize=3, alpha=0.35, color="tab:blue", label="episode return")
        window = max(1, len(rets) // ROLLING_POINTS)
        if window > 1:
            mean, std = rolling(rets, window)
            x = ends[window - 1:]
            ax.plot(x, mean, color="tab:red", linewidth=1.5, label=f"rolling mean of {window} (all envs)")
            ax.fill_between(x, mean - std, mean + std, color="tab:red", alpha=0.2, label="±1 std")
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no complete episodes with a finite return", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("transition number at episode end")
    ax.set_ylabel("episode return")
    ax.set_title(f"{os.path.basename(os.path.abspath(buf.path))}: {len(returns)} complete episodes, "
                 f"{buf.num_envs} envs")
    for i, name in enumerate(names):
        counts, edges = hists[name]
        hax = fig.add_subplot(nrows, ncols, ncols + 1 + i)
        hax.bar(edges[:-1], counts, width=np.diff(edges), align="edge")
        hax.set_title(name)
    fig.tight_layout()
    try:
        with atomic_replace(out) as tmp:  # a new file renamed into place: never a partial or followed OUT
            fig.savefig(tmp, format=fmt)
    finally:
        plt.close(fig)
    return {"episodes": len(returns), "histograms": names, "skipped_overwritten": stats["skipped_overwritten"]}
