"""The worker template learns the installed modules its workers imported and loads them before
forking the next workers (``runtime/local/_zygote_imports.py``): a pipeline's later tasks start
with what the earlier tasks' block functions loaded, never with the user's own modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daisy_nb.runtime.local import _zygote, _zygote_imports

ROOT = Path(__file__).resolve().parents[1]

BLOCKFNS = '''
import json, os, sys

def _note(task, block):
    """First call in this process: what was loaded before the block function imported anything."""
    path = os.path.join(os.environ["ZI_OUT"], f"{task}_{os.getpid()}.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump({"colorsys": "colorsys" in sys.modules, "zi_mine": "zi_mine" in sys.modules,
                       "numpy": "numpy" in sys.modules, "inits": INITS}, f)

INITS = []

def init():
    INITS.append(os.getpid())

def first(block):
    _note("first", block)
    import colorsys  # noqa: F401  (the standard library: installed)
    import numpy  # noqa: F401  (site-packages; OpenBLAS starts a native thread: still learned)
    import zi_mine  # noqa: F401  (the user's own module: never learned)

def second(block):
    _note("second", block)
    import colorsys  # noqa: F401
    import zi_mine  # noqa: F401
'''

RUN = """
import json, sys
import daisy_nb as daisy
from daisy_nb import Roi
import zi_blockfns as f
a = daisy.Task("first", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=f.first,
               read_write_conflict=False, max_workers=1, requires={"cpu": 1})
b = daisy.Task("second", Roi((0,), (40,)), Roi((0,), (40,)), Roi((0,), (10,)), process_function=f.second,
               init_fn=f.init, read_write_conflict=False, max_workers=1, requires={"cpu": 1},
               fit="shrink")
ok = daisy.run_blockwise(a + b, resources={"cpu": 1}, progress=False, summary=False)
print(json.dumps({"ok": ok}))
"""


@pytest.mark.mp
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(180)
@pytest.mark.skipif(not _zygote.available(), reason="no worker template on this platform")
def test_a_later_task_starts_with_what_an_earlier_task_imported(tmp_path):
    (tmp_path / "zi_blockfns.py").write_text(BLOCKFNS)
    (tmp_path / "zi_mine.py").write_text("LOADED = True\n")
    out = tmp_path / "out"
    out.mkdir()
    # no *_NUM_THREADS: numpy's OpenBLAS starts its native threads in the template, as for a user
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "DAISY_NB_WORKER_START") and not k.endswith("_NUM_THREADS")
    }
    # each task forks its own workers (no worker moves to the next task): what the template learned shows
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), ZI_OUT=str(out), DAISY_NB_REUSE_WORKERS="0")
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=170
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ok": True}
    notes = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
    first = [n for k, n in notes.items() if k.startswith("first_")]
    second = [n for k, n in notes.items() if k.startswith("second_")]
    assert first and second
    # the first task's worker imported colorsys itself; the second task's worker found it loaded
    assert all(not n["colorsys"] and not n["zi_mine"] and not n["numpy"] for n in first)
    assert all(n["colorsys"] and n["numpy"] for n in second), notes
    # the user's own module is never loaded into the template
    assert all(not n["zi_mine"] for n in second), notes
    # init_fn still ran in the worker of its task (once, before its first block)
    assert all(n["inits"] for n in second), notes


OVERLAP_BLOCKFNS = """
import json, os, sys, time

OUT = os.environ["ZI_OUT"]

def first(block):
    if block.write_roi.offset[0] == 0:
        with open(os.path.join(OUT, "first.json"), "w") as f:
            json.dump({"colorsys": "colorsys" in sys.modules}, f)
        import colorsys  # noqa: F401  (installed: learned after this first batch)
        return
    # later blocks: this worker still runs until the second task's worker has started (deadline: 60 s)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(OUT, "second.json")):
        if time.monotonic() > deadline:
            raise RuntimeError("the second task's worker never started")
        time.sleep(0.01)

def second(block):
    path = os.path.join(OUT, "second.json")
    if not os.path.exists(path):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"colorsys": "colorsys" in sys.modules}, f)
        os.replace(tmp, path)
"""

OVERLAP_RUN = """
import json
import daisy_nb as daisy
from daisy_nb import Roi
import zi_overlap as f
a = daisy.Task("first", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=f.first,
               read_write_conflict=False, max_workers=1, requires={"cpu": 1})
