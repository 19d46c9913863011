"""run_blockwise(..., executor=client) on a real dask LocalCluster with worker processes.

Outputs are checked through files (np.memmap arrays under tmp_path): dask workers
are separate processes. Block functions are module-level and pickled by value,
so workers never import this test module.
"""

import functools
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

import daisy_nb  # noqa: E402
from daisy_nb import BlockStatus, Roi  # noqa: E402
from daisy_nb.dask import run_dask  # noqa: E402
from daisy_nb.scheduler import Scheduler  # noqa: E402

pytestmark = [pytest.mark.mp, pytest.mark.timeout(120)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LENGTH = 1200  # cells; read 30 / write 10 with 10 context: 118 blocks per task


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture
def both_workers(client):
    client.wait_for_workers(2, timeout=30)
    return client


# ------------------------------------------------------------------ block functions
def _mm(path, n):
    return np.memmap(path, dtype=np.int64, mode="r+", shape=(n,))


def _new(path, n):
    np.memmap(path, dtype=np.int64, mode="w+", shape=(n,)).flush()


def _attempt(out, tag, sid, n=4096):
    """Count one attempt of block ``sid``; returns the count so far (1-based)."""
    c = _mm(os.path.join(out, f"{tag}.cnt"), n)
    c[sid] += 1
    return int(c[sid])


def layer(block, out, tid, up, fail_always=(), fail_first=(), status_failed=(), sleep=0.0):
    """Cell values depend on the task's own already-written neighbours (conflict order)
    and on the upstream task's values under the read ROI."""
    k = _attempt(out, tid, block.spatial_id)
    if sleep:
        time.sleep(sleep)
    if block.spatial_id in fail_always:
        raise ValueError(f"block {block.spatial_id} always fails (attempt {k})")
    if block.spatial_id in fail_first and k == 1:
        raise RuntimeError("fails on its first attempt")
    if block.spatial_id in status_failed:
        block.status = BlockStatus.FAILED
        return
    (r0,), (rl,) = block.read_roi.offset, block.read_roi.shape
    (w0,), (wl,) = block.write_roi.offset, block.write_roi.shape
    own = _mm(os.path.join(out, f"{tid}.dat"), LENGTH)
    src = int(_mm(os.path.join(out, f"{up}.dat"), LENGTH)[r0 : r0 + rl].sum()) if up else r0
    v = (int(own[r0 : r0 + rl].sum()) * 7 + src * 3 + w0) % 1_000_003
    own[w0 : w0 + wl] = v + np.arange(wl)


def make_pipeline(out, n=3, conflict=True, skip_mask=None, check=None, max_retries=2, tracking=None, **fn_kw):
    ids = ["a", "b", "c"][:n]
    tasks = []
    for i, tid in enumerate(ids):
        _new(os.path.join(out, f"{tid}.dat"), LENGTH)
        _new(os.path.join(out, f"{tid}.cnt"), 4096)
        kw = {k: (v.get(tid, ()) if isinstance(v, dict) else v) for k, v in fn_kw.items()}
        fn = functools.partial(layer, out=str(out), tid=tid, up=ids[i - 1] if i else None, **kw)
        tasks.append(
            daisy_nb.Task(
                tid,
                Roi((0,), (LENGTH,)),
                Roi((0,), (30,)),
                Roi((10,), (10,)),
                process_function=fn,
                read_write_conflict=conflict,
                max_retries=max_retries,
                skip_mask=skip_mask if i == 0 else None,
                check_function=check if i == n - 1 else None,
                tracking_path=False if tracking is None else os.path.join(tracking, tid),
            )
        )
    p = tasks[0]
    for t in tasks[1:]:
        p = p + t
    return p


def outputs(out, n=3):
    return {tid: np.array(_mm(os.path.join(out, f"{tid}.dat"), LENGTH)) for tid in ["a", "b", "c"][:n]}


def counts(out, tid, n=118):
    return np.array(_mm(os.path.join(out, f"{tid}.cnt"), 4096))[:n]


def summary_of(states):
    return {
        tid: (
            st.total_block_count,
            st.completed_count,
            st.skipped_count,
            st.failed_count,
            st.orphaned_count,
            st.ready_count,
            st.processing_count,
            st.abandoned,
        )
        for tid, st in states.items()
    }


def check_c(block):
    return block.spatial_id % 9 == 4  # "already done": skipped


class Recorder:
    def __init__(self):
        self.calls = []

    def on_start(self, states):
        self.calls.append("start")

    def on_progress(self, states):
        self.calls.append("progress")

    def on_finish(self, states):
        self.calls.append(("finish", {t: s.completed_count for t, s in states.items()}))


def reference_states(pipeline):
    """The scheduler driven in-process; a raising block fails (the pool's semantics)."""
    s = Scheduler(pipeline, block_tracking=False)
    try:
        while True:
            progressed = False
            for tid in s.task_ids:
                b = s.acquire_block(tid)
                if b is None:
                    continue
                b.status = BlockStatus.PROCESSING
                try:
                    s.tasks[tid].process_function(b)
                    if b.status != BlockStatus.FAILED:
                        b.status = BlockStatus.SUCCESS
                except Exception:
                    b.status = BlockStatus.FAILED
                s.release_block(b)
                progressed = True
                break
            if not progressed:
                return s.task_states
    finally:
        s.close()


# ------------------------------------------------------------------ tests
def test_pipeline_matches_serial(both_workers, tmp_path):
    mask = np.zeros(118, np.uint8)
    mask[[3, 50, 51, 117]] = 1
    ser, dsk = tmp_path / "serial", tmp_path / "dask"
    ser.mkdir()
    dsk.mkdir()
    ref = daisy_nb.run_blockwise(
        make_pipeline(ser, skip_mask=mask, check=check_c),
        multiprocessing=False,
        progress=False,
        summary=False,
        return_states=True,
    )
    rec = Recorder()
    states = daisy_nb.run_blockwise(
        make_pipeline(dsk, skip_mask=mask, check=check_c),
        executor=both_workers,
        progress=rec,
        summary=False,
        return_states=True,
    )
    assert summary_of(states) == summary_of(ref)
    assert states["a"].skipped_count == 4 and states["c"].skipped_count == 13
    o_ref, o = outputs(ser), outputs(dsk)
    for tid in "abc":
        np.testing.assert_array_equal(o[tid], o_ref[tid], err_msg=tid)
        assert np.all(counts(dsk, tid) == counts(ser, tid))  # every block ran once, skipped ones never
    assert o["c"].any()
    assert rec.calls[0] == "start" and rec.calls[-1][0] == "finish" and "progress" in rec.calls
    assert rec.calls[-1][1] == {"a": 118, "b": 118, "c": 118}
    assert all(st.worker_failure_count == 0 for st in states.values())
    assert not any(both_workers.run(lambda: "numba" in sys.modules).values())  # workers: daisy_nb.block only
    # the plain return value and the summary
    assert daisy_nb.run_blockwise(make_pipeline(tmp_path, n=1), executor=both_workers, progress=False) is True


def test_failures_retry_and_orphan_as_locally(both_workers, tmp_path, capsys):
    kw = dict(fail_always={"a": {7}}, fail_first={"a": {1, 2, 60}, "b": {30}}, status_failed={"c": {90}})
    ref_dir, pool_dir, dsk = tmp_path / "ref", tmp_path / "pool", tmp_path / "dask"
    for d in (ref_dir, pool_dir, dsk):
        d.mkdir()
    ref = reference_states(make_pipeline(ref_dir, **kw))
    pool = daisy_nb.run_blockwise(make_pipeline(pool_dir, **kw), progress=False, summary=False, return_states=True)
    states = daisy_nb.run_blockwise(
        make_pipeline(dsk, **kw), executor=both_workers, progress=False, summary=True, return_states=True
    )
    assert summary_of(states) == summary_of(ref) == summary_of(pool)
    a = states["a"]
    assert a.failed_count == 1 and a.orphaned_count == 0 and states["b"].orphaned_count > 0
    assert states["c"].failed_count == 1
    for d in (ref_dir, dsk):
        np.testing.assert_array_equal(counts(d, "a"), counts(ref_dir, "a"))
    assert counts(dsk, "a")[7] == 3 and counts(dsk, "a")[1] == 2 and counts(dsk, "b")[30] == 2
    assert "fails on its first attempt" in a.first_worker_error or "always fails" in a.first_worker_error
    assert a.worker_failure_count == 0  # block failures are not worker failures
    out = capsys.readouterr().out
    assert "Execution Summary" in out and "First failure in task 'a'" in out and "Traceback" in out
    # outputs of blocks that completed agree with the reference run
    o_ref, o = outputs(ref_dir), outputs(dsk)
    for tid in "abc":
        np.testing.assert_array_equal(o[tid], o_ref[tid], err_msg=tid)
    assert (
        daisy_nb.run_blockwise(make_pipeline(tmp_path, **kw), executor=both_workers, progress=False, summary=False)
        is False
    )


def init_state(out):
    with open(os.path.join(out, "inits"), "a") as f:
        f.write(f"{os.getpid()}\n")
    return {"pid": os.getpid(), "token": object()}


def use_state(block, out):
    st = daisy_nb.dask.worker_state()
    assert st is daisy_nb.dask.worker_state("init")
    with open(os.path.join(out, f"blk_{block.spatial_id}"), "w") as f:
        f.write(f"{os.getpid()} {st['pid']}")


def test_init_fn_once_per_worker(both_workers, tmp_path):
    task = daisy_nb.Task(
        "init",
        Roi((0,), (300,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=functools.partial(use_state, out=str(tmp_path)),
        init_fn=functools.partial(init_state, str(tmp_path)),
        read_write_conflict=False,
        tracking_path=False,
    )
    with Scheduler(task, block_tracking=False) as s:  # the tuning knobs: run_dask directly
        st = run_dask(s, both_workers, progress=False, summary=False, batch_target_secs=0.01, futures_per_thread=3)
    assert st["init"].completed_count == 300 and st["init"].failed_count == 0
    inits = (tmp_path / "inits").read_text().split()
    assert len(inits) == len(set(inits)) <= 2  # once per worker process
    for i in range(300):
        pid, state_pid = (tmp_path / f"blk_{i}").read_text().split()
        assert pid == state_pid and pid in inits
    with pytest.raises(LookupError):
        daisy_nb.dask.worker_state()


def bad_init():
    raise OSError("cannot open the volume")


def noop(block):
    pass


def test_failing_init_fn_abandons_task_like_the_pool(both_workers):
    roi = dict(total_roi=Roi((0,), (50,)), read_roi=Roi((0,), (1,)), write_roi=Roi((0,), (1,)), tracking_path=False)
    bad = daisy_nb.Task("bad", process_function=noop, init_fn=bad_init, max_worker_restarts=2, **roi)
    down = daisy_nb.Task("down", process_function=noop, **roi)
    with pytest.raises(RuntimeError, match="abandoned") as ei:
        daisy_nb.run_blockwise(bad + down, executor=both_workers, progress=False, summary=False)
    st = ei.value.daisy_states
    assert st["bad"].worker_failure_count == 3 and st["bad"].orphaned_count == 50 and st["bad"].failed_count == 0
    assert st["down"].orphaned_count == 50 and st["down"].abandoned
    assert "cannot open the volume" in st["bad"].last_worker_error


def test_worker_function_is_refused(both_workers, tmp_path):
    def worker_fn():
        pass

    task = daisy_nb.Task(
        "w", Roi((0,), (10,)), Roi((0,), (1,)), Roi((0,), (1,)), process_function=worker_fn, tracking_path=False
    )
    with pytest.raises(ValueError, match="0-argument worker function"):
        daisy_nb.run_blockwise(task, executor=both_workers, progress=False, summary=False)


def test_resume_after_failures_and_ctrl_c(both_workers, tmp_path):
    track = str(tmp_path / "track")
    # run 1: some blocks fail for good (no retries); tracking records the rest
    r1 = tmp_path / "r1"
    r1.mkdir()
    st1 = daisy_nb.run_blockwise(
        make_pipeline(r1, n=2, max_retries=0, tracking=track, fail_always={"a": {20, 90}}),
        executor=both_workers,
        progress=False,
        summary=False,
        return_states=True,
    )
    done1 = {t: s.completed_count for t, s in st1.items()}
    assert st1["a"].failed_count == 2 and st1["b"].orphaned_count > 0
    # run 2, stopped early by Ctrl-C: blocks finished so far are tracked, the rest given back
    r2 = tmp_path / "r2"
    r2.mkdir()
    stop = threading.Event()

    def ctrl_c_after_two_b_blocks():
        while not stop.is_set():
            if (r2 / "b.cnt").exists() and counts(r2, "b").sum() >= 2:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    pipeline = make_pipeline(r2, n=2, tracking=track, sleep=0.15)
    th = threading.Thread(target=ctrl_c_after_two_b_blocks)
    th.start()
    try:
        with pytest.raises(KeyboardInterrupt) as ei:
            daisy_nb.run_blockwise(pipeline, executor=both_workers, progress=False, summary=False)
    finally:
        stop.set()
        th.join()
    st2 = ei.value.daisy_states
    assert all(s.processing_count == 0 for s in st2.values())
    assert st2["a"].skipped_count <= done1["a"] and st2["b"].skipped_count <= done1["b"]
    assert st2["b"].completed_count < 118
    # tracked as done now: done in run 1, plus what run 2 ran to completion
    tracked = {t: done1[t] + st2[t].completed_count - st2[t].skipped_count for t in "ab"}
    # run 3: resumes; the functions run only on the blocks not done before
    r3 = tmp_path / "r3"
    r3.mkdir()
    st3 = daisy_nb.run_blockwise(
        make_pipeline(r3, n=2, tracking=track), executor=both_workers, progress=False, summary=False, return_states=True
    )
    for tid in "ab":
        assert st3[tid].completed_count == 118 and st3[tid].failed_count == 0
        assert st3[tid].skipped_count == tracked[tid]
        c = counts(r3, tid)
        assert int(c.sum()) == 118 - tracked[tid] and c.max() <= 1
    assert tracked["b"] < 118


def slow_mark(block, out, hang=(), hang_secs=0.0, sleep=0.06):
    """Count the attempt, sleep, leave ``done_<id>``; the first attempt of a block in ``hang`` sleeps
    ``hang_secs`` more and, at its very end, leaves ``hang_over_<id>`` (its thread is free again)."""
    k = _attempt(out, "k", block.spatial_id, n=200)
    hung = block.spatial_id in hang and k == 1
    if hung:
        time.sleep(hang_secs)
    time.sleep(sleep)
    with open(os.path.join(out, f"done_{block.spatial_id}"), "w") as f:
        f.write(str(os.getpid()))
    if hung:
        open(os.path.join(out, f"hang_over_{block.spatial_id}"), "w").close()


def test_timeout_cancels_batch_and_retries(both_workers, tmp_path):
    _new(os.path.join(tmp_path, "k.cnt"), 200)
    # blocks slower than batch_target_secs go one per future: the per-batch deadline is 0.5 s
    task = daisy_nb.Task(
        "k",
        Roi((0,), (12,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=functools.partial(slow_mark, out=str(tmp_path), hang={5}, hang_secs=3.0, sleep=0.12),
        read_write_conflict=False,
        timeout=0.5,
        tracking_path=False,
    )
    t = time.monotonic()
    st = daisy_nb.run_blockwise(task, executor=both_workers, progress=False, summary=False, return_states=True)["k"]
    assert time.monotonic() - t < 2.8  # did not wait for the hanging block
    assert st.completed_count == 12 and st.failed_count == 0
    assert st.timeout_reclaim_count == 1 and st.worker_failure_count == 1
    assert "exceeded timeout=0.5s" in st.first_worker_error
    assert all((tmp_path / f"done_{i}").exists() for i in range(12))
    assert counts(tmp_path, "k", 12)[5] == 2
    # the hanging attempt still holds a thread of the shared cluster's worker: let it end before the next test
    deadline = time.monotonic() + 30
    while not (tmp_path / "hang_over_5").exists():
        assert time.monotonic() < deadline, "the hanging attempt of block 5 never ended"
        time.sleep(0.05)


def stamp_mark(block, out, sleep):
    """Count the attempt, leave ``start_<id>`` (the worker's pid and the time), sleep (modelled
    work), then leave ``done_<id>`` with the worker's pid and the time."""
    _attempt(out, "k", block.spatial_id, n=200)
    path = os.path.join(out, f"start_{block.spatial_id}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {time.monotonic()!r}")
    os.replace(path + ".tmp", path)
    time.sleep(sleep)
    path = os.path.join(out, f"done_{block.spatial_id}")
    with open(path + ".tmp", "w") as f:  # renamed into place: a reader never sees it half written
        f.write(f"{os.getpid()} {time.time()!r}")
    os.replace(path + ".tmp", path)


def _a_batch_result():
    return {"status": b"\x02", "elapsed_ns": 1}


def test_a_result_whose_worker_died_after_returning_it_counts(no_leaks):
    """A batch's result fetched by ``as_completed`` stays its result when its worker dies a moment
    later and dask marks the future "lost" (to compute it again). The driver counted such a batch
    as failed, with a worker failure: a task at ``max_worker_restarts=0`` was abandoned (seen in
    ``test_killed_worker_never_stalls_the_run``, when the kill came between the result and the
    driver reading it)."""
    from distributed import Client, LocalCluster, as_completed

    from daisy_nb.runtime.dask.driver import batch_result

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=30)
        addr, pid = sorted(client.run(os.getpid).items())[0]
        fut = client.submit(_a_batch_result, workers=[addr], allow_other_workers=False, pure=False)
        done, result = next(iter(as_completed([fut], with_results=True, raise_errors=False)))
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while fut.status == "finished" and time.monotonic() < deadline:
            time.sleep(0.01)  # polling
        assert fut.status != "finished"  # dask's side: the result's holder is gone
        assert batch_result(done, result) == {"status": b"\x02", "elapsed_ns": 1}
        del fut, done
    assert batch_result(None, (RuntimeError, RuntimeError("x"), None)) is None  # an erred future's
    assert batch_result(None, distributed.client.CancelledError("k")) is None  # a cancelled one's


def test_killed_worker_never_stalls_the_run(tmp_path, no_leaks):
    """A dask worker SIGKILLed in the middle of a batch (after it finished blocks, as a preempted
    job): the others go on at once (the driver used to wait 30 s for dask's connect timeout, in
    client.run to the dead worker), its block runs again, nothing is lost, and the lost worker is
    a job end, not counted toward max_worker_restarts (0 here)."""
    from distributed import Client, LocalCluster

    n, sleep = 120, 0.12  # slower than the batch target: one block per future, results seen at once
    _new(os.path.join(tmp_path, "k.cnt"), 200)
    task = daisy_nb.Task(
        "k",
        Roi((0,), (n,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=functools.partial(stamp_mark, out=str(tmp_path), sleep=sleep),
        read_write_conflict=False,
        tracking_path=False,
        max_worker_restarts=0,
    )
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=30)
        victim = sorted(client.run(os.getpid).values())[0]
        killed_at = []

        def mine(prefix):
            out = {}
            for f in tmp_path.glob(prefix + "*"):
                if not f.name.endswith(".tmp"):
                    pid, t = f.read_text().split()
                    if pid == str(victim):
                        out[f.name[len(prefix) :]] = float(t)
            return out

        def announced():
            """Batch starts the victim announced that reached the dask scheduler: a worker killed
            before its announcement left it has its batch rerun by dask, unseen by the driver."""
            topics = client.get_events()
            return sum(
                1
                for name, events in topics.items()
                if str(name).startswith("daisy_nb-")
                for _, msg in events
                if isinstance(msg, dict) and msg.get("pid") == victim and "bid" in msg and not msg.get("end")
            )

        def killer():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                done = mine("done_")
                running = {b: t for b, t in mine("start_").items() if b not in done}
                # in the middle of a block: 4 finished, one started less than half a block ago,
                # and its start announced (the driver counts a lost worker by its started batches)
                if (
                    len(done) >= 4
                    and any(time.monotonic() - t < sleep / 2 for t in running.values())
                    and announced() >= len(done) + len(running)
                ):
                    killed_at.append(time.time())
                    os.kill(victim, signal.SIGKILL)
                    return
                time.sleep(0.002)  # polling

        th = threading.Thread(target=killer)
        th.start()
        try:
            st = daisy_nb.run_blockwise(task, executor=client, progress=False, summary=False, return_states=True)["k"]
        finally:
            th.join()
    assert killed_at, "the victim never finished 4 blocks"
    stamps = sorted(float((tmp_path / f"done_{i}").read_text().split()[1]) for i in range(n))
    after = [t for t in stamps if t > killed_at[0]]
    gaps = [b - a for a, b in zip([killed_at[0], *after], after)]
    # blocks keep completing: the longest pause after the kill is a block or a few, never dask's
    # 30 s connect timeout (it was 29.9 s before the driver stopped calling the dead worker)
    assert len(after) >= 40 and max(gaps) < 8.0, max(gaps)
    assert st.completed_count == n and st.failed_count == 0 and st.orphaned_count == 0 and not st.abandoned
    c = counts(tmp_path, "k", n)
    assert c.min() == 1 and int((c == 2).sum()) >= 1 and c.max() <= 2  # the block it was running ran again
    assert st.worker_failure_count == 1 and st.worker_job_end_count == 1 and st.worker_restart_count == 0
    assert "was lost" in st.first_worker_error and "a job end" in st.first_worker_error


# ------------------------------------------------------------------ public distributed APIs only
def _plugins(dask_scheduler):
    return sorted(str(k) for k in dask_scheduler.plugins)


def test_run_leaves_the_users_event_handlers_and_no_plugin(both_workers, tmp_path):
    client = both_workers
    seen = []
    client.subscribe_topic("all", lambda event: seen.append(event[1]))
    before = client.run_on_scheduler(_plugins)
    try:
        ok = daisy_nb.run_blockwise(make_pipeline(tmp_path, n=1), executor=client, progress=False, summary=False)
        assert ok
        assert client.run_on_scheduler(_plugins) == before  # the run's scheduler plugin is gone
        client.log_event("all", {"mine": 1})  # the user's handler on "all" still gets events
        deadline = time.monotonic() + 10
        while {"mine": 1} not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {"mine": 1} in seen
    finally:
        client.unsubscribe_topic("all")


def test_cancelled_running_batch_stops_at_a_block_boundary(both_workers, tmp_path):
    """The driver's cancel (``client.run(_cancel_batches)``) reaches a batch that already runs."""
    from daisy_nb.runtime.common.payload import serialize_function
    from daisy_nb.runtime.dask import worker as ddask

    client = both_workers
    _new(os.path.join(tmp_path, "k.cnt"), 200)
    fn = functools.partial(slow_mark, out=str(tmp_path), sleep=0.05)
    payload = serialize_function(fn, None, "k")
    n = 100
    packed = np.zeros((n, 6), np.int64)
    packed[:, 0] = packed[:, 1] = np.arange(n)  # index, spatial id
    packed[:, 2] = packed[:, 4] = np.arange(n)  # read / write offset
    packed[:, 3] = packed[:, 5] = 1  # shapes
    token = "t" + os.urandom(8).hex()
    fut = client.submit(ddask._run_batch, token, "daisy_nb-test", 7, "k", payload, packed, 1, pure=False)
    deadline = time.monotonic() + 20
    while len(list(tmp_path.glob("done_*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.run(ddask._running_batches, token)  # it runs somewhere
    client.run(ddask._cancel_batches, token, [7])
    out = fut.result(timeout=20)
    status = np.frombuffer(out["status"], np.uint8)
    ran = int(np.count_nonzero(status))
    assert 3 <= ran < n and (status[:ran] == 2).all() and (status[ran:] == 0).all()
    assert len(list(tmp_path.glob("done_*"))) == ran
    assert not any(client.run(ddask._running_batches, token).values())
    client.run(ddask._forget_run, token)


def test_dask_executor_uses_no_private_distributed_state():
    import inspect

    from daisy_nb.runtime.dask import core, driver, events, worker

    src = "".join(inspect.getsource(m) for m in (core, driver, events, worker))
    for private in ("_event_handlers", ".state.tasks", ".state.executing", "get_current_task"):
        assert private not in src


def test_timeline_and_error_groups_of_a_dask_run(both_workers, tmp_path):
    import json
    import re

    path = tmp_path / "dask.html"
    states = daisy_nb.run_blockwise(
        make_pipeline(tmp_path, n=1, max_retries=0, fail_always={"a": {7, 20}}),
        executor=both_workers,
        progress=False,
        summary=False,
        return_states=True,
        report=str(path),
    )
    data = json.loads(re.search(r"window.DAISY_NB_REPORT = (.*?);</script>", path.read_text(), re.S).group(1))
    rows = data["/api/timeline"]["rows"]
    assert rows and {r["kind"] for r in rows} == {"dask"}
    assert {r["key"].split("-", 1)[1] for r in rows} <= set(both_workers.scheduler_info()["workers"])
    a = states["a"]
    assert (
        sum(r["blocks"] for r in rows) == a.completed_count + a.failed_count == a.total_block_count - a.orphaned_count
    )
    groups = states["a"].error_groups.as_list()
    assert states["a"].failed_count == 2 and groups and groups[0]["first_block"] in (7, 20)
    assert data["/api/state"]["error_groups"][0]["type"] == groups[0]["type"]


class DiskGone(Exception):  # noqa: N818 - named as no convention expects: the text path cannot find it
    pass


def gone(block, out):
    _attempt(out, "g", block.spatial_id)
    if block.spatial_id in (3, 9):
        raise DiskGone(f"disk {block.spatial_id} is gone\nsecond line: ask the admin")


def test_failed_blocks_come_back_structured_and_group_as_raised(both_workers, tmp_path):
    """A batch's first and last errors come back as the exception's type, message and traceback
    (errors.WorkerError), so they group as raised where parsing their text would not; the
    recorded text (``last_worker_error``) is as before, naming the dask worker."""
    import re

    from daisy_nb.errors import split_error

    _new(os.path.join(tmp_path, "g.cnt"), 4096)
    task = daisy_nb.Task(
        "g",
        Roi((0,), (200,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=functools.partial(gone, out=str(tmp_path)),
        read_write_conflict=False,
        max_retries=0,
        tracking_path=False,
    )
    states = daisy_nb.run_blockwise([task], executor=both_workers, progress=False, summary=False, return_states=True)
    st = states["g"]
    assert (st.failed_count, st.completed_count) == (2, 18)
    (g,) = st.error_groups.as_list()  # a batch's first and last errors: both failures are counted
    assert (g["type"], g["count"], {g["first_block"], g["last_block"]}) == ("DiskGone", 2, {3, 9})
    assert g["message"] == f"disk {g['first_block']} is gone\nsecond line: ask the admin"
    assert split_error(g["traceback"])[:2] == ("error", "second line: ask the admin")  # what parsing finds
    for text in (st.first_worker_error, st.last_worker_error):
        m = re.match(r"block \('g', (3|9)\) failed on dask worker tcp://\S+ \(pid \d+\):\nTraceback", text)
        assert m, text
        assert text.rstrip().endswith(f"DiskGone: disk {m.group(1)} is gone\nsecond line: ask the admin")


def test_a_speculative_task_on_dask_warns_that_it_has_no_backups(both_workers):
    """dask runs no backup copies: the run says so for the task that asked, and runs it as usual."""
    t = daisy_nb.Task(
        "spec",
        Roi((0,), (8,)),
        Roi((0,), (1,)),
        Roi((0,), (1,)),
        process_function=noop,
        speculative=True,
        tracking_path=False,
    )
    with pytest.warns(UserWarning, match=r"task 'spec': speculative=3 has no effect in a dask"):
        st = daisy_nb.run_blockwise(t, executor=both_workers, progress=False, summary=False, return_states=True)
    assert st["spec"].completed_count == 8 and st["spec"].failed_count == 0
