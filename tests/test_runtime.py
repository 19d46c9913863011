"""Runtime tests: real worker processes in every test, outputs checked through files."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import blockfns  # noqa: E402
import harness  # noqa: E402

from daisy_nb.runtime.local.pool import raise_if_abandoned, run_pool  # noqa: E402

pytestmark = [pytest.mark.mp, pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaks")]

# ---------------------------------------------------------------- task builders
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402

_UPSTREAM = {}


def make_task(tid, n, fn, upstream=(), **kw):
    """``n`` independent 1-D blocks: block i reads and writes [10 i, 10 i + 10)."""
    t = daisy_nb.Task(
        tid,
        total_roi=Roi((0,), (10 * n,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        **kw,
    )
    _UPSTREAM[id(t)] = list(upstream)
    return t


def run(tasks, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("summary", False)
    by_id = {t.task_id: t for t in tasks}
    edges = [(by_id[u], t) for t in tasks for u in _UPSTREAM.get(id(t), ())]
    scheduler = daisy_nb.Scheduler(daisy_nb.Pipeline(tasks, edges))
    try:
        return run_pool(scheduler, **kw)
    finally:
        scheduler.close()


# ---------------------------------------------------------------- helpers (fixtures: conftest.py)
def done_files(out, tid):
    return sorted(out.glob(f"done_{tid}_*"))


def attempts(out, tid, sid):
    p = out / f"attempt_{tid}_{sid}"
    return p.stat().st_size if p.exists() else 0


# ---------------------------------------------------------------- block functions
def test_block_function_runs_every_block_once(out):
    states = run([make_task("a", 300, blockfns.mark, max_workers=2)])
    st = states["a"]
    assert st.completed_count == 300 and st.failed_count == 0
    files = done_files(out, "a")
    assert len(files) == 300
    assert all(attempts(out, "a", i) == 1 for i in range(300))
    pids = {f.read_text().split()[0] for f in files}
    assert 1 <= len(pids) <= 2
    # ROIs arrive intact: block i reads [10 i, 10 i + 10)
    for f in files:
        sid = int(f.name.split("_")[-1])
        _, off, shape = f.read_text().split()[:3]
        assert (int(off), int(shape)) == (10 * sid, 10)
    assert st.worker_start_count == 2 and st.worker_failure_count == 0


def test_closure_is_shipped_with_cloudpickle(out):
    target = out / "closure"

    def fn(block, _t=str(target)):
        with open(_t, "a") as f:
            f.write(f"{block.spatial_id}\n")

    states = run([make_task("c", 20, lambda b: fn(b), max_workers=2)])
    assert states["c"].completed_count == 20
    assert sorted(int(x) for x in target.read_text().split()) == list(range(20))


def test_unpicklable_function_fails_before_any_worker(out):
    lock = threading.Lock()

    def fn(block):
        with lock:
            pass

    with pytest.raises(RuntimeError, match="could not serialize"):
        run([make_task("u", 5, fn)])


def test_worker_never_imports_numba(out):
    import numba  # noqa: F401  (the parent has it)

    run([make_task("n", 4, blockfns.check_numba)])
    texts = [f.read_text() for f in done_files(out, "n")]
    assert len(texts) == 4 and all(t.split()[3] == "clean" for t in texts)


# ---------------------------------------------------------------- worker functions
def test_worker_function_with_client(out):
    states = run([make_task("w", 30, blockfns.client_loop, max_workers=2)])
    assert states["w"].completed_count == 30
    assert len(done_files(out, "w")) == 30


def test_worker_function_with_context_keyword(out):
    states = run([make_task("wc", 10, blockfns.client_loop_with_context)])
    assert states["wc"].completed_count == 10
    ctx = (next(out.glob("context_*"))).read_text()
    assert "task_id=wc" in ctx and "authkey=" in ctx  # a worker function connects: it gets the secret


def test_external_worker_program_connects_through_context(out):
    states = run([make_task("x", 12, blockfns.launch_external, max_workers=2)])
    assert states["x"].completed_count == 12
    texts = [f.read_text() for f in done_files(out, "x")]
    assert len(texts) == 12 and all("external" in t for t in texts)


def test_client_exception_fails_block_and_is_retried(out, tmp_path):
    states = run([make_task("ce", 6, blockfns.client_loop_raising, max_workers=1)])
    st = states["ce"]
    assert st.completed_count == 6 and st.failed_count == 0
    assert attempts(out, "ce", 1) == 2
    # the exception ended that worker function (daisy 2.0: re-raised): one dirty exit, one restart
    assert st.worker_failure_count == 1 and st.worker_restart_count == 1
    err = "".join(p.read_text() for p in (tmp_path / "logs" / "ce").glob("*.err"))
    assert "client block failed" in err


def test_bad_authkey_is_rejected(out):
    """A peer that speaks daisy_nb's own handshake with a wrong secret is closed before the scheduler
    proves anything (the client sees NotOurRun), while the same handshake with the run's secret gets
    in; the run goes on. The intruder connects from the pool's thread once the listener is up (the
    listener authenticates in its own thread), so both tries happen while the run is live."""
    from daisy_nb.runtime.net import liveness as net_liveness
    from daisy_nb.runtime.net import transport as net_transport

    results = {}
    import daisy_nb.runtime.local.pool as pool_mod

    orig = pool_mod._Pool._start_listener

    def patched(self):
        orig(self)
        timeouts = net_liveness.liveness()
        for name, secret in (("wrong", bytes(32)), ("right", self.authkey)):
            try:
                net_transport.connect("127.0.0.1", self.port, secret, timeouts).close()
                results[name] = "accepted"
            except net_transport.NotOurRun as e:
                results[name] = f"refused: {e}"

    pool_mod._Pool._start_listener = patched
    try:
        states = run([make_task("auth", 20, blockfns.client_loop)], host="127.0.0.1")
    finally:
        pool_mod._Pool._start_listener = orig
    assert states["auth"].completed_count == 20
    assert results["wrong"].startswith("refused: the scheduler closed the connection during authentication")
    assert results["right"] == "accepted"  # the control: the check above is the secret's, not the protocol's


# ---------------------------------------------------------------- failures
def test_exception_fails_block_retries_and_logs(out, tmp_path, capsys):
    states = run(
        [make_task("e", 8, blockfns.raise_first_attempt_and_block3, max_workers=2, max_retries=2)], summary=True
    )
    st = states["e"]
    assert st.completed_count == 7 and st.failed_count == 1
    assert attempts(out, "e", 3) == 3  # max_retries + 1
    assert attempts(out, "e", 1) == 2 and attempts(out, "e", 0) == 1
    # daisy 2.0: every raising attempt ends its worker (a dirty exit): 1, 3, 5, 7 once, 3 twice more
    assert st.worker_failure_count == 6
    assert not st.abandoned  # 6 <= max_worker_restarts
    err = "".join(p.read_text() for p in (tmp_path / "logs" / "e").glob("*.err"))
    assert "block 3 always fails" in err and "Traceback" in err
    # first/last error: the tracebacks of the first and the latest failure; which block failed
    # last depends on how the two workers' batches interleave
    errors = ("block 3 always fails", "odd blocks fail on their first attempt")
    for text in (st.first_worker_error, st.last_worker_error):
        assert "Traceback" in text and any(e in text for e in errors)
    printed = capsys.readouterr().out
    assert "Execution Summary" in printed and "First failure in task 'e'" in printed


def test_raising_block_function_drives_abandonment_as_in_daisy_2(out):
    """daisy 2.0.0's worker-restart arithmetic (API.md 3.3): an exception ends the worker, so a
    block function that always raises costs max_worker_restarts + 1 failed blocks, then the task
    is abandoned and its other blocks are orphaned."""
    states = run([make_task("ab", 8, blockfns.always_raise, max_retries=0, max_worker_restarts=3)])
    st = states["ab"]
    assert (st.failed_count, st.orphaned_count, st.completed_count) == (4, 4, 0)
    assert st.worker_restart_count == 3 and st.worker_failure_count == 4
    assert st.abandoned and "restart" in st.abandon_reason
    assert sum(attempts(out, "ab", i) for i in range(8)) == 4  # one attempt per worker life
    assert "always raises" in st.first_worker_error


def test_status_failed_without_raising(out):
    states = run([make_task("s", 4, blockfns.status_failed, max_retries=1)])
    assert states["s"].failed_count == 1 and states["s"].completed_count == 3
    assert attempts(out, "s", 0) == 2


@pytest.mark.parametrize(
    "fn",
    [blockfns.exit_once_on_5, blockfns.sigkill_once_on_5, blockfns.segfault_once_on_5],
    ids=["os_exit", "sigkill", "segfault"],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_dead_worker_is_replaced_and_block_retried(out, fn, workers):
    t0 = time.monotonic()
    states = run([make_task("d", 40, fn, max_workers=workers)])
    st = states["d"]
    assert st.completed_count == 40 and st.failed_count == 0
    assert attempts(out, "d", 5) == 2
    # blocks of the dead worker's batch it never started are given back, not counted as attempts
    assert all(attempts(out, "d", i) == 1 for i in range(40) if i != 5)
    assert st.worker_failure_count == 1
    # a local block worker's death is a crash, whatever it finished before (as daisy 2.0.0 counts it):
    # no job-end exemption (that is for worker functions' cluster jobs)
    assert st.worker_job_end_count == 0
    if workers == 1:
        # the only worker died after it finished blocks 0-4: it is replaced, as a restart
        assert st.worker_restart_count == 1
        assert st.worker_start_count == 2
    else:
        # replaced only if work was left for a second worker: the survivor may already
        # hold every remaining block (fast blocks come in growing batches)
        assert st.worker_restart_count in (0, 1)
    assert "job end" not in st.last_worker_error
    assert "exited with code" in st.last_worker_error
    assert time.monotonic() - t0 < 10


def test_hanging_block_times_out(out):
    t0 = time.monotonic()
    states = run([make_task("h", 6, blockfns.hang_on_2, max_workers=2, max_retries=1, timeout=0.5)])
    st = states["h"]
    assert st.failed_count == 1 and st.completed_count == 5
    assert st.timeout_reclaim_count == 2
    assert st.worker_failure_count == 2 and st.worker_restart_count == 1
    assert attempts(out, "h", 2) == 2
    assert time.monotonic() - t0 < 8


def test_restart_cap_abandons_task_and_downstream(out):
    crashy = make_task("crashy", 8, blockfns.always_exit, max_worker_restarts=2, max_retries=5)
    down = make_task("down", 4, blockfns.mark, upstream=["crashy"])
    indep = make_task("indep", 30, blockfns.mark)
    states = run([crashy, down, indep])
    c, d, i = states["crashy"], states["down"], states["indep"]
    assert c.abandoned and c.abandon_reason == "worker restart cap exhausted"
    assert c.worker_failure_count == 3 and c.worker_restart_count == 2
    assert c.completed_count == 0 and c.orphaned_count + c.failed_count == 8
    assert d.abandoned and d.orphaned_count == 4 and not done_files(out, "down")
    assert i.completed_count == 30 and len(done_files(out, "indep")) == 30
    with pytest.raises(RuntimeError, match="task 'crashy' was abandoned \\(worker restart cap exhausted\\)") as ei:
        raise_if_abandoned(states, ["crashy", "down", "indep"])
    assert ei.value.daisy_states is states


# ---------------------------------------------------------------- resources
def test_resources_limit_concurrency(out):
    a = make_task("ra", 12, blockfns.slow_mark, max_workers=2, requires={"cpu": 1})
    b = make_task("rb", 12, blockfns.slow_mark, max_workers=2, requires={"cpu": 1})
    states = run([a, b], resources={"cpu": 2})
    assert states["ra"].completed_count == 12 and states["rb"].completed_count == 12
    # max number of workers alive at once, from block spans per worker pid
    spans = {}
    for f in out.glob("span_*"):
        t0, t1, pid = f.read_text().split()
        lo, hi = spans.get(pid, (float("inf"), 0.0))
        spans[pid] = (min(lo, float(t0)), max(hi, float(t1)))
    events = sorted(
        [(t0, 1) for t0, _ in spans.values()] + [(t1, -1) for _, t1 in spans.values()], key=lambda e: (e[0], e[1])
    )
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    assert peak <= 2


def test_requirement_above_budget_is_rejected(out):
    with pytest.raises(ValueError, match='task "g" requires'):
        run([make_task("g", 2, blockfns.mark, requires={"gpu": 2})], resources={"gpu": 1})


# ---------------------------------------------------------------- observers, logs
def test_progress_observer_and_json(out, tmp_path):
    from daisy_nb.progress import JsonProgressObserver

    class Obs:
        def __init__(self):
            self.events = []

        def on_start(self, states):
            self.events.append("start")

        def on_progress(self, states):
            self.events.append("progress")
            raise RuntimeError("observer bugs are swallowed")

        def on_finish(self, states):
            self.events.append(("finish", states["p"].completed_count))

    obs = Obs()
    run([make_task("p", 10, blockfns.sleepy, max_workers=2)], progress=obs)
    assert obs.events[0] == "start" and obs.events[-1] == ("finish", 10) and "progress" in obs.events
    path = tmp_path / "p.jsonl"
    run([make_task("p", 3, blockfns.mark)], progress=JsonProgressObserver(path=str(path)))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "finish" and lines[-1]["completed"] == 3


def test_tqdm_progress_and_summary(out, capsys):
    run([make_task("bar", 5, blockfns.mark)], progress=True, summary=True)
    cap = capsys.readouterr()
    assert "bar ✔ ♻=0" in cap.err and "5/5" in cap.err
    assert "Execution Summary" in cap.out and "blocks/s" in cap.out


def test_worker_logs_append_with_separator(out, tmp_path):
    run([make_task("lg", 3, blockfns.mark_and_print)])
    run([make_task("lg", 3, blockfns.mark_and_print)])
    text = (tmp_path / "logs" / "lg" / "worker_0.out").read_text()
    assert text.count("hello from block") >= 1 and "=== daisy run " in text


def test_clear_logs_deletes_one_tasks_log_tree_or_all(out, tmp_path):
    import daisy_nb.logging as dlog

    run([make_task("ca", 2, blockfns.mark_and_print), make_task("cb", 2, blockfns.mark_and_print)])
    logs = tmp_path / "logs"
    assert (logs / "ca").is_dir() and (logs / "cb").is_dir()
    assert dlog.clear_logs("ca") == logs / "ca"
    assert not (logs / "ca").exists() and (logs / "cb").is_dir()
    assert dlog.clear_logs() == logs
    assert not logs.exists()


# ---------------------------------------------------------------- Ctrl-C
CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, os
    sys.path.insert(0, {workers!r}); sys.path.insert(0, {root!r})
    import blockfns
    import daisy_nb
    from funlib.geometry import Roi
    task = daisy_nb.Task("slow", total_roi=Roi((0,), ({size},)), read_roi=Roi((0,), (10,)), write_roi=Roi((0,), (10,)),
                         process_function=blockfns.{fn}, read_write_conflict=False, max_workers=2)
    try:
        daisy_nb.run_blockwise(task, progress=False, summary=True)
    except KeyboardInterrupt as e:
        print("KI", type(e).__name__, hasattr(e, "daisy_states"), flush=True)
        sys.exit(42)
    """
)


