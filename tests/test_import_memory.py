"""The worker template's import memory (``runtime/local/_zygote_imports.py``,
``DAISY_NB_IMPORT_MEMORY``): a run writes down which installed modules each task's workers
imported, and the next run of the same program loads them into the template before it forks
that task's first worker, so no task's first block waits for its imports."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import daisy_nb as daisy
from daisy_nb import Roi
from daisy_nb.runtime.local import _zygote, _zygote_imports

ROOT = Path(__file__).resolve().parents[1]

BLOCKFNS = '''
import json, os, sys

def _note(task, module):
    """First call in this process: whether ``module`` was loaded before the block imported it."""
    path = os.path.join(os.environ["ZM_OUT"], f"{os.environ['ZM_ROUND']}_{task}_{os.getpid()}.json")
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump({"loaded": module in sys.modules}, f)

def first(block):
    _note("first", "colorsys")
    import colorsys  # noqa: F401  (the standard library: installed, so remembered)

def second(block):
    _note("second", "wave")
    import wave  # noqa: F401
'''

RUN = """
import json
import daisy_nb as daisy
from daisy_nb import Roi
import zm_blockfns as f
a = daisy.Task("first", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=f.first,
               read_write_conflict=False, max_workers=2, requires={"cpu": 1})
b = daisy.Task("second", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=f.second,
               read_write_conflict=False, max_workers=2, requires={"cpu": 1}, upstream_tasks=[a])
