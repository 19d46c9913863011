"""Workers forked from the run's template process (runtime/_zygote.py), with real processes.

The template is exec'd once per run, forks every block worker, reports their exit codes,
dies with the run and takes its workers with it; a killed template makes the pool give the
lost blocks back and start later workers by exec.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import daisy_nb

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import harness
import templatefns
from test_runtime import attempts, done_files, make_task, run

pytestmark = [pytest.mark.mp, pytest.mark.timeout(90), pytest.mark.usefixtures("no_leaks")]


def done_lines(out, tid):
    """``(worker pid, extra)`` per finished block."""
    rows = []
    for f in done_files(out, tid):
        for line in f.read_text().splitlines():
            parts = line.split()
            rows.append((int(parts[0]), parts[3] if len(parts) > 3 else ""))
    return rows


def parents(out, tid):
    return {int(extra.split(",")[0]) for _, extra in done_lines(out, tid)}


def test_sixteen_workers_fork_from_one_template_and_it_goes_away(out):
    n = 480
    states = run([make_task("many", n, templatefns.record_parent, max_workers=16, max_retries=0)])
    st = states["many"]
    assert st.completed_count == n and st.failed_count == 0 and st.orphaned_count == 0
    assert st.worker_start_count == 16 and st.worker_failure_count == 0
    assert all(attempts(out, "many", i) == 1 for i in range(n))
    rows = done_lines(out, "many")
    assert len(rows) == n
    (template,) = parents(out, "many")  # one template forked them all; the pool is not their parent
    assert template != os.getpid()
    assert len({pid for pid, _ in rows}) > 1
    assert not harness.pid_alive(template)
    assert not any(harness.pid_alive(pid) for pid, _ in rows)


def test_forked_workers_import_no_numba_or_numpy(out):
    import numba  # noqa: F401  (loaded here, in the pool's process)

    run([make_task("li", 6, templatefns.record_parent_and_imports, max_workers=3)])
    extras = [extra for _, extra in done_lines(out, "li")]
    assert len(extras) == 6
    assert {e.split(",")[1] for e in extras} == {"none"}
    assert os.getpid() not in parents(out, "li")


@pytest.mark.parametrize("speculative", [None, True])
def test_forked_block_workers_find_the_worker_side_loaded_in_the_template(out, speculative):
    # what every block worker imports before its first block is imported once, in the template:
    # left to the workers, it cost each ~1 ms of CPU, a 32-worker start ~40 ms on 2 cores; a
    # speculative task's workers also arm the drop handler (``daisy_nb.runtime.net.drops``)
    task = make_task("ws", 40, templatefns.record_worker_side_imports, max_workers=3, speculative=speculative)
    states = run([task])  # batches each
    st = states["ws"]
    assert st.completed_count == 40 and st.failed_count == 0 and st.worker_failure_count == 0
    extras = [extra for _, extra in done_lines(out, "ws")]
    assert len(extras) == 40
    assert {e.split(",")[1] for e in extras} == {"none"}


def test_the_template_holds_only_what_block_workers_use(out):
    # the template's start is on the way to every worker's first block: the pool's side of it
    # (subprocess) and what only the main process's log handling uses (shutil, datetime, and
    # bz2/lzma through shutil) are not imported there (~8 ms of a ~70 ms start)
    task = make_task("tx", 6, templatefns.record_template_extras, max_workers=2)
    states = run([task])
    assert states["tx"].completed_count == 6
    extras = [extra for _, extra in done_lines(out, "tx")]
    assert len(extras) == 6
    assert {e.split(",")[1] for e in extras} == {"none"}


CLOUDPICKLE_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{workers!r}, {root!r}]
    import daisy_nb, templatefns
    from funlib.geometry import Roi

    def task(tid, fn):
        return daisy_nb.Task(tid, total_roi=Roi((0,), (120,)), read_roi=Roi((0,), (10,)), write_roi=Roi((0,), (10,)),
                             process_function=fn, read_write_conflict=False, max_workers=2)

    ok = daisy_nb.run_blockwise([task("ref", templatefns.record_cloudpickle_source)], progress=False, summary=False)
    print("program loaded cloudpickle:", "cloudpickle" in sys.modules)
    ok &= daisy_nb.run_blockwise([task("val", lambda b: templatefns.record_cloudpickle_source(b))], progress=False,
                                 summary=False)
    sys.exit(0 if ok else 1)
    """
)