@pytest.mark.parametrize(
    "fn,size,started",
    [("sleepy", 4000, 2), ("quick_mark", 400_000, 300)],
    ids=["slow_blocks", "fast_blocks_prefetched"],
)
def test_ctrl_c_stops_within_two_seconds(out, tmp_path, fn, size, started):
    script = tmp_path / "run.py"
    script.write_text(CTRL_C_SCRIPT.format(workers=str(HERE / "workers"), root=str(HERE.parent), fn=fn, size=size))
    before = harness.shm_segments()
    p = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 20
    while len(list(out.glob("attempt_slow_*"))) < started:
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    # a file a worker has just opened is still empty: skip it (the pids also come from psutil below)
    worker_pids = {int(w[0]) for f in out.glob("done_slow_*") if (w := f.read_text().split())}
    import psutil

    kids = {c.pid for c in psutil.Process(p.pid).children(recursive=True)}
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=10)
    elapsed = time.monotonic() - t0
    assert p.returncode == 42, stderr
    assert elapsed < 2.0
    assert "KI KeyboardInterrupt True" in stdout
    assert "Run interrupted; counts at shutdown:" in stdout
    assert not harness.alive_after(kids | worker_pids)
    assert not (harness.shm_segments() - before)


def test_log_mode_both_tees_to_console_and_file(out, tmp_path, capfd):
    import daisy_nb.logging as dlog

    dlog.set_log_mode("both")
    try:
        run([make_task("tee", 2, blockfns.mark_and_print)])
    finally:
        dlog.set_log_mode("file")
    assert "hello from block" in (tmp_path / "logs" / "tee" / "worker_0.out").read_text()
    assert "hello from block" in capfd.readouterr().out