ok = daisy.run_blockwise([a, b], resources={"cpu": 2}, progress=False, summary=False)
print(json.dumps({"ok": ok}))
"""


def _run(tmp_path: Path, out: Path, memory: Path, round_: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DAISY_NB_WORKER_START")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]),
        ZM_OUT=str(out),
        ZM_ROUND=round_,
        DAISY_NB_IMPORT_MEMORY=str(memory),
        DAISY_NB_REUSE_WORKERS="0",  # each task forks its own workers: what the template learned shows
    )
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=170
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ok": True}
    notes: dict = {"first": [], "second": []}
    for p in out.glob(f"{round_}_*.json"):
        notes[p.name.split("_")[1]].append(json.loads(p.read_text())["loaded"])
    return notes


@pytest.mark.mp
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _zygote.available(), reason="no worker template on this platform")
def test_the_next_run_forks_every_worker_with_what_its_task_imported(tmp_path):
    (tmp_path / "zm_blockfns.py").write_text(BLOCKFNS)
    out = tmp_path / "out"
    out.mkdir()
    memory = tmp_path / "memory"

    cold = _run(tmp_path, out, memory, "cold")
    assert cold["first"] and cold["second"]
    # nothing remembered yet: the first worker of each task imported its module itself
    assert False in cold["first"] and False in cold["second"], cold
    files = list(memory.glob("*.json"))
    assert len(files) == 1, files
    remembered = _zygote_imports.read_memory(str(files[0]))
    assert ("colorsys", "first") in remembered and ("wave", "second") in remembered, remembered

    warm = _run(tmp_path, out, memory, "warm")
    # every worker of both tasks, the first ones included, started with its module loaded
    assert warm["first"] and warm["second"]
    assert all(warm["first"]) and all(warm["second"]), warm
    assert len(list(memory.glob("*.json"))) == 1  # the same program: the same memory, rewritten
    assert not list(memory.glob("*.tmp"))

    # an edited program starts over: its block functions' module has another stamp
    src = tmp_path / "zm_blockfns.py"
    src.write_text(BLOCKFNS + "\n# edited\n")
    edited = _run(tmp_path, out, memory, "edited")
    assert False in edited["first"] and False in edited["second"], edited
    assert len(list(memory.glob("*.json"))) == 2


@pytest.mark.mp
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _zygote.available(), reason="no worker template on this platform")
def test_switched_off_it_writes_nothing(tmp_path, monkeypatch):
    (tmp_path / "zm_blockfns.py").write_text(BLOCKFNS)
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for word in ("0", "off"):
        env_memory = word
        notes = _run(tmp_path, out, Path(env_memory), f"off{word}")
        assert False in notes["first"] and False in notes["second"]
    assert not any(home.rglob("*")) and not (tmp_path / "0").exists() and not (tmp_path / "off").exists()


def _blockfn(block):
    return None


class _Callable:
    def __call__(self, block):
        return None


def test_memory_path_names_the_program(tmp_path, monkeypatch):
    monkeypatch.setenv("DAISY_NB_IMPORT_MEMORY", str(tmp_path))

    def task(tid, fn):
        return daisy.Task(tid, Roi((0,), (10,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=fn)

    one = _zygote.memory_path([task("a", _blockfn)])
    assert one is not None and os.path.dirname(one) == str(tmp_path)
    # the same function bound to other arguments is the same program
    assert _zygote.memory_path([task("a", functools.partial(_blockfn))]) == one
    assert _zygote.memory_path([task("b", _blockfn)]) != one  # another task id
    assert _zygote.memory_path([task("a", _Callable())]) not in (one, None)  # another function
    assert _zygote.memory_path([task("a", _blockfn), task("b", _blockfn)]) != one
    monkeypatch.setenv("DAISY_NB_IMPORT_MEMORY", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    default = _zygote.memory_path([task("a", _blockfn)])
    assert default is not None and default.startswith(str(tmp_path / "home" / ".cache" / "daisy_nb" / "imports"))
    for off in ("0", "false", "No", " off "):
        monkeypatch.setenv("DAISY_NB_IMPORT_MEMORY", off)
        assert _zygote.memory_path([task("a", _blockfn)]) is None


def test_a_memory_is_only_a_hint(tmp_path):
    path = str(tmp_path / "sub" / "m.json")
    assert _zygote_imports.read_memory(path) == []  # none yet
    _zygote_imports.write_memory(path, [("colorsys", "a"), ("xml.dom", "b")])
    assert _zygote_imports.read_memory(path) == [("colorsys", "a"), ("xml.dom", "b")]
    assert os.listdir(tmp_path / "sub") == ["m.json"]
    for bad in ("not json", "[]", '{"version": 99, "modules": []}', '{"version": 1}', '{"version": 1, "modules": 3}'):
        Path(path).write_text(bad)
        assert _zygote_imports.read_memory(path) == [], bad
    # names that are not module names are dropped, the rest kept
    Path(path).write_text(json.dumps({"version": 1, "modules": [["os; rm", "a"], ["", "a"], ["json", "a"], [1, "a"]]}))
    assert _zygote_imports.read_memory(path) == [("json", "a")]


def test_the_memory_directory_keeps_the_programs_run_last(tmp_path, monkeypatch):
    """Each edit of a program names a new memory file: writing one deletes all but the
    ``MAX_MEMORIES`` modified last, the one just written among them; other files stay."""
    monkeypatch.setattr(_zygote_imports, "MAX_MEMORIES", 3)
    old = [f"{i:016x}.json" for i in range(4)] + ["f" * 32 + ".json"]  # as named now, and before
    for i, name in enumerate(old):
        p = tmp_path / name
        p.write_text("{}")
        os.utime(p, ns=(10**18 + i, 10**18 + i))  # the first oldest
    others = ["notes.txt", "config.json", "0123.json"]  # a directory the user chose may hold other files
    for name in others:
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, ns=(1, 1))
    monkeypatch.setenv("DAISY_NB_IMPORT_MEMORY", str(tmp_path))
    t = daisy.Task("a", Roi((0,), (10,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=_blockfn)
    new = Path(_zygote.memory_path([t]) or "").name
    assert _zygote_imports.is_memory_name(new)
    _zygote_imports.write_memory(str(tmp_path / new), [("json", "a")])
    assert sorted(os.listdir(tmp_path)) == sorted([new, *old[-2:], *others])
    assert _zygote_imports.read_memory(str(tmp_path / new)) == [("json", "a")]


def test_recall_imports_a_task_and_those_remembered_before_it(monkeypatch):
    """Before a worker of task b forks: a's and b's modules; c's wait for idle time, one at a time."""
    # the template has no Python thread; this test process may (the runner's, a dashboard's)
    monkeypatch.setattr(_zygote_imports, "_python_threads", lambda: 1)
    names = [m for m in ("colorsys", "wave", "tabnanny", "netrc", "plistlib") if m not in sys.modules]
    if len(names) < 3:
        pytest.skip("the standard modules this test imports are loaded already")
    a, b, c, gone = names[0], names[1], names[2], "zm_no_such_module"
    learner = _zygote_imports.Learner([(a, "a"), (gone, "b"), (b, "b"), (c, "c")])
    learner.enabled = True
    learner.recall("unknown")  # a task the memory does not know: nothing
    assert learner.preloaded == [] and len(learner.remembered) == 4
    # before the first fork, idle time imports the first remembered task's modules only
    assert learner.idle_work()
    learner.recall_one()
    assert learner.preloaded == [a] and learner.remembered[0] == (gone, "b") and not learner.idle_work()
    learner.forked(4242, None, "a")
    assert learner.idle_work()
    learner.recall("b")
    assert learner.preloaded == [a, b] and a in sys.modules and b in sys.modules
    assert learner.remembered == [(c, "c")]
    learner.recall_one()
    assert learner.preloaded == [a, b, c] and learner.remembered == [] and not learner.idle_work()
    learner.recall_one()  # nothing left: nothing happens
    # what the next run remembers: what was imported, each with its task (the failed one forgotten)
    assert learner.memory() == [(a, "a"), (b, "b"), (c, "c")]