def test_the_template_loads_cloudpickle_only_for_a_function_sent_by_value(out, tmp_path):
    # a module's function travels by reference: neither the template nor its workers load
    # cloudpickle (12 ms, a sixth of the template's start, before the first fork); a lambda
    # travels by value, and the template loads cloudpickle once, before the fork, for all its
    # workers. (A fresh program: one that loaded cloudpickle sends everything with it.)
    script = tmp_path / "run.py"
    script.write_text(CLOUDPICKLE_SCRIPT.format(workers=str(HERE / "workers"), root=str(HERE.parent)))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "program loaded cloudpickle: False" in r.stdout
    assert len(done_lines(out, "ref")) == len(done_lines(out, "val")) == 12
    assert {e.split(",")[1] for _, e in done_lines(out, "ref")} == {"none"}
    assert {e.split(",")[1] for _, e in done_lines(out, "val")} == {"template"}


def test_sigkilled_forked_worker_is_replaced_by_a_forked_one(out):
    # one worker, so that a replacement is needed whatever the timing (with 3, the survivors may
    # already hold every remaining block when the death is seen: no restart, seen in CI on a quiet
    # machine)
    states = run([make_task("sk", 30, templatefns.sigkill_once_on_5, max_workers=1, max_retries=1)])
    st = states["sk"]
    assert st.completed_count == 30 and st.failed_count == 0
    assert attempts(out, "sk", 5) == 2
    # a local block worker's death is a crash (no job-end exemption), replaced as a restart
    assert st.worker_failure_count == 1 and st.worker_restart_count == 1 and st.worker_job_end_count == 0
    assert st.worker_start_count == 2
    assert "exited with code -9" in st.last_worker_error  # the template's report of the SIGKILL
    (template,) = parents(out, "sk")
    assert template != os.getpid()


def test_forked_worker_timeout_kills_and_replaces_it(out):
    t0 = time.monotonic()
    states = run([make_task("to", 8, templatefns.hang_on_2, max_workers=2, max_retries=0, timeout=0.5)])
    st = states["to"]
    assert st.completed_count == 7 and st.failed_count == 1
    assert st.timeout_reclaim_count == 1 and st.worker_failure_count == 1
    assert "timeout" in st.last_worker_error
    assert os.getpid() not in parents(out, "to")
    assert time.monotonic() - t0 < 20


