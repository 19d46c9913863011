"""The scheduler as a TCP server (issue 21): a release asks for the next block, every readable
connection taken in one pass with one scheduler call per task, blocks sent ahead whatever
their time, quiet time between passes, and the list API behind it.

Real worker programs (0-argument worker functions running ``daisy_nb.Client`` loops over
TCP on 127.0.0.1) and real tracking stores; the frames a run exchanges are the counts of its
hand-out core (``HandOut.counts``), the scheduler calls counted by wrapping its list API
(``ListedCalls``). The decisions themselves are tested without processes in test_net_handout.py.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from funlib.geometry import Roi
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import blockfns  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb.runtime.local.pool_parts import Waitables  # noqa: E402
from daisy_nb.scheduler import Scheduler  # noqa: E402
from daisy_nb.scheduling.listed import ListedCalls  # noqa: E402
from daisy_nb.tracking import read_tracking  # noqa: E402


def make_task(tid, n, fn, **kw):
    kw.setdefault("tracking_path", False)
    return daisy_nb.Task(
        tid, Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=fn,
        read_write_conflict=False, **kw,
    )  # fmt: skip


def run(task, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("summary", False)
    return daisy_nb.run_blockwise(task, return_states=True, host="127.0.0.1", **kw)


def done_ids(out, tid):
    return sorted(int(p.name.rsplit("_", 1)[1]) for p in out.glob(f"done_{tid}_*"))


class _Seen(dict):
    """The counts of the run's hand-out core (``HandOut.counts``: passes, messages by kind, blocks
    sent and sent ahead) merged with the scheduler calls counted here."""

    def __init__(self, cores, calls):
        super().__init__()
        self.cores, self.calls = cores, calls

    def _merged(self):
        out = dict(self.calls)
        for core in self.cores:
            for k, v in core.counts.items():
                out[k] = out.get(k, 0) + v
        return out

    def __getitem__(self, k):
        return self._merged()[k]

    def get(self, k, default=None):
        return self._merged().get(k, default)

    def __repr__(self):
        return repr(self._merged())


@pytest.fixture
def counted(monkeypatch, hand_outs):
    """Frames received by kind, blocks sent (and how many ahead), passes (the core's own counts) and
    scheduler calls (wrapping the list API, ``ListedCalls``)."""
    calls = {"release_calls": 0, "acquire_calls": 0, "released": 0}
    release, acquire = ListedCalls.release, ListedCalls.acquire

    def counted_release(self, task_id, index, status):
        calls["release_calls"] += 1
        calls["released"] += len(index)
        return release(self, task_id, index, status)

    def counted_acquire(self, task_id, max_n):
        calls["acquire_calls"] += 1
        return acquire(self, task_id, max_n)

    monkeypatch.setattr(ListedCalls, "release", counted_release)
    monkeypatch.setattr(ListedCalls, "acquire", counted_acquire)
    return _Seen(hand_outs, calls)


@pytest.mark.mp
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_a_release_asks_for_the_next_block(out, counted):
    """One frame each way per block: a worker's loop sends ``A`` once (its first block) and an
    ``R`` per block, and every block sent is one it ran."""
    st = run(make_task("r", 60, blockfns.client_loop, max_workers=1, max_retries=0))["r"]
    assert st.completed_count == 60 and st.failed_count == 0
    assert counted["R"] == 60 and counted.get("A", 0) == 1, counted
    assert counted["sent"] == 60 and len(done_ids(out, "r")) == 60


@pytest.mark.mp
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_a_raised_block_asks_again_with_an_acquire(out, counted, monkeypatch):
    """A failure (``F``) is no request: a loop that goes on after it asks with ``A``, unless it
    holds a block already (sent ahead before the failure, it reached the client after the
    client gave back what it held: on a busy machine); the scheduler answers no ``F``."""
    from daisy_nb.runtime.net import wire
    from daisy_nb.runtime.net.handout import HandOut

    after_failure: list[tuple[bool, str]] = []  # per F: the connection held a block sent ahead; what came next
    on_msg = HandOut._on_msg

    answered: list[bool] = []  # per F: the hand-out took it as a request (it must not)

    def seen(self, cc, msg, batch, now_ns):
        if after_failure and after_failure[-1][1] == "" and msg is not wire.PING:
            after_failure[-1] = (after_failure[-1][0], type(msg).__name__ if msg is not wire.ACQUIRE else "A")
        if isinstance(msg, wire.Failure):
            after_failure.append((len(cc.held) > 1, ""))
            asked = cc in batch.want or cc in batch.ahead
        on_msg(self, cc, msg, batch, now_ns)
        if isinstance(msg, wire.Failure):
            answered.append(not asked and (cc in batch.want or cc in batch.ahead or cc in self.parked.get(cc.tr, {})))

    monkeypatch.setattr(HandOut, "_on_msg", seen)
    task = make_task("f", 12, blockfns.client_loop_catching, max_workers=1, max_retries=1, max_worker_restarts=5)
    st = run(task)["f"]
    assert st.completed_count == 11 and st.failed_count == 1
    assert counted["F"] == 2 == len(after_failure)  # block 7 raised in both attempts
    assert answered == [False, False]
    # after each F: an A, a give-back and then an A, or the release of a block it held already
    assert all(nxt in ("A", "GiveBack") or (nxt == "Release" and held) for held, nxt in after_failure), after_failure
    used = sum(nxt == "Release" for _, nxt in after_failure)
    assert counted.get("A", 0) == 1 + counted["F"] - used, counted  # the first block, then after each F


@pytest.mark.mp
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_slow_blocks_go_ahead_and_a_killed_job_gives_each_back_once(out, counted, tmp_path):
    """30 ms blocks are sent ahead too; a job killed inside block 5 with another block waiting
    behind it: block 5 fails (one attempt, no retries), the one behind it goes back uncounted
    and runs elsewhere, and tracking holds exactly the blocks that ran to their end."""
    trk = tmp_path / "trk"
    task = make_task("s", 40, blockfns.client_loop_slow_killed_on_5, max_workers=2, max_retries=0, tracking_path=trk)
    st = run(task)["s"]
    ran = done_ids(out, "s")
    assert st.failed_count == 1 and st.completed_count == 39 and st.worker_failure_count == 1
    assert 5 not in ran and len(ran) == 39 == len(set(ran))  # none ran twice to its end
    attempts = {i: (out / f"attempt_s_{i}").stat().st_size for i in range(40)}
    assert attempts[5] == 1 and all(v == 1 for v in attempts.values()), attempts  # each block once
    marks = np.flatnonzero(np.asarray(read_tracking(trk)["done"])).tolist()
    assert marks == ran  # nothing recorded done that did not finish, nothing twice
    assert counted["ahead"] >= 10, counted


@pytest.mark.mp
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_frames_of_several_connections_are_taken_in_one_pass(out, counted):
    """8 jobs of 20 ms blocks: the quiet time lets releases gather, and each pass makes one
    release call and at most one acquisition per task for all of them."""
    n = 320
    st = run(make_task("p", n, blockfns.client_loop_sleep_20ms, max_workers=8, max_retries=0))["p"]
    assert st.completed_count == n and st.failed_count == 0 and len(done_ids(out, "p")) == n
    assert counted["released"] == n
    assert counted["release_calls"] <= counted["passes"]  # never more than one per pass (one task)
    assert counted["acquire_calls"] <= 2 * counted["passes"]  # blocks asked for, then blocks ahead
    # fewer passes than blocks: frames of several connections gathered (one per block without)
    assert counted["passes"] < 0.8 * n, counted
    assert counted["ahead"] >= n / 2, counted


# ------------------------------------------------------------------ the list API
def _scheduler(n, conflict, check=None):
    task = daisy_nb.Task(
        "t", Roi((0, 0), (4 * n, 8)), Roi((0, 0), (6, 6)), Roi((1, 1), (4, 4)), process_function=blockfns.noop,
        read_write_conflict=conflict, fit="shrink", max_retries=1, check_function=check,
    )  # fmt: skip
    return Scheduler([task])


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    conflict=st.booleans(),
    script=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3)), min_size=1, max_size=40),
)
def test_the_list_api_runs_as_the_batch_api(n, conflict, script):
    """``ListedCalls.acquire``/``release`` (what the TCP path calls) hand out and release
    exactly as ``acquire_blocks``/``release_blocks``: same blocks, ROIs, order and counters."""
    a, b = _scheduler(n, conflict), _scheduler(n, conflict)
    listed = ListedCalls(b)
    held_a: list[int] = []
    held_b: list[int] = []
    for k, code_pick in script:
        ba = a.acquire_blocks("t", k)
        rows = listed.acquire("t", k)
        cols = (ba.index, ba.spatial_id, ba.read_offset, ba.read_shape, ba.write_offset, ba.write_shape)
        expect = [[i, sid, *ro, *rs, *wo, *ws] for i, sid, ro, rs, wo, ws in zip(*(c.tolist() for c in cols))]
        assert rows == expect
        held_a += ba.index.tolist()
        held_b += [r[0] for r in rows]
        if held_a:  # release the oldest one or two with a status from the pick
            m = 1 + code_pick % 2
            idx, held_a, held_b = held_a[:m], held_a[m:], held_b[m:]
            code = (0, 2, 3, 2)[code_pick]
            a.release_blocks("t", np.array(idx, np.int64), np.full(len(idx), code, np.uint8))
            listed.release("t", idx, [code] * len(idx))
        sa, sb = (dict(vars(x.task_states["t"])) for x in (a, b))
        assert sa.pop("error_groups").total == sb.pop("error_groups").total and sa == sb
        assert a.ready_count("t") == b.ready_count("t") and a.remaining_count("t") == b.remaining_count("t")


def test_the_list_api_prechecks_with_the_check_function():
    seen = []

    def check(block):
        seen.append(block.block_id)
        return block.block_id[1] % 2 == 0  # even ids are done already

    s = _scheduler(4, False, check)
    rows = ListedCalls(s).acquire("t", 1)
    assert rows and rows[0][1] % 2 == 1 and seen  # the first not-done block, after the checks
    ref = _scheduler(4, False, check)
    assert rows[0][0] == int(ref.acquire_blocks("t", 1).index[0])


# ------------------------------------------------------------------ Waitables (epoll)
def test_waitables_track_adds_discards_and_reused_descriptors():
    wake_r, wake_w = os.pipe()
    w = Waitables(wake_r)
    try:
        r1, w1 = os.pipe()
        w.add(r1, "pidfd", "one")
        os.write(w1, b"x")
        assert w.wait(1.0) == [r1] and w.get(r1) == ("pidfd", "one")
        os.close(r1)  # closed without a discard: its number may come back
        r2, w2 = os.pipe()
        assert r2 == r1  # the lowest free descriptor
        w.add(r2, "pidfd", "two")  # replaces the stale registration
        os.write(w2, b"y")
        assert w.wait(1.0) == [r2] and w.get(r2) == ("pidfd", "two")
        w.discard(r2)
        w.discard(r2)  # twice is fine
        assert w.wait(0) == []  # discarded: never reported, though readable
        os.write(wake_w, b"z")
        assert w.wait(1.0) == [wake_r]
        for fd in (w1, r2, w2):
            os.close(fd)
    finally:
        w.close()
        os.close(wake_r)
        os.close(wake_w)