def test_context_round_trip():
    from daisy_nb.runtime.context import Context

    c = Context(hostname="a:b", port=1, odd="x=y%z")
    assert Context.from_env(c.to_env()) == c and c["port"] == "1"
    with pytest.raises(ValueError):
        Context.from_env("novalue")
    with pytest.raises(KeyError):
        os.environ.pop("DAISY_CONTEXT", None)
        Context.from_env()


def test_client_block_timeout_kills_worker_function(out):
    t0 = time.monotonic()
    states = run([make_task("ct", 5, blockfns.client_loop_hang_on_2, max_retries=1, timeout=0.5)])
    st = states["ct"]
    assert st.failed_count == 1 and st.completed_count == 4
    assert st.timeout_reclaim_count == 2 and st.worker_failure_count == 2
    assert attempts(out, "ct", 2) == 2
    assert time.monotonic() - t0 < 8


def test_run_blockwise_raises_on_abandonment(out, capsys):
    crashy = make_task("crashy", 4, blockfns.always_exit, max_worker_restarts=1)
    with pytest.raises(RuntimeError, match="task 'crashy' was abandoned \\(worker restart cap exhausted\\)") as ei:
        daisy_nb.run_blockwise(crashy, progress=False)
    assert ei.value.daisy_states["crashy"].worker_failure_count == 2
    assert ei.value.daisy_task_order == ["crashy"]
    assert "Execution Summary" in capsys.readouterr().out


