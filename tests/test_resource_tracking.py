"""resource_tracking=True (daisy 2.0 wheel): per-block stats from real worker processes,
the serial runner and Client loops, folded per task and shown in the "Resource Utilization" panel."""

import math
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import resfns  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb.profiling import TaskResourceStats  # noqa: E402

PANEL = "Resource Utilization"


def make_task(tid, n, fn, **kw):
    kw.setdefault("max_workers", 2)
    return daisy_nb.Task(
        tid,
        total_roi=Roi((0,), (10 * n,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        **kw,
    )


def run(tasks, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("summary", False)
    return daisy_nb.run_blockwise(tasks, return_states=True, **kw)


def panel(text):
    """The lines of the Resource Utilization panel ('' when absent)."""
    i = text.find(PANEL)
    return "" if i < 0 else text[i:]


def _write_bytes_counted(d: Path) -> bool:
    """Does /proc/self/io's write_bytes see page-cache writes on this filesystem (not tmpfs)?"""
    from daisy_nb.profiling import _io

    if not os.access("/proc/self/io", os.R_OK):
        return False
    before = _io()[1]
    with open(d / "probe.bin", "wb") as f:
        f.write(b"x" * 65536)
    ok = _io()[1] - before >= 65536
    os.unlink(d / "probe.bin")
    return ok


# ------------------------------------------------------------------ in-process API
def test_block_stats_fields_and_defaults():
    s = daisy_nb.BlockStats()
    assert daisy_nb.BlockStats is daisy_nb.profiling.BlockStats
    assert s._fields == (
        "wall_seconds",
        "cpu_seconds",
        "peak_rss_bytes",
        "io_read_bytes",
        "io_write_bytes",
        "gpu_util_pct",
        "gpu_mem_bytes",
    )
    assert math.isnan(s.gpu_util_pct) and s.gpu_mem_bytes == 0 and s.wall_seconds == 0.0
    b = daisy_nb.Block(Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)), task_id="t")
    assert b.stats is None
    assert pickle.loads(pickle.dumps(b)).stats is None
    b.stats = daisy_nb.BlockStats(1.5, 0.5, 1024, 2, 3)
    c = pickle.loads(pickle.dumps(b))
    assert c == b and c.stats[:5] == (1.5, 0.5, 1024, 2, 3) and math.isnan(c.stats.gpu_util_pct)


def test_profile_block_measures_and_first_wins(tmp_path):
    b = daisy_nb.Block(Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)), task_id="t")
    with daisy_nb.profile_block(b) as outer:
        with daisy_nb.profile_block(b) as inner:  # nested: the inner one attaches first and wins
            resfns._burn(0.02)
            with open(tmp_path / "f.bin", "wb") as f:
                f.write(b"x" * 200_000)
        time.sleep(0.03)
    s = b.stats
    assert s is inner.stats and s is not outer.stats
    assert 0.015 < s.cpu_seconds <= s.wall_seconds + 0.005 and s.wall_seconds < outer.stats.wall_seconds
    assert s.peak_rss_bytes > 1 << 20
    if _write_bytes_counted(tmp_path):
        assert s.io_write_bytes >= 200_000
    with daisy_nb.profile_block(b):  # a second, sequential profile does not overwrite either
        pass
    assert b.stats is s
    b2 = daisy_nb.Block(Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)), task_id="t")
    with pytest.raises(ValueError):
        with daisy_nb.profile_block(b2):
            raise ValueError("measured anyway")
    assert b2.stats is not None and b2.stats.wall_seconds >= 0


def test_task_stats_slope_leaves_failed_blocks_out():
    rng = np.random.default_rng(0)
    n = 200
    wall = 0.010 + 0.0001 * np.arange(n) + rng.normal(0, 0.0005, n)  # 10 ms + 0.1 ms per block
    failed = rng.random(n) < 0.2
    wall[failed] = 5.0  # failed blocks are slow: they must not bend the fit
    rows = np.zeros((n, 5))
    rows[:, 0], rows[:, 1], rows[:, 2] = wall, wall / 2, np.arange(n) * 1000
    acc = TaskResourceStats("t")
    for lo in range(0, n, 37):  # batches, then single blocks, give the same fit
        acc.add(rows[lo : lo + 37][: max(0, min(37, 150 - lo))], failed[lo : lo + 37][: max(0, min(37, 150 - lo))])
    for i in range(150, n):
        acc.add_one(rows[i], bool(failed[i]))
    ok = ~failed
    slope, _ = np.polyfit(np.arange(n)[ok], wall[ok] * 1e3, 1)
    assert acc.blocks == n and acc.failed == int(failed.sum())
    assert acc.block_ms_slope == pytest.approx(slope, rel=1e-9)
    assert acc.mean_block_ms == pytest.approx(wall[ok].mean() * 1e3, rel=1e-9)
    assert acc.peak_rss_bytes == (n - 1) * 1000
    assert acc.cpu_seconds == pytest.approx(rows[:, 1].sum()) and acc.cpu_per_block_second == pytest.approx(0.5)
    empty = TaskResourceStats("e")
    assert math.isnan(empty.mean_block_ms) and math.isnan(empty.block_ms_slope)


