"""``run_blockwise``: run a pipeline serially (in-process) or on a pool of worker processes."""

from __future__ import annotations

import os

__all__ = ["run_blockwise"]


def run_blockwise(
    pipeline,
    multiprocessing: bool = True,
    resources=None,
    progress=True,
    block_tracking: bool = True,
    return_states: bool = False,
    host=None,
    summary: bool = True,
    executor=None,
    log_dir=None,
    dashboard=None,
    dry_run: bool = False,
    hang_alarm=None,
    report=None,
):
    """Run a Pipeline, a Task, or a list of tasks (daisy 1.x form) blockwise.

    The parameters are daisy 2.0.0's, in its positional order; ``executor`` and
    ``log_dir`` are daisy_nb's.

    Returns True iff every block of every task completed (skipped blocks count as
    completed), or the ``{task_id: TaskState}`` dict with ``return_states=True``.
    ``multiprocessing=False`` runs in this process and re-raises the first exception
    of a block function. With worker processes, a task abandoned after
    ``max_worker_restarts`` raises ``RuntimeError`` with the states attached.
    ``dashboard=True`` (or a port, or a :class:`daisy_nb.dashboard.Dashboard`)
    serves a live page of the run on 127.0.0.1 and prints its URL, with the token every
    request needs (``$DAISY_NB_DASHBOARD_TOKEN``, else a random one).
    ``host`` (else ``DAISY_HOST``) is where the pool accepts ``Client`` connections and
    what it tells workers (``DAISY_CONTEXT``). Unset, as daisy 2.0.0: every interface,
    advertising the address detected for this machine (its resolved host name, else
    the default route's interface, checked by a connection to itself; else 127.0.0.1
    with a warning). ``"0.0.0.0"``/``"::"``: every interface, the detected address
    advertised too. A loopback host (``"127.0.0.1"``) is the only address listened on (this
    machine only); any other host is advertised as given while every interface listens.
    ``dry_run=True`` runs nothing and returns a :class:`daisy_nb.plan.Plan` (blocks,
    levels, done by tracking, skipped by ``skip_mask``, to run, memory, workers).
    ``hang_alarm``: when a task's blocks stop finishing while some run, warn (log, JSON
    observer, dashboard): None (default: on, ``DAISY_NB_HANG_SECS``/``DAISY_NB_HANG_FACTOR``
    or 60 s and 10 x the median block time), False (off), seconds, or
    ``{"secs": ..., "factor": ...}`` (see :mod:`daisy_nb.hang`).
    ``report="run.html"`` (else the ``DAISY_NB_REPORT`` variable, which ``daisy-nb run
    --report`` sets) writes a self-contained HTML report of the run when it ends, also
    after Ctrl-C or an abandoned task (:mod:`daisy_nb.dashboard.report`).
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


def _execute(
    tasks,
    *,
    multiprocessing,
    resources,
    progress,
    summary,
    block_tracking,
    host,
    executor,
    log_dir,
    dashboard=None,
    hang_alarm=None,
    report=None,
):
    """One run without the abandonment raise: ``(states, task_order)``; shared with ``Server``.

    Under ``daisy-nb run --dry-run`` (:data:`daisy_nb.plan.DRY_RUN_ENV`) it prints the
    plan and ends the program with exit code 0 instead, before anything starts.
    """
    if os.environ.get("DAISY_NB_DRY_RUN", "") not in ("", "0"):
        from .plan import exit_with_plan

        exit_with_plan(_plan(tasks, multiprocessing, resources, block_tracking, executor))
    host = host if host is not None else os.environ.get("DAISY_HOST")
    if host is not None and not isinstance(host, str):
        raise TypeError(f"host must be a string (an address or host name of this machine), got {type(host).__name__}")
    if dashboard is not None and dashboard is not False:
        from .dashboard import check_dashboard

        check_dashboard(dashboard)
    from .hang import resolve_hang_alarm

    resolve_hang_alarm(hang_alarm)  # bad values raise before anything starts

    if report is not None or os.environ.get("DAISY_NB_REPORT"):
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
            scheduler.close()


def _plan(tasks, multiprocessing, resources, block_tracking, executor):
    from .plan import make_plan

    return make_plan(
        tasks, multiprocessing=multiprocessing, resources=resources, block_tracking=block_tracking, executor=executor
    )


def _early_template(tasks):
    """The worker template for a pool run about to start, or None (see ``_zygote.start_early``)."""
    if os.environ.get("DAISY_NB_EARLY_TEMPLATE", "1") == "0":
        return None
    from .runtime.local import _zygote
    from .task import as_pipeline

    try:
        preload_client = any(t.arity == 0 for t in as_pipeline(tasks).tasks)
    except (TypeError, ValueError):
        return None  # bad input: the Scheduler says what is wrong, no process to start
    return _zygote.start_early(preload_client)
