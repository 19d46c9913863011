"""``Task`` and ``Pipeline``: daisy 2.0.0's API (API.md 1.2, 1.3), the daisy 1.x
aliases, and validation that happens before any block runs."""

from __future__ import annotations

import copy
import datetime
import inspect
import warnings

import numpy as np
import pytest

import daisy_nb as daisy
from daisy_nb import BlockStatus, Roi

T2 = Roi((0, 0), (40, 40))
R2 = Roi((0, 0), (10, 10))
W2 = Roi((0, 0), (10, 10))


def mk(tid="t", total=T2, read=R2, write=W2, **kw):
    return daisy.Task(tid, total, read, write, **kw)


def task_1d(tid, n=4, **kw):
    return daisy.Task(tid, Roi((0,), (10 * n,)), Roi((0,), (10,)), Roi((0,), (10,)), **kw)


def ids(tasks):
    return [t.task_id for t in tasks]


def edge_ids(p):
    return [(u.task_id, d.task_id) for u, d in p.edges]


# ---------------------------------------------------------------------------
# Task: signature, defaults, properties
# ---------------------------------------------------------------------------


def test_signature_matches_daisy_2():
    params = list(inspect.signature(daisy.Task).parameters.values())
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == [
        "task_id",
        "total_roi",
        "read_roi",
        "write_roi",
        "process_function",
        "check_function",
        "read_write_conflict",
        "fit",
        "max_workers",
        "max_retries",
        "timeout",
        "tracking_path",
        "requires",
        "max_worker_restarts",
        "skip_mask",
    ]
    kw_only = {p.name for p in params if p.kind == p.KEYWORD_ONLY}
    assert {"num_workers", "upstream_tasks", "done_marker_path"} <= kw_only


def test_defaults():
    t = mk()
    assert t.task_id == "t"
    assert t.max_retries == 2
    assert t.timeout_secs == 600.0 and isinstance(t.timeout_secs, float)
    assert t.max_workers == 1
    assert t.max_worker_restarts == 10
    assert t.read_write_conflict is True
    assert t.fit == "valid"
    assert t.requires == {}
    assert t.tracking_path is None and t.done_marker_path is None
    assert t.process_function is None and t.check_function is None
    assert t.skip_mask is None
    assert t.block_grid_shape == [4, 4]
    assert (t.total_roi, t.read_roi, t.write_roi) == (T2, R2, W2)


def test_positional_arguments_in_daisy_order():
    def f(b):
        pass

    def c(b):
        return False

    t = daisy.Task("p", T2, R2, W2, f, c, False, "overhang", 3, 4, 5.0, False, {"gpu": 1}, 7, None)
    assert t.process_function is f and t.check_function is c
    assert (t.read_write_conflict, t.fit, t.max_workers, t.max_retries, t.timeout_secs) == (
        False,
        "overhang",
        3,
        4,
        5.0,
    )
    assert (t.tracking_path, t.requires, t.max_worker_restarts) == (False, {"gpu": 1}, 7)


def test_block_grid_shape():
    # API 1.2: [4,4] for 400^2 total with 100^2 blocks
    t = daisy.Task("g", Roi((0, 0), (400, 400)), Roi((0, 0), (100, 100)), Roi((0, 0), (100, 100)))
    assert t.block_grid_shape == [4, 4]
    # with context 5: 4 x 2 blocks (CORE 7.1 example)
    t = daisy.Task("g", Roi((0, 0), (50, 30)), Roi((0, 0), (20, 20)), Roi((5, 5), (10, 10)))
    assert t.block_grid_shape == [4, 2]


def test_timeout_forms():
    assert mk(timeout=2).timeout_secs == 2.0
    assert mk(timeout=0.5).timeout_secs == 0.5
    assert mk(timeout=datetime.timedelta(minutes=2)).timeout_secs == 120.0


def test_requires_is_a_copy():
    req = {"cpu": 2}
    t = mk(requires=req)
    req["cpu"] = 5
    got = t.requires
    got["gpu"] = 1
    assert t.requires == {"cpu": 2}


def test_functions_are_settable_and_copies_share_them():
    t = mk()

    def f(b):
        pass

    t.process_function = f
    t.check_function = lambda b: True
    c = copy.copy(t)
    d = copy.deepcopy(t)
    assert c.process_function is f and d.process_function is f
    assert c.task_id == t.task_id and c is not t


