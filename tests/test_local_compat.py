"""Local worker deaths and fire-and-forget worker functions, counted as daisy 2.0.0 (the wheel) counts them.

Measured on the wheel (``daisy==2.0.0``) with the same functions:

* a block worker that dies mid-block (``os._exit(3)``) after finishing 3 blocks is a crash:
  ``worker_restart_count == 1``, and nothing is said about a walltime (a local worker has none);
* a block function that raises (2 workers, ``max_retries`` 0 and 2): the task's
  ``first_worker_error`` and ``last_worker_error`` are blocks' tracebacks, not the workers'
  exits (``daisy worker subprocess exited with code 1``); when the restart cap abandons the task,
  its "Last worker error" is the exit that used the cap up (its stderr tail quotes the block's);
* a 0-argument worker function that starts its program with ``subprocess.Popen`` and returns:
  the program is not killed when the function returns; the function is respawned about once a
  second, and the program's late connection stops the run with a ``RuntimeError`` ("connected
  after its spawn function had already returned", naming ``sbatch --wait``, ``srun``,
  ``subprocess.run``) after a few spawns.

Real worker processes and real programs (``tests/workers/localfns.py``, ``late_prog.py``).
"""

import logging
import time

import pytest
from funlib.geometry import Roi

import daisy_nb

pytestmark = [pytest.mark.mp, pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]


