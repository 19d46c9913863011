"""The pool's roster of worker processes (``daisy_nb.runtime.local.roster``), without processes.

The roster only files workers and the resources they hold; starting, signalling and reaping
them is ``Processes``'s, tested end to end with real processes in ``test_runtime.py``.
"""

from types import SimpleNamespace

import pytest

from daisy_nb.runtime.local.blocks import BlockWorker, WorkerState
from daisy_nb.runtime.local.records import QUITTING, BlockProcess, FunctionWorker
from daisy_nb.runtime.local.roster import Roster


def _tr(tid, **requires):
    return SimpleNamespace(tid=tid, requires=requires)


def _block(roster, tr, state=WorkerState.IDLE):
    wid = roster.new_wid()
    return BlockProcess(wid, tr, 0, BlockWorker(wid, tr.tid, state=state))


def test_workers_are_filed_by_id_and_task_and_hold_their_resources():
    r = Roster({"gpu": 2, "cpu": 4})
    a, b = _tr("a", gpu=1), _tr("b", cpu=1)
    w0, w1 = _block(r, a), FunctionWorker(r.new_wid(), b, 0)
    assert (w0.wid, w1.wid) == (0, 1)
    r.add(w0)
    r.add(w1)
    assert len(r) == 2 and r.block_workers == 1
    assert r.of(a) == {w0} and r.of(b) == {w1}
    assert r.budget.used == {"gpu": 1, "cpu": 1}
    assert r.is_current(w0) and r.function_worker(1) is w1 and r.function_worker(1, b) is w1
    assert r.function_worker(1, a) is None and r.function_worker(0) is None  # w0 is a block worker
    r.remove(w0)
    assert len(r) == 1 and r.block_workers == 0 and not r.of(a) and not r.is_current(w0)
    assert r.budget.used == {"gpu": 0, "cpu": 1}
    assert r.new_wid() == 2  # ids are never reused
    r.remove(w1)
    with pytest.raises(RuntimeError, match="given back more often"):
        r.budget.give(b.requires)


def test_iterating_is_over_a_copy():
    r = Roster({})
    tr = _tr("a")
    for _ in range(3):
        r.add(_block(r, tr))
    for w in r:
        r.remove(w)
    assert len(r) == 0


def test_function_workers_asked_to_quit_do_not_count_as_alive():
    r = Roster({})
    tr = _tr("f")
    ws = [FunctionWorker(r.new_wid(), tr, i) for i in range(3)]
    for w in ws:
        r.add(w)
    ws[0].state = QUITTING
    assert r.functions_alive(tr) == 2


def test_a_parked_worker_of_another_task_holding_a_needed_resource():
    r = Roster({"gpu": 1, "cpu": 2})
    a, b, c = _tr("a", gpu=1), _tr("b", gpu=1), _tr("c", cpu=1)
    parked_a = _block(r, a, WorkerState.PARKED)
    r.add(parked_a)
    assert r.parked_holding(b) is parked_a
    assert r.parked_holding(a) is None  # its own task's
    assert r.parked_holding(c) is None  # holds nothing c needs
    parked_a.core.state = WorkerState.BUSY
    assert r.parked_holding(b) is None


def test_views_show_each_worker_as_observers_see_it():
    r = Roster({})
    w = _block(r, _tr("a"))
    f = FunctionWorker(r.new_wid(), _tr("f"), 0)
    f.job = {"scheduler": "slurm", "job": "12", "state": "running"}
    r.add(w)
    r.add(f)
    views = {v.wid: v for v in r.views(lambda bw: (7, 1.5))}
    assert (views[0].kind, views[0].state, views[0].row, views[0].since, views[0].pid) == (
        "block",
        "idle",
        7,
        1.5,
        None,
    )
    assert (views[1].kind, views[1].state, views[1].row, views[1].job) == ("function", "busy", None, "slurm 12 running")