# ---------------------------------------------------------------- prefetch (a second batch queued per worker)
# Which batches are sent, and when a second one waits behind a running one, is the block workers'
# decision core's (tests/test_local_blocks.py: fast blocks prefetched, slow ones one at a time, what a death
# with two batches gives back); these runs are the proof that the shell and the core agree.


def test_fast_blocks_are_prefetched_and_run_once(out):
    n_fds = len(os.listdir("/proc/self/fd"))
    states = run([make_task("pf", 600, blockfns.quick_mark, max_workers=2)])
    st = states["pf"]
    assert st.completed_count == 600 and st.failed_count == 0
    assert all(attempts(out, "pf", i) == 1 for i in range(600))
    assert len(done_files(out, "pf")) == 600
    # the shared-memory mappings and descriptors of both workers are gone
    assert not harness.memfd_mappings()
    assert len(os.listdir("/proc/self/fd")) == n_fds


def test_slow_blocks_run_once_each_with_one_sent_ahead(out):
    # ~50 ms blocks are slower than the 10 ms batch target: batches of one block, and one more waits
    # behind the running one while the ready blocks last (tests/test_local_blocks.py); each runs once
    states = run([make_task("sl", 12, blockfns.slow_mark, max_workers=2)])
    assert states["sl"].completed_count == 12
    assert [len(f.read_text().splitlines()) for f in done_files(out, "sl")] == [1] * 12  # each ran once


