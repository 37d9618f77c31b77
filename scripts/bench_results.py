"""What scripts/bench.py reports of its runs: the summary of a system's processes (median,
min, max), the ratios to the baselines of the same run (``x_<baseline>``, ``x_best_peer``),
the goals of the issues checked against them, and the Markdown tables printed at the end
(scripts/bench_report.py renders the same JSON for docs/benchmarks.md).
"""
from __future__ import annotations

import statistics

from bench_peers import PEERS  # scripts/, this script's directory, is on sys.path

W5_BASELINES = ("cpprb-per", "slm-per", "diskreplay-uniform")
BASELINES = ("seed", "numpy", "np.memmap", "h5py-chunked")


def summarize(runs):
    return {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs)} for k in runs[0] if not isinstance(runs[0][k], str)}


def is_rate(key):
    return key.endswith("_per_s")


def add_ratios(results):
    for w, systems in results.items():
        for name, metrics in systems.items():
            for key, value in metrics.items():
                if not is_rate(key) and key != "cold_ms_per_batch":
                    continue
                for base in BASELINES + (W5_BASELINES if w == "W5" else ()) + (
                        ("diskreplay-whole",) if w in ("W6", "W6cold") else ()):
                    ref = systems.get(base, {}).get(key)
                    if ref and ref["median"] and base != name:
                        r = value["median"] / ref["median"]
                        value[f"x_{base}"] = 1 / r if key == "cold_ms_per_batch" else r
                if name.startswith("diskreplay"):
                    add_best_peer(systems, key, value)
    return results


def add_best_peer(systems, key, value):
    """``x_best_peer``: the ratio to the best of the other libraries on this line (and its name)."""
    lower_is_better = key == "cold_ms_per_batch"
    peers = [(p, systems[p][key]["median"]) for p in PEERS if key in systems.get(p, {})
             and systems[p][key]["median"]]
    if not peers:
        return
    best, ref = (min if lower_is_better else max)(peers, key=lambda pv: pv[1])
    r = value["median"] / ref
    value["x_best_peer"] = 1 / r if lower_is_better else r
    value["best_peer"] = best


GOALS = [  # (workload, metric, baseline, minimum ratio, what)
    ("W1", "add_per_s", "numpy", 0.4, "W1 add >= 0.4x numpy"),
    ("W1", "sample32_per_s", "numpy", 0.5, "W1 sample b=32 >= 0.5x numpy"),
    ("W1", "sample256_per_s", "numpy", 0.5, "W1 sample b=256 >= 0.5x numpy"),
    ("W2", "add_per_s", "numpy", 0.4, "W2 add >= 0.4x numpy"),
    ("W3", "add_per_s", "np.memmap", 1.0, "W3 add >= 1.0x np.memmap"),
    ("W3", "sample32_per_s", "np.memmap", 1.0, "W3 warm sample >= 1.0x np.memmap"),
    ("W5", "sample32_update_per_s", "cpprb-per", 1.0, "W5 sample(32)+update >= 1.0x cpprb PER"),
    ("W5", "add_per_s", "diskreplay-uniform", 0.5, "W5 prioritized add >= 0.5x uniform add"),
]


def goals(results):
    rows = []
    for backend in ("memmap", "hdf5"):
        name = f"diskreplay-{backend}"
        for w, key, base, want, what in GOALS:
            v = results.get(w, {}).get(name, {}).get(key, {})
            if f"x_{base}" in v:
                rows.append({"system": name, "goal": what, "value": v[f"x_{base}"], "met": v[f"x_{base}"] >= want})
        v = results.get("W4", {}).get(name, {}).get("sample32_per_s")
        if v:
            rows.append({"system": name, "goal": "W4 cold >= 550 batches/s of 32", "value": v["median"],
                         "met": v["median"] >= 550})
            if "x_fio_buffered" in v:
                rows.append({"system": name, "goal": "W4 cold >= 0.8x fio buffered (same reads)",
                             "value": v["x_fio_buffered"], "met": v["x_fio_buffered"] >= 0.8})
        v = results.get("W3", {}).get(name, {}).get("rss_anon_mb")
        if v:
            rows.append({"system": name, "goal": "W3 RssAnon < 100 MB", "value": v["max"], "met": v["max"] < 100})
        v = results.get("W1x", {}).get(name, {}).get("add_per_s", {})
        if "x_numpy" in v:
            rows.append({"system": name, "goal": "W1x add >= 0.3x numpy", "value": v["x_numpy"],
                         "met": v["x_numpy"] >= 0.3})
        for w in ("W3lat", "W3pace"):
            lat = results.get(w, {}).get(name, {})
            for key, limit, what in (("add_p99_us", 1000, f"{w} add p99 < 1 ms (us)"),
                                     ("add_max_us", 100_000, f"{w} add max < 100 ms (us)")):
                if key in lat:
                    rows.append({"system": name, "goal": what, "value": lat[key]["max"],
                                 "met": lat[key]["max"] < limit})
    rows += stacked_goals(results)
    for w, key, *_ in GOALS + [("W4", "sample32_per_s")]:
        a = results.get(w, {}).get("diskreplay-memmap", {}).get(key)
        b = results.get(w, {}).get("diskreplay-hdf5", {}).get(key)
        if a and b:
            r = b["median"] / a["median"]
            rows.append({"system": "diskreplay-hdf5", "goal": f"{w} {key} within 10% of memmap", "value": r,
                         "met": abs(r - 1) <= 0.1})
    return rows


