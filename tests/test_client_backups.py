"""Backup copies of stragglers for ``Client`` jobs, end to end: real programs over TCP.

A ``Task(speculative=True)`` whose worker functions run ``tests/workers/backupprog.py`` as their
jobs (``tests/workers/backupfns.py``). Block 0 straggles on one of its copies; the other blocks
take 20 ms. At the task's tail a job stays parked, gets a copy of block 0, and the first copy
to succeed counts; the other job is told to drop the block, its body is interrupted
(``BlockDropped``) and its loop goes on to its clean end. The counts are those of a run
without stragglers: every block done once, no failure, no job lost. Also the client's
drop handler: a drop interrupts only the block it names, any other signal of that number still
reaches the handler it replaced, and the program's ``SIGINT`` is left alone.
"""

import contextlib
import signal
import subprocess
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
def test_a_straggler_copy_wins_or_loses_and_the_other_is_interrupted(out, mode, hand_outs):
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
    # every other block once, but for copies the hand-out sent: on a busy machine a 20 ms block
    # can pass 1.5 median block times at the task's tail, where it gets a copy too
    again = {sid: len((out / f"attempt_{sid}").read_text()) - 1 for sid in range(1, N)}
    assert all(k in (0, 1) for k in again.values()), again
    (core,) = hand_outs
    assert sum(again.values()) <= core.counts["backups"] - 1, (again, core.counts)


@pytest.fixture(params=["default", "ignored", "a handler"])
def armed_handler(request):
    """A client's drop handler, armed over the drop signal's default action, ``SIG_IGN`` or a
    program's own handler (it records the signals it gets); the previous handler restored after."""
    sig = net_drops.DROP_SIGNAL
    got: list = []
    before = {"default": signal.SIG_DFL, "ignored": signal.SIG_IGN, "a handler": lambda n, f: got.append(n)}
    prev = signal.signal(sig, before[request.param])
    h = net_drops.DropHandler()
    c = net_drops.Drops()
    h.arm(c)
    try:
        yield h, c, got
    finally:
        signal.signal(sig, prev)


def test_a_drop_interrupts_only_the_block_it_names_and_other_signals_reach_the_old_handler(armed_handler):
    h, c, got = armed_handler
    sig = net_drops.DROP_SIGNAL
    assert signal.getsignal(sig) is h and sig != signal.SIGINT
    c.running, c.now = 7, 7  # the block that runs was dropped: its body gets BlockDropped
    with pytest.raises(net_drops.BlockDropped):
        signal.raise_signal(sig)
    assert c.now is None
    c.running, c.now = None, 7  # its body ended before the signal came: nothing happens
    signal.raise_signal(sig)
    assert c.now is None and got == []
    c.running = 8  # the same signal, not a drop (sent by someone else): the handler it replaced
    if h.prev is signal.SIG_DFL:  # the default action ends the process: seen in a child
        code = (
            "import signal; from daisy_nb.runtime.net import drops as d; "
            "c = d.Drops(); d.DropHandler().arm(c); c.running = 8; signal.raise_signal(d.DROP_SIGNAL); print('alive')"
        )
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert child.returncode == -sig and "alive" not in child.stdout, (child.returncode, child.stderr)
    else:
        signal.raise_signal(sig)  # ignored, or the program's handler called
        assert got == ([] if h.prev is signal.SIG_IGN else [sig])
    assert signal.getsignal(sig) is h


def test_arming_the_drop_handler_leaves_sigint_and_what_children_inherit_alone():
    """A job started in the background (SIGINT ignored) keeps SIGINT ignored once its client
    armed the drop handler, and so do the programs it starts (they inherit the disposition)."""
    prev_int, prev_drop = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.getsignal(net_drops.DROP_SIGNAL)
    try:
        net_drops.DropHandler().arm(net_drops.Drops())
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert child.stdout.strip() == "True", child.stderr
    finally:
        signal.signal(signal.SIGINT, prev_int)
        signal.signal(net_drops.DROP_SIGNAL, prev_drop)


def test_a_drop_that_comes_while_the_client_itself_runs_waits_to_be_sent_again(armed_handler):
    h, c, _ = armed_handler
    c.running, c.now = 3, 3
    for mod in (net_client, net_drops, contextlib):  # the client's own code runs: not raised, kept for the next send
        h(net_drops.DROP_SIGNAL, SimpleNamespace(f_code=SimpleNamespace(co_filename=mod.__file__)))
        assert c.now == 3
    with pytest.raises(net_drops.BlockDropped):
        h(net_drops.DROP_SIGNAL, sys._getframe())  # the block's own code
    assert c.now is None
