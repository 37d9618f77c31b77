"""The benchmark keeps running: one --quick run, asserting structure, never time."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_benchmark_reports_every_workload_and_system(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    results = data["results"]
    assert set(results) == {"W1", "W2", "W3", "W4"}
    assert {"diskreplay-memmap", "diskreplay-hdf5", "numpy", "seed"} <= set(results["W1"])
    for workload, systems in results.items():
        for name, metrics in systems.items():
            for key, value in metrics.items():
                if key.endswith("_per_s"):
                    assert value["median"] > 0, (workload, name, key)
    w1 = results["W1"]["diskreplay-memmap"]
    assert {"add_per_s", "sample32_per_s", "sample256_per_s", "rss_anon_mb"} <= set(w1)
    assert "x_numpy" in w1["add_per_s"] and "x_seed" in w1["sample32_per_s"]
    w4 = results["W4"]["diskreplay-memmap"]
    assert w4["resident_pages_before_batch"]["max"] == 0  # the cold measurement is honest
    assert w4["cold_bytes_per_batch"]["median"] >= 0
    assert "W1" in proc.stdout and "x numpy" in proc.stdout