REPLACE_ENVIRONMENT_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, os, sys
    sys.path.insert(0, {root!r})
    from daisy_nb.config import replace_environment

    target = json.loads(sys.argv[1])
    replace_environment(target)
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    c_side = {{k: (getenv(k.encode()) or b"").decode() for k in ("DNB_GONE", "DNB_SAME", "DNB_CHANGED", "DNB_NEW")}}
    print(json.dumps([dict(os.environ), c_side]))
    """
)


def test_replace_environment_leaves_exactly_the_given_environment_in_python_and_in_c():
    # what a forked worker does with the template's environment (config.replace_environment):
    # it writes only what differs (its context), and ends with exactly the environment an exec'd
    # worker would get: a variable removed, one kept, one changed, one added; in Python and in C
    base = {k: v for k, v in os.environ.items() if not k.startswith("DNB_")}
    start = dict(base, DNB_GONE="1", DNB_SAME="2", DNB_CHANGED="3")
    target = dict(base, DNB_SAME="2", DNB_CHANGED="30", DNB_NEW="4")
    prog = REPLACE_ENVIRONMENT_SCRIPT.format(root=str(HERE.parent))
    r = subprocess.run(
        [sys.executable, "-c", prog, json.dumps(target)], env=start, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    py_side, c_side = json.loads(r.stdout)
    assert py_side == target
    assert c_side == {"DNB_GONE": "", "DNB_SAME": "2", "DNB_CHANGED": "30", "DNB_NEW": "4"}


def test_exit_code_of_a_forked_worker_reaches_the_pool(out):
    states = run([make_task("ex", 4, templatefns.exit_3, max_worker_restarts=1)])
    st = states["ex"]
    assert st.worker_failure_count == 2
    assert "exited with code 3" in st.last_worker_error


def test_killed_template_gives_blocks_back_and_later_workers_are_execd(out, caplog, monkeypatch):
    monkeypatch.setenv("DAISY_NB_TEST_POOL_PID", str(os.getpid()))  # never kill the pool (exec'd workers)
    n = 240
    with caplog.at_level("WARNING", logger="daisy"):
        states = run([make_task("kt", n, templatefns.kill_template_once_on_40, max_workers=4, max_retries=0)])
    st = states["kt"]
    # nothing lost, nothing failed: the blocks the template's workers were running were given back
    assert st.completed_count == n and st.failed_count == 0 and st.orphaned_count == 0
    assert st.worker_failure_count == 0
    assert attempts(out, "kt", 40) == 2
    assert all(attempts(out, "kt", i) >= 1 for i in range(n))
    assert len(done_files(out, "kt")) == n
    ps = parents(out, "kt")
    assert os.getpid() in ps and len(ps) == 2  # forked before, exec'd after
    assert "worker template process died" in caplog.text


def test_killed_template_gives_a_client_loops_held_block_back(out, caplog, monkeypatch):
    """A worker function's Client connection that drops because the template died (its death signal
    ended the worker) does not count the block it held as an attempt: with no retries, nothing fails."""
    monkeypatch.setenv("DAISY_NB_TEST_POOL_PID", str(os.getpid()))
    n = 60
    with caplog.at_level("WARNING", logger="daisy"):
        states = run(
            [make_task("kc", n, templatefns.client_loop_killing_template_once_on_12, max_workers=2, max_retries=0)]
        )
    st = states["kc"]
    assert st.completed_count == n and st.failed_count == 0 and st.orphaned_count == 0
    assert st.worker_failure_count == 0
    assert attempts(out, "kc", 12) == 2
    assert len(done_files(out, "kc")) == n
    ps = parents(out, "kc")
    assert os.getpid() in ps and len(ps) == 2  # forked before, exec'd after
    assert "worker template process died" in caplog.text


def test_workers_asked_together_are_forked_in_order_and_each_runs(out):
    # one spawn pass asks the template for several forks before it collects the first
    # (Processes.spawn_many): each worker is the one asked for, with its own socket and segment
    n = 64
    states = run([make_task("tog", n, templatefns.record_parent, max_workers=8, max_retries=0)])
    st = states["tog"]
    assert st.completed_count == n and st.worker_start_count == 8 and st.worker_failure_count == 0
    assert all(attempts(out, "tog", i) == 1 for i in range(n))
    (template,) = parents(out, "tog")
    assert template != os.getpid()


def test_a_function_too_large_to_send_with_the_fork_is_sent_once_the_worker_exists(out):
    from daisy_nb.runtime.local import starter

    n = 12
    fn = templatefns.RecordParentWith(4 * starter.EARLY_SEND_BYTES)  # past any socket buffer: never sent early
    states = run([make_task("big", n, fn, max_workers=3, max_retries=0)])
    st = states["big"]
    assert st.completed_count == n and st.failed_count == 0
    assert os.getpid() not in parents(out, "big")


def test_template_dead_before_reporting_a_fork_gives_the_execd_worker_a_fresh_socket(out, monkeypatch):
    """The template forked a worker, which read the setup sent with the request, and died before
    its report reached the pool: the worker started by exec instead gets its own socket pair and
    setup (on the first one nothing would ever come: it would wait forever)."""
    from multiprocessing import connection as mpc

    from daisy_nb.runtime.local import starter

    finish = starter.Starter._finish
    killed = []

    def finish_after_the_template_died(self, st):
        if not killed and st.asked and st.sent:
            forked = self.template.collect()
            assert mpc.wait([st.parent_end], timeout=30), "the forked worker never said it was ready"
            os.kill(self.template.proc.pid, signal.SIGKILL)  # its workers die with it
            self.template.proc.wait(timeout=30)
            os.close(forked.pidfd)
            forked.pidfd = None
            self.template.asked += 1  # its report is lost: collect now finds the template dead
            killed.append(forked.pid)
        finish(self, st)

    monkeypatch.setattr(starter.Starter, "_finish", finish_after_the_template_died)
    monkeypatch.setenv("DAISY_NB_TEST_POOL_PID", str(os.getpid()))
    n = 24
    states = run([make_task("fresh", n, templatefns.record_parent, max_workers=2, max_retries=0)])
    st = states["fresh"]
    assert killed
    assert st.completed_count == n and st.failed_count == 0 and st.worker_failure_count == 0
    assert os.getpid() in parents(out, "fresh")  # exec'd after the template died
    assert not harness.pid_alive(killed[0])


def test_forked_worker_logs_are_its_fd_1_and_2(out, tmp_path):
    states = run([make_task("lg", 4, templatefns.write_fds_and_fail_on_1, max_workers=1, max_retries=0)])
    st = states["lg"]
    assert st.completed_count == 3 and st.failed_count == 1
    assert "block 1 fails" in st.last_worker_error
    logs = tmp_path / "logs" / "lg"
    # block 1's exception ends worker 0 (daisy 2.0); worker 1 runs blocks 2 and 3
    outs = "".join(p.read_text() for p in sorted(logs.glob("worker_*.out")))
    errs = "".join(p.read_text() for p in sorted(logs.glob("worker_*.err")))
    assert all(f"fd1 from block {i} " in outs for i in range(4))
    assert all(f"fd2 from block {i}\n" in errs for i in range(4))
    assert "ValueError: block 1 fails" in errs  # the traceback, through sys.stderr
    assert os.getpid() not in parents(out, "lg")


def test_client_loop_in_a_forked_worker_sends_without_nagle_delay(out):
    # a release and the next acquire are two small writes: with Nagle's algorithm the second waited for
    # the pool's delayed ACK, ~40 ms per block (44 blocks/s instead of thousands, bench_runtime --cases client)
    states = run([make_task("cn", 20, templatefns.client_loop_reporting_nodelay, max_workers=2)])
    assert states["cn"].completed_count == 20
    extras = [extra for _, extra in done_lines(out, "cn")]
    assert len(extras) == 20 and {e.split(",")[1] for e in extras} == {"nodelay=1"}
    assert os.getpid() not in parents(out, "cn")


def test_exec_start_when_asked(out, monkeypatch):
    monkeypatch.setenv("DAISY_NB_WORKER_START", "exec")
    states = run([make_task("ex", 6, templatefns.record_parent, max_workers=2)])
    assert states["ex"].completed_count == 6
    assert parents(out, "ex") == {os.getpid()}


KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{workers!r}, {root!r}]
    import daisy_nb, templatefns
    from funlib.geometry import Roi
    t = daisy_nb.Task("k", total_roi=Roi((0,), (400_000,)), read_roi=Roi((0,), (10,)), write_roi=Roi((0,), (10,)),
                      process_function=templatefns.record_parent, read_write_conflict=False, max_workers=4)
    daisy_nb.run_blockwise([t], progress=False, summary=False)
    """
)


