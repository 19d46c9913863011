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
        "bench_main_memory.py",
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


@pytest.mark.slow
def test_run_suite_under_load_reports_the_failures_and_ends_its_hogs(tmp_path):
    """The suite-under-load runner on two tiny tests, one failing: it names that one, returns
    pytest's exit code, and none of its hogs outlives it."""
    import psutil

    t = tmp_path / "test_tiny_under_load.py"
    t.write_text("def test_ok():\n    assert True\n\n\ndef test_bad():\n    assert 1 == 2, 'on purpose'\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_suite_under_load.py"), "--hogs", "1", "--", str(t)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 test(s) failed under load" in r.stdout
    assert "test_tiny_under_load::test_bad" in r.stdout and "on purpose" in r.stdout
    pids = [int(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("hog pid ")]
    assert len(pids) == 1
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
