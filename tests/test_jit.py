"""Plain-Python and compiled kernels: when daisy_nb compiles, that both give the same runs,
and what a user sees (numba never loaded by small runs, one notice when compiling, warmup).

The kernel and scheduler test files run in both modes: compiled in the default run
(conftest), plain Python under ``DAISY_NB_JIT=0`` (``.ci/run``). Here, tests that need the
automatic choice run it in a fresh interpreter, where nothing has switched yet.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daisy_nb as daisy
from daisy_nb import Roi
from daisy_nb.kernels import _jit
from daisy_nb.kernels import graph as kg
from daisy_nb.kernels import surface as ks

try:
    from .strategies import graph_configs, pipeline_configs
except ImportError:
    from strategies import graph_configs, pipeline_configs

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "DAISY_NB_JIT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(WORKERS)])
    env.update(extra)
    return env


def _python(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(**env),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture
def plain_then_back():
    """Run the kernels as plain Python inside the test, then restore the session's mode."""
    was = _jit.mode()
    yield
    _jit.set_mode(was)


def _roi(spec):
    return Roi(tuple(spec[0]), tuple(spec[1]))


# ---------------------------------------------------------------- what users see
def test_small_run_never_imports_numba(tmp_path):
    """10 blocks, 2 real worker processes: numba stays unloaded in the scheduler and in the workers."""
    out = tmp_path / "out"
    out.mkdir()
    r = _python(
        """
        import json, sys
        import daisy_nb as daisy
        from daisy_nb import Roi
        import blockfns
        t = daisy.Task("s", Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=blockfns.check_numba,
                       read_write_conflict=False, max_workers=2)
        ok = daisy.run_blockwise([t], progress=False, summary=False)
        print(json.dumps({"ok": ok, "numba": "numba" in sys.modules,
                          "kernels": sorted(m for m in sys.modules if m.startswith("daisy_nb.kernels"))}))
    """,
        tmp_path,
        DAISY_NB_TEST_OUT=str(out),
    )
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["ok"] is True
    assert res["numba"] is False, "the scheduler process imported numba for a 10-block run"
    assert "daisy_nb.kernels.surface" in res["kernels"]  # the kernels did run, as plain Python
    texts = [f.read_text().split() for f in out.glob("done_s_*")]
    assert len(texts) == 10
    assert {t[3] for t in texts} == {"clean"}, "a worker imported numba"
    assert len({t[0] for t in texts}) >= 1
    assert "compiling" not in r.stderr


def test_large_run_compiles_and_small_pieces_add_up(tmp_path):
    """One Scheduler above the threshold compiles at once; small ones compile once their
    plain-Python work adds up to the price of loading numba (rent or buy)."""
    r = _python(
        """
        import json, sys
        import daisy_nb as daisy
        from daisy_nb import Roi
        from daisy_nb.kernels import _jit
        small = lambda n: daisy.Task("s", Roi((0,), (n,)), Roi((0,), (1,)), Roi((0,), (1,)), read_write_conflict=False)
        out = {}
        daisy.Scheduler([small(10)])
        out["after_10"] = "numba" in sys.modules
        from daisy_nb.scheduler import _US_BLOCK, _US_PER_DOWNSTREAM
        per_block = _US_BLOCK + _US_PER_DOWNSTREAM  # the Scheduler's estimate for this pipeline (one downstream entry)
        n = _jit.COMPILE_AT // per_block // 3
        for i in range(2):
            daisy.Scheduler([small(n)])
        out["after_two_thirds"] = _jit.compiled()
        daisy.Scheduler([small(n + 10)])
        out["after_all"] = _jit.loading() or _jit.compiled()  # numba loads in the background
        _jit.settle()
        out["after_all"] = out["after_all"] and _jit.compiled()
        print(json.dumps(out))
    """,
        tmp_path,
    )
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == {"after_10": False, "after_two_thirds": False, "after_all": True}