def test_sigkilled_run_takes_template_and_workers_with_it(out, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(KILL_SCRIPT.format(workers=str(HERE / "workers"), root=str(HERE.parent)))
    p = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while len(list(out.glob("done_k_*"))) < 40 or len({pid for pid, _ in done_lines(out, "k")}) < 4:
            assert time.monotonic() < deadline and p.poll() is None  # until every worker (max_workers=4) ran one
            time.sleep(0.05)
        rows = done_lines(out, "k")
        template = {int(e) for _, e in rows} - {p.pid}
        workers = {pid for pid, _ in rows}
        assert len(template) == 1
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    deadline = time.monotonic() + 5
    while any(harness.pid_alive(x) for x in template | workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(harness.pid_alive(x) for x in template | workers), "outlived a SIGKILLed run"


def test_run_blockwise_starts_the_template_before_building_the_scheduler(out, monkeypatch):
    """The template's start-up overlaps the Scheduler's (numpy's import, the tables), and it forks the workers."""
    import daisy_nb.scheduler
    from daisy_nb.runtime.local import _zygote

    events = []

    def spy(cls, label):
        orig = cls.__init__

        def init(self, *a, **k):
            events.append(label)
            orig(self, *a, **k)

        monkeypatch.setattr(cls, "__init__", init)

    spy(_zygote.Template, "template")
    spy(daisy_nb.scheduler.Scheduler, "scheduler")
    task = make_task("early", 20, templatefns.record_parent, max_workers=2, max_retries=0)
    assert daisy_nb.run_blockwise([task], progress=False, summary=False)
    assert events == ["template", "scheduler"]  # one template, started first, and no second one later
    (template,) = parents(out, "early")
    assert template != os.getpid() and not harness.pid_alive(template)


@pytest.mark.parametrize(
    "problem, error",
    [
        ("duplicate", "duplicate"),  # the Pipeline check, inside the Scheduler: the template has started
        ("no_function", "process_function"),  # the pool's own check, before any worker
    ],
)
def test_bad_input_to_run_blockwise_leaves_no_template_behind(out, problem, error):
    if problem == "duplicate":
        tasks = [make_task("dup", 4, templatefns.record_parent), make_task("dup", 4, templatefns.record_parent)]
    else:
        tasks = [make_task("nofn", 4, None)]
    before = harness.children()
    with pytest.raises((ValueError, RuntimeError), match=error):
        daisy_nb.run_blockwise(tasks, progress=False, summary=False)
    assert harness.children() == before  # the early template was ended (no_leaks checks again)
    assert not list(out.iterdir())


END_CHILDREN = """
import os, signal, sys, time
from daisy_nb.runtime.local import _zygote

out = sys.argv[1]
def child(ignore_term):
    pid = os.fork()
    if pid == 0:
        os.setsid()  # as a forked worker: its own session
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            def on_term(*a):
                open(os.path.join(out, "term_%d" % os.getpid()), "w").close()  # a launcher's cancel
                os._exit(0)
            signal.signal(signal.SIGTERM, on_term)
        open(os.path.join(out, "up_%d" % os.getpid()), "w").close()
        while True:
            signal.pause()  # a worker at work, until a signal ends it
    return pid

kids = {child(False), child(True)}
deadline = time.monotonic() + 30
while len([f for f in os.listdir(out) if f.startswith("up_")]) < 2:
    assert time.monotonic() < deadline, "the children did not start"
    time.sleep(0.01)
t0 = time.monotonic()
left = set(kids)
try:
    _zygote._end_children(left)
finally:  # whatever happened, no child outlives the test
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
print(sorted(kids), round(time.monotonic() - t0, 2), sorted(left))
"""


def test_workers_left_when_the_pool_closes_get_sigterm_and_a_grace_before_sigkill(tmp_path):
    """A run's process killed: the template may see its socket close before its own death signal. The
    workers it still has are ended as the pool ends them: SIGTERM (a launcher cancels its job), a grace,
    SIGKILL for one that ignores it; all reaped."""
    from daisy_nb.runtime.local.ending import TERM_GRACE_SECS

    script = tmp_path / "end.py"
    script.write_text(END_CHILDREN)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(HERE.parent)),
    )
    assert r.returncode == 0, r.stderr
    pids = [int(x) for x in r.stdout.split("]")[0].strip("[").split(",")]
    took = float(r.stdout.split("]")[1].split()[0])
    assert r.stdout.strip().endswith("[]")  # both reaped
    termed = [p for p in pids if (tmp_path / f"term_{p}").exists()]
    assert len(termed) == 1  # the one that handles SIGTERM had it (and left on its own)
    assert took >= TERM_GRACE_SECS - 0.1  # the other one was given the grace before its SIGKILL
    assert not any(harness.pid_alive(p) for p in pids)


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_block_workers_keep_what_a_block_freed_for_the_next_one(out, monkeypatch, start):
    """A block that allocates and frees buffers of varied sizes (zarr chunks, its arrays) takes
    their pages from what the previous round freed, in a worker forked by the template and in
    one started by exec (``DAISY_NB_WORKER_HEAP_MIB``, runtime/local/_heap.py); with ``0``,
    glibc's malloc gives them back and faults them in again, thousands of pages a round."""
    monkeypatch.setenv("DAISY_NB_WORKER_START", start)

    def faults(tid):
        run([make_task(tid, 4, templatefns.churn_buffers, max_workers=2)])
        rows = done_lines(out, tid)
        assert len(rows) == 4
        return [int(extra.split(",")[1]) for _, extra in rows]

    kept = faults("kept")
    monkeypatch.setenv("DAISY_NB_WORKER_HEAP_MIB", "0")
    given_back = faults("given")
    assert min(given_back) > 500, given_back  # the default malloc: pages faulted in every round
    assert max(kept) * 5 < min(given_back), (kept, given_back)