W6_GOALS = [  # (W6 workload, metric, compared with, ratio, at most (else at least), what)
    ("W6", "disk_bytes_per_transition", "W3", 0.3, True, "W6 disk bytes/transition <= 0.3x W3"),
    ("W6", "add_per_s", "W3", 1.0, False, "W6 add >= 1.0x W3 add"),
    ("W6", "sample32_per_s", "W3", 0.8, False, "W6 warm sample >= 0.8x W3 warm sample"),
    ("W6cold", "sample32_per_s", "W4", 1.0, False, "W6cold batches/s >= 1.0x W4"),
]


def stacked_goals(results):
    """W6 against W3 and W4 of the same run, system by system (issue 17)."""
    rows = []
    for backend in ("memmap", "hdf5"):
        name = f"diskreplay-{backend}"
        for w, key, other, want, at_most, what in W6_GOALS:
            a = results.get(w, {}).get(name, {}).get(key)
            b = results.get(other, {}).get(name, {}).get(key)
            if a and b and b["median"]:
                r = a["median"] / b["median"]
                rows.append({"system": name, "goal": what, "value": r, "met": r <= want if at_most else r >= want})
    return rows


def stacked_table(results):
    """W6's disk use, rates and bytes read per cold batch next to W3's and W4's, and next to
    the same steps in a store of whole states (diskreplay-whole)."""
    lines = ["| system | metric | W6 / W6cold | W3 / W4 | ratio | whole states, same steps | ratio |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for backend in ("memmap", "hdf5"):
        name = f"diskreplay-{backend}"
        for w, other, key in (("W6", "W3", "disk_bytes_per_transition"), ("W6", "W3", "add_per_s"),
                              ("W6", "W3", "sample32_per_s"), ("W6cold", "W4", "sample32_per_s"),
                              ("W6cold", "W4", "cold_bytes_per_batch"),
                              ("W6cold", "W4", "cold_read_calls_per_batch")):
            a = results.get(w, {}).get(name, {}).get(key)
            if not a:
                continue
            cells = []
            for b in (results.get(other, {}).get(name, {}).get(key),
                      results.get(w, {}).get("diskreplay-whole", {}).get(key)):
                cells += [fmt(b["median"]) if b else "-",
                          f"{a['median'] / b['median']:.2f}" if b and b["median"] else "-"]
            lines.append(f"| {name} | {w} {key} | {fmt(a['median'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt(v):
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def best_peer_cell(v):
    return f"{v['x_best_peer']:.2f} ({v['best_peer']})" if "x_best_peer" in v else "-"


def table(results):
    lines = ["| workload | system | metric | median | spread (min-max) | x seed | x numpy | x np.memmap | x h5py "
             "| x best peer |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for w, systems in results.items():
        for name, metrics in systems.items():
            for key, v in metrics.items():
                ratios = [f"{v[f'x_{b}']:.2f}" if f"x_{b}" in v else "-" for b in BASELINES]
                lines.append(f"| {w} | {name} | {key} | {fmt(v['median'])} | {fmt(v['min'])}-{fmt(v['max'])} | "
                             + " | ".join(ratios) + f" | {best_peer_cell(v)} |")
    return "\n".join(lines)


def w5_table(results):
    """W5's ratios to its own baselines (cpprb PER, the SLM-Lab port, the uniform store)."""
    lines = ["| system | metric | median | spread (min-max) | x cpprb-per | x slm-per | x diskreplay-uniform |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, metrics in results.get("W5", {}).items():
        for key, v in metrics.items():
            ratios = [f"{v[f'x_{b}']:.2f}" if f"x_{b}" in v else "-" for b in W5_BASELINES]
            lines.append(f"| {name} | {key} | {fmt(v['median'])} | {fmt(v['min'])}-{fmt(v['max'])} | "
                         + " | ".join(ratios) + " |")
    return "\n".join(lines)


def goals_table(rows):
    lines = ["| system | goal | measured | met |", "|---|---|---:|---|"]
    for r in rows:
        lines.append(f"| {r['system']} | {r['goal']} | {fmt(r['value'])} | {'yes' if r['met'] else 'NO'} |")
    return "\n".join(lines)