@pytest.mark.parametrize("retries", [0, 2])
def test_sigkill_with_prefetched_batch_retries_all_its_blocks(out, retries):
    n_fds = len(os.listdir("/proc/self/fd"))
    states = run([make_task("pk", 1500, blockfns.sigkill_once_on_300, max_workers=2, max_retries=retries)])
    st = states["pk"]
    # the block it was running failed (an attempt: retried, or failed for good without retries); every
    # block it had not started (the rest of its batch and the whole prefetched batch) was given back
    # uncounted, so it ran exactly once, later or on another worker, even with max_retries=0
    if retries:
        assert st.completed_count == 1500 and st.failed_count == 0
        assert attempts(out, "pk", 300) == 2
    else:
        assert st.completed_count == 1499 and st.failed_count == 1
        assert attempts(out, "pk", 300) == 1
    assert st.orphaned_count == 0
    assert all(attempts(out, "pk", i) == 1 for i in range(1500) if i != 300)
    assert len(done_files(out, "pk")) == 1499 + (retries > 0)
    # a local block worker's death is a crash, also after finished blocks: replaced as a restart
    assert st.worker_failure_count == 1 and st.worker_job_end_count == 0 and st.worker_restart_count == 1
    assert st.worker_start_count == 3
    assert "exited with code" in st.last_worker_error
    assert not harness.memfd_mappings()
    assert len(os.listdir("/proc/self/fd")) == n_fds


