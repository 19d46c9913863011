"""``run_blockwise``: run a pipeline serially (in-process) or on a pool of worker processes."""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from daisy_nb import config

if TYPE_CHECKING:
    from .dashboard import Dashboard
    from .plan import Plan
    from .scheduler import TaskState
    from .task import Tasks

    DashboardArg = bool | int | Dashboard | None
    HangAlarmArg = bool | float | Mapping[str, float] | None
    PathArg = str | os.PathLike[str] | None

__all__ = ["run_blockwise"]

# A run of at least this many blocks ends with a full garbage collection, so that its per-block
# state is freed before run_blockwise returns (a few MiB and up; a collection costs ~10-100 ms,
# which only a run this large pays without noticing).
COLLECT_AT = 1 << 20


@overload
def run_blockwise(
    pipeline: Tasks,
    multiprocessing: bool = ...,
    resources: Mapping[str, int] | None = ...,
    progress: Any = ...,
    block_tracking: bool = ...,
    return_states: Literal[False] = ...,
    host: str | None = ...,
    summary: bool = ...,
    executor: Any = ...,
    log_dir: PathArg = ...,
    dashboard: DashboardArg = ...,
    dry_run: Literal[False] = ...,
    hang_alarm: HangAlarmArg = ...,
    report: PathArg = ...,
) -> bool: ...


@overload
def run_blockwise(
    pipeline: Tasks,
    multiprocessing: bool = ...,
    resources: Mapping[str, int] | None = ...,
    progress: Any = ...,
    block_tracking: bool = ...,
    *,
    return_states: Literal[True],
    host: str | None = ...,
    summary: bool = ...,
    executor: Any = ...,
    log_dir: PathArg = ...,
    dashboard: DashboardArg = ...,
    dry_run: Literal[False] = ...,
    hang_alarm: HangAlarmArg = ...,
    report: PathArg = ...,
) -> dict[str, TaskState]: ...


@overload
def run_blockwise(
    pipeline: Tasks,
    multiprocessing: bool,
    resources: Mapping[str, int] | None,
    progress: Any,
    block_tracking: bool,
    return_states: Literal[True],
    host: str | None = ...,
    summary: bool = ...,
    executor: Any = ...,
    log_dir: PathArg = ...,
    dashboard: DashboardArg = ...,
    dry_run: Literal[False] = ...,
    hang_alarm: HangAlarmArg = ...,
    report: PathArg = ...,
) -> dict[str, TaskState]: ...


@overload
def run_blockwise(
    pipeline: Tasks,
    multiprocessing: bool = ...,
    resources: Mapping[str, int] | None = ...,
    progress: Any = ...,
    block_tracking: bool = ...,
    return_states: bool = ...,
    host: str | None = ...,
    summary: bool = ...,
    executor: Any = ...,
    log_dir: PathArg = ...,
    dashboard: DashboardArg = ...,
    *,
    dry_run: Literal[True],
    hang_alarm: HangAlarmArg = ...,
    report: PathArg = ...,
) -> Plan: ...


@overload
def run_blockwise(
    pipeline: Tasks,
    multiprocessing: bool = ...,
    resources: Mapping[str, int] | None = ...,
    progress: Any = ...,
    block_tracking: bool = ...,
    return_states: bool = ...,
    host: str | None = ...,
    summary: bool = ...,
    executor: Any = ...,
    log_dir: PathArg = ...,
    dashboard: DashboardArg = ...,
    dry_run: bool = ...,
    hang_alarm: HangAlarmArg = ...,
    report: PathArg = ...,
) -> bool | dict[str, TaskState] | Plan: ...