def test_worker_function_with_no_arguments_is_accepted():
    def worker():
        pass

    def worker_ctx(*, context=None):
        pass

    assert mk(process_function=worker).process_function is worker
    assert mk(process_function=worker_ctx).process_function is worker_ctx

    class Obj:
        def method(self, block):
            pass

    mk(process_function=Obj().method)  # self is not counted


def test_init_callback_fn_is_not_accepted():
    with pytest.raises(TypeError):
        mk(init_callback_fn=lambda: None)


# ---------------------------------------------------------------------------
# daisy 1.x aliases and deprecated names
# ---------------------------------------------------------------------------


def test_num_workers_alias_warns():
    with pytest.warns(DeprecationWarning, match="num_workers"):
        t = mk(num_workers=3)
    assert t.max_workers == 3


def test_num_workers_and_max_workers_both_given():
    with pytest.raises(TypeError, match="num_workers"):
        mk(num_workers=3, max_workers=2)


def test_done_marker_path_alias_warns(tmp_path):
    with pytest.warns(DeprecationWarning, match="done_marker_path"):
        t = mk(done_marker_path=str(tmp_path / "x"))
    assert t.tracking_path == str(tmp_path / "x") == t.done_marker_path


def test_done_marker_path_and_tracking_path_both_given(tmp_path):
    with pytest.raises(TypeError, match="done_marker_path"):
        mk(done_marker_path=str(tmp_path / "x"), tracking_path=str(tmp_path / "y"))


