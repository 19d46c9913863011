"""Dry run: the plan says what the run then really does, and runs nothing itself."""

import hashlib
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc

import blockfns
import harness
import numpy as np
import planfns
import pytest

import daisy_nb as daisy
from daisy_nb import Roi
from daisy_nb.plan import Plan, make_plan
from daisy_nb.scheduler import Scheduler

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pipeline(tmp_path, fn, mask=None):
    """a (conflicts, tracked) -> b (tracked, optional skip_mask) -> c (untracked): 81 blocks each."""
    a = daisy.Task(
        "a", Roi((0, 0), (92, 92)), Roi((0, 0), (12, 12)), Roi((1, 1), (10, 10)), process_function=fn,
        read_write_conflict=True, tracking_path=tmp_path / "trk" / "a", max_retries=0, max_workers=2,
    )  # fmt: skip
    b = daisy.Task(
        "b", Roi((1, 1), (90, 90)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)), process_function=fn,
        read_write_conflict=False, tracking_path=tmp_path / "trk" / "b", max_retries=0, skip_mask=mask,
    )  # fmt: skip
    c = daisy.Task(
        "c", Roi((1, 1), (90, 90)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)), process_function=fn,
        read_write_conflict=False, tracking_path=False, max_retries=0,
    )  # fmt: skip
    return a + b + c