def test_timeout_counts_from_block_start_not_from_queueing(out):
    # batches of ~0.6 s of 2 ms blocks: a prefetched batch waits far longer than the timeout before it runs,
    # yet no block runs longer than it
    t = make_task("tq", 1200, blockfns.quick_mark, max_workers=2, timeout=0.25, max_retries=0)
    states = run([t], batch_target_secs=0.6)
    st = states["tq"]
    assert st.completed_count == 1200 and st.failed_count == 0
    assert st.timeout_reclaim_count == 0 and st.worker_failure_count == 0


def test_hang_with_prefetched_batch_times_out_and_gives_back_the_rest(out):
    t0 = time.monotonic()
    states = run([make_task("hq", 1000, blockfns.hang_on_300, max_workers=2, max_retries=1, timeout=0.5)])
    st = states["hq"]
    assert st.failed_count == 1 and st.completed_count == 999
    assert st.timeout_reclaim_count == 2 and st.worker_failure_count == 2
    assert attempts(out, "hq", 300) == 2
    assert all(attempts(out, "hq", i) == 1 for i in range(1000) if i != 300)
    assert time.monotonic() - t0 < 15


def test_block_worker_imports_stay_light(out):
    run([make_task("li", 4, blockfns.light_imports)])
    texts = [f.read_text().split()[3] for f in done_files(out, "li")]
    assert texts == ["none"] * 4


def test_named_shared_memory_fallback(out, monkeypatch):
    # platforms without memfd: a named POSIX segment, mapped by name, unlinked at the end (no_leaks checks)
    monkeypatch.delattr(os, "memfd_create")
    before = harness.shm_segments()
    states = run([make_task("nm", 300, blockfns.quick_mark, max_workers=2)])
    assert states["nm"].completed_count == 300
    assert all(attempts(out, "nm", i) == 1 for i in range(300))
    assert not (harness.shm_segments() - before)


def test_worker_pipe_frames_match_multiprocessing_connection():
    """Both ends of a worker's socket pair (runtime/local/_pipe.py) frame bytes exactly as
    ``multiprocessing.connection`` does, so either end reads the other's frames."""
    import socket
    from multiprocessing.connection import Connection

    from daisy_nb.runtime.local._pipe import Pipe

    a, b = socket.socketpair()
    parent, child = Connection(a.detach()), Pipe(b.detach())
    try:
        for size in (0, 1, 16384, 16385, 3_000_000):
            data = os.urandom(size)
            sender = threading.Thread(target=parent.send_bytes, args=(data,))
            sender.start()
            assert child.recv_bytes() == data
            sender.join()
            sender = threading.Thread(target=child.send_bytes, args=(data,))
            sender.start()
            assert parent.recv_bytes() == data
            sender.join()
    finally:
        parent.close()
        child.close()


def test_worker_pipe_poll_and_a_closed_peer():
    """``poll`` says whether a frame (or the peer's close) can be read, waiting at most its timeout;
    a closed peer ends reads with EOFError and writes with BrokenPipeError; a closed end has no
    descriptor and closes once."""
    from daisy_nb.runtime.local._pipe import pipe_pair

    a, b = pipe_pair()
    try:
        assert not a.poll(0) and not a.poll(0.01)
        b.send_bytes(b"ready")
        assert a.poll(None) and a.recv_bytes() == b"ready"
        assert not a.poll(0)
        b.close()
        assert b.closed and a.poll(0)
        with pytest.raises(OSError):
            b.fileno()
        b.close()  # a second close does nothing
        with pytest.raises(EOFError):
            a.recv_bytes()
        with pytest.raises(BrokenPipeError):
            a.send_bytes(b"x" * 1_000_000)
    finally:
        a.close()
        b.close()
    a, b = pipe_pair()
    fds = [a.fileno(), b.fileno()]
    del a, b  # dropped unclosed (as multiprocessing's Connection, the descriptors go with them)
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