def run_blockwise(
    pipeline: Tasks,
    multiprocessing: bool = True,
    resources: Mapping[str, int] | None = None,
    progress: Any = True,
    block_tracking: bool = True,
    return_states: bool = False,
    host: str | None = None,
    summary: bool = True,
    executor: Any = None,
    log_dir: PathArg = None,
    dashboard: DashboardArg = None,
    dry_run: bool = False,
    hang_alarm: HangAlarmArg = None,
    report: PathArg = None,
) -> bool | dict[str, TaskState] | Plan:
    """Run a Pipeline, a Task, or a list of tasks (daisy 1.x form) blockwise.

    The parameters are daisy 2.0.0's, in its positional order; ``executor``, ``log_dir``,
    ``dashboard``, ``dry_run``, ``hang_alarm`` and ``report`` are daisy_nb's. Every
    argument and every task is checked before anything starts (no worker, no tracking
    file): errors about a task start with ``Task '<task_id>': ``.

    Parameters
    ----------
    pipeline : Pipeline or Task or list of Task
        What to run; a list follows each task's deprecated ``upstream_tasks``.
    multiprocessing : bool, default True
        False runs every block in this process, one at a time, and re-raises the first
        exception of a block function.
    resources : dict of str to int, optional
        The budget that tasks' ``requires`` draw from (e.g. ``{"gpu": 2}``); a task
        that requires more than the budget is refused.
    progress : bool or observer, default True
        True shows tqdm bars, False/None nothing; any other object is an observer
        whose ``on_start``/``on_progress``/``on_finish`` get the task states
        (:class:`daisy_nb.JsonProgressObserver` writes JSON lines).
    block_tracking : bool, default True
        Record done blocks (each task's ``tracking_path``) and skip them in the next
        run (resume).
    return_states : bool, default False
        Return the ``{task_id: TaskState}`` dict instead of a bool.
    host : str, optional
        Where the pool accepts :class:`daisy_nb.Client` connections and what it tells
        workers (``DAISY_CONTEXT``); else ``$DAISY_HOST``. Unset, as daisy 2.0.0: every
        interface, advertising the address detected for this machine (its resolved host
        name, else the default route's interface, checked by a connection to itself;
        else 127.0.0.1 with a warning). ``"0.0.0.0"``/``"::"``: every interface, the
        detected address advertised too. A loopback host (``"127.0.0.1"``) is the only
        address listened on (this machine only); any other host is advertised as given
        while every interface listens.
    summary : bool, default True
        Print the execution summary when the run ends.
    executor : distributed.Client, optional
        Run the blocks on this dask client's workers instead of local worker processes
        (block functions only; see :mod:`daisy_nb.dask`).
    log_dir : str or os.PathLike, optional
        Directory of the workers' log files (default: the worker log basedir).
    dashboard : bool or int or daisy_nb.dashboard.Dashboard, optional
        True (or a port, or a Dashboard) serves a live page of the run on 127.0.0.1 and
        prints its URL, with the token every request needs
        (``$DAISY_NB_DASHBOARD_TOKEN``, else a random one).
    dry_run : bool, default False
        Run nothing and return a :class:`daisy_nb.Plan` (blocks, levels, done by
        tracking, skipped by ``skip_mask``, to run, memory, workers).
    hang_alarm : bool or float or dict, optional
        When a task's blocks stop finishing while some run, warn (log, JSON observer,
        dashboard): None (default: on, ``$DAISY_NB_HANG_SECS``/``$DAISY_NB_HANG_FACTOR``
        or 60 s and 10 x the median block time), False (off), seconds, or
        ``{"secs": ..., "factor": ...}`` (see :mod:`daisy_nb.hang`).
    report : str or os.PathLike, optional
        Write a self-contained HTML report of the run there when it ends, also after
        Ctrl-C or an abandoned task (else ``$DAISY_NB_REPORT``, which ``daisy-nb run
        --report`` sets; :mod:`daisy_nb.dashboard.report`).

    Returns
    -------
    bool
        True iff every block of every task completed (skipped blocks count as
        completed): the default.
    dict of str to TaskState
        With ``return_states=True``.
    Plan
        With ``dry_run=True`` (whatever ``return_states`` is).

    Raises
    ------
    TypeError
        An argument or a task parameter of the wrong type (e.g. ``host=5``,
        ``resources=[1]``, ``dashboard="yes"``).
    ValueError
        A bad value, before anything starts: a pipeline with duplicate ids or a cycle,
        tasks that cannot run in this mode (no ``process_function``; a worker function
        in serial or dask mode), a task that requires more than ``resources``, a bad
        ``hang_alarm`` or ``report``.
    RuntimeError
        With worker processes (no ``executor``), a task abandoned after
        ``max_worker_restarts``; the states are attached (``err.daisy_states``). Also a
        tracking store written for a different task layout.
    KeyboardInterrupt
        Ctrl-C, after the partial summary (the workers are stopped).
    """
    if dry_run:
        return _plan(pipeline, multiprocessing, resources, block_tracking, executor)
    states, order = _execute(
        pipeline,
        multiprocessing=multiprocessing,
        resources=resources,
        progress=progress,
        summary=summary,
        block_tracking=block_tracking,
        host=host,
        executor=executor,
        log_dir=log_dir,
        dashboard=dashboard,
        hang_alarm=hang_alarm,
        report=report,
    )
    if multiprocessing and executor is None:
        from .runtime.local.pool import raise_if_abandoned

        raise_if_abandoned(states, order)
    if return_states:
        return states
    return all(s.completed_count == s.total_block_count for s in states.values())


