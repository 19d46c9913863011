"""What the pool's parts share: the run record of a task and the main loop's waitables.

The pool (:mod:`.pool`) is made of parts that each own their state: the block and
worker-function processes (:class:`.processes.Processes`), the ``daisy_nb.Client``
connections (:class:`.clients.Clients`), and the pool itself (the main loop, the
dispatch policy across tasks, the listener, abandonment). They share only what is
here, each part handed it at construction:

* :class:`PoolTaskRun`: the pool's run record of a task (the shared
  :class:`.policy.TaskRun` plus what the pool's parts measure: the batch's time per
  block, worker slots, when its first worker started). A record, not a part: the
  pool builds one per task, the parts update its counts (``inflight``,
  ``per_block``, ...) as the scheduler's block state changes;
* :class:`Waitables`: what the main loop waits on. Each part registers the
  objects it reads (a worker's socket and pidfd; a client connection) with
  :meth:`Waitables.add` and removes them with :meth:`Waitables.discard`; the pool
  waits with :meth:`Waitables.wait` and hands each ready object back to its part;
* :func:`nothing_left`: whether a task has no block left to hand out (every part
  that hands out blocks asks it).
"""

from __future__ import annotations

import selectors
from typing import Any

from daisy_nb.runtime.policy import TaskRun

__all__ = ["PoolTaskRun", "Waitables", "nothing_left"]


class PoolTaskRun(TaskRun):
    """The pool's run record of a task: the shared one, plus what the pool's parts measure."""

    def __init__(self, task):
        super().__init__(task)
        self.timeout_ns = None if self.timeout is None else int(self.timeout * 1e9)
        self.per_block: float | None = None  # seconds, from the last finished batch (None: not measured yet)
        self.next_slot = 0  # the next worker's slot number (its log file names)
        self.t_spawned: float | None = None  # monotonic time its first worker started


def nothing_left(scheduler, tr: TaskRun) -> bool:
    """``tr`` is abandoned, or every block it has left is handed out already."""
    return tr.abandoned or scheduler.remaining_count(tr.tid) - tr.inflight <= 0


class Waitables:
    """The objects the main loop waits on: ``obj -> (kind, x)`` (``"w"``/``"pidfd"``: a worker,
    ``"c"``: a client connection), plus the pool's wake-up pipe (``wake_fd``)."""

    def __init__(self, wake_fd: int):
        self.wake_fd = wake_fd
        self._by_obj: dict[Any, tuple[str, Any]] = {}
        self._sel: selectors.PollSelector | None = None  # cached poll selector over _by_obj (see wait)
        self._sel_set: set = set()

    def add(self, obj, kind: str, x) -> None:
        self._by_obj[obj] = (kind, x)

    def discard(self, obj) -> None:
        self._by_obj.pop(obj, None)

    def get(self, obj) -> tuple[str, Any] | None:
        return self._by_obj.get(obj)

    def wait(self, timeout: float) -> list:
        """The waitables (and the wake pipe) that are ready to read.

        Like ``multiprocessing.connection.wait``, but the poll selector is kept until
        the set of waitables changes: building one per loop (a register call per
        waitable) was a third of this process's CPU time on small batches.
        """
        cur = set(self._by_obj)
        if self._sel is None or cur != self._sel_set:
            sel = selectors.PollSelector()
            sel.register(self.wake_fd, selectors.EVENT_READ)
            for obj in cur:
                sel.register(obj, selectors.EVENT_READ)
            if self._sel is not None:
                self._sel.close()
            self._sel, self._sel_set = sel, cur
        return [key.fileobj for key, _ in self._sel.select(timeout)]

    def close(self) -> None:
        if self._sel is not None:
            self._sel.close()
            self._sel = None
