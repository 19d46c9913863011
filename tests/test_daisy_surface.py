"""daisy 2.0's whole public surface on daisy_nb: names, submodules, Server, SerialServer, v2.

``tests/data/daisy_names.json`` lists the public names of PyPI ``daisy==2.0.0``
(``tests/golden/gen_daisy_names.py`` made it from the wheel); every one must exist
here. Server runs use real worker processes; outputs are counted through files.
"""

import importlib
import json
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))

import blockfns  # noqa: E402
import harness  # noqa: E402
import surfacefns  # noqa: E402
from funlib.geometry import Roi  # noqa: E402

import daisy_nb  # noqa: E402

NAMES = json.loads((HERE / "data" / "daisy_names.json").read_text())
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _required(info) -> bool:
    """Names the wheel defines or re-exports; not the stdlib modules/classes its modules import."""
    top = (info["origin"] or "").split(".")[0]
    if info["kind"] == "module":
        return top == "daisy"
    if info["kind"] in ("class", "function"):
        return top not in STDLIB
    return top != "__future__"


def _ours(module_name):
    return importlib.import_module("daisy_nb" + module_name[len("daisy") :])


def make_task(tid, n, fn, cls=None, **kw):
    kw.setdefault("read_write_conflict", False)
    return (cls or daisy_nb.Task)(
        tid, Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=fn, **kw
    )


# ---------------------------------------------------------------- names
def test_golden_names_cover_the_wheel_modules():
    assert set(NAMES["modules"]) == {
        "daisy",
        "daisy.block",
        "daisy.cl_monitor",
        "daisy.logging",
        "daisy.v1_compat",
        "daisy.v2",
    }
    assert NAMES["daisy_version"] == "2.0.0"


@pytest.mark.parametrize("module", sorted(NAMES["modules"]))
def test_every_public_name_of_the_wheel_exists(module):
    entry = NAMES["modules"][module]
    ours = _ours(module)
    listed = set(dir(ours))
    required = [n for n, info in entry["names"].items() if _required(info)]
    assert required, module
    missing = [n for n in required if not hasattr(ours, n)]
    not_listed = [n for n in required if n not in listed]
    assert not missing, f"{module}: missing {missing}"
    assert not not_listed, f"{module}: not in dir(): {not_listed}"
    assert set(entry["all"]) <= set(getattr(ours, "__all__", ())), (
        f"{module}.__all__ lacks {set(entry['all']) - set(ours.__all__)}"
    )
    for n, info in entry["names"].items():
        if _required(info) and info["kind"] == "module":
            assert getattr(ours, n) is importlib.import_module(f"daisy_nb.{n}")


# Where daisy_nb's parameters differ from the wheel's on purpose (the README says why).
SIGNATURE_DIFFERENCES = {
    "Block": "daisy 1.x positional order (block_id, task_id); a str 4th argument is taken as the task id",
    "BlockwiseDependencyGraph": "daisy 1.x names positionally (block_read_roi, ...); daisy 2.0's as keywords",
    "DependencyGraph": "only made by Scheduler.dependency_graph, never by user code",
    "Scheduler": "first parameter named tasks (daisy takes it positionally)",
    "Context.get": "dict.get's (key, default), positional in practice",
}


def _params(obj):
    import inspect

    try:
        return [[p.name, p.kind.name] for p in inspect.signature(obj).parameters.values()]
    except (TypeError, ValueError):
        return None