def make_task(tid, n, fn, **kw):
    return daisy_nb.Task(
        tid,
        Roi((0,), (10 * n,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        tracking_path=False,
        **kw,
    )


def test_block_worker_that_dies_after_finished_blocks_is_a_crash(out, caplog):
    import localfns

    task = make_task("x3", 20, localfns.exit3_after_three, max_workers=1, max_worker_restarts=2)
    with caplog.at_level(logging.INFO, logger="daisy"):
        st = daisy_nb.run_blockwise([task], progress=False, summary=False, return_states=True)["x3"]
    assert (out / "died").exists()
    assert st.completed_count == 20 and st.failed_count == 0 and not st.abandoned
    # the wheel: ♻=1 (a restart), a crash; daisy_nb: the same, and no job-end exemption
    assert (st.worker_failure_count, st.worker_restart_count, st.worker_job_end_count) == (1, 1, 0)
    assert st.worker_start_count == 2
    assert "exited with code 3" in st.last_worker_error
    for text in (st.last_worker_error, caplog.text):
        assert "walltime" not in text and "job end" not in text


@pytest.mark.parametrize("retries", [0, 2])
def test_a_raising_block_is_the_last_worker_error_as_the_wheel(out, retries):
    import localfns

    task = make_task("rb", 4, localfns.raises_boom, max_workers=2, max_retries=retries)
    st = daisy_nb.run_blockwise([task], progress=False, summary=False, return_states=True)["rb"]
    assert st.failed_count == 4 and st.completed_count == 0 and not st.abandoned
    # the wheel: 4 exits and 2 restarts (max_retries=0), 12 and 10 (max_retries=2), as before
    assert st.worker_failure_count == st.worker_start_count == 4 * (retries + 1)
    for text in (st.first_worker_error, st.last_worker_error):
        assert text.startswith("block ('rb', ") and "Traceback (most recent call last)" in text, text
        assert text.rstrip().endswith(f"ValueError: boom {text.split(chr(10))[0][6:-8]}"), text
        assert "exited with code" not in text
    # the errors are grouped from the structured messages: the block's type and message, its block id
    groups = {g["type"]: g for g in st.error_groups.as_list()}
    assert groups["ValueError"]["count"] == 4 * (retries + 1) and groups["ValueError"]["message"].startswith("boom")
    assert groups["ValueError"]["first_block"] in range(4)
    assert groups["worker error"]["count"] == st.worker_failure_count  # the exits are still counted


def test_abandonment_names_the_exit_that_used_up_the_cap_as_the_wheel(out):
    """The wheel (same task): the abandonment's "Last worker error" is the exit the cap did not let
    be replaced, with its stderr tail quoting the block's traceback."""
    import localfns

    task = make_task("ab", 8, localfns.raises_boom, max_workers=2, max_retries=5, max_worker_restarts=1)
    with pytest.raises(RuntimeError, match="was abandoned") as e:
        daisy_nb.run_blockwise([task], progress=False, summary=False)
    st = e.value.daisy_states["ab"]
    last = str(e.value).split("Last worker error: ", 1)[1]
    assert last == st.last_worker_error
    assert last.startswith("daisy worker process exited with code 1") and "worker stderr tail:" in last
    assert "ValueError: boom ('ab', " in last
    assert st.first_worker_error.startswith("block ('ab', ") and "exited with code" not in st.first_worker_error


def test_fire_and_forget_worker_function_stops_the_run_as_the_wheel(out, caplog):
    import localfns

    task = make_task("ff", 20, localfns.fire_and_forget, max_workers=1, max_worker_restarts=50)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="daisy"), pytest.raises(RuntimeError) as ei:
        daisy_nb.run_blockwise([task], progress=False, summary=False)
    secs = time.monotonic() - t0
    spawns = list(out.glob("spawn_*"))
    progs = list(out.glob("prog_*"))
    # the program was not killed when its function returned: it connected, late
    assert progs, "no fire-and-forget program lived to connect"
    # a few spawns (the wheel: about one a second), never hundreds
    assert 1 <= len(spawns) <= 6, (len(spawns), secs)
    text = str(ei.value) + caplog.text
    assert "already returned" in text
    for name in ("sbatch --wait", "srun", "subprocess.run", "daisy_nb.launch"):
        assert name in text, name
    states = ei.value.daisy_states
    assert states["ff"].abandoned and states["ff"].completed_count == 0
    # and like every job it ended with the run (it was reparented when its function returned: checked by pid)
    import harness

    pids = {int(p.name.split("_")[1]) for p in progs}
    assert not harness.alive_after(pids, wait=5.0)


def test_a_worker_of_another_pipe_version_fails_loudly(out, monkeypatch):
    """A worker whose pipe protocol differs from the pool's (another daisy_nb installed since the driver
    started) exits non-zero saying what to do; the run does not read it as "done"."""
    import blockfns

    from daisy_nb.runtime.local import wire

    monkeypatch.setattr(wire, "VERSION", wire.VERSION + 1000)  # the driver's side only: workers are processes
    task = make_task("ver", 4, blockfns.mark, max_workers=1, max_worker_restarts=0)
    with pytest.raises(RuntimeError, match="abandoned") as ei:
        daisy_nb.run_blockwise([task], progress=False, summary=False)
    st = ei.value.daisy_states["ver"]
    assert st.abandoned and st.completed_count == 0
    assert f"exited with code {wire.VERSION_MISMATCH_EXIT}" in st.last_worker_error
    assert "install the same daisy_nb version as the driver" in st.last_worker_error
    assert not list(out.glob("done_*"))


def test_a_worker_that_writes_before_the_pool_has_closed_its_logs_keeps_its_stderr_tail(out, monkeypatch):
    """A worker's stderr tail starts where its log file ended when it was opened for it: the pool
    closes its copies of the worker's log files only after the fork, when a worker that failed at
    once (a busy machine) has written to them, and that file's offset, shared with the worker's
    fds, has moved past what it wrote. The pool here waits for the worker's write before closing."""
    import os

    import blockfns

    from daisy_nb.runtime.local import starter, wire

    close = starter._Starting.close

    def close_after_the_worker_wrote(self):
        if self.logs and not self.closed:
            fd, size = self.logs[1].fileno(), os.fstat(self.logs[1].fileno()).st_size
            deadline = time.monotonic() + 30
            while os.fstat(fd).st_size == size and time.monotonic() < deadline:
                time.sleep(0.005)
        close(self)

    monkeypatch.setattr(starter._Starting, "close", close_after_the_worker_wrote)
    monkeypatch.setattr(wire, "VERSION", wire.VERSION + 1000)  # the worker writes its refusal, then exits
    task = make_task("ver", 4, blockfns.mark, max_workers=1, max_worker_restarts=0)
    with pytest.raises(RuntimeError, match="abandoned") as ei:
        daisy_nb.run_blockwise([task], progress=False, summary=False)
    assert "install the same daisy_nb version as the driver" in ei.value.daisy_states["ver"].last_worker_error


def test_the_pool_pipe_carries_a_raised_block_structured():
    """The worker -> pool frame of a raised block keeps type, message and traceback apart (any text,
    newlines and non-ASCII included) and refuses a frame whose fields do not add up."""
    from daisy_nb.runtime.local import wire

    err = wire.Raised("KeyError", "'é'\nsecond line", "Traceback (most recent call last):\nKeyError: 'é'", 2**40)
    m = wire.decode(wire.raised(1, err))
    assert (m.kind, m.slot, m.error) == (wire.Kind.RAISED, 1, err)
    assert err.text("t") == f"block ('t', {2**40}) failed:\n{err.traceback}"
    with pytest.raises(ValueError, match="fields make"):
        wire.decode(wire.raised(1, err) + b"x")
