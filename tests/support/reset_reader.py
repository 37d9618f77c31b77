"""A reader process scanning a store whose writer resets it (issue 35 item 6), run by
tests/features/test_reset_readers.py:

    python reset_reader.py STORE OUTDIR SECONDS

The writer's rows: ``actions`` is the transition number, ``rewards`` the generation (how
many resets came before). Until ``SECONDS`` pass (and at least until a few scans met a
reset), it scans in turn: raw chronological blocks of two rows (every row's action must be
the transition number its block gives it, and one generation per scan), ``episodes()``
(actions one ``num_envs`` apart, one generation per episode), an ``export`` to npz (one
generation, consecutive transitions per env), and ``diskreplay stats`` in process (exit 0, or
1 with the reset message: never 2). A scan either is right or stops with
``StoreResetError``. Prints one JSON line of counts.
"""
import json
import os
import sys
import time

import numpy as np
from click.testing import CliRunner

from diskreplay import DiskReplay, StoreResetError
from diskreplay.cli.main import main as cli
from diskreplay.export import export_store
from diskreplay.views import ChronoReader


def raw_scan(buf) -> None:
    reader = ChronoReader(buf, rows=2)
    gens = set()
    for block in reader:
        assert block.batch["actions"].tolist() == block.transitions.tolist(), (block.transitions, block.batch)
        gens.update(block.batch["rewards"].tolist())
    assert len(gens) <= 1, gens


def episodes_scan(buf) -> None:
    for ep in buf.episodes():
        actions, rewards = ep["actions"], ep["rewards"]
        assert (np.diff(actions) == buf.num_envs).all(), actions
        assert len(set(rewards.tolist())) <= 1, rewards


def export_scan(buf, out: str) -> None:
    export_store(buf, out)
    with np.load(out) as got:
        actions, rewards = got["actions"], got["rewards"]
    assert len(set(rewards.tolist())) <= 1, rewards
    assert (np.diff(actions) == 1).all(), actions  # env-major steps: transitions one apart, oldest first


def stats_scan(store: str) -> None:
    r = CliRunner().invoke(cli, ["stats", store, "--json"])
    text = r.output + (getattr(r, "stderr", "") or "")
    if r.exit_code == 1 and "was reset while it was being read" in text:
        raise StoreResetError("stats")
    assert r.exit_code == 0, (r.exit_code, r.output, r.stderr)


def main() -> None:
    store, outdir, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    counts = {name: {"ok": 0, "reset": 0} for name in ("raw", "episodes", "export", "stats")}
    stop = time.monotonic() + seconds
    out = os.path.join(outdir, f"export-{os.getpid()}.npz")
    with DiskReplay.open(store, mode="r") as buf:
        while time.monotonic() < stop or counts["raw"]["reset"] < 3:
            for name, scan in (("raw", lambda: raw_scan(buf)), ("episodes", lambda: episodes_scan(buf)),
                               ("export", lambda: export_scan(buf, out)), ("stats", lambda: stats_scan(store))):
                try:
                    scan()
                    counts[name]["ok"] += 1
                except StoreResetError:
                    counts[name]["reset"] += 1
            if time.monotonic() > stop + 120:
                break  # the writer is too slow to reset under a scan: reported, the test fails
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