def _snapshot(root):
    """Every file under ``root``: its bytes and mtime (a dry run must change none)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[p] = (hashlib.sha256(fh.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return out


def _sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _done_files(out, task):
    return sum(1 for n in os.listdir(out) if n.startswith(f"done_{task}_"))


def test_plan_matches_what_the_run_then_does(tmp_path, out, no_leaks):
    # an earlier run finished part of a and b (see planfns.fail_some); c is not tracked
    first = daisy.run_blockwise(
        _pipeline(tmp_path, planfns.fail_some), multiprocessing=False, progress=False, summary=False,
        return_states=True,
    )  # fmt: skip
    assert (first["a"].completed_count, first["a"].failed_count) == (56, 25)
    assert (first["b"].completed_count, first["b"].failed_count, first["b"].orphaned_count) == (20, 36, 25)
    for n in os.listdir(out):
        os.unlink(out / n)
    mask = np.zeros((9, 9), bool)
    mask[:3] = True  # 27 blocks, of which 8 are done already (columns 0 and 2, odd rows)
    pipeline = _pipeline(tmp_path, blockfns.done, mask)
    before, children, sockets = _snapshot(tmp_path / "trk"), harness.children(), _sockets()
    plan = daisy.run_blockwise(pipeline, dry_run=True)
    assert isinstance(plan, Plan)
    assert _snapshot(tmp_path / "trk") == before  # read only
    assert harness.children() == children and _sockets() == sockets  # no worker, no listener
    assert os.listdir(out) == []  # no block ran
    got = {t.task_id: (t.blocks, t.levels, t.done_by_tracking, t.skipped_by_mask, t.to_run) for t in plan.tasks}
    assert got == {"a": (81, 4, 56, 0, 25), "b": (81, 1, 20, 19, 42), "c": (81, 1, None, 0, 81)}
    assert [t.upstream for t in plan.tasks] == [[], ["a"], ["b"]]
    assert plan.to_run == 25 + 42 + 81

    states = daisy.run_blockwise(pipeline, progress=False, summary=False, return_states=True)
    for tp in plan.tasks:
        st = states[tp.task_id]
        assert st.total_block_count == tp.blocks
        assert st.skipped_count == (tp.done_by_tracking or 0) + tp.skipped_by_mask
        assert st.completed_count - st.skipped_count == tp.to_run
        assert _done_files(out, tp.task_id) == tp.to_run  # the blocks that really ran
    # and now tracking has everything: the next plan runs nothing of a and b
    again = make_plan(pipeline)
    assert again.task("a").to_run == 0 and again.task("b").to_run == 0 and again.task("c").to_run == 81


def test_dry_run_creates_no_tracking_and_describes_workers(tmp_path):
    def work(block):
        pass

    t = daisy.Task(
        "gpu", Roi((0,), (1000,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=work,
        tracking_path=tmp_path / "new", requires={"gpu": 1}, max_workers=4, check_function=lambda b: False,
    )  # fmt: skip
    plan = daisy.Server().run_blockwise(t, resources={"gpu": 2}, dry_run=True)
    assert not (tmp_path / "new").exists()
    tp = plan.task("gpu")
    assert (tp.blocks, tp.done_by_tracking, tp.to_run, tp.tracking_note) == (
        100,
        0,
        100,
        "none yet: the run creates it",
    )
    assert tp.kind == "block function" and tp.function.endswith("work") and tp.requires == {"gpu": 1}
    assert plan.resources == {"gpu": 2} and not plan.problems
    text = str(plan)
    assert "4 (2 at once)" in text and "upper bound" in text  # the budget caps the workers; check_function
    d = plan.to_dict()
    assert d["to_run"] == 100 and d["tasks"][0]["max_workers"] == 4
    # what the run would raise at its start is in the plan, not a traceback
    bad = daisy.run_blockwise(t, resources={}, dry_run=True)
    assert any("requires {gpu: 1}" in p for p in bad.problems) and "PROBLEM" in str(bad)


def test_a_store_of_another_layout_is_a_problem_not_a_change(tmp_path):
    old = daisy.Task(
        "t", Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=blockfns.noop,
        tracking_path=tmp_path / "t",
    )  # fmt: skip
    daisy.run_blockwise(old, multiprocessing=False, progress=False, summary=False)
    before = _snapshot(tmp_path / "t")
    new = daisy.Task(
        "t", Roi((0,), (100,)), Roi((0,), (20,)), Roi((0,), (20,)), process_function=blockfns.noop,
        tracking_path=tmp_path / "t",
    )  # fmt: skip
    plan = make_plan(new)
    assert _snapshot(tmp_path / "t") == before
    assert plan.problems and "different task layout" in plan.problems[0]
    with pytest.raises(RuntimeError, match="different task layout"):
        daisy.run_blockwise(new, multiprocessing=False, progress=False, summary=False)


@pytest.mark.parametrize(
    "tasks",
    [
        lambda: daisy.Task("x", Roi((0,), (1000,)), Roi((0,), (12,)), Roi((1,), (10,)), read_write_conflict=True),
        lambda: (
            daisy.Task(
                "y",
                Roi((0, 0, 0), (95, 80, 64)),
                Roi((0, 0, 0), (14, 14, 14)),
                Roi((2, 2, 2), (10, 10, 10)),
                fit="shrink",
            )
            + daisy.Task("z", Roi((2, 2, 2), (90, 70, 60)), Roi((0, 0, 0), (20, 20, 20)), Roi((5, 5, 5), (10, 10, 10)))
        ),
        lambda: (
            (
                daisy.Task("p", Roi((0, 0), (200, 200)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)))
                | daisy.Task("q", Roi((0, 0), (200, 200)), Roi((0, 0), (30, 30)), Roi((10, 10), (10, 10)))
            )
            + daisy.Task("r", Roi((0, 0), (200, 200)), Roi((0, 0), (50, 50)), Roi((20, 20), (10, 10)))
        ),
    ],
)
def test_expected_memory_is_what_the_scheduler_allocates(tasks):
    pipeline = tasks()
    plan = make_plan(pipeline)
    with Scheduler(pipeline, block_tracking=False) as s:
        assert plan.scheduler_bytes == s._b.nbytes + s._u8.nbytes + s.n_met.nbytes
        assert plan.state_bytes == 15 * s.num_blocks_total


def test_expected_memory_against_the_measured_peak():
    # 3-D, conflicts, 512k blocks: the peak of building the Scheduler and running every block (batches)
    t = daisy.Task("m", Roi((0, 0, 0), (802, 802, 802)), Roi((0, 0, 0), (12, 12, 12)), Roi((1, 1, 1), (10, 10, 10)))
    plan = make_plan(t, block_tracking=False)
    assert plan.blocks == 80**3
    tracemalloc.start()
    try:
        with Scheduler(t, block_tracking=False) as s:
            while not s.is_done():
                b = s.acquire_blocks("m", 4096)
                s.release_blocks("m", b.index, np.full(len(b), 2, np.uint8))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 1.0 <= peak / plan.expected_bytes <= 1.25, (peak, plan.expected_bytes)


def test_a_1e8_block_plan_takes_seconds():
    t = daisy.Task(
        "huge", Roi((0, 0, 0), (4642, 4642, 4642)), Roi((0, 0, 0), (10, 10, 10)), Roi((0, 0, 0), (10, 10, 10)),
        read_write_conflict=True, tracking_path=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    plan = make_plan(t)
    assert time.perf_counter() - t0 < 10
    assert plan.blocks == 464**3 and plan.task("huge").levels == 1 and plan.state_bytes == 15 * 464**3


def test_daisy_nb_run_dry_run_prints_the_plan_and_exits_0(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import daisy
            from daisy import Roi

            def work(block):
                open({str(tmp_path / "ran")!r}, "w").close()

            print("before the run", flush=True)
            t = daisy.Task("seg", Roi((0, 0), (100, 100)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)),
                           process_function=work, tracking_path={str(tmp_path / "trk")!r})
            daisy.Server().run_blockwise([t])
            print("after the run")
            """
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "run", "--dry-run", str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("before the run\nDry run (nothing was run): 1 task(s), 100 blocks, 100 to run")
    assert "seg" in r.stdout and "after the run" not in r.stdout
    assert not (tmp_path / "ran").exists() and not (tmp_path / "trk").exists()


def test_plan_classes_are_top_level_exports():
    """``daisy_nb.Plan`` (what ``dry_run=True`` returns) and ``TaskPlan`` without reaching into submodules."""
    import daisy_nb
    from daisy_nb import plan

    assert daisy_nb.Plan is plan.Plan and daisy_nb.TaskPlan is plan.TaskPlan
    assert {"Plan", "TaskPlan"} <= set(daisy_nb.__all__)