def test_upstream_tasks_warns_and_records():
    a = task_1d("a")
    with pytest.warns(DeprecationWarning, match="upstream_tasks"):
        b = task_1d("b", upstream_tasks=[a])
    assert b.upstream_tasks == [a]
    with pytest.raises(TypeError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            task_1d("c", upstream_tasks=[1])


def test_no_warning_without_deprecated_names():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mk(max_workers=2, tracking_path=False)


def _legacy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = task_1d("a")
        b = task_1d("b", upstream_tasks=[a])
        c = task_1d("c", upstream_tasks=[a])
        d = task_1d("d", upstream_tasks=[b, c])
    return a, b, c, d


def test_list_of_tasks_with_upstream_tasks_builds_the_edges():
    a, b, c, d = _legacy()
    s = daisy.Scheduler([d])  # upstream tasks are collected recursively
    assert sorted(s.task_ids) == ["a", "b", "c", "d"]
    assert sorted(edge_ids(s.pipeline)) == [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    assert sorted(s.upstream_task_ids("d")) == ["b", "c"]
    assert s.upstream_task_ids("a") == []
    # the same task listed again (directly and via upstream_tasks) is one task
    s2 = daisy.Scheduler([a, b, c, d, a])
    assert sorted(s2.task_ids) == ["a", "b", "c", "d"] and len(s2.pipeline.edges) == 4


def test_list_form_runs_in_dependency_order():
    order = []

    def f(block):
        order.append((block.task_id, block.block_id[1]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = task_1d("a", process_function=f)
        b = task_1d("b", process_function=f, upstream_tasks=[a])
    assert daisy.run_blockwise([b], multiprocessing=False, summary=False) is True
    pos = {k: i for i, k in enumerate(order)}
    assert len(order) == 8
    for i in range(4):
        assert pos[("b", i)] > pos[("a", i)]


# ---------------------------------------------------------------------------
# Pipeline composition
# ---------------------------------------------------------------------------


def test_add_chains_outputs_to_sources():
    a, b, c = task_1d("a"), task_1d("b"), task_1d("c")
    p = a + b
    assert isinstance(p, daisy.Pipeline)
    assert ids(p.tasks) == ["a", "b"] and edge_ids(p) == [("a", "b")]
    assert ids(p.sources) == ["a"] and ids(p.outputs) == ["b"]
    q = (a | b) + c
    assert sorted(edge_ids(q)) == [("a", "c"), ("b", "c")]
    assert ids(q.sources) == ["a", "b"] and ids(q.outputs) == ["c"]
    r = a + (b | c)
    assert sorted(edge_ids(r)) == [("a", "b"), ("a", "c")]
    assert ids(r.outputs) == ["b", "c"]
    chain = a + b + c
    assert edge_ids(chain) == [("a", "b"), ("b", "c")]


def test_or_unions_without_edges():
    a, b = task_1d("a"), task_1d("b")
    p = a | b
    assert ids(p.tasks) == ["a", "b"] and p.edges == []
    assert ids(p.sources) == ids(p.outputs) == ["a", "b"]


def test_reflected_and_mixed_forms():
    a, b, c = task_1d("a"), task_1d("b"), task_1d("c")
    p = b + c
    assert sorted(edge_ids(a + p)) == [("a", "b"), ("b", "c")]
    assert sorted(edge_ids(p + a)) == [("b", "c"), ("c", "a")]
    assert sorted(ids((a | p).tasks)) == ["a", "b", "c"] and edge_ids(a | p) == [("b", "c")]
    assert sorted(ids((p | a).tasks)) == ["a", "b", "c"] and edge_ids(p | a) == [("b", "c")]
    assert sorted(edge_ids(p.__radd__(a))) == [("a", "b"), ("b", "c")]
    assert sorted(ids(p.__ror__(a).tasks)) == ["a", "b", "c"]
    assert sorted(edge_ids(a.__radd__(p))) == [("b", "c"), ("c", "a")]
    assert sorted(ids(a.__ror__(p).tasks)) == ["a", "b", "c"]


def test_identity_deduplication():
    a, b, c = task_1d("a"), task_1d("b"), task_1d("c")
    p = (a + b) | (a + c)
    assert ids(p.tasks) == ["a", "b", "c"]
    assert sorted(edge_ids(p)) == [("a", "b"), ("a", "c")]
    q = (a + b) | (a + b) | a
    assert ids(q.tasks) == ["a", "b"] and edge_ids(q) == [("a", "b")]
    assert ids(daisy.Pipeline([a, b, a]).tasks) == ["a", "b"]


def test_composition_never_mutates():
    a, b, c = task_1d("a"), task_1d("b"), task_1d("c")
    p = a + b
    tasks, edges = p.tasks, p.edges
    q = p + c
    r = c + p
    s = p | c
    assert p.tasks == tasks and p.edges == edges and edge_ids(p) == [("a", "b")]
    assert len(q.edges) == len(r.edges) == 2 and len(s.edges) == 1
    # the returned lists are copies
    p.tasks.append(c)
    p.edges.append((b, c))
    assert ids(p.tasks) == ["a", "b"] and edge_ids(p) == [("a", "b")]
    assert a.upstream_tasks == [] and b.upstream_tasks == []


@pytest.mark.parametrize("other", [1, 2.5, "x", True, [1], {"a": 1}, (1,), None])
def test_composition_with_non_tasks_raises_type_error(other):
    a = task_1d("a")
    p = a + task_1d("b")
    for x in (a, p):
        with pytest.raises(TypeError):
            x + other
        with pytest.raises(TypeError):
            other + x
        with pytest.raises(TypeError):
            x | other
        with pytest.raises(TypeError):
            other | x


def test_pipeline_constructor_and_from_task():
    a, b = task_1d("a"), task_1d("b")
    p = daisy.Pipeline([a, b], [(a, b)])
    assert ids(p.tasks) == ["a", "b"] and edge_ids(p) == [("a", "b")]
    assert ids(daisy.Pipeline.from_task(a).tasks) == ["a"]
    assert daisy.Pipeline().tasks == [] and daisy.Pipeline().edges == []
    assert repr(p) == 'Pipeline(tasks=["a", "b"], sources=["a"], outputs=["b"], edges=[("a", "b")])'
    with pytest.raises(TypeError):
        daisy.Pipeline([a, "b"])


def test_edge_to_a_task_not_in_the_list_raises_at_construction():
    a, b = task_1d("a"), task_1d("b")
    with pytest.raises(ValueError, match="downstream"):
        daisy.Pipeline([a], [(a, b)])
    with pytest.raises(ValueError, match="upstream"):
        daisy.Pipeline([b], [(a, b)])


def test_pipeline_run_blockwise_and_reset(tmp_path):
    calls = []
    a = task_1d("a", process_function=lambda b: calls.append(b.block_id[1]), tracking_path=str(tmp_path / "a"))
    b = task_1d("b", process_function=lambda b: calls.append(b.block_id[1]), tracking_path=False)
    p = a + b
    assert p.run_blockwise(multiprocessing=False, summary=False) is True
    assert len(calls) == 8 and (tmp_path / "a").is_dir()
    assert p.reset() == [str(tmp_path / "a"), None]
    assert not (tmp_path / "a").exists()
    assert a.reset() is None


# ---------------------------------------------------------------------------
# pipeline validation: duplicate ids, cycles (at Scheduler / run, before any work)
# ---------------------------------------------------------------------------


def counting_task(tid, calls, **kw):
    return task_1d(tid, process_function=lambda b: calls.append(b.block_id), **kw)


def test_duplicate_task_ids_raise_before_any_work(tmp_path):
    calls = []
    a1 = counting_task("a", calls, tracking_path=str(tmp_path / "a1"))
    a2 = counting_task("a", calls)
    p = a1 + a2  # a Pipeline itself accepts it
    assert len(p.tasks) == 2
    with pytest.raises(ValueError, match="Task 'a': duplicate task_id in pipeline"):
        daisy.Scheduler(p)
    with pytest.raises(ValueError, match="duplicate"):
        daisy.Scheduler([a1, a2])
    with pytest.raises(ValueError, match="duplicate"):
        daisy.run_blockwise(a1 | a2, multiprocessing=False, summary=False)
    assert calls == [] and not (tmp_path / "a1").exists()


def test_cycles_raise_before_any_work(tmp_path):
    calls = []
    a = counting_task("a", calls, tracking_path=str(tmp_path / "a"))
    b = counting_task("b", calls)
    c = counting_task("c", calls)
    for p in (daisy.Pipeline([a, b], [(a, b), (b, a)]), a + a, daisy.Pipeline([a, b, c], [(a, b), (b, c), (c, b)])):
        with pytest.raises(ValueError, match="cycle"):
            daisy.Scheduler(p)
        with pytest.raises(ValueError, match="cycle"):
            daisy.run_blockwise(p, multiprocessing=False, summary=False)
    assert calls == [] and not (tmp_path / "a").exists()


def test_empty_task_list_raises():
    with pytest.raises(ValueError):
        daisy.Scheduler([])


def test_connected_tasks_with_different_dimensions_raise():
    a = task_1d("a")
    b = mk("b")
    with pytest.raises(ValueError, match="dimensions"):
        daisy.Scheduler(a + b)
    daisy.Scheduler(a | b)  # unconnected: fine


# ---------------------------------------------------------------------------
# parameter validation: named errors at construction
# ---------------------------------------------------------------------------


def two_args(a, b):
    pass


BAD = [
    ("max_workers", dict(max_workers=0), ValueError),
    ("max_workers", dict(max_workers=-3), ValueError),
    ("max_workers", dict(max_workers=1.5), TypeError),
    ("max_retries", dict(max_retries=-1), ValueError),
    ("max_retries", dict(max_retries="2"), TypeError),
    ("max_worker_restarts", dict(max_worker_restarts=-1), ValueError),
    ("timeout", dict(timeout=0), ValueError),
    ("timeout", dict(timeout=-1.0), ValueError),
    ("timeout", dict(timeout=float("nan")), ValueError),
    ("timeout", dict(timeout=datetime.timedelta(0)), ValueError),
    ("timeout", dict(timeout="10"), TypeError),
    ("requires", dict(requires={"gpu": -1}), ValueError),
    ("requires", dict(requires={"gpu": 0.5}), TypeError),
    ("requires", dict(requires=["gpu"]), TypeError),
    ("tracking_path", dict(tracking_path=True), TypeError),
    ("tracking_path", dict(tracking_path=3), TypeError),
    ("process_function", dict(process_function=two_args), TypeError),
    ("process_function", dict(process_function=42), TypeError),
    ("check_function", dict(check_function=two_args), TypeError),
    ("skip_mask", dict(skip_mask=np.zeros((4, 3))), ValueError),
    ("skip_mask", dict(skip_mask=np.zeros(16)), ValueError),
    ("fit", dict(fit="bogus"), ValueError),
    ("task_id", dict(tid=5), TypeError),
    # '/' nests (daisy 2.0.0, tests/test_cluster_net.py); ids that leave or replace <basedir> are refused
    ("task_id", dict(tid=""), ValueError),
    ("task_id", dict(tid="a/../b"), ValueError),
    ("task_id", dict(tid="/abs"), ValueError),
]


@pytest.mark.parametrize("name,kw,exc", BAD, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD)])
def test_bad_parameters_raise_naming_the_parameter(name, kw, exc):
    with pytest.raises(exc, match=name):
        mk(**kw)


@pytest.mark.parametrize(
    "total,read,write", [(Roi((0,), (40,)), R2, W2), (T2, Roi((0,), (10,)), W2), (T2, R2, Roi((0, 0, 0), (10, 10, 10)))]
)
def test_mismatched_roi_dimensions_raise(total, read, write):
    with pytest.raises(ValueError, match="dimensions"):
        daisy.Task("t", total, read, write)


def test_write_shape_zero_raises():
    with pytest.raises(ValueError, match="write_roi"):
        daisy.Task("t", T2, R2, Roi((0, 0), (0, 10)))


def test_bad_parameters_fail_before_any_work():
    """Nothing runs: the error comes from building the Task, not from a worker."""
    calls = []
    with pytest.raises(TypeError):
        p = task_1d("ok", process_function=lambda b: calls.append(b)) + mk("bad", process_function=two_args)
        daisy.run_blockwise(p, multiprocessing=False)
    with pytest.raises(ValueError):
        p = task_1d("ok", process_function=lambda b: calls.append(b)) + task_1d("bad", max_retries=-1)
        daisy.run_blockwise(p, multiprocessing=False)
    assert calls == []


def test_valid_edge_values():
    t = mk(max_retries=0, max_worker_restarts=0, requires={"gpu": 0}, tracking_path=False)
    assert (t.max_retries, t.max_worker_restarts, t.requires, t.tracking_path) == (0, 0, {"gpu": 0}, False)
    m = mk(skip_mask=[[1, 0, 0, 0]] * 4)
    assert m.skip_mask.dtype == np.uint8 and m.skip_mask.shape == (4, 4) and m.skip_mask.flags.c_contiguous
    for fit in ("valid", "overhang", "shrink"):
        assert mk(fit=fit).fit == fit


def test_status_constants():
    assert (BlockStatus.CREATED, BlockStatus.PROCESSING, BlockStatus.SUCCESS, BlockStatus.FAILED) == (0, 1, 2, 3)


def test_resource_tracking_is_accepted_without_a_warning():
    """resource_tracking=True is measured now (tests/test_resource_tracking.py): no warning either way."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = mk(resource_tracking=True)
    assert t.resource_tracking is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mk(resource_tracking=False).resource_tracking is False


def _noop(block):
    pass


def test_building_tasks_and_pipelines_does_not_import_numpy():
    """A Task is validated in plain Python (a grid too large for int64 IDs raises here too); its arrays
    are derived on first use, so that ``run_blockwise`` can start its worker template while numpy loads."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        from funlib.geometry import Roi
        import daisy_nb as daisy
        a = daisy.Task("a", Roi((0, 0), (40, 40)), Roi((0, 0), (6, 6)), Roi((1, 1), (4, 4)), process_function=print)
        b = daisy.Task("b", Roi((0, 0), (40, 40)), Roi((0, 0), (6, 6)), Roi((1, 1), (4, 4)), process_function=print,
                       fit="shrink", max_retries=1, timeout=3.5)
        p = a + b
        assert repr(a) == "Task('a', blocks=81, fit='valid', conflict=True)", repr(a)
        try:
            daisy.Task("big", Roi((0, 0), (2**32, 2)), Roi((0, 0), (1, 1)), Roi((0, 0), (1, 1)), process_function=print)
        except ValueError as e:
            assert "64 bits" in str(e), e
        else:
            raise AssertionError("a grid too large for int64 IDs was accepted")
        assert "numpy" not in sys.modules, "building Tasks imported numpy"
        assert a.block_grid_shape == [9, 9] and b.layout.num_levels == 4
        assert "numpy" in sys.modules
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
