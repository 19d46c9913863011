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
        "bench_heavy_tail.py",
    ],
)
def test_benchmark_quick(script, tmp_path):
    """It runs, prints its table, and leaves nothing in the temporary directory or the checkout
    (its children's worker logs, daisy's among them, stamp files, scratch space)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    logs_before = (ROOT / "daisy_logs").exists()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp))
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
    assert sorted(p.name for p in tmp.iterdir()) == []
    assert logs_before or not (ROOT / "daisy_logs").exists()  # nor in the checkout, its working directory


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


def test_heavy_tail_splits_the_makespan_into_work_waste_and_idle_slots():
    """``bench_heavy_tail.where_time_goes`` on a made-up log of two worker slots over 10 s: the
    attempts that count, the ones that do not (an interrupted copy, a second success), and the
    idle slots at the start, between and at the tail add up to the makespan."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_heavy_tail
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    attempts = [
        ("a", 1, "S", 101.0, 105.0),  # slot A: blocks 1 and 2 back to back
        ("a", 2, "S", 105.0, 109.0),
        ("a", 3, "S", 102.0, 106.0),  # slot B: block 3, then a copy of 2, interrupted
        ("a", 2, "D", 106.0, 107.0),
        ("a", 3, "S", 107.0, 108.0),  # block 3 once more: its second success is waste
        ("a", 4, "F", 108.0, 108.5),  # a failed attempt counts (a retry of it follows)
    ]
    got = bench_heavy_tail.where_time_goes(attempts, t0=100.0, wall=10.0, workers=2)
    assert got == pytest.approx({"work": 6.25, "waste": 1.0, "before": 1.5, "between": 0.0, "after": 1.25})
    assert sum(got.values()) == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("wave", "chain", "want"),
    [
        ([0.2, 0.6, 0.4, 1.0], 0.5, 2.55),  # the work dominates: mean start 0.55 + 8 s over 4 jobs
        ([0.2, 0.2, 0.2, 0.2], 0.5, 2.2),  # every job up at once: the plain bound plus the start
        ([0.2, 0.6, 0.4, 1.0], 3.0, 3.2),  # one long chain: it waits for one job's start only
        ([0.2, 0.2, 0.2, 9.0], 0.5, 8.6 / 3),  # a job up too late to help: the other three do the work
    ],
)
def test_the_cluster_wave_bound_is_what_jobs_that_start_one_after_another_can_reach(wave, chain, want):
    """``bench_tail.wave_bound``: the earliest end of 8 s of finely divisible work on 4 jobs that come up
    at the wave's times, found by bisection on ``sum(max(0, T - s_k)) >= work``, or the chain after a
    job's start."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_tail
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    work, start = 8.0, 0.2
    lo, hi = 0.0, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(max(0.0, mid - s) for s in wave) < work else (lo, mid)
    reachable = max(hi, chain + start)
    got = bench_tail.wave_bound(chain, work / len(wave), start, wave)
    assert got == pytest.approx(reachable) == pytest.approx(want)


def _fake_python(path: Path, imports: str = "") -> str:
    """An interpreter for ``_util.editable_finder``'s probe: this one without ``site`` (so without
    any ``.pth`` hook of the environment running the tests), first importing ``imports``."""
    pre = f"import {imports}; " if imports else ""
    path.write_text(
        "#!/bin/sh\n"
        "shift\n"  # the probe's "-c"
        f'exec {sys.executable} -S -c "import sys; sys.path.insert(0, \'{path.parent}\'); {pre}exec(sys.argv[1])" "$1"\n'
    )
    path.chmod(0o755)
    return str(path)


def test_the_benchmarks_warn_of_an_interpreter_that_loads_daisy_nb_through_the_editable_finder(tmp_path, monkeypatch):
    """setuptools' editable ``.pth`` hook costs every interpreter daisy_nb starts ~9 ms: a benchmark
    run on such an interpreter says so (``_util.as_installed``); one without it says nothing."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _util
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # no byte-compiling here
    (tmp_path / "__editable___daisy_nb_9_finder.py").write_text("")
    hooked = _fake_python(tmp_path / "hooked", "__editable___daisy_nb_9_finder")
    plain = _fake_python(tmp_path / "plain")
    assert _util.editable_finder(hooked) and not _util.editable_finder(plain)
    note = _util.as_installed(plain, hooked)
    assert "editable finder" in note and hooked in note and plain not in note
    assert _util.as_installed(plain) == ""
