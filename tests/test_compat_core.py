"""Behaviour as daisy 2.0.0's wheel shows it (checked by running the wheel): the check_function
warning and log, and the capped traceback's first line."""

import logging
import warnings

import pytest
from funlib.geometry import Roi

import daisy_nb
from daisy_nb.block import BlockStatus
from daisy_nb.runtime.common.run_block import TB_CAP_BYTES, TB_CAP_LINES, TB_TRUNCATED, cap_traceback
from daisy_nb.scheduler import Scheduler


def _task(**kw):
    return daisy_nb.Task("t", Roi((0,), (3,)), Roi((0,), (1,)), Roi((0,), (1,)), read_write_conflict=False,
                         tracking_path=False, **kw)  # fmt: skip


def test_check_function_warns_pointing_to_done_markers():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _task(check_function=lambda b: False)
    msgs = [x for x in w if issubclass(x.category, UserWarning) and "check_function" in str(x.message)]
    assert len(msgs) == 1
    text = str(msgs[0].message)
    assert text.startswith("Task(check_function=...) runs your callable on the server for EVERY block")
    assert "done markers (Task(tracking_path=...)" in text
    assert msgs[0].filename == __file__  # points to the caller, not into daisy_nb


def test_no_warning_without_check_function():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _task()
    assert not [x for x in w if "check_function" in str(x.message)]


def test_a_raising_check_function_is_logged_once_on_daisys_logger_with_its_text(caplog):
    def check(block):
        raise ValueError(f"cannot read chunk {block.block_id[1]}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        s = Scheduler([_task(check_function=check)])
    with caplog.at_level(logging.WARNING):
        got = []
        while (b := s.acquire_block("t")) is not None:  # every block is treated as not done: handed out
            got.append(b.block_id[1])
            b.status = BlockStatus.SUCCESS
            s.release_block(b)
    assert got == [0, 1, 2]
    recs = [r for r in caplog.records if "check_function" in r.getMessage()]
    assert len(recs) == 1  # once per task
    r = recs[0]
    assert r.name == "daisy" and r.levelno == logging.WARNING
    msg = r.getMessage()
    assert msg.startswith('check_function for task "t" raised; treating block t/0 as not done')
    assert "ValueError: cannot read chunk 0" in msg  # the exception's text, in the message itself
    assert "scheduler.py" not in msg  # the user's frames only


def test_short_tracebacks_are_kept_whole():
    tb = 'Traceback (most recent call last):\n  File "x", line 1, in f\nValueError: x\n'
    assert cap_traceback(tb) == tb


def test_too_many_lines_keep_the_last_ones_after_the_marker():
    tb = "\n".join(f"line {i}" for i in range(300))
    out = cap_traceback(tb)
    lines = out.splitlines()
    assert lines[0] == TB_TRUNCATED == "... (traceback truncated) ..."
    assert lines[1:] == [f"line {i}" for i in range(300 - TB_CAP_LINES, 300)]


def test_too_many_characters_keep_the_last_ones_after_the_marker():
    tb = ("y" * 500 + "\n") * 30
    out = cap_traceback(tb)
    assert out == f"{TB_TRUNCATED}\n" + tb[-TB_CAP_BYTES:]  # as the wheel: 8,222 characters here
    assert len(out) == 8222


def test_exactly_at_the_caps_is_not_truncated():
    tb = "\n".join("z" for _ in range(TB_CAP_LINES))
    assert cap_traceback(tb) == tb
    tb = "x" * TB_CAP_BYTES
    assert cap_traceback(tb) == tb


@pytest.mark.parametrize("n", [51, 1000])
def test_marker_once_whatever_the_length(n):
    out = cap_traceback("\n".join(str(i) for i in range(n)))
    assert out.count(TB_TRUNCATED) == 1


def test_an_observer_that_raises_is_reported_once_at_warning_and_the_run_goes_on(caplog):
    """progress.notify: a user's observer bug is said once per event, with its traceback."""
    from daisy_nb.progress import notify

    class Buggy:
        calls = 0

        def on_progress(self, states):
            Buggy.calls += 1
            raise ZeroDivisionError("observer bug")

    s = Scheduler([_task()])
    obs = Buggy()
    with caplog.at_level(logging.DEBUG, logger="daisy"):
        for _ in range(3):
            notify(obs, "on_progress", s)
    assert Buggy.calls == 3
    warns = [r for r in caplog.records if r.levelno == logging.WARNING and "observer" in r.getMessage()]
    assert len(warns) == 1
    assert warns[0].name == "daisy" and "Buggy raised in on_progress" in warns[0].getMessage()
    assert warns[0].exc_info and warns[0].exc_info[0] is ZeroDivisionError


def test_bars_are_drawn_at_the_start_and_end_with_each_tasks_outcome():
    """One bar per task in the given order, drawn at ``on_start`` (tqdm is imported when the
    observer is made, before the run starts), updated to the end, marked with the outcome."""
    import io

    from daisy_nb import progress

    def task(tid):
        one = Roi((0,), (1,))
        return daisy_nb.Task(
            tid, Roi((0,), (3,)), one, one, read_write_conflict=False, tracking_path=False, max_retries=0
        )

    s = Scheduler([task("a"), task("b")])
    out = io.StringIO()
    obs = progress.TqdmObserver(task_order=["b", "a"], file=out)
    obs.on_start(s.task_states)
    text = out.getvalue()
    assert "0/3" in text and text.index("b ▶") < text.index("a ▶")
    for tid in ("a", "b"):
        while (blk := s.acquire_block(tid)) is not None:
            blk.status = BlockStatus.SUCCESS if tid == "a" else BlockStatus.FAILED
            s.release_block(blk)
    obs.on_finish(s.task_states)
    text = out.getvalue()
    assert "a ✔" in text and "b ✗" in text and "3/3" in text
