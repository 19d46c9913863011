"""The benchmark scripts still run (tiny sizes, no daisy): benchmarks must not rot."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


def _bench(name: str):
    """A module of ``benchmarks/`` (not a package: its directory is on the path only for the import)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


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
    bench_heavy_tail = _bench("bench_heavy_tail")
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
    ("first", "retry", "preds", "roots", "want"),
    [
        # 2 slots; roots 0-3 (1 s each); a chain 4 -> 5 -> 6 after block 0. Every root goes out before
        # the queued chain (t = 2, 3, 4): 5 s, where taking the chain first would end at 4 s
        ([1.0] * 7, [None] * 7, [[], [], [], [], [0], [4], [5]], [0, 1, 2, 3], 5.0),
        # block 0 fails its first attempt: its retry goes behind the roots, then block 4 after it
        ([1.0] * 5, [1.0, None, None, None, None], [[], [], [], [], [0]], [0, 1, 2, 3], 4.0),
        # ... and behind the blocks queued before it failed (2-4, after block 1): block 5, 3 s after
        # the retry, ends at 7 s, where a retry at the front would end it at 6 s
        ([2.0, 1.0, 1.0, 1.0, 1.0, 3.0], [1.0] + [None] * 5, [[], [], [1], [1], [1], [0]], [0, 1], 7.0),
        # a long root keeps one slot; the other runs the rest back to back
        ([5.0, 1.0, 1.0, 1.0], [None] * 4, [[], [], [], []], [0, 1, 2, 3], 5.0),
    ],
)
def test_the_fifo_floor_follows_daisys_hand_out_order(first, retry, preds, roots, want):
    """``bench_heavy_tail.fifo_floor`` on schedules worked out by hand: roots before queued blocks,
    a retry at the back of the queue, a block queued when the last block it waits for ends."""
    assert _bench("bench_heavy_tail").fifo_floor(first, retry, preds, roots, workers=2) == pytest.approx(want)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.001, 10.0), min_size=1, max_size=40),
    st.integers(1, 6),
    st.randoms(use_true_random=False),
)
def test_the_fifo_floor_is_the_greedy_list_schedule_and_never_below_the_ideal(durations, workers, rng):
    """Independent blocks: the floor is the greedy list schedule (each block, in order, on the slot
    free first: a twin written apart). With dependencies: never below the ideal (the work over the
    slots, the longest chain) nor above the work on one slot."""
    ht = _bench("bench_heavy_tail")
    n = len(durations)
    slots = [0.0] * workers
    for d in durations:
        k = slots.index(min(slots))
        slots[k] += d
    got = ht.fifo_floor(durations, [None] * n, [[] for _ in range(n)], list(range(n)), workers)
    assert got == pytest.approx(max(slots))

    preds = [sorted(rng.sample(range(i), rng.randint(0, min(i, 3)))) for i in range(n)]
    roots = [i for i in range(n) if not preds[i]]
    finish: list[float] = []
    for i in range(n):
        finish.append(durations[i] + max((finish[u] for u in preds[i]), default=0.0))
    got = ht.fifo_floor(durations, [None] * n, preds, roots, workers)
    assert max(sum(durations) / workers, max(finish)) - 1e-9 <= got <= sum(durations) + 1e-9


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
    bench_tail = _bench("bench_tail")
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
    _util = _bench("_util")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # no byte-compiling here
    (tmp_path / "__editable___daisy_nb_9_finder.py").write_text("")
    hooked = _fake_python(tmp_path / "hooked", "__editable___daisy_nb_9_finder")
    plain = _fake_python(tmp_path / "plain")
    assert _util.editable_finder(hooked) and not _util.editable_finder(plain)
    note = _util.as_installed(plain, hooked)
    assert "editable finder" in note and hooked in note and plain not in note
    assert _util.as_installed(plain) == ""