# ------------------------------------------------------------------ worker pool
@pytest.mark.mp
@pytest.mark.timeout(60)
def test_pool_measures_every_block_and_prints_the_panel(out, no_leaks, capsys):
    n = 8
    tasks = [
        make_task("burn", n, resfns.burn, resource_tracking=True),
        make_task("write", n, resfns.write_file, resource_tracking=True),
        make_task("plain", n, resfns.burn),
    ]
    states = run(tasks, summary=True)
    text = capsys.readouterr().out
    assert all(s.completed_count == n for s in states.values())
    assert states["plain"].resource_stats is None
    burn, write = states["burn"].resource_stats, states["write"].resource_stats
    assert burn.blocks == write.blocks == n and burn.failed == write.failed == 0
    assert 0.8 * n * resfns.CPU_SECS <= burn.cpu_seconds <= burn.wall_seconds * 1.05 + 0.01
    assert burn.mean_block_ms >= 0.8 * resfns.CPU_SECS * 1e3 and not math.isnan(burn.block_ms_slope)
    assert 1 << 20 < burn.peak_rss_bytes < 1 << 30  # a worker's own peak, not the scheduler's
    if _write_bytes_counted(out):
        assert write.io_write_bytes >= n * resfns.WRITE_BYTES
    p = panel(text)
    assert p and "blocks measured" in p and "mean ms ∠ slope" in p and "peak RSS" in p
    rows = {
        line.split()[0]: line.split() for line in p.splitlines() if line.strip().startswith(("burn", "write", "plain"))
    }
    assert set(rows) == {"burn", "write"}  # untracked tasks have no row
    assert rows["burn"][1:3] == [str(n), "0"]


@pytest.mark.mp
@pytest.mark.timeout(60)
def test_untracked_run_has_no_stats_and_no_panel(out, no_leaks, capsys):
    states = run([make_task("plain", 4, resfns.burn)], summary=True)
    assert states["plain"].resource_stats is None
    assert PANEL not in capsys.readouterr().out


@pytest.mark.mp
@pytest.mark.timeout(60)
def test_failed_blocks_are_counted_and_left_out(out, no_leaks, capsys):
    n = 10
    states = run([make_task("odd", n, resfns.fail_odd, resource_tracking=True, max_retries=0)], summary=True)
    r = states["odd"].resource_stats
    assert states["odd"].failed_count == n // 2
    assert r.blocks == n and r.failed == n // 2
    row = [line.split() for line in panel(capsys.readouterr().out).splitlines() if line.strip().startswith("odd")]
    assert row and row[0][1:3] == [str(n), str(n // 2)]


@pytest.mark.mp
@pytest.mark.timeout(60)
def test_block_functions_own_profile_is_kept(out, no_leaks):
    n = 6
    states = run([make_task("own", n, resfns.own_profile, resource_tracking=True, max_retries=0)])
    r = states["own"].resource_stats
    assert states["own"].completed_count == n  # the asserts inside the block function held
    assert r.blocks == n
    # what reached the scheduler is the block function's short profile, not the worker's whole call
    assert r.cpu_seconds < n * resfns.CPU_SECS / 2 and r.wall_seconds < n * resfns.CPU_SECS / 2


@pytest.mark.mp
@pytest.mark.timeout(60)
def test_client_worker_function_blocks_are_measured(out, no_leaks):
    n = 6
    states = run([make_task("cl", n, resfns.client_burn, resource_tracking=True, max_retries=0, max_workers=1)])
    r = states["cl"].resource_stats
    assert states["cl"].failed_count == 1 and states["cl"].completed_count == n - 1
    assert r.blocks == n and r.failed == 1
    assert r.cpu_seconds >= 0.8 * n * resfns.CPU_SECS


@pytest.mark.mp
@pytest.mark.timeout(60)
def test_stats_of_a_dead_workers_finished_blocks_are_kept(out, no_leaks):
    # 1 worker, batches of 1, 4, 16 blocks: it dies on block 7, after finishing 5 and 6 in that batch
    n = 30
    states = run([make_task("k", n, resfns.sigkill_once_on_7, resource_tracking=True, max_workers=1)])
    st, r = states["k"], states["k"].resource_stats
    assert st.completed_count == n and st.worker_failure_count == 1
    assert r.blocks == n and r.failed == 0  # the killed attempt has no stats; every success has


@pytest.mark.mp
@pytest.mark.timeout(60)
def test_named_segment_fallback_carries_stats(out, no_leaks, monkeypatch):
    monkeypatch.delattr(os, "memfd_create")  # platforms without memfd: a named segment, mapped by name
    states = run([make_task("nm", 6, resfns.burn, resource_tracking=True)])
    assert states["nm"].resource_stats.blocks == 6


# ------------------------------------------------------------------ serial runner
def test_serial_runner_measures(out, capsys):
    n = 5
    states = run(
        [make_task("ser", n, resfns.burn, resource_tracking=True), make_task("p", 2, resfns.burn)],
        multiprocessing=False,
        summary=True,
    )
    r = states["ser"].resource_stats
    assert r.blocks == n and r.failed == 0 and r.cpu_seconds >= 0.8 * n * resfns.CPU_SECS
    assert states["p"].resource_stats is None
    p = panel(capsys.readouterr().out)
    assert p and any(line.strip().startswith("ser") for line in p.splitlines())


def test_dask_executor_warns_that_it_does_not_measure():
    with pytest.warns(UserWarning, match="not measured under executor"):
        with pytest.raises(Exception):  # noqa: B017 - not a dask client: fails after the warning
            daisy_nb.run_blockwise(
                make_task("dk", 2, resfns.burn, resource_tracking=True),
                executor=object(),
                progress=False,
                summary=False,
            )