def check_run(tasks: Tasks, multiprocessing: bool, executor: Any, resources: Mapping[str, int] | None) -> None:
    """The checks of a run's tasks against its mode, before anything starts.

    What each runtime checks again when it starts (serial: a block function per task with
    blocks; pool: a process function per task and ``requires`` within ``resources``;
    dask: a block function per task with blocks), said here with the task's name and the
    parameter, before a tracking file is opened or a worker started. A ``speculative`` task
    in a serial or dask run gets a ``UserWarning``: only the pool and ``Client`` jobs launch
    backup copies.

    Raises
    ------
    TypeError
        ``resources`` is not a mapping of str to int.
    ValueError
        A task that this mode cannot run, or whose ``requires`` exceeds ``resources``.
    """
    import numbers

    from .task import as_pipeline, task_errors

    pipeline = as_pipeline(tasks)
    pipeline.validate()  # duplicate ids, cycles
    budget: dict[str, int] | None = None
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise TypeError(f"resources must be a dict of resource name -> int, got {type(resources).__name__}")
        budget = {}
        for k, v in resources.items():
            if not isinstance(k, str) or not isinstance(v, numbers.Real):
                raise TypeError(f"resources must map resource names (str) to counts (int), got {k!r}: {v!r}")
            budget[k] = int(v)
    pool = multiprocessing and executor is None
    for task in pipeline.tasks:
        has_blocks = task.layout.num_blocks > 0
        with task_errors(task.task_id):
            if not multiprocessing and has_blocks and task.arity != 1:
                what = "none" if task.process_function is None else "a 0-argument worker function (a Client loop)"
                raise ValueError(
                    f"process_function: serial mode (multiprocessing=False) calls process_function(block), "
                    f"and this task has {what}"
                )
            if task.process_function is None and (pool or has_blocks):
                raise ValueError("process_function is None; a run on workers needs one (daisy 2.0 would wait forever)")
            if executor is not None and has_blocks and task.arity != 1:
                raise ValueError(
                    "process_function is a 0-argument worker function (a daisy_nb.Client loop). "
                    "run_blockwise(executor=dask_client) runs 1-argument block functions only: write "
                    "process_function(block) (use Task(init_fn=...) and daisy_nb.dask.worker_state() for "
                    "per-worker setup), or run this task with the local pool (no executor)."
                )
            if task.speculative is not None and has_blocks and not pool:
                mode = "serial (multiprocessing=False)" if not multiprocessing else "dask (executor=...)"
                warnings.warn(
                    f"task {task.task_id!r}: speculative={task.speculative:g} has no effect in a {mode} run: "
                    "backup copies of stragglers are launched by the local worker pool and by Client jobs "
                    "(docs/explanation/pool.md#backups); its blocks run once each, as without it",
                    UserWarning,
                    stacklevel=4,  # run_blockwise's caller
                )
            if pool:
                for k, v in task.requires.items():
                    have = (budget or {}).get(k, 0)
                    if v > have:
                        raise ValueError(
                            f"requires={{{k!r}: {v}}} but run_blockwise's resources= only has {{{k!r}: {have}}}"
                        )