def test_big_graph_compiles_small_graph_does_not(tmp_path):
    r = _python(
        """
        import json, sys
        from daisy_nb import BlockwiseDependencyGraph, Roi
        g = BlockwiseDependencyGraph("g", Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), True, total_read_roi=Roi((0, 0), (20, 20)))
        g.to_arrays(); list(g.blocks()); g.upstream(g.blocks()[5])
        small = "numba" in sys.modules
        g = BlockwiseDependencyGraph("g", Roi((0, 0), (4, 4)), Roi((1, 1), (2, 2)), True, total_read_roi=Roi((0, 0), (1000, 1000)))
        a = g.to_arrays()
        print(json.dumps([small, "numba" in sys.modules, len(a.block_id)]))
    """,
        tmp_path,
    )
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [False, True, 499 * 499]


def test_forced_plain_never_compiles(tmp_path):
    r = _python(
        """
        import sys
        import daisy_nb as daisy
        from daisy_nb import Roi
        daisy.Scheduler([daisy.Task("s", Roi((0,), (100000,)), Roi((0,), (1,)), Roi((0,), (1,)))])
        print("numba" in sys.modules)
    """,
        tmp_path,
        DAISY_NB_JIT="0",
    )
    assert r.stdout.split()[-1] == "False"


def test_ctrl_c_while_numba_loads_leaves_it_loadable(tmp_path):
    """A KeyboardInterrupt in the middle of numba's import (here: raised by an import hook when
    one of its submodules loads) propagates, and the next run compiles its kernels as usual."""
    r = _python(
        """
        import sys
        import daisy_nb as daisy
        from daisy_nb import Roi
        from daisy_nb.kernels import _jit

        class Interrupt:
            def find_spec(self, name, path=None, target=None):
                if name == "numba.core.typing":
                    sys.meta_path.remove(self)
                    raise KeyboardInterrupt
                return None

        sys.meta_path.insert(0, Interrupt())
        task = daisy.Task("s", Roi((0,), (200,)), Roi((0,), (1,)), Roi((0,), (1,)))
        try:
            _jit.use_numba()
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted", _jit.compiled())
        _jit.use_numba()
        s = daisy.Scheduler([task])
        b = s.acquire_block("s")
        print(_jit.compiled(), b.block_id)
    """,
        tmp_path,
    )
    assert r.stdout.split("\n")[:2] == ["interrupted False", "True ('s', 0)"], r.stdout


def test_a_run_that_compiles_says_so_once(tmp_path):
    """An empty numba cache: one notice on stderr with an estimate, however many kernels compile."""
    r = _python(
        """
        import numpy as np
        from daisy_nb.kernels import _jit, block_id, graph
        _jit.use_numba()
        block_id.cantor_ids(np.zeros((3, 2), np.int64), np.zeros(3, np.int64))
        graph.row_level(np.zeros((1, 7), np.int64), np.zeros(2, np.int64), 0, 0)
    """,
        tmp_path,
        NUMBA_CACHE_DIR=str(tmp_path / "cache"),
    )
    lines = [ln for ln in r.stderr.splitlines() if "compiling" in ln]
    assert len(lines) == 1, r.stderr
    assert "daisy_nb" in lines[0] and "once" in lines[0] and " s " in lines[0] and "warmup" in lines[0]


def test_a_warm_cache_says_nothing(tmp_path):
    """After warmup (the session did it), a large run loads the kernels silently."""
    r = _python(
        """
        import sys
        import daisy_nb as daisy
        from daisy_nb import Roi
        from daisy_nb.kernels import _jit
        s = daisy.Scheduler([daisy.Task("s", Roi((0,), (200000,)), Roi((0,), (1,)), Roi((0,), (1,)))])
        b = s.acquire_blocks("s", 10)
        _jit.settle()  # numba loads in the background; the next hand-out would switch
        print(_jit.compiled(), _jit.cache_is_warm())
    """,
        tmp_path,
    )
    assert r.stdout.split()[-2:] == ["True", "True"]
    assert "compiling" not in r.stderr


