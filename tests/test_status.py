"""``python -m daisy_nb status``, :mod:`daisy_nb.status` and :func:`daisy_nb.plot_block_states`.

Counts are checked against real serial runs with injected failures (what the
run's own counters and the process function saw), against the daisy 2.0.0
fixture in tests/data/tracking_daisy2/ (its expected.json), and the picture by
the colour of the pixels where known failed / done blocks land.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb import plot as dplot
from daisy_nb.status import StatusError, task_status, tracking_status
from daisy_nb.tracking import TrackingStore, set_tracking_basedir

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "data" / "tracking_daisy2"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
CASES = {c["dir"]: c for c in EXPECTED["cases"]}

mpl_image = pytest.importorskip("matplotlib.image")


@pytest.fixture(autouse=True)
def _no_basedir():
    set_tracking_basedir(None)
    yield
    set_tracking_basedir(None)


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-m", "daisy_nb", "status", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def _roi_arg(roi: Roi) -> str:
    return ",".join(map(str, roi.offset)) + ":" + ",".join(map(str, roi.shape))


# ---------------------------------------------------------------------------
# a real run with injected failures
# ---------------------------------------------------------------------------

# 2-D, context 10 = one write block on every side: tracking grid 6 x 8, block
# grid 4 x 6 at tracking cells [1:5, 1:7] (cul // write_shape = 1)
TOTAL = Roi((0, 0), (60, 80))
READ = Roi((0, 0), (30, 30))
WRITE = Roi((10, 10), (10, 10))
MAX_RETRIES = 2


def _run(path, fail_begins=(), max_retries=MAX_RETRIES):
    """Run the 2-D task serially; return (task, state, {write_begin: last status})."""
    seen = {}

    def process(block):
        wb = tuple(int(v) for v in block.write_roi.begin)
        if wb in fail_begins:
            block.status = daisy_nb.BlockStatus.FAILED
            seen[wb] = "failed"
        else:
            seen[wb] = "success"

    task = daisy_nb.Task("grid2d", TOTAL, READ, WRITE, process, max_retries=max_retries, tracking_path=str(path))
    states = daisy_nb.run_blockwise([task], multiprocessing=False, return_states=True, progress=False, summary=False)
    return task, states["grid2d"], seen


def _cell(wb, total=TOTAL, write=WRITE):
    """Tracking cell of a block's write begin (CORE.md 7.1)."""
    return tuple((b - o) // s for b, o, s in zip(wb, total.offset, write.shape))


FAILS = {(20, 40), (40, 10)}  # write begins of the blocks made to fail


@pytest.fixture
def failed_run(tmp_path):
    path = tmp_path / "track" / "grid2d"
    task, state, seen = _run(path, FAILS)
    return task, state, seen, path


def test_run_with_failures_counts_exactly(failed_run):
    task, state, seen, path = failed_run
    assert task.block_grid_shape == [4, 6]
    assert state.failed_count == len(FAILS) and state.orphaned_count > 0  # failures orphan dependents
    done_begins = {wb for wb, s in seen.items() if s == "success"}
    assert len(done_begins) == state.completed_count

    s = task_status(task)  # the task is known: its real blocks only
    assert s["counted"] == "blocks"
    assert s["grid_shape"] == [6, 8] and s["block_grid_shape"] == [4, 6]
    assert s["total"] == 24
    assert s["done"] == len(done_begins) == state.completed_count
    assert s["failed"] == len(FAILS) == state.failed_count
    assert s["never"] == state.orphaned_count == 24 - len(done_begins) - len(FAILS)
    assert s["failure_histogram"] == {MAX_RETRIES + 1: len(FAILS)}
    assert s["outside_cells"] == 48 - 24 and s["outside_marked"] == 0
    assert s["done_after_failures"] == 0 and s["skipped_by_mask"] == 0
    assert s["percent_done"] == pytest.approx(np.floor(1000 * s["done"] / 24) / 10)
    assert s["complete"] is False

    b = task_status(path)  # a bare directory: the whole tracking grid
    assert b["counted"] == "cells" and b["block_grid_shape"] is None
    assert (b["total"], b["done"], b["failed"]) == (48, s["done"], s["failed"])
    assert b["never"] == s["never"] + 24
    assert b["failure_histogram"] == s["failure_histogram"]
    assert tracking_status(path) == {"grid2d": b}
    assert tracking_status(path.parent) == {"grid2d": b}  # a basedir
    assert tracking_status(task) == {"grid2d": s}

    # the failed blocks are where the run put them
    info = daisy_nb.tracking.read_tracking(path)
    for wb in FAILS:
        assert info["failures"][_cell(wb)] == MAX_RETRIES + 1 and info["done"][_cell(wb)] == 0
    for wb in done_begins:
        assert info["done"][_cell(wb)] == 1


def test_cli_counts_exit_codes_and_rerun(failed_run):
    task, state, seen, path = failed_run
    geo = [f"--total-roi={_roi_arg(TOTAL)}", f"--read-roi={_roi_arg(READ)}", f"--write-roi={_roi_arg(WRITE)}"]

    r = _cli(path, "--json", *geo)
    assert r.returncode == 1, r.stderr
    (s,) = json.loads(r.stdout)
    assert (s["total"], s["done"], s["failed"], s["never"]) == (
        24,
        state.completed_count,
        state.failed_count,
        state.orphaned_count,
    )
    assert s["failure_histogram"] == {str(MAX_RETRIES + 1): 2}

    r = _cli(path.parent)  # basedir, text output
    assert r.returncode == 1, r.stderr
    out = r.stdout
    assert "task grid2d" in out
    assert "6 x 8 = 48 tracking cells" in out
    assert f"done              {state.completed_count} / 48 cells" in out
    assert "failed, not done  2\n" in out
    assert f"never finished    {state.orphaned_count + 24}\n" in out
    assert f"{MAX_RETRIES + 1} attempts: 2 blocks" in out

    # rerun without failures: resumes, the failed and orphaned blocks now succeed
    task2, state2, seen2 = _run(path)
    assert state2.failed_count == 0
    done_before = {wb for wb, st in seen.items() if st == "success"}
    assert set(seen2).isdisjoint(done_before) and len(seen2) == 24 - len(done_before)
    s2 = task_status(task2)
    assert s2["complete"] and (s2["done"], s2["failed"], s2["never"]) == (24, 0, 0)
    assert s2["percent_done"] == 100.0
    assert s2["failure_histogram"] == {MAX_RETRIES + 1: 2}  # failures accumulate, kept
    assert s2["done_after_failures"] == 2

    r = _cli(path, *geo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "24 / 24 blocks (100.0%)" in r.stdout and "complete" in r.stdout
    # without the layout the 24 cells outside the block grid never get done
    r = _cli(path)
    assert r.returncode == 1
    assert "never finished    24\n" in r.stdout


def test_cli_exit_zero_when_tracking_grid_is_block_grid(tmp_path):
    total, block = Roi((0, 0, 0), (8, 6, 4)), Roi((0, 0, 0), (2, 2, 2))  # no context: 4 x 3 x 2 blocks
    fail = {(4, 2, 2)}

    def process(b):
        if tuple(b.write_roi.begin) in fail:
            b.status = daisy_nb.BlockStatus.FAILED

    def run():
        t = daisy_nb.Task("vol", total, block, block, process, max_retries=0, tracking_path=str(tmp_path / "vol"))
        return daisy_nb.run_blockwise([t], multiprocessing=False, return_states=True, progress=False, summary=False)[
            "vol"
        ]

    st = run()
    r = _cli(tmp_path / "vol", "--json")
    assert r.returncode == 1
    (s,) = json.loads(r.stdout)
    assert (s["total"], s["done"], s["failed"], s["never"]) == (24, st.completed_count, 1, st.orphaned_count)
    assert s["failure_histogram"] == {"1": 1}
    fail.clear()
    run()
    r = _cli(tmp_path / "vol")
    assert r.returncode == 0, r.stdout
    assert "24 / 24 cells (100.0%)" in r.stdout


# ---------------------------------------------------------------------------
# the daisy 2.0.0 fixture
# ---------------------------------------------------------------------------


def _case_rois(c):
    return tuple(Roi(tuple(c[k]["offset"]), tuple(c[k]["shape"])) for k in ("total_roi", "read_roi", "write_roi"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_daisy2_fixture_counts(name):
    c = CASES[name]
    done = np.array(c["done"], np.uint8)
    failures = np.array(c["failures"], np.uint32)
    s = task_status(FIXTURE / name)
    assert s["task_hash"] == c["hash"] and s["grid_shape"] == c["grid_shape"]
    assert s["total"] == done.size
    assert s["done"] == int((done != 0).sum())
    assert s["failed"] == int(((failures > 0) & (done == 0)).sum()) == len(c["failed_blocks_write_begin"])
    assert s["never"] == done.size - s["done"] - s["failed"]
    vals, cnts = np.unique(failures[failures > 0], return_counts=True)
    assert s["failure_histogram"] == dict(zip(vals.tolist(), cnts.tolist()))

    # with the task known: the real block grid, and daisy's own counters of the last run
    total, read, write = _case_rois(c)
    task = daisy_nb.Task(
        name, total, read, write, fit=c["fit"], max_retries=c["max_retries"], tracking_path=str(FIXTURE / name)
    )
    t = task_status(task)
    assert t["block_grid_shape"] == c["block_grid_shape"]
    last = c["runs"][-1]
    assert (t["total"], t["done"], t["failed"], t["never"]) == (
        last["total"],
        last["completed"],
        last["failed"],
        last["orphaned"],
    )
    assert t["outside_marked"] == 0


def test_daisy2_fixture_cli():
    r = _cli(FIXTURE, "--json")
    assert r.returncode == 1, r.stderr
    got = {s["task"]: s for s in json.loads(r.stdout)}
    assert set(got) == set(CASES)
    assert (got["t2d"]["done"], got["t2d"]["failed"], got["t2d"]["never"]) == (3, 1, 11)
    assert (got["t3d"]["done"], got["t3d"]["failed"], got["t3d"]["never"]) == (15, 1, 8)
    assert got["t3d"]["failure_histogram"] == {"4": 1}

    c = CASES["t3d"]
    total, read, write = _case_rois(c)
    r = _cli(
        FIXTURE / "t3d",
        f"--total-roi={_roi_arg(total)}",
        f"--read-roi={_roi_arg(read)}",
        f"--write-roi={_roi_arg(write)}",
        "--fit",
        c["fit"],
    )
    assert r.returncode == 1
    assert "3 x 3 x 2 = 18 blocks (tracking grid 4 x 3 x 2; 6 cells that are not blocks" in r.stdout
    assert "done              15 / 18 blocks (83.3%)" in r.stdout
    assert "4 attempts: 1 block" in r.stdout


def test_cli_bad_paths(tmp_path, capsys):
    from daisy_nb.__main__ import main

    def run(*args):
        rc = main(["status", *map(str, args)])
        return rc, capsys.readouterr().err

    rc, err = run(tmp_path / "missing")
    assert rc == 2 and "no such file or directory" in err
    (tmp_path / "empty").mkdir()
    rc, err = run(tmp_path / "empty")
    assert rc == 2 and "no block tracking here" in err
    # a layout that is not the one the store was written for
    rc, err = run(FIXTURE / "t2d", "--total-roi=0,0:50,30", "--read-roi=0,0:10,10", "--write-roi=0,0:10,10")
    assert rc == 2 and "different task layout" in err
    rc, err = run(FIXTURE / "t2d", "--total-roi=0,0:50,30")
    assert rc == 2 and "go together" in err
    assert run(FIXTURE / "t2d")[0] == 1


# ---------------------------------------------------------------------------
# 10^8 cells: streamed, not loaded
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB, sparse files")
def test_huge_store_is_streamed(tmp_path):
    n = 10**8
    path = tmp_path / "huge"
    # 100 MB of done + 400 MB of failures, sparse on disk: cheap to make
    TrackingStore.open(path, Roi((0,), (n,)), Roi((0,), (1,)), Roi((0,), (1,)), durable=False).close()
    done_at, fail_at = [0, 12_345_678, n - 1], {7: 3, 50_000_000: 2, n - 2: 3}
    with open(path / "done" / "c" / "0", "r+b") as f:
        for i in done_at:
            f.seek(i)
            f.write(b"\x01")
    with open(path / "failures" / "c" / "0", "r+b") as f:
        for i, v in fail_at.items():
            f.seek(4 * i)
            f.write(v.to_bytes(4, "little"))
    script = textwrap.dedent(f"""
        import json, resource, tracemalloc
        import numpy
        from daisy_nb.status import task_status
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        s = task_status({str(path)!r})
        peak = tracemalloc.get_traced_memory()[1]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"status": s, "rss_growth_kib": rss - base, "traced_peak": peak}}))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    s = out["status"]
    assert (s["total"], s["done"], s["failed"]) == (n, 3, 3)
    assert s["never"] == n - 6
    assert s["failure_histogram"] == {"2": 1, "3": 2}
    array_bytes = n * (1 + 4)
    assert out["traced_peak"] < 32 << 20, out  # a few chunks, not 500 MB
    assert out["rss_growth_kib"] * 1024 < array_bytes / 8, out


# ---------------------------------------------------------------------------
# the picture
# ---------------------------------------------------------------------------


def _rgb_at(img: np.ndarray, xy) -> tuple[int, int, int]:
    x, y = xy
    px = img[int(y), int(x), :3]
    return tuple(int(round(v * 255)) for v in px)


def test_png_2d_task_pixels(failed_run, tmp_path):
    task, state, seen, path = failed_run
    out = tmp_path / "states.png"
    p = daisy_nb.plot_block_states(task, file=out)
    assert out.exists()
    img = mpl_image.imread(out)
    assert (img.shape[1], img.shape[0]) == p.size_px == (560, 310)  # 4 x 6 blocks of 40 x 40 px
    assert p.cell_px == (40, 40) and p.grid.factor == 1
    red, green, grey = (p.rgb_of(s) for s in (dplot.STATE_FAILED, dplot.STATE_DONE, dplot.STATE_NEVER))
    assert red == (0xD6, 0x27, 0x28) and green == (0x2C, 0xA0, 0x2C)
    lay = task.layout
    n_checked = {"failed": 0, "done": 0, "never": 0}
    for g in np.ndindex(*task.block_grid_shape):
        wb = tuple(int(v) for v in lay.tw_offset + np.array(g) * lay.write_shape)
        status = seen.get(wb, "never")
        want = {"failed": red, "success": green, "never": grey}[status]
        assert _rgb_at(img, p.pixel_of(g)) == want, (g, wb, status)
        n_checked[{"success": "done"}.get(status, status)] += 1
    assert n_checked["failed"] == 2 and n_checked["done"] == state.completed_count
    assert p.grid.counts == {"done": state.completed_count, "failed": 2, "never": state.orphaned_count, "skipped": 0}

    # the bare directory draws the whole tracking grid: block g sits at cell g + 1
    q = daisy_nb.plot_block_states(path, file=tmp_path / "cells.png")
    img2 = mpl_image.imread(tmp_path / "cells.png")
    assert q.grid.shape == (6, 8) and (img2.shape[1], img2.shape[0]) == q.size_px
    for wb in FAILS:
        assert _rgb_at(img2, q.pixel_of(_cell(wb))) == red
    assert _rgb_at(img2, q.pixel_of((0, 0))) == grey  # a cell that is never a block


def test_png_3d_fixture_and_cli(tmp_path):
    c = CASES["t3d"]
    out = tmp_path / "t3d.png"
    r = _cli(FIXTURE / "t3d", "--png", out)
    assert r.returncode == 1 and f"wrote {out}" in r.stdout
    img = mpl_image.imread(out)
    # the same layout drawn in-process (the CLI calls plot_block_states)
    p = daisy_nb.plot_block_states(FIXTURE / "t3d")
    assert (img.shape[1], img.shape[0]) == p.size_px
    assert p.grid.kind == "slices" and p.grid.panels == 4 and p.grid.z_factor == 1
    done = np.array(c["done"])
    failures = np.array(c["failures"])
    for cell in np.ndindex(*done.shape):
        if done[cell]:
            want = dplot.STATE_DONE
        elif failures[cell]:
            want = dplot.STATE_FAILED
        else:
            want = dplot.STATE_NEVER
        assert _rgb_at(img, p.pixel_of(cell)) == p.rgb_of(want), cell
    assert done[2, 1, 0] == 0 and failures[2, 1, 0] == 4  # the failed block is checked


def test_png_reduced_grid_keeps_a_lone_failure(tmp_path):
    # 2000 x 3000 cells -> 3 x 3 cells per pixel; one failure among done blocks
    path = tmp_path / "big"
    s = TrackingStore.open(path, Roi((0, 0), (2000, 3000)), Roi((0, 0), (1, 1)), Roi((0, 0), (1, 1)), durable=False)
    s.done[:] = 1
    s.done[1001, 1502] = 0
    s.failures[1001, 1502] = 1
    s.done[1999, :] = 0  # a row never finished
    s.mark_dirty()
    s.close()
    out = tmp_path / "big.png"
    p = daisy_nb.plot_block_states(path, file=out, chunk_cells=1 << 16)  # many slabs, unaligned to 3
    assert p.grid.factor == 3 and p.grid.codes.shape == (667, 1000)
    img = mpl_image.imread(out)
    assert (img.shape[1], img.shape[0]) == p.size_px
    assert _rgb_at(img, p.pixel_of((1001, 1502))) == p.rgb_of(dplot.STATE_FAILED)
    assert _rgb_at(img, p.pixel_of((1000, 1500))) == p.rgb_of(dplot.STATE_FAILED)  # same 3 x 3 group
    assert _rgb_at(img, p.pixel_of((10, 10))) == p.rgb_of(dplot.STATE_DONE)
    assert _rgb_at(img, p.pixel_of((1998, 10))) == p.rgb_of(dplot.STATE_NEVER)  # group with row 1999
    assert p.grid.counts == {"done": 6_000_000 - 3001, "failed": 1, "never": 3000, "skipped": 0}


def test_png_1d_strip(tmp_path):
    path = tmp_path / "line"
    s = TrackingStore.open(path, Roi((0,), (2500,)), Roi((0,), (4,)), Roi((0,), (4,)), durable=False)
    s.mark_done(np.arange(0, 400))
    s.add_failures([450], 2)
    s.close()
    p = daisy_nb.plot_block_states(str(path), file=tmp_path / "line.png")
    img = mpl_image.imread(tmp_path / "line.png")
    assert p.grid.kind == "strip" and (img.shape[1], img.shape[0]) == p.size_px
    assert _rgb_at(img, p.pixel_of(450)) == p.rgb_of(dplot.STATE_FAILED)
    assert _rgb_at(img, p.pixel_of(3)) == p.rgb_of(dplot.STATE_DONE)
    assert _rgb_at(img, p.pixel_of(600)) == p.rgb_of(dplot.STATE_NEVER)


def test_plot_from_run_states_and_into_own_axes(tmp_path):
    from matplotlib.figure import Figure

    set_tracking_basedir(tmp_path / "base")

    def process(b):
        if tuple(b.write_roi.begin) == (10,):
            b.status = daisy_nb.BlockStatus.FAILED

    t = daisy_nb.Task("line", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process, max_retries=0)
    states = daisy_nb.run_blockwise([t], multiprocessing=False, return_states=True, progress=False, summary=False)
    # the returned states (one task), one state, and the Task all find the store
    for obj in (states, states["line"], t):
        p = daisy_nb.plot_block_states(obj)
        assert p.grid.counts == {"done": 3, "failed": 1, "never": 0, "skipped": 0}
        assert p.grid.target.path == tmp_path / "base" / "line"
    assert task_status(states["line"])["failed"] == 1

    fig = Figure()
    ax = fig.add_subplot()
    p = daisy_nb.plot_block_states(t, ax=ax)
    assert p.ax is ax and p.size_px is None and ax.get_images()

    set_tracking_basedir(None)
    with pytest.raises(StatusError, match="no tracking basedir"):
        daisy_nb.plot_block_states(states["line"])
    with pytest.raises(StatusError, match="tracking off"):
        task_status(daisy_nb.Task("off", Roi((0,), (4,)), Roi((0,), (2,)), Roi((0,), (2,)), tracking_path=False))


def test_skip_mask_blocks_are_not_never(tmp_path):
    mask = np.zeros((2, 3), bool)
    mask[1, 2] = True
    t = daisy_nb.Task(
        "m",
        Roi((0, 0), (4, 6)),
        Roi((0, 0), (2, 2)),
        Roi((0, 0), (2, 2)),
        lambda b: None,
        skip_mask=mask,
        tracking_path=str(tmp_path / "m"),
    )
    daisy_nb.run_blockwise([t], multiprocessing=False, progress=False, summary=False)
    s = task_status(t)
    assert (s["done"], s["skipped_by_mask"], s["never"], s["complete"]) == (5, 1, 0, True)
    assert task_status(tmp_path / "m")["never"] == 1  # the directory alone cannot know
    p = daisy_nb.plot_block_states(t)
    assert p.grid.counts["skipped"] == 1


def test_missing_matplotlib_and_demo(monkeypatch, tmp_path, capsys):
    from daisy_nb.__main__ import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(dplot.MissingMatplotlib, match=r"daisy_nb\[plot\]"):
        daisy_nb.plot_block_states(FIXTURE / "t2d")
    assert main(["status", str(FIXTURE / "t2d"), "--png", str(tmp_path / "x.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "daisy_nb.demo", None)  # as if demo.py did not exist
    monkeypatch.delattr(daisy_nb, "demo", raising=False)  # else `from . import demo` finds it
    monkeypatch.chdir(tmp_path)  # never let a real demo run write into the checkout
    assert main(["demo"]) == 2
    assert "demo is not available" in capsys.readouterr().err
    assert main([]) == 2


def test_format_status_for_a_basedir(tmp_path):
    shutil.copytree(FIXTURE / "t2d", tmp_path / "t2d")
    shutil.copytree(FIXTURE / "t3d", tmp_path / "t3d")
    (tmp_path / "logs").mkdir()  # not a store: ignored
    st = tracking_status(tmp_path)
    assert list(st) == ["t2d", "t3d"]
    text = daisy_nb.status.format_status(st)
    assert text.count("task t") == 2 and "INCOMPLETE" in text
