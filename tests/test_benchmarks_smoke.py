"""The benchmark scripts still run (tiny sizes, no daisy): benchmarks must not rot."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    [
        "bench_graph.py",
        "bench_scheduler.py",
        "bench_runtime.py",
        "bench_tracking.py",
        "bench_tracking_io.py",
        "bench_tracking_grow.py",
        "bench_cluster.py",
        "bench_small.py",
        "bench_ctrl_c.py",
        "bench_dry_run.py",
        "bench_timeline.py",
        "bench_dask_lost_worker.py",
        "bench_server_cpu.py",
        "bench_connections.py",
        "bench_frame_mac.py",
    ],
)
def test_benchmark_quick(script):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| " in r.stdout  # printed its markdown table