def _execute(
    tasks: Tasks,
    *,
    multiprocessing: bool,
    resources: Mapping[str, int] | None,
    progress: Any,
    summary: bool,
    block_tracking: bool,
    host: str | None,
    executor: Any,
    log_dir: PathArg,
    dashboard: DashboardArg = None,
    hang_alarm: HangAlarmArg = None,
    report: PathArg = None,
) -> tuple[dict[str, TaskState], list[str]]:
    """One run without the abandonment raise: ``(states, task_order)``; shared with ``Server``.

    Under ``daisy-nb run --dry-run`` (:data:`daisy_nb.plan.DRY_RUN_ENV`) it prints the
    plan and ends the program with exit code 0 instead, before anything starts.
    """
    if config.DRY_RUN.get():
        from .plan import exit_with_plan

        exit_with_plan(_plan(tasks, multiprocessing, resources, block_tracking, executor))
    check_run(tasks, multiprocessing, executor, resources)
    host = host if host is not None else config.HOST.get()
    if host is not None and not isinstance(host, str):
        raise TypeError(f"host must be a string (an address or host name of this machine), got {type(host).__name__}")
    if dashboard is not None and dashboard is not False:
        from .dashboard import check_dashboard

        check_dashboard(dashboard)
    from .hang import resolve_hang_alarm

    resolve_hang_alarm(hang_alarm)  # bad values raise before anything starts

    if report is not None or config.REPORT.get():
        from .dashboard.report import check_report

        report = check_report(report)
    # A pool run starts its worker template first: its start-up then overlaps the
    # Scheduler's (numpy, the task tables) instead of following it. Building the Tasks
    # did not import numpy (see ``task``), so this is the earliest point.
    template = _early_template(tasks) if multiprocessing and executor is None else None
    scheduler = None
    dashboard_done = None
    try:
        from .scheduler import Scheduler

        scheduler = Scheduler(tasks, block_tracking=block_tracking)
        if (dashboard is not None and dashboard is not False) or report is not None:
            from .dashboard import start_for_run

            runtime = "serial" if not multiprocessing else ("dask" if executor is not None else "pool")
            progress, dashboard_done = start_for_run(dashboard, scheduler, progress, runtime, report)
        if not multiprocessing:
            from .runtime.serial import run_serial

            states = run_serial(scheduler, progress=progress, summary=summary, hang_alarm=hang_alarm)
        elif executor is not None:
            from .runtime.dask import run_dask  # optional extra

            states = run_dask(scheduler, executor, progress=progress, summary=summary, hang_alarm=hang_alarm)
        else:
            from .runtime.local.pool import run_pool

            states = run_pool(
                scheduler,
                resources=resources,
                progress=progress,
                summary=summary,
                log_dir=log_dir,
                host=host,
                template=template,
                hang_alarm=hang_alarm,
            )
        return states, list(scheduler.task_ids)
    finally:
        if template is not None:
            template.close()  # the pool closed it already, unless bad input ended the run first
        if dashboard_done is not None:
            dashboard_done()
        if scheduler is not None:
            large = scheduler.num_blocks_total >= COLLECT_AT
            scheduler.close()
            scheduler = None
            if large:
                # the pool's parts reference one another and the Scheduler: without a collection
                # its per-block state (~12 bytes a block) would wait for Python's next full one
                gc.collect()
            from .runtime.local._heap import give_back_freed_memory

            give_back_freed_memory()  # what the run freed, back to the system (runtime/local/_heap.py)


def _plan(
    tasks: Tasks, multiprocessing: bool, resources: Mapping[str, int] | None, block_tracking: bool, executor: Any
) -> Plan:
    from .plan import make_plan

    return make_plan(
        tasks, multiprocessing=multiprocessing, resources=resources, block_tracking=block_tracking, executor=executor
    )


def _early_template(tasks: Tasks) -> Any:
    """The worker template for a pool run about to start, or None (see ``_zygote.start_early``)."""
    if not config.EARLY_TEMPLATE.get():
        return None
    from .runtime.local import _zygote
    from .task import as_pipeline

    try:
        all_tasks = as_pipeline(tasks).tasks
        preload_client = any(t.arity == 0 for t in all_tasks)
    except (TypeError, ValueError):
        return None  # bad input: the Scheduler says what is wrong, no process to start
    return _zygote.start_early(preload_client, _zygote.memory_path(all_tasks))
