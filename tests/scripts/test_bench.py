"""The benchmark keeps running (one --quick run: structure, never time), and the seed port
it compares against keeps the seed's semantics."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paths

ROOT = paths.ROOT

# the other libraries, each measured when installed (the [bench] and [test] extras install them)
PEER_MODULES = {"sb3": ("stable_baselines3", "gymnasium", "torch"),
                "sb3-optimized": ("stable_baselines3", "gymnasium", "torch"), "cpprb": ("cpprb",),
                "torchrl-tensor": ("torchrl", "tensordict", "torch"),
                "torchrl-memmap": ("torchrl", "tensordict", "torch")}
INSTALLED = {p for p, mods in PEER_MODULES.items() if all(importlib.util.find_spec(m) for m in mods)}
W4_SYSTEMS = {"diskreplay-memmap", "diskreplay-hdf5", "np.memmap", "np.memmap+random", "h5py-chunked"} | (
    INSTALLED & {"torchrl-memmap"})
SYSTEMS = {
    "W1": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"} | INSTALLED,
    "W2": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap"} | INSTALLED,
    "W3": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"} | INSTALLED,
    "W4": W4_SYSTEMS | ({"fio"} if shutil.which("fio") else set()),  # fio: the disk's limit (bench_fio.py)
    "W1x": {"diskreplay-memmap", "diskreplay-hdf5", "numpy"},
    "W3lat": {"diskreplay-memmap", "diskreplay-hdf5", "numpy", "np.memmap"},
    "W3pace": {"diskreplay-memmap", "diskreplay-hdf5", "numpy", "np.memmap"},
    "W5": {"diskreplay-memmap", "diskreplay-hdf5", "diskreplay-uniform", "slm-per"}
    | ({"cpprb-per"} if "cpprb" in INSTALLED else set()),
    "W6": {"diskreplay-memmap", "diskreplay-hdf5", "diskreplay-whole"},
    "W6cold": {"diskreplay-memmap", "diskreplay-hdf5", "diskreplay-whole"},
}


def test_quick_benchmark_reports_every_workload_and_system(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    results = data["results"]
    assert set(results) == set(SYSTEMS)
    for workload, systems in SYSTEMS.items():
        assert set(results[workload]) == systems, workload
    assert set(data["skipped"]) == (set(PEER_MODULES) - INSTALLED) | (
        {"cpprb-per"} if "cpprb" not in INSTALLED else set()) | (set() if shutil.which("fio") else {"fio"})
    for peer, why in data["skipped"].items():
        assert "not installed" in why and f"skipped {peer}: not installed" in proc.stdout
    assert set(data["peer_notes"]) == INSTALLED
    for workload, systems in results.items():
        for name, metrics in systems.items():
            rates = [k for k in metrics if k.endswith("_per_s")]
            assert rates, (workload, name)
            for key in rates:
                assert metrics[key]["median"] > 0, (workload, name, key)
                assert metrics[key]["min"] <= metrics[key]["median"] <= metrics[key]["max"]
            assert name == "fio" or metrics["rss_anon_mb"]["median"] > 0, (workload, name)  # fio: a process of its own
    for name in ("diskreplay-memmap", "diskreplay-hdf5"):
        w1 = results["W1"][name]
        assert {"add_per_s", "sample32_per_s", "sample256_per_s"} <= set(w1)
        assert {"x_numpy", "x_seed", "x_np.memmap"} <= set(w1["add_per_s"])
        assert results["W2"][name]["add_per_s"]["median"] > 0
        w3 = results["W3"][name]
        assert {"add_per_s", "sample32_per_s", "open_s"} <= set(w3)
        assert "x_np.memmap" in w3["sample32_per_s"] and "x_h5py-chunked" in w3["sample32_per_s"]
    for name in SYSTEMS["W6"]:  # frame stacks (issue 17): disk use, and an honest cold measurement
        assert results["W6"][name]["disk_bytes_per_transition"]["median"] > 0
        assert results["W6cold"][name]["resident_pages_before_batch"]["max"] == 0, name
        assert results["W6cold"][name]["cold_bytes_per_batch"]["median"] > 0, name
    assert "x_diskreplay-whole" in results["W6"]["diskreplay-memmap"]["add_per_s"]
    assert any(row["goal"].startswith("W6 disk bytes") for row in data["goals"])
    for name in W4_SYSTEMS:
        w4 = results["W4"][name]
        assert w4["resident_pages_before_batch"]["max"] == 0, name  # the cold measurement is honest
        # diskreplay keeps its small fields in RAM (not counted above)
        assert (w4.get("pinned_pages", {}).get("max", 0) > 0) == name.startswith("diskreplay"), name
        assert w4["cold_bytes_per_batch"]["median"] > 0, name  # cold batches really read the disk
        assert w4["cold_ms_per_batch"]["median"] > 0 and w4["open_s"]["median"] > 0
        if name.startswith("diskreplay"):
            assert w4["loop_ms_serial"]["median"] > 0 and w4["loop_ms_prefetch"]["median"] > 0
            assert "x_np.memmap" in w4["sample32_per_s"]
            assert ("x_fio_buffered" in w4["sample32_per_s"]) == bool(shutil.which("fio"))
    for name in ("diskreplay-memmap", "diskreplay-hdf5"):
        for workload, key in (("W1", "sample32_per_s"), ("W2", "add_per_s"), ("W3", "add_per_s"),
                              ("W4", "sample32_per_s")):
            v = results[workload][name][key]
            peers = INSTALLED & set(results[workload])
            if not peers:
                assert "x_best_peer" not in v
                continue
            best = max(peers, key=lambda p: results[workload][p][key]["median"])
            assert v["best_peer"] == best, (workload, key)
            assert abs(v["x_best_peer"] - v["median"] / results[workload][best][key]["median"]) < 1e-9
        assert "x_numpy" in results["W1x"][name]["add_per_s"]
        for lat_w in ("W3lat", "W3pace"):
            lat = results[lat_w][name]
            assert lat["wraps"]["median"] >= 3
            assert 0 < lat["add_p50_us"]["median"] <= lat["add_p99_us"]["median"] <= lat["add_p999_us"]["median"] \
                <= lat["add_max_us"]["median"]
        w5 = results["W5"][name]
        assert "x_diskreplay-uniform" in w5["add_per_s"] and "x_slm-per" in w5["sample32_update_per_s"]
        assert ("x_cpprb-per" in w5["sample32_update_per_s"]) == ("cpprb" in INSTALLED)
    assert data["goals"] and {"nproc", "kernel", "numpy", "h5py", "mem_gib"} <= set(data["machine"])
    assert "| W1 | diskreplay-memmap | add_per_s |" in proc.stdout and "x numpy" in proc.stdout


def test_seed_port_keeps_the_seed_semantics():
    spec = importlib.util.spec_from_file_location("seed_replay", os.path.join(ROOT, "scripts", "seed_replay.py"))
    seed_replay = importlib.util.module_from_spec(spec)  # a script, not a package: loaded from its file
    spec.loader.exec_module(seed_replay)
    mem = seed_replay.SeedReplay(max_size=10, batch_size=4, num_envs=2)
    for t in range(7):
        s = np.full((2, 3), t, np.float32)
        mem.update(s, np.array([t, t]), np.array([0.5, 0.5]), s + 1, np.array([False, False]))
    assert mem.size == 10 and mem.seen_size == 14 and mem.head == 3
    assert mem.states[3].dtype == np.float16
    np.random.seed(0)
    batch = mem.sample()
    assert set(batch) == {"states", "actions", "rewards", "next_states", "dones"}
    assert batch["states"].shape == (4, 3) and batch["next_states"].dtype == np.float16


def test_quick_scaling_reports_every_size(tmp_path):
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--scaling", "--quick",
                           "--json", str(out), "--plot", str(png), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["skipped"] == {}
    assert {shape: sorted(int(s) for s in sizes) for shape, sizes in data["scaling"].items()} == \
        {"W1": [1000, 10000], "W3": [1000, 2000]}
    for shape, sizes in data["scaling"].items():
        for size, r in sizes.items():
            assert r["slots"] == int(size)
            for key in ("open_warm_ms", "open_cold_ms", "add_per_s", "sample32_warm_per_s", "sample32_cold_per_s",
                        "verify_bytes_per_s", "disk_read_bytes_per_s", "rss_anon_mb"):
                assert r[key] > 0, (shape, size, key)
            assert r["store_bytes"] >= int(size) * (4 * 4 if shape == "W1" else 4 * 84 * 84)
    assert png.stat().st_size > 0
    assert "| W1 | 1,000 |" in proc.stdout and "W3 1,000 -> 2,000 slots" in proc.stdout
    assert not os.listdir(tmp_path / "work")  # stores removed


def test_cli_stream_benchmark_runs_every_command(tmp_path):
    """``--cli-stream`` at a tiny size: every command ran cold and was measured (never timed here)."""
    out = tmp_path / "stream.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--cli-stream", "--quick",
                           "--slots", "400", "--repeats", "2", "--json", str(out), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())["cli_stream"]
    assert data["slots"] == 400 and data["store_bytes"] == 400 * (4 * 84 * 84 + 8 + 4 + 1)  # the rows, no side file
    lo, hi = data["seq_read_range_mb_s"]
    assert data["repeats"] == 2 and 0 < lo <= data["seq_read_mb_s"] <= hi
    assert set(data["commands"]) == {"stats", "plot", "export-npz", "export-h5", "export-d4rl"}
    for name, r in data["commands"].items():
        lo, hi = r["seconds_range"]
        assert 0 < lo <= r["seconds"] <= hi and r["mb_s"] > 0 and r["x_seq_read"] > 0, name
        assert 0 < r["rss_anon_mb"] < 1000, name
        assert (r["out_bytes"] > 0 and r["x_seq_write"] > 0) if name.startswith("export") else "out_bytes" not in r
    lo, hi = data["seq_write_range_mb_s"]  # measured before every export run
    assert 0 < lo <= data["seq_write_mb_s"] <= hi
    assert "| stats |" in proc.stdout
    assert not os.listdir(tmp_path / "work")  # the store and the outputs are gone


def test_cli_stream_benchmark_runs_another_install_beside(tmp_path):
    """``--against EXE --commands``: the named commands only, each also run by EXE (here the
    same install) in the same runs, reported beside."""
    out = tmp_path / "stream.json"
    exe = os.path.join(os.path.dirname(sys.executable), "diskreplay")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--cli-stream", "--quick",
                           "--slots", "200", "--commands", "stats", "--against", exe, "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())["cli_stream"]
    assert list(data["commands"]) == ["stats"] and data["against"] == exe
    assert data["commands"]["stats"]["against"]["seconds"] > 0 and "| stats (against) |" in proc.stdout
