"""Render a scripts/bench.py JSON result as the Markdown of docs/benchmarks.md.

    .venv/bin/python scripts/bench_report.py bench.json > table.md
"""
from __future__ import annotations

import json
import sys

from bench_results import BASELINES, best_peer_cell, fmt, goals_table  # scripts/, this script's directory, is on sys.path

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
           f"- Python {m['python']}, numpy {m['numpy']}, h5py {m['h5py']}"
           + "".join(f", {k} {v}" for k, v in m.get("peers", {}).items()),
           "- torch runs with one thread (`torch.set_num_threads(1)`) in every peer that uses it",
           f"- code: commit {data.get('code', {}).get('commit', '?')}"
           + (f" plus uncommitted changes to {', '.join(data['code']['uncommitted'])}"
              if data.get("code", {}).get("uncommitted") else ""),
           f"- command: `.venv/bin/python {data['command']}` ({data['repeats']} processes per system, "
           f"wall time {data.get('wall_s', 0):.0f} s)", ""]
    res = data["results"]
    if data.get("peer_notes") or data.get("skipped"):
        out += ["## Other libraries (how each is used)", ""]
        out += [f"- `{name}`: {note}" for name, note in data.get("peer_notes", {}).items()]
        out += [f"- `{name}`: skipped, {why}" for name, why in data.get("skipped", {}).items()]
        out += [""]
    out += ["## Rates (median of the processes; spread min-max; ratios of medians)", "",
            "`x best peer`: a diskreplay figure divided by the best other library's on the same line.", "",
            "| workload | system | metric | median | spread | x seed | x numpy | x np.memmap | x h5py | x best peer |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for w, systems in res.items():
        if w in ("W3lat", "W3pace"):
            continue
        for name, metrics in systems.items():
            for key in MAIN_METRICS:
                if key in metrics:
                    v = metrics[key]
                    unit = "transitions/s" if key.startswith("add") else "batches/s"
                    label = f"{key.replace('_per_s', '')} ({unit})"
                    if w == "W4":
                        label = "cold sample b=32 (batches/s)"
                    out.append(f"| {w} | {name} | {label} | {fmt(v['median'])} | {spread(v)} | "
                               + " | ".join(ratio_cell(v, b) for b in BASELINES) + f" | {best_peer_cell(v)} |")
    out += ["", "## W4 cold batches, memory, open time", "",
            "| system | ms/batch | batches/s | KB read/batch | resident pages before a batch (max) | "
            "loop ms/batch serial | with Prefetcher | speed-up | with batches() | learner wait % | "
            "KB read/batch in that loop | RssAnon MB (max) | open ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, v in res.get("W4", {}).items():
        def g(key, scale=1.0, digits=2):
            return f"{v[key]['median'] * scale:.{digits}f}" if key in v else "-"

        def worst(key, digits):  # systems measured only in part (fio: its rate alone) have no such key
            return f"{v[key]['max']:.{digits}f}" if key in v else "-"

        out.append(f"| {name} | {g('cold_ms_per_batch')} | {g('sample32_per_s', digits=0)} | "
                   f"{g('cold_bytes_per_batch', 1 / 1024, 0)} | {worst('resident_pages_before_batch', 0)} | "
                   f"{g('loop_ms_serial')} | {g('loop_ms_prefetch')} | {g('loop_prefetch_speedup')} | "
                   f"{g('loop_ms_batches')} | {g('learner_wait_pct', digits=1)} | "
                   f"{g('loop_bytes_per_batch', 1 / 1024, 0)} | {worst('rss_anon_mb', 1)} | {g('open_s', 1000, 1)} |")
    for lat_w in ("W3lat", "W3pace"):
        if lat_w not in res:
            continue
        out += ["", f"## {lat_w}: add latency over several wraps (us; median of the processes, worst in brackets)", "",
                "| system | wraps | p50 | p99 | p99.9 | max | adds over 1 ms | transitions/s |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, v in res[lat_w].items():
            cells = [f"{fmt(v[k]['median'])} ({fmt(v[k]['max'])})"
                     for k in ("add_p50_us", "add_p99_us", "add_p999_us", "add_max_us")]
            out.append(f"| {name} | {v['wraps']['median']:.0f} | " + " | ".join(cells)
                       + f" | {v['adds_over_1ms']['median']:.0f} | {fmt(v['add_per_s']['median'])} |")
    out += ["", "| workload | system | RssAnon MB (max over processes) | open ms |", "|---|---|---:|---:|"]
    for w in ("W1", "W2", "W3", "W1x"):
        for name, v in res.get(w, {}).items():
            open_ms = f"{1000 * v['open_s']['median']:.1f}" if "open_s" in v else "-"
            out.append(f"| {w} | {name} | {v['rss_anon_mb']['max']:.1f} | {open_ms} |")
    out += ["", "## Goals of issues 6 and 19 (and issue 4's HDF5 checks)", "", goals_table(data["goals"]), ""]
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(json.load(f)))
