"""``Server`` and ``SerialServer``: daisy's class front-ends over :func:`daisy_nb.run_blockwise`.

``Server.run_blockwise`` runs on worker processes like ``run_blockwise`` but returns
the ``{task_id: TaskState}`` dict and never raises for an abandoned task (look at
``states[t].abandoned``). Ctrl-C raises ``KeyboardInterrupt`` after the partial
summary; errors in the pipeline or the arguments raise as in ``run_blockwise``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .run import _execute, _plan

if TYPE_CHECKING:
    from .plan import Plan
    from .run import DashboardArg, HangAlarmArg
    from .scheduler import TaskState
    from .task import Tasks

__all__ = ["Server", "SerialServer"]


def tracking_summary(states: Mapping[str, TaskState]) -> dict[str, dict[str, dict[str, Any]]]:
    """The wheel's ``{"per_task": {task_id: {...}}}``: resource figures of tasks with ``resource_tracking``."""
    per_task = {}
    for tid, st in states.items():
        rs = getattr(st, "resource_stats", None)
        if rs is None:
            continue
        per_task[tid] = {
            "blocks": rs.blocks,
            "failures": rs.failed,
            "has_stats": rs.blocks > 0,
            "total_cpu_secs": rs.cpu_seconds,
            "total_block_secs": rs.wall_seconds,
            "max_peak_rss_bytes": rs.peak_rss_bytes,
            "io_read_bytes": rs.io_read_bytes,
            "io_write_bytes": rs.io_write_bytes,
            "mean_block_ms": rs.mean_block_ms,
            "block_ms_slope": rs.block_ms_slope,
        }
    return {"per_task": per_task}


class Server:
    """Runs pipelines on worker processes; keeps the last run's task order and tracking summary.

    Parameters
    ----------
    stop_event : threading.Event, optional
        Accepted and unused (as in daisy).
    host : str, optional
        The default of :meth:`run_blockwise`'s ``host``.

    Attributes
    ----------
    hostname, port : None
        daisy's attributes; they stay None (each run listens on its own port).
    last_task_order : list of str or None
        The task ids of the last run, in display order.
    last_tracking_summary : dict or None
        ``{"per_task": {task_id: {...}}}``: resource figures of the last run's tasks
        with ``resource_tracking=True`` (the daisy 2.0 wheel's).
    """

    def __init__(self, stop_event: threading.Event | None = None, host: str | None = None) -> None:
        self._stop_event = stop_event
        self.host = host
        self.hostname: str | None = None
        self.port: int | None = None
        self.last_task_order: list[str] | None = None
        self.last_tracking_summary: dict[str, dict[str, dict[str, Any]]] | None = None

    def run_blockwise(
        self,
        pipeline: Tasks,
        resources: Mapping[str, int] | None = None,
        progress: Any = True,
        block_tracking: bool = True,
        host: str | None = None,
        summary: bool = True,
        dashboard: DashboardArg = None,
        dry_run: bool = False,
        hang_alarm: HangAlarmArg = None,
    ) -> dict[str, TaskState] | Plan:
        """Run ``pipeline`` on worker processes and return every task's state.

        Unlike :func:`daisy_nb.run_blockwise`, an abandoned task does not raise: look at
        ``states[task_id].abandoned``.

        Parameters
        ----------
        pipeline : Pipeline or Task or list of Task
            What to run.
        resources, progress, block_tracking, summary, dashboard, hang_alarm
            As in :func:`daisy_nb.run_blockwise`.
        host : str, optional
            As in :func:`daisy_nb.run_blockwise`; default: the ``host`` given to the Server.
        dry_run : bool, default False
            Run nothing and return a :class:`daisy_nb.Plan`.

        Returns
        -------
        dict of str to TaskState
            ``{task_id: TaskState}``; a :class:`daisy_nb.Plan` with ``dry_run=True``.

        Raises
        ------
        TypeError, ValueError
            Bad arguments or tasks, before anything starts (as :func:`daisy_nb.run_blockwise`).
        KeyboardInterrupt
            Ctrl-C, after the partial summary (:attr:`last_task_order` is set).
        """
        if dry_run:
            return _plan(pipeline, True, resources, block_tracking, None)
        host = host if host is not None else self.host
        try:
            states, order = _execute(
                pipeline,
                multiprocessing=True,
                resources=resources,
                progress=progress,
                summary=summary,
                block_tracking=block_tracking,
                host=host,
                executor=None,
                log_dir=None,
                dashboard=dashboard,
                hang_alarm=hang_alarm,
            )
        except KeyboardInterrupt as e:
            order_at_interrupt = getattr(e, "daisy_task_order", None)
            if order_at_interrupt is not None:
                self.last_task_order = list(order_at_interrupt)
            raise
        self.last_task_order = order
        self.last_tracking_summary = tracking_summary(states)
        return states


class SerialServer:
    """daisy 1.x's in-process server (deprecated): ``run_blockwise(..., multiprocessing=False)``.

    Warns
    -----
    DeprecationWarning
        When made.
    """

    def __init__(self) -> None:
        warnings.warn(
            "SerialServer is deprecated (daisy 1.x); use run_blockwise(tasks, multiprocessing=False)",
            DeprecationWarning,
            stacklevel=2,
        )

    def run_blockwise(self, tasks: Tasks, block_tracking: bool = True) -> dict[str, TaskState]:
        """Run ``tasks`` block by block in this process; the first block exception propagates.

        Parameters
        ----------
        tasks : Pipeline or Task or list of Task
            What to run.
        block_tracking : bool, default True
            Record done blocks and skip them next time.

        Returns
        -------
        dict of str to TaskState
            ``{task_id: TaskState}``; the execution summary is printed.

        Raises
        ------
        TypeError, ValueError
            Bad tasks, before anything starts.
        Exception
            The first exception of a block function.
        """
        states, _ = _execute(
            tasks,
            multiprocessing=False,
            resources=None,
            progress=False,
            summary=True,
            block_tracking=block_tracking,
            host=None,
            executor=None,
            log_dir=None,
        )
        return states
