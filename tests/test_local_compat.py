"""Local worker deaths and fire-and-forget worker functions, counted as daisy 2.0.0 (the wheel) counts them.

Measured on the wheel (``daisy==2.0.0``) with the same functions:

* a block worker that dies mid-block (``os._exit(3)``) after finishing 3 blocks is a crash:
  ``worker_restart_count == 1``, and nothing is said about a walltime (a local worker has none);
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
