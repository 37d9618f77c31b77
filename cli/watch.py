"""``diskreplay watch``: a refreshing view of a store a trainer is filling.

Each refresh reads the counters (one snapshot), whether a writer holds the store, and the
rewards and episode ends of the rows added since the previous refresh
(:class:`diskreplay.stats.RecentReturns`), never the states; the store is opened read-only,
so watching never writes or blocks the trainer. Ctrl-C ends it quietly (exit 0).
"""
from __future__ import annotations

import sys
import time

import click

from diskreplay import DiskReplay
from diskreplay.stats import RecentReturns
from diskreplay.views import snapshot, store_info

from .output import echo_json, fmt_numbers, kv_lines, terminal_width

RECENT_SHOWN = 10  # the newest returns listed one by one


def poll(buf: DiskReplay, recent: RecentReturns, previous: dict | None) -> dict:
    """One refresh: counters, add rate since ``previous`` (None at the first), writer, returns."""
    now = time.monotonic()
    info = store_info(buf)
    snap = snapshot(buf)
    recent.poll()
    rate = None
    if previous is not None and now > previous["time"]:
        rate = (snap.seen - previous["seen_size"]) / (now - previous["time"])
    return {"time": now, "seen_size": snap.seen, "size": snap.size, "head": snap.head, "max_size": buf.max_size,
            "num_envs": buf.num_envs, "writer_alive": info["writer_alive"], "last_flush": info["last_flush"],
            "adds_per_s": rate, "returns": recent.summary(),
            "recent_returns": [r for _, _, r in recent.returns[-RECENT_SHOWN:]]}


def render(path: str, state: dict, interval: float) -> list[str]:
    """The view of one refresh, as lines."""
    r = state["returns"]
    rate = "-" if state["adds_per_s"] is None else f"{state['adds_per_s']:.1f} transitions/s"
    full = " (full)" if state["size"] == state["max_size"] else ""
    if r["count"]:
        mean, lo, hi = fmt_numbers([r["mean"], r["min"], r["max"]])
        shown = f"last {r['count']}: mean {mean}, min {lo}, max {hi}"
        if r["finite"] < r["count"]:
            shown += f" ({r['count'] - r['finite']} NaN or infinite left out)"
    else:
        shown = "no episode ended in the rows read"
    pairs = [("writer", "live" if state["writer_alive"] else "none"),
             ("last_flush", state["last_flush"] or "never"),
             ("seen_size", state["seen_size"]),
             ("size", f"{state['size']} of {state['max_size']}{full}"),
             ("head", state["head"]),
             ("add rate", rate),
             ("episodes", f"{r['ended']} ended in the {r['rows_read']} rows read"),
             ("returns", shown)]
    if state["recent_returns"]:
        pairs.append(("newest", " ".join(fmt_numbers(state["recent_returns"]))))
    tail = f"  every {interval:g} s, Ctrl-C quits  {time.strftime('%H:%M:%S')}"
    room = terminal_width() - len(tail)
    # A long path loses its start, not the store's name at its end.
    shown = path if len(path) <= room else "…" + path[len(path) - max(room - 1, 12):]
    return [shown + tail] + kv_lines(pairs)


def watch_store(path: str, interval: float, count: int | None, as_json: bool, keep: int) -> None:
    """Refresh ``count`` times (forever when None), ``interval`` seconds apart; Ctrl-C,
    whenever it comes (opening the store too), ends it quietly."""
    try:
        with DiskReplay.open(path, mode="r") as buf:
            _refresh(buf, path, interval, count, as_json, keep)
    except KeyboardInterrupt:
        if not as_json:
            click.echo("")


def _refresh(buf: DiskReplay, path: str, interval: float, count: int | None, as_json: bool, keep: int) -> None:
    clear = not as_json and sys.stdout.isatty()
    recent = RecentReturns(buf, keep=keep)
    state, done = None, 0
    while count is None or done < count:
        if done:
            time.sleep(interval)
        state = poll(buf, recent, state)
        done += 1
        if as_json:
            echo_json({k: v for k, v in state.items() if k != "time"})
            continue
        if clear:
            click.clear()
        elif done > 1:
            click.echo("")
        for line in render(path, state, interval):
            click.echo(line)
