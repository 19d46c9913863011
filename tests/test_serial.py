"""Serial runs (``run_blockwise(..., multiprocessing=False)``) and block tracking.

Serial mode runs block functions in this process, so call counts are plain
lists. Tracking is daisy 2.0.0's on-disk format (CORE.md 7.1, 7.3); the
fixture ``tests/data/tracking_daisy2/`` was written by daisy 2.0.0 itself
(``tests/golden/gen_tracking_fixture.py``).
"""

from __future__ import annotations

import json
import shutil
import traceback
from pathlib import Path

import numpy as np
import pytest

import daisy_nb as daisy
from daisy_nb import BlockStatus, Roi
from daisy_nb.tracking import read_tracking, set_tracking_basedir

FIXTURE = Path(__file__).parent / "data" / "tracking_daisy2"
EXPECTED = {c["dir"]: c for c in json.loads((FIXTURE / "expected.json").read_text())["cases"]}


@pytest.fixture(autouse=True)
def _no_basedir():
    set_tracking_basedir(None)
    yield
    set_tracking_basedir(None)


def run(x, **kw):
    kw.setdefault("summary", False)
    return daisy.run_blockwise(x, multiprocessing=False, **kw)


def wb(block):
    return tuple(int(v) for v in block.write_roi.begin)


class Recorder:
    """A block function: logs write begins; fails (status FAILED) or raises on request."""

    def __init__(self, fail=(), raise_on=()):
        self.calls = []
        self.fail = set(map(tuple, fail))
        self.raise_on = set(map(tuple, raise_on))

    def __call__(self, block):
        w = wb(block)
        self.calls.append(w)
        if w in self.raise_on:
            raise KeyError(f"boom at {w}")
        if w in self.fail:
            block.status = BlockStatus.FAILED


def task_2d(tid, fn, path=None, max_retries=1, **kw):
    """4 x 4 blocks of 10 x 10, no context."""
    if path is not None:
        kw["tracking_path"] = str(path)
    return daisy.Task(
        tid,
        Roi((0, 0), (40, 40)),
        Roi((0, 0), (10, 10)),
        Roi((0, 0), (10, 10)),
        process_function=fn,
        max_retries=max_retries,
        **kw,
    )


ALL_2D = {(x, y) for x in range(0, 40, 10) for y in range(0, 40, 10)}


def done_cells(path):
    return {tuple(int(v) for v in c) for c in np.argwhere(np.asarray(read_tracking(path)["done"]) != 0)}


# ---------------------------------------------------------------------------
# run_blockwise basics
# ---------------------------------------------------------------------------


def test_returns_true_iff_everything_completed():
    f = Recorder()
    assert run(task_2d("a", f)) is True
    assert sorted(f.calls) == sorted(ALL_2D)
    g = Recorder(fail=[(10, 10)])
    assert run(task_2d("a", g, max_retries=0)) is False
    assert g.calls.count((10, 10)) == 1


def test_return_states():
    f = Recorder(fail=[(0, 0)])
    states = run(task_2d("a", f, max_retries=2), return_states=True)
    assert set(states) == {"a"}
    s = states["a"]
    assert (s.total_block_count, s.completed_count, s.failed_count, s.orphaned_count, s.skipped_count) == (
        16,
        15,
        1,
        0,
        0,
    )
    assert (s.ready_count, s.processing_count, s.pending_count) == (0, 0, 0) and s.is_done() and s.started
    assert f.calls.count((0, 0)) == 3  # max_retries + 1 attempts


def test_status_failed_without_raising_fails_the_block_and_orphans_dependents():
    a_fn, b_fn = Recorder(fail=[(10,)]), Recorder()
    a = daisy.Task("a", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=a_fn, max_retries=1)
    b = daisy.Task("b", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=b_fn)
    states = run(a + b, return_states=True)  # no exception
    assert a_fn.calls.count((10,)) == 2
    assert (states["a"].failed_count, states["a"].completed_count) == (1, 3)
    assert (states["b"].orphaned_count, states["b"].completed_count) == (1, 3)
    assert (10,) not in b_fn.calls
    assert run(a + b) is False


def test_skipped_blocks_count_as_completed_for_the_return_value():
    f = Recorder()
    t = task_2d("a", f, check_function=lambda b: wb(b)[0] == 0)
    states = run(t, return_states=True)
    assert len(f.calls) == 12 and (states["a"].completed_count, states["a"].skipped_count) == (16, 4)
    assert run(task_2d("a", Recorder(), check_function=lambda b: True)) is True


