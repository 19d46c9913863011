"""How the pool ends its worker processes: signals, a worker function's grace, one reaping deadline.

:class:`.processes.Processes` decides *that* a worker ends (the run's end, a task
abandoned, a timeout, a grace passed); this module is *how*:

* a block worker's process group gets ``SIGKILL`` (:func:`sigkill`);
* a live worker function gets ``SIGTERM`` to its process group first and ``SIGKILL``
  ``TERM_GRACE_SECS`` later (:func:`kill`, then :func:`term_overdue`): the grace lets a
  launcher (:mod:`daisy_nb.launch`) cancel the job it submitted;
* at the run's end every worker, signalled at once, is reaped within one deadline
  (:func:`reap`, ``REAP_SECS`` after the last grace): waiting for them in turn costs the
  slowest one, not one deadline per worker.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping

from daisy_nb.runtime.local.records import DEAD, FunctionWorker
from daisy_nb.runtime.local.template_wire import TERM_GRACE_SECS

__all__ = ["REAP_SECS", "TERM_GRACE_SECS", "kill", "reap", "sigkill", "term_overdue"]

logger = logging.getLogger("daisy")

REAP_SECS = 5.0  # the run's end: every worker gone within this (worker functions: after their grace)


def kill(w) -> None:
    """SIGKILL ``w``'s process group; a live worker function gets SIGTERM first (see the docstring)."""
    if isinstance(w, FunctionWorker) and w.state != DEAD:
        if w.t_term is None:
            w.t_term = time.monotonic()
            try:
                os.killpg(w.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        return  # term_overdue sends the SIGKILL
    sigkill(w)


def sigkill(w) -> None:
    try:
        os.killpg(w.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            w.proc.kill()
        except OSError:
            pass


def term_overdue(workers: Iterable, now: float) -> None:
    """SIGKILL the worker functions still alive ``TERM_GRACE_SECS`` after their SIGTERM."""
    for w in list(workers):
        if w.t_term is not None and now - w.t_term > TERM_GRACE_SECS:
            sigkill(w)


def reap(workers: Mapping[int, object], on_exit: Callable, give_up: Callable) -> None:
    """Every worker of ``workers`` (all signalled already) reaped within one deadline, worker functions
    after their SIGTERM grace: ``on_exit(w)`` for each one that ended; ``give_up(w)`` after a SIGKILL
    for each one still there at the deadline (logged)."""
    last = time.monotonic() + REAP_SECS
    for w in list(workers.values()):
        t_term = getattr(w, "t_term", None)
        proc = w.proc  # type: ignore[attr-defined]
        if t_term is not None:  # a worker function: SIGKILL once its grace is over
            try:
                proc.wait(timeout=max(0.0, t_term + TERM_GRACE_SECS - time.monotonic()))
            except subprocess.TimeoutExpired:
                sigkill(w)
            last = max(last, t_term + TERM_GRACE_SECS + REAP_SECS)
        try:
            proc.wait(timeout=max(0.0, last - time.monotonic()))
        except subprocess.TimeoutExpired:
            continue  # reported below
        on_exit(w)
    if workers:
        left = sorted(workers)
        logger.warning("daisy_nb: %d worker(s) not reaped within %g s: %s", len(left), REAP_SECS, left)
        for w in list(workers.values()):
            sigkill(w)
            give_up(w)
