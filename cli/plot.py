"""``diskreplay plot``: episode returns over time and per-field histograms, as a PNG.

The numbers come from :mod:`diskreplay.stats`; this module only draws them with matplotlib.
"""
from __future__ import annotations

import numpy as np

from diskreplay import DiskReplay
from diskreplay.stats import compute_stats, histograms

INSTALL_HINT = ("plot needs matplotlib, which is not installed; install it with "
                "pip install 'diskreplay[plot]'")


def load_pyplot():
    """matplotlib.pyplot on the Agg backend, or ImportError with how to install it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_store(buf: DiskReplay, out: str, plt) -> dict:
    """Draw the episode returns and a histogram of every field of ``buf`` into the PNG ``out``."""
    stats = compute_stats(buf, keep_returns=True)
    returns = stats["episodes"]["returns"]
    hists = histograms(buf, {name: (s["min"], s["max"]) for name, s in stats["fields"].items()})
    names = list(hists)
    ncols = 2
    nrows = 1 + (len(names) + ncols - 1) // ncols
    fig = plt.figure(figsize=(10, 3.2 * nrows))
    ax = fig.add_subplot(nrows, 1, 1)
    if returns:
        ends = np.array([t for t, _, _ in returns])
        envs = np.array([e for _, e, _ in returns])
        rets = np.array([r for _, _, r in returns])
        for env in np.unique(envs):
            sel = envs == env
            ax.plot(ends[sel], rets[sel], marker=".", linewidth=1, label=f"env {env}")
        if buf.num_envs > 1 and buf.num_envs <= 10:
            ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no complete episodes in the store", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("transition number at episode end")
    ax.set_ylabel("episode return")
    ax.set_title(f"{buf.path}: {len(returns)} complete episodes")
    for i, name in enumerate(names):
        counts, edges = hists[name]
        hax = fig.add_subplot(nrows, ncols, ncols + 1 + i)
        hax.bar(edges[:-1], counts, width=np.diff(edges), align="edge")
        hax.set_title(name)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)
    return {"episodes": len(returns), "histograms": names}
