"""Errors that say where: every bad input to a Task or a run is a ValueError/TypeError that
names the task (``Task '<id>': ``, the one prefix of configuration errors) and the parameter,
raised before any work starts (no tracking file written, no worker started)."""

from __future__ import annotations

import datetime
import re
import warnings

import pytest

import daisy_nb as daisy
from daisy_nb import Roi

TOTAL = Roi((0, 0), (40, 40))
READ = Roi((0, 0), (20, 20))
WRITE = Roi((5, 5), (10, 10))


def block_fn(block):
    pass


def worker_fn():
    pass


def make(task_id="smooth", total=TOTAL, read=READ, write=WRITE, **kw):
    kw.setdefault("process_function", block_fn)
    return daisy.Task(task_id, total, read, write, **kw)


def raises_named(exc, param, task_id="smooth"):
    """pytest.raises for an error that starts with the task's prefix and names ``param``."""
    return pytest.raises(exc, match=rf"^Task {re.escape(repr(task_id))}: .*{re.escape(param)}")


# (parameter named in the message, exception, Task keyword arguments)
BAD_TASKS = [
    ("write_roi", ValueError, dict(write=Roi((15, 15), (10, 10)))),  # sticks out of read_roi
    ("write_roi", ValueError, dict(write=Roi((5, 5), (0, 10)))),
    ("read_roi and write_roi", ValueError, dict(write=Roi((5,), (10,)))),
    ("total_roi", ValueError, dict(total=Roi((0, 0, 0), (40, 40, 40)))),
    ("total_roi", ValueError, dict(total=None)),
    ("read_roi", TypeError, dict(read="0:20")),
    ("write_roi", TypeError, dict(write=(5, 10))),
    ("fit", ValueError, dict(fit="snug")),
    ("read_write_conflict", TypeError, dict(read_write_conflict="yes")),
    ("max_workers", ValueError, dict(max_workers=0)),
    ("max_workers", TypeError, dict(max_workers="4")),
    ("max_retries", ValueError, dict(max_retries=256)),
    ("max_retries", TypeError, dict(max_retries=1.5)),
    ("max_worker_restarts", ValueError, dict(max_worker_restarts=-1)),
    ("timeout", ValueError, dict(timeout=0)),
    ("timeout", ValueError, dict(timeout=datetime.timedelta(seconds=-1))),
    ("timeout", TypeError, dict(timeout="10")),
    ("tracking_path", TypeError, dict(tracking_path=True)),
    ("tracking_path", TypeError, dict(tracking_path=5)),
    ("requires", TypeError, dict(requires=["gpu"])),
    ("requires", TypeError, dict(requires={1: 1})),
    ("requires['gpu']", ValueError, dict(requires={"gpu": -1})),
    ("skip_mask", ValueError, dict(skip_mask=[[0, 1]])),
    ("process_function", TypeError, dict(process_function=5)),
    ("process_function", TypeError, dict(process_function=lambda a, b: None)),
    ("check_function", TypeError, dict(check_function=lambda: True)),
    ("init_fn", TypeError, dict(init_fn="setup")),
    ("retry_backoff", ValueError, dict(retry_backoff=-1)),
    ("retry_backoff", ValueError, dict(retry_backoff=float("nan"))),
    ("retry_backoff", ValueError, dict(retry_backoff=float("inf"))),
    ("retry_backoff", ValueError, dict(retry_backoff=datetime.timedelta(seconds=-1))),
    ("retry_backoff", TypeError, dict(retry_backoff="1")),
    ("retry_backoff", TypeError, dict(retry_backoff=True)),
    ("retry_backoff", TypeError, dict(retry_backoff=1j)),
    ("speculative", ValueError, dict(speculative=1)),
    ("speculative", ValueError, dict(speculative=float("nan"))),
    ("speculative", TypeError, dict(speculative="3")),
    ("num_workers", TypeError, dict(num_workers=2, max_workers=2)),
    ("done_marker_path", TypeError, dict(done_marker_path="a", tracking_path="b")),
    ("upstream_tasks", TypeError, dict(upstream_tasks=["extract"])),
]


