"""The end of every run (serial, pool, dask).

The periodic chores during a run are :class:`daisy_nb.progress.Heartbeat`;
abandonment is raised by :func:`.failures.raise_if_abandoned` after this.
"""

from __future__ import annotations

from daisy_nb.runtime.common.taskrun import elapsed_of

__all__ = ["end_run"]


def end_run(scheduler, observer, trs: dict, order, *, summary: bool, interrupted: bool, interrupt=None):
    """The end of a run, once its workers are gone and tracking is flushed; returns the states.

    Every runtime ends here: each task's resource stats (None unless measured), the
    observer's ``on_finish``, then :func:`daisy_nb.progress.finish_run` (the summary;
    a Ctrl-C re-raised as ``KeyboardInterrupt``, ``interrupt`` if given, with the states).
    """
    from daisy_nb.progress import finish_run, notify

    states = scheduler.task_states
    for tid, tr in trs.items():
        states[tid].resource_stats = tr.res
    notify(observer, "on_finish", scheduler)
    finish_run(states, order, elapsed_of(trs, order), summary=summary, interrupted=interrupted, interrupt=interrupt)
    return states
