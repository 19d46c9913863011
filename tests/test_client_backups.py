"""Backup copies of stragglers for ``Client`` jobs, end to end: real programs over TCP.

A ``Task(speculative=True)`` whose worker functions run ``tests/workers/backupprog.py`` as their
jobs (``tests/workers/backupfns.py``). Block 0 straggles on one of its copies; the other blocks
take 20 ms. At the task's tail a job stays parked, gets a copy of block 0, and the first copy
to succeed counts; the other job is told to drop the block, its body is interrupted
(``BlockDropped``) and its loop goes on to its clean end. The counts are those of a run
without stragglers: every block done once, no failure, no job lost. Also the client's
``SIGINT`` handler: a drop interrupts only the block it names, and any other ``SIGINT`` still
reaches the handler it replaced.
"""

import contextlib
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import backupfns  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb.runtime.net import client as net_client  # noqa: E402
from daisy_nb.runtime.net import drops as net_drops  # noqa: E402

N = 40  # blocks
JOBS = 4


def run(fn):
    task = daisy_nb.Task(
        "t",
        Roi((0,), (10 * N,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=JOBS,
        max_retries=0,
        speculative=True,
        tracking_path=False,
    )
    return daisy_nb.Server().run_blockwise([task], progress=False, summary=False)["t"]


def record(out, name):
    return (out / name).read_text().split()


@pytest.mark.mp
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("mode", ["first-hangs", "copy-hangs"])
def test_a_straggler_copy_wins_or_loses_and_the_other_is_interrupted(out, mode):
    t0 = time.monotonic()
    st = run(backupfns.first_hangs if mode == "first-hangs" else backupfns.copy_hangs)
    assert time.monotonic() - t0 < 50, "the hanging copy was not interrupted (it runs for 60 s)"
    assert (st.completed_count, st.failed_count, st.orphaned_count) == (N, 0, 0)
    assert st.worker_failure_count == 0 and st.worker_restart_count == 0
    assert (out / "attempt_0").read_text() == "xx", "block 0 ran twice: its first attempt and one copy"
    done_pid, done_k = record(out, "done_0")
    int_pid, int_k, why = record(out, "interrupted_0")
    winner, loser = ("2", "1") if mode == "first-hangs" else ("1", "2")
    assert (done_k, int_k, why) == (winner, loser, "BlockDropped")
    assert done_pid != int_pid, "the copy ran in another job"
    ended = {p.name.split("_")[1] for p in out.glob("ended_*")}
    assert int_pid in ended, "the job whose copy was dropped went on to its clean end"
    for sid in range(1, N):
        assert (out / f"attempt_{sid}").read_text() == "x", f"block {sid} ran more than once"


@pytest.fixture(params=["default", "ignored"])
def armed_handler(request):
    """A client's SIGINT handler, armed for a client's drops over Python's default handler or over
    ``SIG_IGN`` (a program started in the background); the previous handler restored after."""
    prev = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler if request.param == "default" else signal.SIG_IGN)
    h = net_drops.SigintHandler()
    c = net_drops.Drops()
    h.arm(c)
    try:
        yield h, c
    finally:
        signal.signal(signal.SIGINT, prev)


def test_a_drop_interrupts_only_the_block_it_names_and_other_sigints_reach_the_old_handler(armed_handler):
    h, c = armed_handler
    assert signal.getsignal(signal.SIGINT) is h
    c.running, c.now = 7, 7  # the block that runs was dropped: its body gets BlockDropped
    with pytest.raises(net_drops.BlockDropped):
        signal.raise_signal(signal.SIGINT)
    assert c.now is None
    c.running, c.now = None, 7  # its body ended before the signal came: nothing happens
    signal.raise_signal(signal.SIGINT)
    assert c.now is None
    c.running = 8  # a SIGINT that is not a drop (Ctrl-C, the run's end): the handler it replaced
    if h.prev is signal.SIG_IGN:
        signal.raise_signal(signal.SIGINT)  # ignored, as before the client armed its handler
    else:
        assert h.prev is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_a_drop_that_comes_while_the_client_itself_runs_waits_to_be_sent_again(armed_handler):
    h, c = armed_handler
    c.running, c.now = 3, 3
    for mod in (net_client, net_drops, contextlib):  # the client's own code runs: not raised, kept for the next send
        h(signal.SIGINT, SimpleNamespace(f_code=SimpleNamespace(co_filename=mod.__file__)))
        assert c.now == 3
    with pytest.raises(net_drops.BlockDropped):
        h(signal.SIGINT, sys._getframe())  # the block's own code
    assert c.now is None
