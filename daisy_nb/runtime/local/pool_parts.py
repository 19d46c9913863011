"""What the pool's parts share: the run record of a task and the main loop's waitables.

The pool (:mod:`.pool`) is made of parts that each own their state: the worker
processes (:class:`.processes.Processes`), worker functions' jobs
(:class:`.functions.Functions`), the ``daisy_nb.Client`` connections
(:class:`daisy_nb.runtime.net.server.Clients`), and the pool itself (the main loop, the
dispatch across tasks, the listener, abandonment). They share only what is here, each
part handed it at construction:

* :class:`PoolTaskRun`: the pool's run record of a task (the shared
  :class:`daisy_nb.runtime.common.taskrun.TaskRun` plus what the pool measures: the time per
  block, worker slots, when its first worker started). A
  record, not a part; block counts are the scheduler's (processing, abandoned);
* :class:`Waitables`: what the main loop waits on. Each part registers the
  objects it reads (a worker's socket and pidfd; a client connection) with
  :meth:`Waitables.add` and removes them with :meth:`Waitables.discard`; the pool
  waits with :meth:`Waitables.wait` (or :meth:`Waitables.wait_quiet`, leaving the
  connections unread) and hands each ready object back to its part;
* :func:`nothing_left`: whether a task has no block left to hand out (every part
  that hands out blocks asks it).
"""

from __future__ import annotations

import selectors
from typing import Any

from daisy_nb.runtime.common.taskrun import TaskRun

__all__ = ["PoolTaskRun", "Waitables", "nothing_left"]


class PoolTaskRun(TaskRun):
    """The pool's run record of a task: the shared one, plus what the pool's parts measure."""

    def __init__(self, task):
        super().__init__(task)
        self.timeout_ns = None if self.timeout is None else int(self.timeout * 1e9)
        self.per_block: float | None = None  # seconds, typical of the last batches (None: not measured yet)
        self.next_slot = 0  # the next worker's slot number (its log file names)
        self.t_spawned: float | None = None  # monotonic time its first worker started
        self.no_spawn_before = 0.0  # monotonic time: a worker function returned early, the next one waits


def nothing_left(scheduler, tr: TaskRun) -> bool:
    """``tr`` is abandoned, or every block it has left is handed out already (derived from the
    scheduler: its processing count is every block handed out, to any part)."""
    tid = tr.tid
    return scheduler.is_abandoned(tid) or scheduler.remaining_count(tid) - scheduler.processing_count(tid) <= 0


class Waitables:
    """The objects the main loop waits on: ``obj -> (kind, x)`` (``"w"``/``"pidfd"``: a worker,
    ``"c"``: a client connection), plus the pool's wake-up pipe (``wake_fd``).

    One ``epoll`` (``selectors.DefaultSelector``) kept for the whole run: :meth:`add` and
    :meth:`discard` register and unregister one object each, so a wait costs the same
    with 2,000 connections as with 2 (a ``poll`` passes every descriptor to the kernel
    on each call, and rebuilding the set per change is quadratic in a connection storm).
    An object is discarded before it is closed (its descriptor number may be reused);
    its descriptor is remembered at :meth:`add`, so discarding one that was closed
    anyway still works.
    """

    def __init__(self, wake_fd: int):
        self.wake_fd = wake_fd
        self._by_obj: dict[Any, tuple[str, Any]] = {}
        self._fd: dict[Any, int] = {}  # obj -> its descriptor when added
        self._sel = selectors.DefaultSelector()
        self._sel.register(wake_fd, selectors.EVENT_READ, wake_fd)
        # everything but the client connections: what the loop still serves while it lets the
        # connections' frames gather (the TCP side's quiet time), see wait_quiet
        self._quiet = selectors.DefaultSelector()
        self._quiet.register(wake_fd, selectors.EVENT_READ, wake_fd)

    def add(self, obj, kind: str, x) -> None:
        if obj in self._by_obj:
            self.discard(obj)
        fd = obj if isinstance(obj, int) else obj.fileno()
        stale = self._sel.get_map().get(fd)
        if stale is not None:  # a closed object's number, reused: its registration is stale
            self._sel.unregister(fd)
            if fd in self._quiet.get_map():
                self._quiet.unregister(fd)
            self._by_obj.pop(stale.data, None)
            self._fd.pop(stale.data, None)
        self._sel.register(fd, selectors.EVENT_READ, obj)
        if kind != "c":
            self._quiet.register(fd, selectors.EVENT_READ, obj)
        self._by_obj[obj] = (kind, x)
        self._fd[obj] = fd

    def discard(self, obj) -> None:
        entry = self._by_obj.pop(obj, None)
        if entry is None:
            return
        fd = self._fd.pop(obj)
        for sel in (self._sel, self._quiet) if entry[0] != "c" else (self._sel,):
            try:
                sel.unregister(fd)
            except (KeyError, ValueError, OSError):  # closed meanwhile: its registration went with it
                pass

    def get(self, obj) -> tuple[str, Any] | None:
        return self._by_obj.get(obj)

    def wait(self, timeout: float) -> list:
        """The waitables (and the wake pipe) that are ready to read."""
        return [key.data for key, _ in self._sel.select(timeout)]

    def wait_quiet(self, timeout: float) -> list:
        """Like :meth:`wait`, leaving the client connections unread (their frames gather meanwhile)."""
        return [key.data for key, _ in self._quiet.select(timeout)]

    def close(self) -> None:
        if self._sel is not None:
            self._sel.close()
            self._quiet.close()
            self._sel = None  # type: ignore[assignment]
