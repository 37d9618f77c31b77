"""The benchmark keeps running (one --quick run: structure, never time), and the seed port
it compares against keeps the seed's semantics."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

W4_SYSTEMS = {"diskreplay-memmap", "diskreplay-hdf5", "np.memmap", "np.memmap+random", "h5py-chunked"}
SYSTEMS = {
    "W1": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"},
    "W2": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap"},
    "W3": {"diskreplay-memmap", "diskreplay-hdf5", "seed", "numpy", "np.memmap", "h5py-chunked"},
    "W4": W4_SYSTEMS,
}


def test_quick_benchmark_reports_every_workload_and_system(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    results = data["results"]
    assert set(results) == set(SYSTEMS)
    for workload, systems in SYSTEMS.items():
        assert set(results[workload]) == systems, workload
    for workload, systems in results.items():
        for name, metrics in systems.items():
            rates = [k for k in metrics if k.endswith("_per_s")]
            assert rates, (workload, name)
            for key in rates:
                assert metrics[key]["median"] > 0, (workload, name, key)
                assert metrics[key]["min"] <= metrics[key]["median"] <= metrics[key]["max"]
            assert metrics["rss_anon_mb"]["median"] > 0, (workload, name)
    for name in ("diskreplay-memmap", "diskreplay-hdf5"):
        w1 = results["W1"][name]
        assert {"add_per_s", "sample32_per_s", "sample256_per_s"} <= set(w1)
        assert {"x_numpy", "x_seed", "x_np.memmap"} <= set(w1["add_per_s"])
        assert results["W2"][name]["add_per_s"]["median"] > 0
        w3 = results["W3"][name]
        assert {"add_per_s", "sample32_per_s", "open_s"} <= set(w3)
        assert "x_np.memmap" in w3["sample32_per_s"] and "x_h5py-chunked" in w3["sample32_per_s"]
    for name in W4_SYSTEMS:
        w4 = results["W4"][name]
        assert w4["resident_pages_before_batch"]["max"] == 0, name  # the cold measurement is honest
        assert w4["cold_bytes_per_batch"]["median"] > 0, name  # cold batches really read the disk
        assert w4["cold_ms_per_batch"]["median"] > 0 and w4["open_s"]["median"] > 0
        if name.startswith("diskreplay"):
            assert w4["loop_ms_serial"]["median"] > 0 and w4["loop_ms_prefetch"]["median"] > 0
            assert "x_np.memmap" in w4["sample32_per_s"]
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