class MyError(Exception):
    pass


def test_exception_propagates_with_type_and_traceback(tmp_path):
    seen = []

    def exploding_block_function(block):
        seen.append(wb(block))
        if len(seen) == 5:
            raise MyError("exploded")

    with pytest.raises(MyError, match="exploded") as ei:
        run(task_2d("a", exploding_block_function, path=tmp_path / "a", max_retries=5))
    assert len(seen) == 5  # no retries, the run stops at once
    frames = [f.name for f in traceback.extract_tb(ei.value.__traceback__)]
    assert frames[-1] == "exploding_block_function"
    # blocks that succeeded before are recorded (the store is flushed); the one that raised is not
    assert done_cells(tmp_path / "a") == {(x // 10, y // 10) for x, y in seen[:4]}
    info = read_tracking(tmp_path / "a")
    assert int(np.asarray(info["failures"]).sum()) == 0


def test_process_function_required_in_serial_mode():
    with pytest.raises((RuntimeError, ValueError), match="process_function"):
        run(task_2d("a", None))

    def worker():
        pass

    with pytest.raises((RuntimeError, ValueError), match="process_function"):
        run(task_2d("a", worker))


def test_serial_runs_every_task_of_a_pipeline_in_dependency_order():
    order = []

    def f(block):
        order.append((block.task_id, wb(block)))

    a = daisy.Task("a", Roi((0,), (60,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=f)
    b = daisy.Task(
        "b", Roi((0,), (60,)), Roi((-10,), (30,)), Roi((0,), (10,)), process_function=f, read_write_conflict=False
    )  # writes [10, 50)
    c = daisy.Task("c", Roi((0,), (60,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=f)
    assert run((a + b) | c) is True
    pos = {k: i for i, k in enumerate(order)}
    assert len(order) == 6 + 4 + 6
    for x in range(10, 50, 10):  # b's write cells [10, 50): read [x-10, x+20)
        for up in (x - 10, x, x + 10):
            assert pos[("b", (x,))] > pos[("a", (up,))]


def test_init_fn_states_of_two_tasks_are_bound_per_block_and_gone_after_the_run():
    # a defect fixed: the serial runner stored init_fn results process-wide, so with two such
    # tasks worker_state() (no task id) raised LookupError, and the states outlived the run
    seen = []

    def f(block):
        seen.append((block.task_id, daisy.worker_state()))

    a = task_2d("a", f, init_fn=lambda: "state of a")
    b = task_2d("b", f, init_fn=lambda: "state of b")
    assert run([a, b]) is True
    assert len(seen) == 32 and all(st == f"state of {tid}" for tid, st in seen)
    with pytest.raises(LookupError):
        daisy.worker_state()


# ---------------------------------------------------------------------------
# tracking: resume, failures, failed_blocks
# ---------------------------------------------------------------------------


def test_rerun_skips_exactly_the_done_blocks(tmp_path):
    path = tmp_path / "a"
    bad = [(10, 10), (30, 0)]
    f1 = Recorder(fail=bad)
    s1 = run(task_2d("a", f1, path=path), return_states=True)["a"]
    assert (s1.completed_count, s1.failed_count, s1.skipped_count) == (14, 2, 0)
    assert done_cells(path) == {(x // 10, y // 10) for x, y in ALL_2D - set(bad)}
    f2 = Recorder()
    s2 = run(task_2d("a", f2, path=path), return_states=True)["a"]
    assert sorted(f2.calls) == sorted(bad)
    assert (s2.completed_count, s2.skipped_count, s2.failed_count) == (16, 14, 0)
    f3 = Recorder()
    s3 = run(task_2d("a", f3, path=path), return_states=True)["a"]
    assert f3.calls == [] and (s3.completed_count, s3.skipped_count) == (16, 16)
    # block_tracking=False ignores the store
    f4 = Recorder()
    assert run(task_2d("a", f4, path=path), block_tracking=False) is True
    assert len(f4.calls) == 16


def test_rerun_of_a_chain_skips_done_blocks_and_runs_orphans(tmp_path):
    a1, b1 = Recorder(fail=[(10,)]), Recorder()

    def pipeline(fa, fb):
        a = daisy.Task(
            "a",
            Roi((0,), (50,)),
            Roi((0,), (10,)),
            Roi((0,), (10,)),
            process_function=fa,
            max_retries=0,
            tracking_path=str(tmp_path / "a"),
        )
        b = daisy.Task(
            "b",
            Roi((0,), (50,)),
            Roi((-10,), (30,)),
            Roi((0,), (10,)),
            process_function=fb,
            read_write_conflict=False,
            tracking_path=str(tmp_path / "b"),
        )
        return a + b

    st1 = run(pipeline(a1, b1), return_states=True)
    # b's blocks write [10,40) and read [x-10, x+20): a/[10,20) feeds b/[10,20) and b/[20,30)
    assert (st1["a"].failed_count, st1["b"].orphaned_count, st1["b"].total_block_count) == (1, 2, 3)
    a2, b2 = Recorder(), Recorder()
    st2 = run(pipeline(a2, b2), return_states=True)
    assert a2.calls == [(10,)]
    assert sorted(b2.calls) == [(10,), (20,)]
    assert (st2["a"].skipped_count, st2["b"].skipped_count) == (4, 1)
    assert all(s.completed_count == s.total_block_count for s in st2.values())


def test_failures_accumulate_and_failed_blocks(tmp_path):
    path = tmp_path / "a"
    t = task_2d("a", Recorder(fail=[(20, 30)]), path=path, max_retries=1)
    assert t.failed_blocks() == []
    run(t)
    fails = np.asarray(read_tracking(path)["failures"])
    assert fails[2, 3] == 2 and fails.sum() == 2
    assert [wb(b) for b in t.failed_blocks()] == [(20, 30)]
    b = t.failed_blocks()[0]
    assert b.task_id == "a" and tuple(b.read_roi.shape) == (10, 10)
    run(task_2d("a", Recorder(fail=[(20, 30)]), path=path, max_retries=1))
    assert np.asarray(read_tracking(path)["failures"])[2, 3] == 4
    f = Recorder()
    run(task_2d("a", f, path=path, max_retries=1))
    assert f.calls == [(20, 30)]
    info = read_tracking(path)
    assert np.asarray(info["failures"])[2, 3] == 4  # history is kept
    assert np.asarray(info["done"]).all()
    assert t.failed_blocks() == []


def test_block_is_marked_only_after_success(tmp_path):
    path = tmp_path / "a"
    f = Recorder(raise_on=[(0, 0)])
    t = task_2d("a", f, path=path, read_write_conflict=False)
    with pytest.raises(KeyError):
        run(t)
    assert f.calls == [(0, 0)]
    assert done_cells(path) == set()
    g = Recorder(raise_on=[(20, 20)])
    with pytest.raises(KeyError):
        run(task_2d("a", g, path=path, read_write_conflict=False))
    marked = done_cells(path)
    assert (2, 2) not in marked and marked == {(x // 10, y // 10) for x, y in g.calls[:-1]}
    h = Recorder()
    run(task_2d("a", h, path=path, read_write_conflict=False))
    assert sorted(h.calls) == sorted(ALL_2D - set(g.calls[:-1]))


def test_check_function_skips_are_recorded_as_done(tmp_path):
    """CORE 7.1: a block skipped by check_function gets its done byte."""
    path = tmp_path / "a"
    f = Recorder()
    run(task_2d("a", f, path=path, check_function=lambda b: wb(b) == (0, 0)))
    assert (0, 0) in done_cells(path) and len(f.calls) == 15


def test_tracking_path_false_and_no_basedir_write_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = Recorder()
    run(task_2d("a", f))
    run(task_2d("b", f, tracking_path=False))
    assert list(tmp_path.iterdir()) == [] or all(p.name == "daisy_logs" for p in tmp_path.iterdir())
    assert len(f.calls) == 32


def test_set_tracking_basedir_gives_auto_paths(tmp_path):
    base = tmp_path / "base"
    set_tracking_basedir(base)
    assert daisy.get_tracking_basedir() == base
    f = Recorder(fail=[(0, 10)])
    run(task_2d("auto", f, max_retries=0) | task_2d("off", Recorder(), tracking_path=False))
    assert (base / "auto" / "zarr.json").is_file()
    assert not (base / "off").exists()
    assert done_cells(base / "auto") == {(x // 10, y // 10) for x, y in ALL_2D - {(0, 10)}}
    g = Recorder()
    run(task_2d("auto", g))
    assert g.calls == [(0, 10)]
    t = task_2d("auto", g)
    assert t.reset() == str(base / "auto") and not (base / "auto").exists()
    set_tracking_basedir(None)
    assert daisy.get_tracking_basedir() is None
    h = Recorder()
    run(task_2d("auto", h))
    assert len(h.calls) == 16 and not (base / "auto").exists()


def test_layout_mismatch_raises_naming_the_path(tmp_path):
    path = tmp_path / "a"
    run(task_2d("a", Recorder(), path=path))
    f = Recorder()
    other = daisy.Task(
        "a",
        Roi((0, 0), (40, 40)),
        Roi((0, 0), (20, 20)),
        Roi((0, 0), (20, 20)),
        process_function=f,
        tracking_path=str(path),
    )
    with pytest.raises(RuntimeError, match="different task layout") as ei:
        run(other)
    assert str(path) in str(ei.value) and "rm -rf" in str(ei.value)
    assert f.calls == []
    with pytest.raises(RuntimeError, match=str(path)):
        daisy.Scheduler(other)
    # a different fit is a different layout too
    with pytest.raises(RuntimeError, match=str(path)):
        run(task_2d("a", f, path=path, fit="shrink"))
    assert f.calls == []


# ---------------------------------------------------------------------------
# tracking written by daisy 2.0.0
# ---------------------------------------------------------------------------


def fixture_task(name, path, fn, **kw):
    c = EXPECTED[name]
    r = lambda d: Roi(tuple(d["offset"]), tuple(d["shape"]))  # noqa: E731
    return daisy.Task(
        name,
        r(c["total_roi"]),
        r(c["read_roi"]),
        r(c["write_roi"]),
        process_function=fn,
        fit=c["fit"],
        max_retries=c["max_retries"],
        tracking_path=str(path),
        **kw,
    )


def copy_fixture(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(FIXTURE / name, dst)
    return dst


@pytest.mark.parametrize("name", ["t2d", "t3d"])
def test_daisy2_store_is_resumed_and_extended(name, tmp_path):
    """Open a copy of daisy 2.0.0's store: exactly the blocks daisy marked done are
    skipped, the rest run, and the result is still daisy's format."""
    c = EXPECTED[name]
    path = copy_fixture(name, tmp_path)
    group_before = (path / "zarr.json").read_bytes()
    meta_before = {a: (path / a / "zarr.json").read_bytes() for a in ("done", "failures")}
    done_before = np.array(c["done"], np.uint8)
    n_done = int(done_before.sum())
    f = Recorder()
    states = run(fixture_task(name, path, f), return_states=True)
    s = states[name]
    assert s.skipped_count == n_done
    assert len(f.calls) == s.total_block_count - n_done
    assert s.completed_count == s.total_block_count
    # the blocks that ran are exactly those daisy had not marked done
    info = read_tracking(path)
    done = np.asarray(info["done"])
    grid = tuple(c["grid_shape"])
    assert done.shape == grid
    assert np.all(done[done_before == 1] == 1)
    assert int(done.sum()) == s.total_block_count
    newly = {tuple(int(v) for v in x) for x in np.argwhere((done == 1) & (done_before == 0))}
    assert len(newly) == len(f.calls)
    # failures are kept, layout/hash unchanged, daisy's metadata bytes untouched
    assert np.array_equal(np.asarray(info["failures"]), np.array(c["failures"], np.uint32))
    assert info["task_hash"] == c["hash"]
    # the group document: daisy's, plus the layout record daisy_nb adds (daisy keeps and ignores it)
    group_now = json.loads((path / "zarr.json").read_text())
    assert group_now["attributes"].pop("daisy_nb_layout")["total_roi"] == c["total_roi"]
    assert group_now == json.loads(group_before)
    for a, b in meta_before.items():
        assert (path / a / "zarr.json").read_bytes() == b
    # readable by the zarr package as daisy's layout
    import zarr

    g = zarr.open_group(str(path), mode="r")
    assert g.attrs["daisy_task_hash"] == c["hash"]
    assert np.array_equal(g["done"][...], done)
    assert g["done"].dtype == np.uint8 and g["failures"].dtype == np.uint32
    # and a further rerun skips everything
    f2 = Recorder()
    s2 = run(fixture_task(name, path, f2), return_states=True)[name]
    assert f2.calls == [] and s2.skipped_count == s2.total_block_count


def test_daisy2_rerun_with_the_same_failures_matches_daisy(tmp_path):
    """t3d: daisy's second run (same failing block) is reproduced on top of its own store:
    same calls, same counters; failures keep accumulating (4 -> 6)."""
    c = EXPECTED["t3d"]
    path = copy_fixture("t3d", tmp_path)
    daisy_run2 = c["runs"][1]
    fail = [tuple(x["write_begin"]) for x in daisy_run2["calls"] if x["status"] == "failed"]
    f = Recorder(fail=fail)
    s = run(fixture_task("t3d", path, f), return_states=True)["t3d"]
    assert [list(x) for x in f.calls] == [x["write_begin"] for x in daisy_run2["calls"]]
    for k in ("completed", "skipped", "failed", "orphaned", "total"):
        assert getattr(s, f"{k}_count" if k != "total" else "total_block_count") == daisy_run2[k], k
    fails = np.asarray(read_tracking(path)["failures"])
    before = np.array(c["failures"])
    (cell,) = [tuple(x) for x in np.argwhere(before > 0)]
    assert fails[cell] == before[cell] + 2 and fails.sum() == before.sum() + 2
    assert np.array_equal(np.asarray(read_tracking(path)["done"]), np.array(c["done"], np.uint8))
    assert sorted(wb(b) for b in fixture_task("t3d", path, None).failed_blocks()) == sorted(
        tuple(x) for x in c["failed_blocks_write_begin"]
    )


@pytest.mark.parametrize("name", ["t2d", "t3d"])
def test_daisy2_failed_blocks(name, tmp_path):
    c = EXPECTED[name]
    path = copy_fixture(name, tmp_path)
    got = sorted(wb(b) for b in fixture_task(name, path, None).failed_blocks())
    assert got == sorted(tuple(x) for x in c["failed_blocks_write_begin"])


def test_daisy2_store_with_another_layout_is_refused(tmp_path):
    path = copy_fixture("t2d", tmp_path)
    f = Recorder()
    t = daisy.Task(
        "t2d",
        Roi((0, 0), (50, 30)),
        Roi((0, 0), (20, 20)),
        Roi((5, 5), (10, 10)),
        process_function=f,
        fit="overhang",
        tracking_path=str(path),
    )
    with pytest.raises(RuntimeError, match="different task layout") as ei:
        run(t)
    assert str(path) in str(ei.value)
    assert f.calls == []
    assert (path / "done" / "c" / "0" / "0").read_bytes() == (FIXTURE / "t2d" / "done" / "c" / "0" / "0").read_bytes()


def test_summary_keeps_one_line_per_task_whatever_its_id():
    """Task ids may hold control characters (as daisy 2.0.0 accepts them): the summary shows them
    escaped, so each task stays one aligned row."""
    import io

    from daisy_nb.progress import print_summary

    ids = ["a\nb", "tab\there", "ünï"]
    tasks = [
        daisy.Task(
            tid,
            Roi((0,), (10,)),
            Roi((0,), (1,)),
            Roi((0,), (1,)),
            process_function=lambda b: None,
            read_write_conflict=False,
        )
        for tid in ids
    ]
    states = daisy.run_blockwise(tasks, multiprocessing=False, progress=False, summary=False, return_states=True)
    buf = io.StringIO()
    print_summary(states, ids, file=buf)
    rows = [line for line in buf.getvalue().splitlines() if "✔" in line]
    assert [r.split()[0] for r in rows] == ["a\\nb", "tab\\there", "ünï"]
    assert len({len(r) for r in rows}) == 1  # aligned: every row as wide


def test_a_speculative_task_in_a_serial_run_warns_that_it_has_no_backups():
    """Backup copies need workers (the pool, Client jobs): a serial run says so, naming the task, at
    the user's call, and runs every block once; a plain task runs without the warning."""
    import warnings

    ran = []

    def task(tid, **kw):
        return daisy.Task(tid, Roi((0,), (6,)), Roi((0,), (1,)), Roi((0,), (1,)), process_function=ran.append, **kw)

    with pytest.warns(UserWarning, match=r"task 'spec': speculative=2\.5 has no effect in a serial") as rec:
        states = run([task("spec", speculative=2.5), task("plain")], progress=False, return_states=True)
    ours = [w for w in rec if "speculative" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == __file__  # the caller's line (stacklevel)
    assert states["spec"].completed_count == 6 and len(ran) == 12
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain task: no warning at all
        run(task("plain2"), progress=False)
