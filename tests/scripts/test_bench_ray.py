"""scripts/bench_ray.py keeps running: one --quick run checks its structure, never its times."""
import json
import os
import subprocess
import sys
import paths

ROOT = paths.ROOT


def test_quick_ray_benchmark_reports_every_system_and_figure(tmp_path):
    out = tmp_path / "ray.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_ray.py"), "--quick", "--shards", "2",
                           "--json", str(out), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"in-process", "ray-2"}
    for name, metrics in results.items():
        assert set(metrics) == {"add_transitions_per_s", "sample_b32_batches_per_s", "sample_b256_batches_per_s",
                                "prefetch_b256_batches_per_s"}, name
        for key, m in metrics.items():
            assert 0 < m["min"] <= m["median"] <= m["max"], (name, key)
    link = json.loads(out.read_text())["link"]
    assert set(link) == {"roundtrip_calls_per_s", "transfer_mb_per_s"} and all(m["median"] > 0 for m in link.values())
    assert "ratio to in-process" in proc.stdout and "x1.000" in proc.stdout