@pytest.mark.parametrize("module", sorted(NAMES["modules"]))
def test_parameters_of_the_wheel_callables_are_accepted(module):
    """Every parameter of the wheel's callables is accepted under its name, in daisy's positional order."""
    ours = _ours(module)
    problems = []
    for key, wheel_params in NAMES["modules"][module]["signatures"].items():
        if key in SIGNATURE_DIFFERENCES:
            continue
        obj = ours
        for part in key.split("."):
            obj = getattr(obj, part)
        mine = _params(obj)
        if mine is None:  # e.g. a property-backed callable: nothing to compare
            continue
        names = {n for n, _ in mine}
        takes_kwargs = any(k == "VAR_KEYWORD" for _, k in mine)
        for name, kind in wheel_params:
            if kind not in ("VAR_POSITIONAL", "VAR_KEYWORD") and name not in names and not takes_kwargs:
                problems.append(f"{key}: no parameter {name!r}")
        positional = [n for n, k in wheel_params if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
        my_positional = [n for n, k in mine if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
        if my_positional[: len(positional)] != positional and not any(k == "VAR_POSITIONAL" for _, k in mine):
            problems.append(f"{key}: positional {my_positional}, daisy {positional}")
    assert not problems, "\n".join(problems)


def _instance_for(cls_name):
    """An instance for classes whose public attributes are per instance (TaskState)."""
    if cls_name == "TaskState":
        sched = daisy_nb.Scheduler(make_task("s", 2, blockfns.noop))
        try:
            return sched.task_states["s"]
        finally:
            sched.close()
    return None


@pytest.mark.parametrize("module", sorted(NAMES["modules"]))
def test_public_attributes_of_the_wheel_classes_exist(module):
    ours = _ours(module)
    for cls_name, members in NAMES["modules"][module]["classes"].items():
        obj = getattr(ours, cls_name)
        missing = [m for m in members if not hasattr(obj, m)]
        if missing:
            inst = _instance_for(cls_name)
            missing = [m for m in missing if inst is None or not hasattr(inst, m)]
        assert not missing, f"{module}.{cls_name} lacks {missing}"


def test_import_is_light_and_submodules_are_attributes():
    code = textwrap.dedent(
        """
        import sys
        import daisy_nb
        mods = [daisy_nb.v2, daisy_nb.v1_compat, daisy_nb.cl_monitor, daisy_nb.block, daisy_nb.logging]
        import daisy_nb.v2, daisy_nb.v1_compat, daisy_nb.cl_monitor
        daisy_nb.cl_monitor.CLMonitor(None)
        print(sorted(m.__name__ for m in mods), "numba" in sys.modules, "daisy_nb.scheduler" in sys.modules)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.split("]")[1].split() == ["False", "False"], r.stdout
    assert "'daisy_nb.v2'" in r.stdout and "'daisy_nb.logging'" in r.stdout


def test_v1_compat_is_the_top_level_surface():
    import daisy_nb.v1_compat as v1

    for name in v1.__all__:
        assert getattr(v1, name) is getattr(daisy_nb, name), name
    with pytest.warns(DeprecationWarning):
        t = v1.Task("t", Roi((0,), (20,)), Roi((0,), (10,)), Roi((0,), (10,)), num_workers=2)
    assert t.max_workers == 2


# ---------------------------------------------------------------- v2
def test_v2_has_no_daisy1_aliases():
    import daisy_nb.v2 as v2

    with pytest.raises(TypeError, match="num_workers"):
        make_task("t", 2, blockfns.noop, cls=v2.Task, num_workers=2)
    with pytest.raises(TypeError, match="upstream_tasks"):
        make_task("t", 2, blockfns.noop, cls=v2.Task, upstream_tasks=[])
    assert not hasattr(v2, "SerialServer") and "SerialServer" not in dir(v2)
    with pytest.raises(AttributeError):
        v2.SerialServer  # noqa: B018
    assert v2.BlockStats is daisy_nb.BlockStats and v2.Server is daisy_nb.Server
    # the v2 Task is a full Task: it composes with top-level tasks and runs
    a = make_task("a", 3, blockfns.noop, cls=v2.Task, max_workers=2)
    b = make_task("b", 3, blockfns.noop)
    assert isinstance(a, daisy_nb.Task) and isinstance(b, v2.Task) and issubclass(daisy_nb.Task, v2.Task)
    assert daisy_nb.run_blockwise(a + b, multiprocessing=False, progress=False, summary=False)
    # other bad input keeps its own error
    with pytest.raises(TypeError, match="task_id"):
        v2.Task(3, Roi((0,), (20,)), Roi((0,), (10,)), Roi((0,), (10,)))


# ---------------------------------------------------------------- Server
@pytest.mark.mp
@pytest.mark.timeout(120)
def test_server_runs_a_pipeline_and_returns_the_states(out, no_leaks, capsys):
    a = make_task("a", 12, blockfns.mark, max_workers=2)
    b = daisy_nb.Task(
        "b",
        Roi((0,), (120,)),
        Roi((0,), (20,)),
        Roi((0,), (20,)),
        process_function=blockfns.mark,
        read_write_conflict=False,
    )
    server = daisy_nb.Server()
    assert server.hostname is None and server.port is None
    assert server.last_task_order is None and server.last_tracking_summary is None
    states = server.run_blockwise(a + b, progress=False)
    assert isinstance(states, dict) and list(states) == ["a", "b"]
    assert states["a"].completed_count == 12 and states["b"].completed_count == 6
    assert all(s.is_done() and s.failed_count == 0 for s in states.values())
    assert len(list(out.glob("done_a_*"))) == 12 and len(list(out.glob("done_b_*"))) == 6
    assert server.last_task_order == ["a", "b"]
    assert server.last_tracking_summary == {"per_task": {}}
    assert "Execution Summary" in capsys.readouterr().out
    # summary=False silences it; a list of tasks (daisy 1.x form) works too
    states = server.run_blockwise([make_task("c", 4, blockfns.mark)], progress=False, summary=False)
    assert states["c"].completed_count == 4 and server.last_task_order == ["c"]
    assert "Execution Summary" not in capsys.readouterr().out


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_server_reports_abandonment_in_the_states_without_raising(out, no_leaks):
    crashy = make_task("crashy", 6, blockfns.always_exit, max_worker_restarts=1)
    after = daisy_nb.Task(
        "after",
        Roi((0,), (60,)),
        Roi((0,), (10,)),
        Roi((0,), (10,)),
        process_function=blockfns.mark,
        read_write_conflict=False,
    )
    states = daisy_nb.Server().run_blockwise(crashy + after, progress=False, summary=False)
    c = states["crashy"]
    assert c.abandoned and c.abandon_reason == "worker restart cap exhausted"
    assert c.worker_failure_count == 2 and c.worker_restart_count == 1
    assert c.failed_count + c.orphaned_count == 6 and c.completed_count == 0
    assert states["after"].abandoned and states["after"].completed_count == 0
    assert not list(out.glob("done_after_*"))
    # the same pipeline through run_blockwise raises
    crashy2 = make_task("crashy", 6, blockfns.always_exit, max_worker_restarts=1)
    with pytest.raises(RuntimeError, match="abandoned") as ei:
        daisy_nb.run_blockwise(crashy2, progress=False, summary=False)
    assert ei.value.daisy_states["crashy"].abandoned


@pytest.mark.mp
def test_server_raises_bad_input_like_run_blockwise(out):
    task = make_task("gpu", 2, blockfns.mark, requires={"gpu": 2})
    with pytest.raises(ValueError, match="gpu") as from_run:
        daisy_nb.run_blockwise(task, resources={"gpu": 1}, progress=False, summary=False)
    with pytest.raises(ValueError, match="gpu") as from_server:
        daisy_nb.Server().run_blockwise(task, resources={"gpu": 1}, progress=False, summary=False)
    assert str(from_server.value) == str(from_run.value)
    assert not list(out.glob("done_*"))


def test_server_forwards_host(monkeypatch):
    import daisy_nb.server as srv

    seen = []

    def fake_execute(tasks, **kw):
        seen.append(kw["host"])
        return {}, []

    monkeypatch.setattr(srv, "_execute", fake_execute)
    srv.Server(host="127.0.0.2").run_blockwise([])
    srv.Server(host="127.0.0.2").run_blockwise([], host="127.0.0.3")
    srv.Server().run_blockwise([])
    assert seen == ["127.0.0.2", "127.0.0.3", None]


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_server_tracking_summary_has_the_resource_figures(out, no_leaks):
    server = daisy_nb.Server()
    states = server.run_blockwise(
        make_task("r", 6, blockfns.mark, resource_tracking=True), progress=False, summary=False
    )
    assert states["r"].completed_count == 6
    per_task = server.last_tracking_summary["per_task"]
    assert set(per_task) == {"r"}
    r = per_task["r"]
    assert r["blocks"] == 6 and r["failures"] == 0 and r["has_stats"] is True
    assert r["total_block_secs"] > 0 and r["max_peak_rss_bytes"] > 0
    assert {"total_cpu_secs", "io_read_bytes", "io_write_bytes", "mean_block_ms", "block_ms_slope"} <= set(r)


SERVER_CTRL_C = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {workers!r})
    import daisy_nb
    from funlib.geometry import Roi
    import blockfns
    t = daisy_nb.Task("slow", Roi((0,), (40000,)), Roi((0,), (10,)), Roi((0,), (10,)),
                      process_function=blockfns.sleepy, read_write_conflict=False, max_workers=2)
    server = daisy_nb.Server()
    try:
        server.run_blockwise(t, progress=False)
    except KeyboardInterrupt as e:
        print("KI", hasattr(e, "daisy_states"), server.last_task_order, flush=True)
        sys.exit(42)
    print("no interrupt", flush=True)
    """
)


@pytest.mark.mp
@pytest.mark.timeout(60)
def test_server_ctrl_c_raises_keyboardinterrupt(out, tmp_path):
    import psutil

    script = tmp_path / "run.py"
    script.write_text(SERVER_CTRL_C.format(workers=str(HERE / "workers")))
    p = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while len(list(out.glob("attempt_slow_*"))) < 2:
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
        time.sleep(0.05)
    kids = {c.pid for c in psutil.Process(p.pid).children(recursive=True)}
    assert kids
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=15)
    assert p.returncode == 42, stderr
    assert time.monotonic() - t0 < 5
    assert "KI True ['slow']" in stdout
    assert "Run interrupted" in stdout  # the partial summary
    assert not harness.alive_after(kids)


# ---------------------------------------------------------------- SerialServer, CLMonitor
def _counting(calls):
    def fn(block):
        calls.append(block.block_id[1])

    return fn


def test_serial_server_runs_in_process_and_returns_the_states(tmp_path, capsys):
    with pytest.warns(DeprecationWarning, match="SerialServer"):
        server = daisy_nb.SerialServer()
    calls = []
    a = make_task("a", 5, _counting(calls), tracking_path=str(tmp_path / "track_a"))
    states = server.run_blockwise([a])
    assert isinstance(states, dict) and states["a"].completed_count == 5 and len(calls) == 5
    assert "Execution Summary" in capsys.readouterr().out
    # a second run skips what tracking recorded; block_tracking=False runs everything again
    states = server.run_blockwise([a])
    assert states["a"].skipped_count == 5 and len(calls) == 5
    states = server.run_blockwise([a], block_tracking=False)
    assert states["a"].skipped_count == 0 and len(calls) == 10


def test_serial_server_propagates_the_block_exception():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        server = daisy_nb.SerialServer()

    class Boom(Exception):
        pass

    def fail(block):
        raise Boom(f"block {block.block_id[1]}")

    with pytest.raises(Boom, match="block 0"):
        server.run_blockwise([make_task("f", 3, fail)])


def test_serial_server_honours_upstream_tasks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        order = []
        up = make_task("up", 3, lambda b: order.append(("up", b.block_id[1])))
        down = make_task("down", 3, lambda b: order.append(("down", b.block_id[1])), upstream_tasks=[up])
        states = daisy_nb.SerialServer().run_blockwise([down])
    assert set(states) == {"up", "down"}
    assert [t for t, _ in order] == ["up"] * 3 + ["down"] * 3


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_cl_monitor_is_accepted(out, no_leaks):
    from daisy_nb.cl_monitor import CLMonitor

    server = daisy_nb.Server()
    monitor = CLMonitor(server)
    assert monitor.server is server
    states = server.run_blockwise([make_task("m", 3, blockfns.mark)], progress=False, summary=False)
    assert states["m"].completed_count == 3


# ---------------------------------------------------------------- logging, Context
def test_emit_failure_and_slot_files_outside_a_worker(capfd):
    import daisy_nb.logging as dlog

    assert dlog.current_slot_files() is None
    dlog.emit_failure("quiet in file mode")
    assert "quiet" not in capfd.readouterr().err
    dlog.set_log_mode("console")
    try:
        dlog.emit_failure("block 3 failed: boom")
    finally:
        dlog.set_log_mode("file")
    assert capfd.readouterr().err == "block 3 failed: boom\n"


@pytest.mark.mp
@pytest.mark.timeout(120)
def test_emit_failure_and_slot_files_in_a_worker(out, tmp_path, no_leaks):
    import daisy_nb.logging as dlog

    saved = dlog.get_log_basedir()
    dlog.set_log_basedir(tmp_path / "logs")
    try:
        states = daisy_nb.run_blockwise(
            make_task("lg", 2, surfacefns.report_via_logging), progress=False, summary=False
        )
    finally:
        dlog.set_log_basedir(saved)
    assert states
    err = "".join(p.read_text() for p in (tmp_path / "logs" / "lg").glob("*.err"))
    assert "emitted failure of block 0" in err and "emitted failure of block 1" in err
    assert sorted(p.read_text() for p in out.glob("slotfiles_*")) == ["2", "2"]
    logged = "".join(p.read_text() for p in (tmp_path / "logs" / "lg").glob("*.out"))
    assert "slot out of block 0" in logged and "slot out of block 1" in logged


def test_context_from_env_string():
    from daisy_nb.runtime.context import Context

    c = Context(task_id="t", hostname="a:b")
    parsed = Context.from_env_string(c.to_env())
    assert parsed == c and parsed["hostname"] == "a:b"
    assert dict(Context.from_env_string("a=1::b=2").items()) == {"a": "1", "b": "2"}
    assert len(Context.from_env_string("")) == 0
    with pytest.raises(ValueError, match="junk"):
        Context.from_env_string("junk")
    with pytest.raises(TypeError, match="str"):
        Context.from_env_string(None)


def test_block_ids_are_checked_like_daisy():
    roi = Roi((0, 0), (10, 10))
    with pytest.raises(TypeError, match="task_id must be a str"):
        daisy_nb.Block(roi, roi, roi, block_id=1, task_id=1)
    with pytest.raises(TypeError, match="block_id must be an int"):
        daisy_nb.Block(roi, roi, roi, block_id=1.5, task_id="t")
    with pytest.raises(TypeError, match="block_id must be an int"):
        daisy_nb.Block(roi, roi, roi, block_id="x", task_id="t")
    import numpy as np

    assert daisy_nb.Block(roi, roi, roi, block_id=np.int64(3), task_id="t").block_id == ("t", 3)


def test_keyword_names_of_daisy_2():
    """daisy 2.0.0's parameter names and positional order, where daisy code passes them."""
    import inspect

    params = list(inspect.signature(daisy_nb.run_blockwise).parameters)
    assert params[:8] == [
        "pipeline",
        "multiprocessing",
        "resources",
        "progress",
        "block_tracking",
        "return_states",
        "host",
        "summary",
    ]
    calls = []
    t = make_task("kw", 3, lambda b: calls.append(b.block_id[1]), tracking_path=False)
    # positional as in daisy: (pipeline, multiprocessing, resources, progress, block_tracking, return_states)
    states = daisy_nb.run_blockwise(t, False, None, False, True, True, summary=False)
    assert isinstance(states, dict) and states["kw"].completed_count == 3 and len(calls) == 3
    assert daisy_nb.run_blockwise(pipeline=t, multiprocessing=False, summary=False) is True
    assert list(inspect.signature(daisy_nb.Server.run_blockwise).parameters)[1] == "pipeline"
    r, w, total = Roi((0,), (10,)), Roi((0,), (10,)), Roi((0,), (100,))
    by_2_0 = daisy_nb.BlockwiseDependencyGraph(
        "g", read_roi=r, write_roi=w, read_write_conflict=False, fit="valid", total_read_roi=total
    )
    by_1_x = daisy_nb.BlockwiseDependencyGraph(
        "g", block_read_roi=r, block_write_roi=w, read_write_conflict=False, total_read_roi=total
    )
    assert by_2_0.num_blocks == by_1_x.num_blocks == 10
    with pytest.raises(TypeError, match="not both"):
        daisy_nb.BlockwiseDependencyGraph("g", r, w, read_roi=r, total_read_roi=total)
    with pytest.raises(TypeError, match="write_roi"):
        daisy_nb.BlockwiseDependencyGraph("g", r, total_read_roi=total)
    from daisy_nb.runtime.context import Context

    assert Context.from_env_string(env="a=1")["a"] == "1"


def test_max_workers_none_and_both_spellings():
    import daisy_nb.v2 as v2

    assert make_task("n", 2, blockfns.noop, max_workers=None).max_workers == 1  # the 1.x-compatible Task
    with pytest.raises(TypeError, match="max_workers"):
        make_task("n", 2, blockfns.noop, cls=v2.Task, max_workers=None)
    with pytest.raises(TypeError, match="not both"):
        make_task("n", 2, blockfns.noop, max_workers=1, num_workers=2)