def test_warmup_command(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "warmup"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "already compiled" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "warmup", "--check"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=300,
    )
    assert r.returncode == 0 and "compiled" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "daisy_nb", "warmup", "--check"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(NUMBA_CACHE_DIR=str(tmp_path / "empty")),
        timeout=300,
    )
    assert r.returncode == 1 and "not compiled" in r.stdout


def test_set_mode_validates():
    with pytest.raises(ValueError, match="mode"):
        _jit.set_mode("fast")


# ---------------------------------------------------------------- same results in both modes
def _trace(config, seed, switch_at=None):
    """Drive a Scheduler through a seeded mix of batch and single acquires, releases with
    failures and give-backs; return every observable step and the final counters and state.
    ``switch_at``: switch to compiled kernels before that step (between two Scheduler calls,
    where a background load switches)."""
    rng = np.random.default_rng(seed)
    tasks = {
        tid: daisy.Task(
            tid,
            _roi(c["total_roi"]),
            _roi(c["read_roi"]),
            _roi(c["write_roi"]),
            read_write_conflict=c["read_write_conflict"],
            fit=c["fit"],
            max_retries=c["max_retries"],
        )
        for tid, c in config["tasks"].items()
    }
    s = daisy.Scheduler(daisy.Pipeline(list(tasks.values()), [(tasks[u], tasks[d]) for u, d in config["edges"]]))
    log, probes = [], []
    for i in range(5000):
        if i == switch_at:
            _jit.set_mode("numba")
        progressed = False
        for tid in s.task_ids:
            if rng.random() < 0.5:
                b = s.acquire_block(tid)
                if b is None:
                    continue
                progressed = True
                if len(probes) < 6:
                    probes.append(b)
                b.status = daisy.BlockStatus.FAILED if rng.random() < 0.2 else daisy.BlockStatus.SUCCESS
                log.append(("one", tid, b.block_id[1], b.read_roi.offset, b.write_roi.shape, b.status))
                s.release_block(b)
            else:
                batch = s.acquire_blocks(tid, int(rng.integers(1, 5)))
                if not len(batch):
                    continue
                progressed = True
                codes = rng.choice(np.array([0, 2, 2, 3], np.uint8), len(batch))
                log.append(("batch", tid, batch.spatial_id.tolist(), batch.read_offset.tolist(), codes.tolist()))
                s.release_blocks(tid, batch.index, codes)
        if not progressed:
            break
    states = {
        tid: (st.completed_count, st.skipped_count, st.failed_count, st.orphaned_count, st.is_done())
        for tid, st in s.task_states.items()
    }
    states["state"] = [a.tolist() for a in (s.status, s.retries, s.n_met, s.cnt, s.queue)]
    g = s.dependency_graph
    neigh = [([u.block_id for u in g.upstream(b)], [d.block_id for d in g.downstream(b)]) for b in probes]
    return log, states, neigh


