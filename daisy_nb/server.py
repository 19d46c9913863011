"""``Server`` and ``SerialServer``: daisy's class front-ends over :func:`daisy_nb.run_blockwise`.

``Server.run_blockwise`` runs on worker processes like ``run_blockwise`` but returns
the ``{task_id: TaskState}`` dict and never raises for an abandoned task (look at
``states[t].abandoned``). Ctrl-C raises ``KeyboardInterrupt`` after the partial
summary; errors in the pipeline or the arguments raise as in ``run_blockwise``.
"""

from __future__ import annotations

import warnings

from .run import _execute, _plan

__all__ = ["Server", "SerialServer"]


def tracking_summary(states) -> dict:
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

    ``stop_event`` is accepted and unused (as in daisy). ``host`` is the default for
    :meth:`run_blockwise`'s ``host``. ``hostname`` and ``port`` stay ``None``.
    """

    def __init__(self, stop_event=None, host=None):
        self._stop_event = stop_event
        self.host = host
        self.hostname = None
        self.port = None
        self.last_task_order = None
        self.last_tracking_summary = None

    def run_blockwise(
        self,
        pipeline,
        resources=None,
        progress=True,
        block_tracking=True,
        host=None,
        summary=True,
        dashboard=None,
        dry_run=False,
        hang_alarm=None,
    ):
        """Run ``pipeline`` (a Pipeline, a Task or a list of tasks); returns ``{task_id: TaskState}``.

        ``dashboard``, ``dry_run`` and ``hang_alarm`` (daisy_nb's): as in :func:`daisy_nb.run_blockwise`
        (``dry_run=True`` returns a :class:`daisy_nb.plan.Plan` and runs nothing).
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
            if getattr(e, "daisy_task_order", None) is not None:
                self.last_task_order = list(e.daisy_task_order)
            raise
        self.last_task_order = order
        self.last_tracking_summary = tracking_summary(states)
        return states


class SerialServer:
    """daisy 1.x's in-process server (deprecated): ``run_blockwise(..., multiprocessing=False)``."""

    def __init__(self):
        warnings.warn(
            "SerialServer is deprecated (daisy 1.x); use run_blockwise(tasks, multiprocessing=False)",
            DeprecationWarning,
            stacklevel=2,
        )

    def run_blockwise(self, tasks, block_tracking=True):
        """Run ``tasks`` block by block in this process; the first block exception propagates.

        Returns ``{task_id: TaskState}`` and prints the execution summary.
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
