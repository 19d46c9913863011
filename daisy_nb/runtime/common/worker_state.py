"""Worker-side state shared by every runtime (serial, pool, dask, ``Client`` loops).

* :func:`worker_state`: what the task's ``Task(init_fn=...)`` returned in this
  process, for the block function to use (an opened volume, a loaded model).
  The pool's workers, which serve one task per process, store it with
  :func:`set_worker_state`; the serial runner (every task in the calling thread) and
  the dask worker (whose threads run batches of several runs and tasks) bind the
  states of the run to the thread with :func:`bind` while its block function runs.
* :func:`report_job`: a 0-argument worker function's process tells the pool about
  the job its launcher submitted (:mod:`daisy_nb.launch`), a ``J`` frame on the
  worker's socket pair (bound by the worker with :func:`bind_report`).

Standard library only: worker processes import this, never numpy or numba.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["bind", "bind_report", "forget_worker_states", "report_job", "set_worker_state", "unbind", "worker_state"]

_PROCESS_STATES: dict = {}  # task_id -> init_fn() result (one task per process)
_current = threading.local()  # .states, .task_id while a dask batch runs in this thread
_REPORT: list = []  # this worker function's end of its socket pair to the pool (one at most)


def bind_report(conn) -> None:
    """The worker (``runtime.worker.serve``): ``conn`` (``send_bytes``) carries job reports to the pool."""
    _REPORT[:] = [conn]


def report_job(info: dict) -> bool:
    """Send ``info`` (JSON-able: scheduler, job id, state) to the pool; False outside a pool worker."""
    if not _REPORT:
        return False
    import json

    try:
        _REPORT[0].send_bytes(b"J" + json.dumps(info).encode())
        return True
    except (OSError, ValueError, TypeError):
        return False


def worker_state(task_id: str | None = None) -> Any:
    """What the task's ``init_fn()`` returned in this worker process.

    Call it from a block function; ``task_id`` defaults to the task whose block is
    running. ``init_fn`` ran once in this worker process (per run), before the
    first block of the task::

        def open_volume():
            return zarr.open("volume.zarr", mode="r+")

        def process(block):
            vol = daisy_nb.worker_state()      # opened once per worker
            ...

        task = daisy_nb.Task(..., process_function=process, init_fn=open_volume)

    Parameters
    ----------
    task_id : str, optional
        The task whose state to return; default: the task whose block is running.

    Returns
    -------
    object
        What ``init_fn()`` returned.

    Raises
    ------
    LookupError
        Outside such a block function when no state is known, or no ``init_fn`` of the
        task ran in this process.
    """
    states = getattr(_current, "states", None)
    tid = task_id if task_id is not None else getattr(_current, "task_id", None)
    if states is not None and tid in states:
        return states[tid]
    if tid is not None and tid in _PROCESS_STATES:
        return _PROCESS_STATES[tid]
    if tid is None and len(_PROCESS_STATES) == 1:  # a pool worker serves one task
        return next(iter(_PROCESS_STATES.values()))
    if tid is None:
        raise LookupError("daisy_nb.worker_state() was called outside a block function run by daisy_nb")
    raise LookupError(f"no worker state for task {tid!r}: the task has no init_fn, or none ran in this process")


def set_worker_state(task_id: str, state) -> None:
    """Make ``worker_state(task_id)`` return ``state`` in this process."""
    _PROCESS_STATES[task_id] = state


def forget_worker_states() -> None:
    """This pool worker moves to another task: the states of the tasks it served go (what they hold
    is released), and ``worker_state()`` means the next task's."""
    _PROCESS_STATES.clear()


def bind(states, task_id):
    """Bind ``states`` (task id -> state) and ``task_id`` to this thread; returns the previous binding.

    ``unbind(bind(...))`` restores it.
    """
    prev = (getattr(_current, "states", None), getattr(_current, "task_id", None))
    _current.states, _current.task_id = states, task_id
    return prev


def unbind(prev) -> None:
    _current.states, _current.task_id = prev