@settings(
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
@given(pipeline_configs(max_tasks=4), st.integers(0, 2**32 - 1), st.integers(0, 80))
def test_switching_to_compiled_mid_run_changes_nothing(plain_then_back, config, seed, switch_at):
    """Plain, then compiled from a random step on (what a background load does): the blocks handed
    out, their order, the counters and the state are an all-plain and an all-compiled run's."""
    _jit.set_mode("python")
    plain = _trace(config, seed)
    _jit.set_mode("python")
    mixed = _trace(config, seed, switch_at=switch_at)
    _jit.set_mode("numba")
    compiled = _trace(config, seed)
    assert mixed == plain
    assert mixed == compiled


@settings(
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
@given(pipeline_configs(max_tasks=4), st.integers(0, 2**32 - 1))
def test_scheduler_plain_and_compiled_give_the_same_run(plain_then_back, config, seed):
    _jit.set_mode("numba")
    compiled = _trace(config, seed)
    assert ks.step.__class__.__name__ != "function"
    _jit.set_mode("python")
    assert ks.step.__class__.__name__ == "function"
    assert _trace(config, seed) == compiled


@settings(
    deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(graph_configs())
def test_graph_plain_and_compiled_give_the_same_arrays(plain_then_back, config):
    def arrays():
        g = daisy.BlockwiseDependencyGraph(
            "g",
            _roi(config["read_roi"]),
            _roi(config["write_roi"]),
            config["read_write_conflict"],
            config["fit"],
            total_read_roi=_roi(config["total_roi"]),
        )
        a = g.to_arrays()
        blocks = list(g.blocks())[:20]
        return (
            [np.asarray(x).tolist() for x in a],
            [b.block_id for b in blocks],
            [[u.block_id for u in g.upstream(b)] for b in blocks],
            [[d.block_id for d in g.downstream(b)] for b in blocks],
        )

    _jit.set_mode("numba")
    compiled = arrays()
    _jit.set_mode("python")
    assert kg.fill_rows.__class__.__name__ == "function"
    assert arrays() == compiled


def test_rebinding_reaches_kernels_imported_by_name(plain_then_back):
    """surface.py imports graph kernels by name: both modules switch together."""
    _jit.set_mode("numba")
    assert ks.cantor is kg.cantor and ks.cantor.__class__.__name__ != "function"
    _jit.set_mode("python")
    assert ks.cantor is kg.cantor and ks.cantor.__class__.__name__ == "function"


# ---------------------------------------------------------------- loading in the background
# A fresh interpreter each, COMPILE_AT lowered so that a small Scheduler decides to compile.
# _jit._load_hook runs in the loader thread ("start" before numba's import, "loaded" when the
# kernels are ready): the tests order events through it, never through timing.
_GATED = """
import sys, threading, time
import daisy_nb as daisy
from daisy_nb import Roi
from daisy_nb.kernels import _jit

_jit.COMPILE_AT = 1
started, gate, prepared, loaded = threading.Event(), threading.Event(), threading.Event(), threading.Event()

def hook(what):
    if what == "start":
        started.set()
        gate.wait()
    elif what == "prepared":  # numba imported, the dispatchers made: loading or compiling next
        prepared.set()
    else:
        loaded.set()

_jit._load_hook = hook

def wait(event):
    deadline = time.monotonic() + 120
    while not event.wait(0.05):
        assert time.monotonic() < deadline, "the loader thread never got there"

def tasks():
    a = daisy.Task("a", Roi((-1, -1), (26, 26)), Roi((-1, -1), (6, 6)), Roi((0, 0), (4, 4)))
    b = daisy.Task("b", Roi((-1, -1), (26, 26)), Roi((-1, -1), (6, 6)), Roi((0, 0), (4, 4)))
    return daisy.Pipeline([a, b], [(a, b)])
"""


def test_the_first_block_goes_out_while_numba_loads(tmp_path):
    """A run that compiles hands out its first block before numba is imported, switches at a
    hand-out once the loader is done, and hands out what an all-plain run hands out."""
    r = _python(
        _GATED
        + textwrap.dedent(
            """
        def drain(s, log, gated):
            live = list(s.task_ids)
            while live:
                for tid in list(live):
                    b = s.acquire_block(tid)
                    if b is None:
                        if s.is_task_done(tid):
                            live.remove(tid)
                        continue
                    log.append((tid, b.block_id[1], _jit.compiled()))
                    if gated and len(log) == 1:
                        wait(started)
                        print("first", "numba" in sys.modules, _jit.loading(), _jit.compiled())
                        gate.set()
                        wait(loaded)
                    b.status = daisy.BlockStatus.SUCCESS
                    s.release_block(b)
            return [(t, i) for t, i, _ in log], {t: st.completed_count for t, st in s.task_states.items()}

        log = []
        mixed = drain(daisy.Scheduler(tasks(), block_tracking=False), log, True)
        switched = [i for i, (_, _, c) in enumerate(log) if c]
        print("switched", switched[0], len(log), _jit.compiled())
        _jit.set_mode("python")
        plain = drain(daisy.Scheduler(tasks(), block_tracking=False), [], False)
        print("same", mixed == plain)
        """
        ),
        tmp_path,
    )
    lines = r.stdout.splitlines()
    assert lines[0] == "first False True False", r.stdout  # numba not even imported yet
    _, at, n, compiled = lines[1].split()
    assert 1 <= int(at) < int(n) and compiled == "True", r.stdout  # switched mid-run, at the next hand-out
    assert lines[2] == "same True", r.stdout


def test_interpreter_exit_stops_a_load_in_flight(tmp_path):
    """The script ends while the loader thread compiles the kernels from an empty cache (~15 s):
    the interpreter stops it and exits cleanly (no traceback, no hang), and the compile did not
    finish (the next process finds the cache cold)."""
    cache = tmp_path / "cache"
    r = _python(
        _GATED.replace("gate.wait()", "pass")
        + textwrap.dedent(
            """
        s = daisy.Scheduler(tasks(), block_tracking=False)
        print(s.acquire_block("a").block_id[0], _jit.loading())
        wait(prepared)  # the script ends while the loader compiles
        """
        ),
        tmp_path,
        NUMBA_CACHE_DIR=str(cache),
    )
    assert r.stdout.split("\n")[0] == "a True", r.stdout
    assert "Traceback" not in r.stderr and "Exception" not in r.stderr, r.stderr
    r = _python("from daisy_nb.kernels import _jit; print(_jit.cache_is_warm())", tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert r.stdout.split()[-1] == "False"


def test_ctrl_c_while_numba_loads_in_the_background(tmp_path):
    """Ctrl-C reaches the main thread, never the loader: the run sees KeyboardInterrupt, the
    load goes on, and the next call switches to the compiled kernels as usual."""
    r = _python(
        _GATED
        + textwrap.dedent(
            """
        import os, signal
        # Python's own handler, even when this process was started with SIGINT ignored (a
        # background job of a non-interactive shell: CI)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        s = daisy.Scheduler(tasks(), block_tracking=False)
        s.acquire_block("a")
        wait(started)
        try:
            gate.set()
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.01)
            print("no interrupt")
        except KeyboardInterrupt:
            print("interrupted", _jit.compiled())
        _jit.settle()
        b = s.acquire_block("a")
        from daisy_nb.kernels import surface
        print(_jit.compiled(), type(surface.step).__name__, b.block_id[0])
        """
        ),
        tmp_path,
    )
    assert r.stdout.split("\n")[:2] == ["interrupted False", "True CPUDispatcher a"], r.stdout


def test_forced_compiling_stays_synchronous(tmp_path):
    """DAISY_NB_JIT=1: the first Scheduler compiles before it returns (no background load)."""
    r = _python(
        """
        import daisy_nb as daisy
        from daisy_nb import Roi
        from daisy_nb.kernels import _jit
        daisy.Scheduler([daisy.Task("s", Roi((0,), (10,)), Roi((0,), (1,)), Roi((0,), (1,)))])
        print(_jit.compiled(), _jit.loading())
        """,
        tmp_path,
        DAISY_NB_JIT="1",
    )
    assert r.stdout.split()[-2:] == ["True", "False"]


def test_a_run_that_loads_numba_in_the_background_keeps_its_workers_clean(tmp_path):
    """run_blockwise with 2 worker processes while the scheduler loads numba in the background:
    every block runs, the scheduler ends compiled, and no worker imported numba."""
    out = tmp_path / "out"
    out.mkdir()
    r = _python(
        """
        import json, sys
        import daisy_nb as daisy
        from daisy_nb import Roi
        from daisy_nb.kernels import _jit
        import blockfns
        _jit.COMPILE_AT = 1  # any run compiles: in the background
        t = daisy.Task("s", Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)), process_function=blockfns.check_numba,
                       read_write_conflict=False, max_workers=2)
        ok = daisy.run_blockwise([t], progress=False, summary=False)
        _jit.settle()
        print(json.dumps({"ok": ok, "compiled": _jit.compiled()}))
    """,
        tmp_path,
        DAISY_NB_TEST_OUT=str(out),
    )
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ok": True, "compiled": True}
    texts = [f.read_text().split() for f in out.glob("done_s_*")]
    assert len(texts) == 10
    assert {t[3] for t in texts} == {"clean"}, "a worker imported numba"