@pytest.mark.parametrize("param,exc,kw", BAD_TASKS, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(BAD_TASKS)])
def test_bad_task_parameters_name_the_task_and_the_parameter(param, exc, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with raises_named(exc, param):
            make(**kw)


def test_geometry_error_of_one_task_in_a_pipeline_built_by_a_helper_says_which():
    """The case that motivated the prefix: six tasks made in a loop, one with a bad write ROI."""

    def stage(i):
        write = Roi((15, 15), (10, 10)) if i == 4 else WRITE
        return make(f"stage{i}", write=write)

    with pytest.raises(ValueError) as e:
        [stage(i) for i in range(6)]
    assert str(e.value).startswith("Task 'stage4': write_roi ")
    assert "must lie inside read_roi" in str(e.value)


def test_bad_task_ids_name_themselves():
    with pytest.raises(TypeError, match=r"^Task 5: task_id must be a str"):
        daisy.Task(5, TOTAL, READ, WRITE)
    with pytest.raises(ValueError, match=r"^Task '\.\./x': task_id '\.\./x' has a '\.\.' segment"):
        daisy.Task("../x", TOTAL, READ, WRITE)


def test_setters_name_the_task():
    t = make()
    with raises_named(TypeError, "process_function"):
        t.process_function = 5
    with raises_named(TypeError, "check_function"):
        t.check_function = lambda a, b: True
    assert t.process_function is block_fn  # a refused value leaves the task as it was


def test_a_prefixed_error_is_not_prefixed_twice():
    with pytest.raises(ValueError) as e:
        make(fit="snug")
    assert str(e.value).count("Task 'smooth'") == 1


def test_deprecation_warnings_point_at_the_task_call():
    with pytest.warns(DeprecationWarning, match="num_workers") as rec:
        make(num_workers=2)
    assert rec[0].filename == __file__


def test_duplicate_task_ids_name_the_task():
    with raises_named(ValueError, "duplicate task_id", "a"):
        daisy.run_blockwise(make("a") + make("a"), multiprocessing=False, progress=False)


def _no_work(tmp_path):
    """Nothing of a run was written: no tracking directory of any task."""
    assert [p.name for p in tmp_path.iterdir()] == [], "a tracking store was written before the error"


@pytest.fixture
def no_template(monkeypatch):
    """Fails the test if a pool run starts its worker template (the first process a run starts)."""
    from daisy_nb.runtime.local import _zygote

    started = []
    real = _zygote.start_early
    monkeypatch.setattr(_zygote, "start_early", lambda *a, **k: started.append(1) or real(*a, **k))
    yield started
    assert started == [], "the run started its worker template before refusing its input"


@pytest.mark.parametrize("multiprocessing", [False, True])
def test_a_task_the_mode_cannot_run_is_refused_before_any_work(tmp_path, multiprocessing, no_template):
    ok = make("ok", tracking_path=tmp_path / "ok")
    if multiprocessing:  # worker processes need a function
        bad = make("nofn", tracking_path=tmp_path / "nofn", process_function=None)
        tid = "nofn"
    else:  # serial mode calls process_function(block): a worker function cannot run there
        bad = make("worker", tracking_path=tmp_path / "worker", process_function=worker_fn)
        tid = "worker"
    with raises_named(ValueError, "process_function", tid):
        daisy.run_blockwise(ok + bad, multiprocessing=multiprocessing, progress=False, summary=False)
    _no_work(tmp_path)


def test_requires_beyond_resources_is_refused_before_any_work(tmp_path, no_template):
    t = make("gpu", tracking_path=tmp_path / "gpu", requires={"gpu": 2})
    with raises_named(ValueError, "requires={'gpu': 2} but run_blockwise's resources= only has {'gpu': 1}", "gpu"):
        daisy.run_blockwise(t, resources={"gpu": 1}, progress=False, summary=False)
    with raises_named(ValueError, "only has {'gpu': 0}", "gpu"):
        daisy.run_blockwise(t, progress=False, summary=False)
    _no_work(tmp_path)


def test_bad_run_arguments_name_the_parameter(tmp_path):
    t = make(tracking_path=tmp_path / "t")
    with pytest.raises(TypeError, match="^resources must be a dict"):
        daisy.run_blockwise(t, resources=["gpu"], progress=False)
    with pytest.raises(TypeError, match="^resources must map"):
        daisy.run_blockwise(t, resources={"gpu": "1"}, progress=False)
    with pytest.raises(TypeError, match="^host must be a string"):
        daisy.run_blockwise(t, host=5, progress=False)
    with pytest.raises(ValueError, match="hang_alarm"):
        daisy.run_blockwise(t, hang_alarm={"seconds": 5}, progress=False)
    with pytest.raises(TypeError, match="^report must be a file path"):
        daisy.run_blockwise(t, report=5, progress=False)
    _no_work(tmp_path)


def test_server_checks_the_same_way(tmp_path, no_template):
    t = make("nofn", tracking_path=tmp_path / "nofn", process_function=None)
    with raises_named(ValueError, "process_function", "nofn"):
        daisy.Server().run_blockwise(t, progress=False, summary=False)
    _no_work(tmp_path)


def test_a_task_with_no_blocks_and_no_function_still_plans_and_runs_serially(tmp_path):
    """The checks refuse only what cannot run: a task with no block needs no function in serial mode."""
    empty = make("empty", total=Roi((0, 0), (4, 4)), process_function=None, tracking_path=tmp_path / "e")
    assert empty.layout.num_blocks == 0
    assert daisy.run_blockwise(empty, multiprocessing=False, progress=False, summary=False) is True
    plan = daisy.run_blockwise(empty, dry_run=True)
    assert plan.blocks == 0
