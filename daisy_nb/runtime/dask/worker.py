"""The dask worker side of :mod:`daisy_nb.runtime.dask.driver`: what runs inside dask worker processes.

:func:`_run_batch` is the function of every future: it rebuilds the batch's
:class:`~daisy_nb.Block` objects from one int64 array, runs the task's block
function on each (``init_fn`` first, once per worker process and run), and
returns a status byte per block plus the first and last errors, structured
(:class:`daisy_nb.errors.WorkerError`: the exception's type, message and capped
traceback, the block's id), so the driver groups them without parsing. The driver
reaches a batch that already runs only through ``client.run``:
:func:`_cancel_batches` (stop at the next block boundary), :func:`_running_batches`
(which cancelled batches still hold a thread) and :func:`_forget_run` (the run is
over). Standard library, numpy (to unpack the batch), daisy_nb.block and daisy_nb.errors only.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict

from daisy_nb.errors import WorkerError
from daisy_nb.runtime.common.run_block import DONE, FAILED, PROCESSING, cap_traceback, format_exception
from daisy_nb.runtime.common.worker_state import bind, unbind

__all__: list[str] = []

_RUNS: OrderedDict = OrderedDict()  # run token -> _WorkerRun
_RUNS_LOCK = threading.Lock()
_KEEP_RUNS = 8


class _WorkerRun:
    def __init__(self):
        self.lock = threading.Lock()
        self.fns: dict = {}  # task_id -> (process_function, init_fn)
        self.states: dict = {}  # task_id -> init_fn() result
        self.init_locks: dict = {}
        self.running: set = set()  # batch ids running in this process's threads
        self.cancelled: set = set()  # batch ids the driver gave up on (see _cancel_batches)


def _worker_run(token: str) -> _WorkerRun:
    with _RUNS_LOCK:
        run = _RUNS.get(token)
        if run is None:
            run = _RUNS[token] = _WorkerRun()
            while len(_RUNS) > _KEEP_RUNS:
                _RUNS.popitem(last=False)
        else:
            _RUNS.move_to_end(token)
        return run


def _forget_run(token: str) -> None:
    """Drop a finished run's functions and init states; its batches still running stop."""
    with _RUNS_LOCK:
        run = _RUNS.pop(token, None)
    if run is not None:
        run.cancelled.update(run.running)


def _running_batches(token: str) -> list:
    """``client.run`` target: the batch ids of this run that run in this worker's threads now."""
    return sorted(_worker_run(token).running)


def _cancel_batches(token: str, bids) -> None:
    """``client.run`` target: batches the driver gave up on stop at their next block boundary.

    ``Future.cancel()`` does not reach a task that already runs, so the driver says it
    here too; a batch checks this set before each block.
    """
    run = _worker_run(token)
    run.cancelled.update(bids)


async def _forget_run_async(token: str) -> None:
    """``client.run(..., wait=False)`` at the end of a run (coroutines only)."""
    _forget_run(token)


def _setup(run: _WorkerRun, task_id: str, payload):
    """The task's block function, running ``init_fn`` the first time (once per process)."""
    entry = run.fns.get(task_id)
    if entry is None:
        with run.lock:
            entry = run.fns.get(task_id)
            if entry is None:
                import pickle

                entry = run.fns[task_id] = pickle.loads(payload)  # cloudpickle output loads with pickle
                run.init_locks[task_id] = threading.Lock()
    fn, init_fn = entry
    if init_fn is not None and task_id not in run.states:
        with run.init_locks[task_id]:  # threads of one worker: init once
            if task_id not in run.states:
                run.states[task_id] = init_fn()
    return fn


def _run_batch(token: str, topic: str, bid: int, task_id: str, payload, packed, nd: int) -> dict:
    """Run one batch of blocks on a dask worker; a status per block and its first and last errors back."""
    from daisy_nb.block import Block

    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not on a dask worker (direct call): no start event
        worker = None
    addr = worker.address if worker is not None else ""
    pid = os.getpid()
    if worker is not None:
        try:
            worker.log_event(topic, {"bid": bid, "worker": addr, "pid": pid})
        except Exception:  # the batch runs all the same; the driver sees no start (no timeout for it)
            logging.getLogger("daisy").warning("daisy_nb: batch %d could not announce its start", bid, exc_info=True)
    out = {
        "status": b"",
        "elapsed_ns": 0,
        "first_error": None,
        "last_error": None,
        "init_error": None,
        "worker": addr,
    }
    run = _worker_run(token)
    try:
        fn = _setup(run, task_id, payload)
    except Exception as e:
        where = f"dask worker {addr} (pid {pid})"
        out["init_error"] = f"init_fn of task {task_id!r} failed on {where}:\n" + cap_traceback(format_exception(e))
        sys.stderr.write(out["init_error"] + "\n")
        return out
    rows = packed.tolist()
    n = len(rows)
    status = bytearray(n)
    make = Block._make
    a, b, c = 2 + nd, 2 + 2 * nd, 2 + 3 * nd
    prev = bind(run.states, task_id)
    gone = run.cancelled
    run.running.add(bid)
    t0 = time.monotonic_ns()
    try:
        for i, r in enumerate(rows):
            if bid in gone:
                break  # the driver gave up on this batch (timeout, lost worker, Ctrl-C)
            blk = make(task_id, r[1], (tuple(r[2:a]), tuple(r[a:b])), (tuple(r[b:c]), tuple(r[c:])), r[0])
            blk._status = PROCESSING
            try:
                fn(blk)
                s = FAILED if blk._status == FAILED else DONE
            except Exception as e:  # the user's block failed: its exception goes back, structured
                s, tb = FAILED, format_exception(e)
                sys.stderr.write(f"block {blk.block_id} failed:\n{tb}")
                err = WorkerError.from_exception(
                    e, cap_traceback(tb), r[1], task_id, f" on dask worker {addr} (pid {pid})"
                )
                if out["first_error"] is None:
                    out["first_error"] = err
                out["last_error"] = err
            status[i] = s
    finally:
        unbind(prev)
        run.running.discard(bid)
        if bid in gone:  # a batch the driver cancelled while it ran: its thread is free again
            gone.discard(bid)
            try:
                worker.log_event(topic, {"bid": bid, "worker": addr, "pid": pid, "end": 1})
            except Exception:  # the driver asks the worker which batches still run every 0.5 s
                logging.getLogger("daisy").warning("daisy_nb: batch %d could not announce its end", bid, exc_info=True)
    out["elapsed_ns"] = time.monotonic_ns() - t0
    out["status"] = bytes(status)
    return out