b = daisy.Task("second", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=f.second,
               read_write_conflict=False, max_workers=1, requires={"cpu": 1}, upstream_tasks=[a])
ok = daisy.run_blockwise([a, b], resources={"cpu": 2}, progress=False, summary=False)
print(json.dumps({"ok": ok}))
"""


@pytest.mark.mp
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(180)
@pytest.mark.skipif(not _zygote.available(), reason="no worker template on this platform")
def test_a_task_started_while_the_previous_one_runs_finds_its_imports(tmp_path):
    """The first task's worker reports after its first batch, not only as it leaves: the second
    task's worker, forked while the first task's worker still runs, starts with its imports."""
    (tmp_path / "zi_overlap.py").write_text(OVERLAP_BLOCKFNS)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DAISY_NB_WORKER_START")}
    # each task forks its own workers (no worker moves to the next task): what the template learned shows
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), ZI_OUT=str(out), DAISY_NB_REUSE_WORKERS="0")
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OVERLAP_RUN)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=170,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # ok: the first task's later blocks saw the second task's worker start while they ran
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ok": True}, r.stderr[-3000:]
    assert json.loads((out / "first.json").read_text()) == {"colorsys": False}
    assert json.loads((out / "second.json").read_text()) == {"colorsys": True}


def test_two_reports_and_a_line_cut_between_reads():
    """A report read in two pieces yields whole names only; the second report names only what is new."""
    learner = _zygote_imports.Learner()
    learner.enabled = True
    r, w = learner.pipe()
    learner.forked(12345, (r, os.dup(w)))
    learner.pending.clear()
    os.write(w, b"zi_not_a_module_a\nzi_not_a_mod")
    learner.poll()
    assert learner.pending == [("zi_not_a_module_a", "")]
    os.write(w, b"ule_b\n")
    learner.poll()
    assert learner.pending == [("zi_not_a_module_a", ""), ("zi_not_a_module_b", "")]
    os.close(w)
    learner.reaped(12345)
    assert learner.pipes == {} and learner.partial == {} and learner.ended == set()
    learner.preload()  # neither exists: skipped, not raised
    assert learner.pending == [] and "zi_not_a_module_a" not in learner.preloaded

    r2, w2 = os.pipe()
    before = set(sys.modules) - {"wave"}
    rep = _zygote_imports.Reporter(w2, before)
    rep.send()
    rep.send()  # nothing new since: nothing written
    rep.close()
    data = b""
    while chunk := os.read(r2, 65536):
        data += chunk
    os.close(r2)
    if "wave" in sys.modules:
        assert data.split(b"\n").count(b"wave") == 1
    assert data == b"" or data.endswith(b"\n")


def test_only_installed_public_modules_are_learnable(tmp_path):
    roots = _zygote_imports.installed_roots()
    import colorsys
    import json as json_mod

    assert _zygote_imports.learnable("colorsys", colorsys, roots)
    assert _zygote_imports.learnable("json", json_mod, roots)
    assert not _zygote_imports.learnable("json._private", json_mod, roots)
    assert not _zygote_imports.learnable("__main__", sys.modules["__main__"], roots)
    mine = type(sys)("mine")
    mine.__spec__ = type("S", (), {"origin": str(tmp_path / "mine.py")})()
    assert not _zygote_imports.learnable("mine", mine, roots)
    assert not _zygote_imports.learnable("sys", sys, roots)  # built in: nothing to import


def test_a_report_round_trip_through_a_pipe():
    learner = _zygote_imports.Learner()
    import threading

    assert learner.enabled == (threading.active_count() == 1)  # a process with a Python thread never learns
    learner.enabled = True  # this test process has threads (the test runner's): the round trip only
    pipe = learner.pipe()
    assert pipe is not None
    pid = os.fork()
    if pid == 0:  # a worker that imported a module the parent lacks
        code = 0
        try:
            before = set(sys.modules) - {"wave"}
            sys.modules.pop("wave", None)
            import wave  # noqa: F401

            _zygote_imports.Reporter(pipe[1], before).close()
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    learner.forked(pid, pipe)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    had_wave = "wave" in sys.modules
    learner.reaped(pid)
    assert learner.pipes == {}
    if not had_wave:
        assert ("wave", "") in learner.pending  # (module, task): the test's fork named no task
        learner.preload()
        assert "wave" in sys.modules and "wave" in learner.preloaded
