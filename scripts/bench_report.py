"""Render a scripts/bench.py JSON result as the Markdown of docs/benchmarks.md.

    .venv/bin/python scripts/bench_report.py bench.json > table.md
"""
from __future__ import annotations

import json
import sys

from bench import BASELINES, fmt, goals_table  # scripts/, this script's directory, is on sys.path

MAIN_METRICS = ("add_per_s", "sample32_per_s", "sample256_per_s")


def ratio_cell(v, base):
    return f"{v[f'x_{base}']:.2f}" if f"x_{base}" in v else "-"


def spread(v):
    if not v["median"]:
        return "-"
    return f"{fmt(v['min'])}-{fmt(v['max'])} ({100 * (v['max'] - v['min']) / v['median']:.0f}%)"


def render(data) -> str:
    m = data["machine"]
    disk = m.get("disk", {})
    out = ["## Machine", "",
           f"- {m['nproc']} CPUs ({m.get('cpu', '?')}), {m['mem_gib']} GiB RAM, kernel {m['kernel']}",
           f"- disk: {disk.get('device', '?')} (rotational={disk.get('rotational')}, "
           f"read_ahead_kb={disk.get('read_ahead_kb')}, scheduler {disk.get('scheduler')}), "
           f"filesystem {disk.get('fs', '?')}",
           f"- Python {m['python']}, numpy {m['numpy']}, h5py {m['h5py']}",
           f"- code: commit {data.get('code', {}).get('commit', '?')}"
           + (f" plus uncommitted changes to {', '.join(data['code']['uncommitted'])}"
              if data.get("code", {}).get("uncommitted") else ""),
           f"- command: `.venv/bin/python {data['command']}` ({data['repeats']} processes per system, "
           f"wall time {data.get('wall_s', 0):.0f} s)", ""]
    res = data["results"]
    out += ["## Rates (median of the processes; spread min-max; ratios of medians)", "",
            "| workload | system | metric | median | spread | x seed | x numpy | x np.memmap | x h5py |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for w, systems in res.items():
        for name, metrics in systems.items():
            for key in MAIN_METRICS:
                if key in metrics:
                    v = metrics[key]
                    unit = "transitions/s" if key.startswith("add") else "batches/s"
                    label = f"{key.replace('_per_s', '')} ({unit})"
                    if w == "W4":
                        label = "cold sample b=32 (batches/s)"
                    out.append(f"| {w} | {name} | {label} | {fmt(v['median'])} | {spread(v)} | "
                               + " | ".join(ratio_cell(v, b) for b in BASELINES) + " |")
    out += ["", "## W4 cold batches, memory, open time", "",
            "| system | ms/batch | batches/s | KB read/batch | resident pages before a batch (max) | "
            "loop ms/batch serial | with Prefetcher | speed-up | RssAnon MB (max) | open ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, v in res.get("W4", {}).items():
        def g(key, scale=1.0, digits=2):
            return f"{v[key]['median'] * scale:.{digits}f}" if key in v else "-"

        out.append(f"| {name} | {g('cold_ms_per_batch')} | {g('sample32_per_s', digits=0)} | "
                   f"{g('cold_bytes_per_batch', 1 / 1024, 0)} | {v['resident_pages_before_batch']['max']:.0f} | "
                   f"{g('loop_ms_serial')} | {g('loop_ms_prefetch')} | {g('loop_prefetch_speedup')} | "
                   f"{v['rss_anon_mb']['max']:.1f} | {g('open_s', 1000, 1)} |")
    out += ["", "| workload | system | RssAnon MB (max over processes) | open ms |", "|---|---|---:|---:|"]
    for w in ("W1", "W2", "W3"):
        for name, v in res.get(w, {}).items():
            open_ms = f"{1000 * v['open_s']['median']:.1f}" if "open_s" in v else "-"
            out.append(f"| {w} | {name} | {v['rss_anon_mb']['max']:.1f} | {open_ms} |")
    out += ["", "## Goals of issue 6 (and issue 4's HDF5 checks)", "", goals_table(data["goals"]), ""]
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(json.load(f)))
