"""On the cluster as with daisy 2.0.0 (issue 18): the default address, what a worker function
that does not wait (or a job that cannot connect) is told, and task ids with '/' in them.

Real processes, real TCP, only to this machine's own addresses: loopback, or the address the
scheduler detects for itself (``net_address.candidate_addresses``). "Another machine" is a job
(``workers/netprog.py``) that refuses a loopback address and connects only to the advertised one.
"""

import json
import logging
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import netfns  # noqa: E402
import psutil  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402
from daisy_nb.dashboard import Dashboard  # noqa: E402
from daisy_nb.progress import ABANDON_NOT_WAITING  # noqa: E402
from daisy_nb.runtime.client import pack_hello, unpack_hello  # noqa: E402
from daisy_nb.runtime.net import address as net_address  # noqa: E402
from daisy_nb.runtime.net import liveness as net_liveness
from daisy_nb.runtime.net import transport as net_transport

pytestmark = [pytest.mark.mp, pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

FAST = {"DAISY_NB_HEARTBEAT_SECS": "0.5", "DAISY_NB_PEER_TIMEOUT_SECS": "3", "DAISY_NB_AUTH_TIMEOUT_SECS": "1"}
CANDIDATES = [ip for ip, _ in net_address.candidate_addresses()]
needs_address = pytest.mark.skipif(not CANDIDATES, reason="this machine has no non-loopback address")


def make_task(tid, n, fn, **kw):
    kw.setdefault("tracking_path", False)
    return daisy_nb.Task(
        tid,
        Roi((0,), (10 * n,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        **kw,
    )


def run(task, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("summary", False)
    return daisy_nb.run_blockwise(task, return_states=True, **kw)


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def jobs_gone(out):
    return not [p for p in job_pids(out) if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def job_pids(out):
    return [int(p.name[4:]) for p in out.glob("job_*")]


@pytest.fixture
def out(out, monkeypatch):
    """conftest's ``out``, without DAISY_HOST; afterwards the detached jobs a test left are ended."""
    monkeypatch.delenv("DAISY_HOST", raising=False)
    yield out
    for pid in job_pids(out):
        try:
            p = psutil.Process(pid)
            if "netprog.py" in " ".join(p.cmdline()):
                p.kill()
                p.wait(5)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass


@pytest.fixture
def fast(monkeypatch):
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)


def progs(out):
    return [json.loads(p.read_text()) for p in out.glob("prog_*.json")]


def blocks_run(out, tid):
    return sorted(out.glob(f"blk_{urllib.parse.quote(tid, safe='')}_*"))


# ------------------------------------------------------------------ the address
@needs_address
def test_default_address_is_not_loopback_and_a_job_elsewhere_completes(out, caplog):
    caplog.set_level(logging.INFO, logger="daisy")
    st = run(make_task("r", 12, netfns.submit_remote, max_workers=2))["r"]
    assert st.completed_count == 12 and st.worker_failure_count == 0  # no job refused the address
    seen = progs(out)
    assert seen and all(s["host"] == CANDIDATES[0] and s["peer"] == CANDIDATES[0] for s in seen)
    assert all(s["listening"] == ["0.0.0.0"] for s in seen)  # every interface, as daisy 2.0.0
    assert len(blocks_run(out, "r")) == 12
    port = seen[0]["port"]
    assert f"advertising auto-detected address {CANDIDATES[0]}" in caplog.text
    assert (
        f"listens on 0.0.0.0:{port} (every interface), advertised to workers as {CANDIDATES[0]}:{port}" in caplog.text
    )


@needs_address
def test_wildcard_host_advertises_a_reachable_address(out):
    """daisy 2.0.0 advertises "0.0.0.0" itself, which no other machine can use."""
    st = run(make_task("w", 6, netfns.submit_remote), host="0.0.0.0")["w"]
    assert st.completed_count == 6 and st.worker_failure_count == 0
    (seen,) = progs(out)
    assert seen["host"] == CANDIDATES[0] and seen["listening"] == ["0.0.0.0"]


def test_a_host_only_other_machines_know_is_advertised_as_given(out, monkeypatch):
    """As daisy 2.0.0: an explicit non-loopback host= (a name only the compute nodes resolve, a
    container's external address; here TEST-NET-3, never a real host's) is advertised as given
    while the scheduler listens on every interface. The job reaches it through 127.0.0.1: nothing
    is sent to the advertised address."""
    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    if {"203.0.113.77", "203.0.113.78"} & mine:
        pytest.skip("this machine has a TEST-NET-3 address")
    assert run(make_task("g", 6, netfns.via_loopback), host="203.0.113.77")["g"].completed_count == 6
    monkeypatch.setenv("DAISY_HOST", "203.0.113.78")  # the same from the environment
    assert run(make_task("g2", 4, netfns.via_loopback))["g2"].completed_count == 4
    told = sorted(p.read_text() for p in out.glob("advertised_*"))
    assert told == ["203.0.113.77", "203.0.113.78"]


@needs_address
def test_loopback_host_stays_loopback_only(out, monkeypatch):
    st = run(make_task("l", 6, netfns.submit_local_only), host="127.0.0.1")["l"]
    assert st.completed_count == 6
    (seen,) = progs(out)
    assert seen["host"] == "127.0.0.1" and seen["listening"] == ["127.0.0.1"]
    assert seen["answers"] and not any(seen["answers"].values())  # not on this machine's other addresses
    for p in out.glob("prog_*.json"):
        p.unlink()
    monkeypatch.setenv("DAISY_HOST", "127.0.0.1")  # the same from the environment
    assert run(make_task("l2", 4, netfns.submit_local_only))["l2"].completed_count == 4
    (seen,) = progs(out)
    assert seen["listening"] == ["127.0.0.1"] and not any(seen["answers"].values())


def test_an_address_that_fails_its_check_is_not_advertised(monkeypatch, caplog):
    """The connectivity check is a real connection to our own listener: here to one of this machine's
    addresses where the listener (on 127.0.0.1) is not, so it fails and 127.0.0.1 is advertised."""
    own = CANDIDATES[0] if CANDIDATES else "127.0.0.2"
    lst = net_transport.Listener("127.0.0.1", os.urandom(32), lambda conn: conn.close(), net_liveness.liveness())
    try:
        monkeypatch.setattr(net_address, "candidate_addresses", lambda: [(own, "default route")])
        with caplog.at_level(logging.INFO, logger="daisy"):
            assert net_address.detect_address(lst) == "127.0.0.1"
        assert f"address {own} (from the default route) failed its connectivity check" in caplog.text
        assert "no reachable non-loopback address found; advertising 127.0.0.1" in caplog.text
        assert lst.reaches("127.0.0.1") and lst.rejected == 0  # our own checks are not strangers
    finally:
        lst.close()


# ------------------------------------------------------------------ say what is wrong
def test_fire_and_forget_worker_function_gets_daisys_diagnosis(out, fast, caplog):
    """Plain ``sbatch``: the function returns, its job connects later. daisy 2.0.0 stops the run with
    a RuntimeError; daisy_nb abandons the task, and run_blockwise raises with the same advice."""
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="connected after its worker function had already returned") as e:
        run(make_task("ff", 200, netfns.fire_and_forget, max_workers=1, max_worker_restarts=100))
    assert time.monotonic() - t0 < 60  # not the restart cap's 100 × 0.3 s
    msg = str(e.value)
    assert f"was abandoned ({ABANDON_NOT_WAITING})" in msg
    for fix in ("`sbatch --wait`", "`srun`", "`subprocess.run`", "daisy_nb.launch"):
        assert fix in msg
    assert e.value.daisy_states["ff"].abandoned
    assert 'worker 0 for task "ff" connected after its worker function had already returned' in caplog.text
    wait_for(lambda: jobs_gone(out), 30, "the late job to end (its connection is closed)")
    (end,) = out.glob("end_*")
    assert int(end.read_text().split()[0]) < 200


def test_worker_function_returning_while_its_job_runs_is_warned(out, fast, caplog):
    st = run(make_task("early", 40, netfns.returns_once_connected, max_workers=1))["early"]
    assert st.completed_count == 40 and st.worker_failure_count == 0  # as daisy 2.0.0: the job goes on
    assert "the worker function of worker 0 returned while its worker is still connected" in caplog.text
    wait_for(lambda: jobs_gone(out), 30, "the job to end")


def test_jobs_that_cannot_connect_are_told_where_the_scheduler_listens(out, fast):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="restart cap exhausted") as e:
        run(make_task("u", 10, netfns.submit_unreachable, max_workers=1, max_worker_restarts=2))
    assert time.monotonic() - t0 < 60
    msg = str(e.value)
    (seen, *_) = progs(out)
    port, host = seen["port"], seen["host"]
    assert "returned without its worker ever connecting" in msg
    assert f"listens on 0.0.0.0:{port} (every interface), advertised to workers as {host}:{port}" in msg
    assert "run_blockwise(host=...) or DAISY_HOST" in msg and "`sbatch --wait`" in msg
    assert all(e.read_text().strip() == "0 connected=False" for e in out.glob("end_*"))


def test_failing_jobs_that_cannot_connect_are_told_too(out, fast):
    with pytest.raises(RuntimeError, match="exited with code 1") as e:
        run(make_task("uf", 10, netfns.submit_unreachable_fails, max_workers=1, max_worker_restarts=1))
    (seen, *_) = progs(out)
    assert (
        "(no worker of this task has connected yet; if its job ran, it may not have reached the scheduler: "
        "the scheduler listens on 0.0.0.0:" in str(e.value)
    )
    assert f"advertised to workers as {seen['host']}:{seen['port']}" in str(e.value)


def test_running_jobs_that_never_connect_get_a_warning(out, monkeypatch, caplog):
    """Worker functions that keep running while nothing connects: after twice the peer timeout a
    warning says where the scheduler listens (queued jobs are fine; unreachable ones are not)."""
    monkeypatch.setenv("DAISY_NB_HEARTBEAT_SECS", "0.2")
    monkeypatch.setenv("DAISY_NB_PEER_TIMEOUT_SECS", "1")
    monkeypatch.setenv("NETFNS_NEVER_SECS", "4")
    with pytest.raises(RuntimeError, match="ever connecting"):
        run(make_task("n", 4, netfns.never_connects, max_worker_restarts=0), host="127.0.0.1")
    assert re.search(r"task 'n': no worker has connected in \d+ s since its first worker function started", caplog.text)
    assert "listens on 127.0.0.1:" in caplog.text and "DAISY_HOST" in caplog.text
    assert caplog.text.count("no worker has connected") == 1  # once per task


# ------------------------------------------------------------------ task ids
WEIRD = "seg/a:b=c%25d\ne f"  # '/', ':', '=', '%', a newline and a space
DACAPO = "predict_/data/run1/pred.zarr_prediction"  # dacapo-ml's f"predict_{container}_{dataset}"


def test_task_ids_travel_through_the_context_and_the_hello_frame():
    for tid in (WEIRD, DACAPO, "ünïcode/ø", "a=b:c"):
        env = daisy_nb.Context(task_id=tid, worker_id=3).to_env()
        assert daisy_nb.Context.from_env_string(env)["task_id"] == tid
        assert unpack_hello(pack_hello(tid, 3)) == (tid, 3)


def test_task_ids_with_slashes_run_end_to_end_and_resume(out, tmp_path, capsys):
    """A worker function and a block function with such ids: logs nested as the wheel nests them
    (``<basedir>/<task_id>/worker_N.out``), block tracking at ``<basedir>/<task_id>``, the dashboard
    serves them, a second run skips every block, and the summary names the tasks."""
    from daisy_nb.tracking import get_tracking_basedir, set_tracking_basedir

    old = get_tracking_basedir()
    set_tracking_basedir(tmp_path / "trk")
    try:

        def pipeline():
            w = make_task(DACAPO, 6, netfns.client_loop, tracking_path=None, max_workers=1)
            b = make_task(WEIRD, 5, netfns.mark, tracking_path=None, max_workers=1)
            return w + b

        with Dashboard(quiet=True) as dash:
            states = daisy_nb.run_blockwise(pipeline(), return_states=True, progress=False, dashboard=dash)
            with urllib.request.urlopen(dash.url_for("api/state"), timeout=10) as r:
                assert [t["task_id"] for t in json.loads(r.read())["tasks"]] == [DACAPO, WEIRD]
            for tid in (DACAPO, WEIRD):
                q = urllib.parse.urlencode({"task": tid, "block_id": 0})
                with urllib.request.urlopen(dash.url_for("api/block", q), timeout=10) as r:
                    assert json.loads(r.read())["blocks"][0]["status"] == "done"
        assert states[DACAPO].completed_count == 6 and states[WEIRD].completed_count == 5
        assert len(blocks_run(out, DACAPO)) == 6 and len(blocks_run(out, WEIRD)) == 5
        logs = tmp_path / "logs"
        assert (logs / "predict_" / "data" / "run1" / "pred.zarr_prediction" / "worker_0.out").read_text().count(
            f"task_id={DACAPO!r}"
        ) == 1
        assert "ran block" in (logs / "seg" / "a:b=c%25d\ne f" / "worker_0.out").read_text()
        for tid in (DACAPO, WEIRD):
            assert (tmp_path / "trk" / tid / "zarr.json").is_file()
        summary = capsys.readouterr().out
        assert DACAPO in summary and "a:b=c%25d" in summary
        again = daisy_nb.run_blockwise(pipeline(), return_states=True, progress=False, summary=False)
        assert again[DACAPO].skipped_count == 6 and again[WEIRD].skipped_count == 5
        assert len(blocks_run(out, DACAPO)) == 6  # no block ran twice
        assert all(len(p.read_text().splitlines()) == 1 for p in blocks_run(out, WEIRD))
    finally:
        set_tracking_basedir(old)


@pytest.mark.parametrize("tid", ["..", "a/../b", "../x", "a/..", "/abs/x", "", ".", "./", "a\0b"])
def test_ids_that_leave_the_log_or_tracking_directory_are_refused(tid):
    with pytest.raises(ValueError, match="task_id") as e:
        make_task(tid, 2, netfns.mark)
    assert repr(tid) in str(e.value)


def test_every_other_id_the_wheel_accepts_is_accepted():
    for tid in ("a/b", "a//b", "a/./b", "a/", " ", "a\nb", "a:b", "a=b", "a%3Ab", "ünï", DACAPO):
        assert make_task(tid, 2, netfns.mark).task_id == tid
