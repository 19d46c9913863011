"""A ``Client``'s side of backup copies (``Task(speculative=...)``): the blocks it is told to drop.

The scheduler sends ``D`` (drop, :class:`daisy_nb.runtime.net.wire.Drop`) to a job whose copy of
a block lost: a backup copy in another job succeeded first. :class:`Drops` is what one client
keeps about it: the block whose body runs in the main thread, a drop that came for it, and
blocks dropped before they started (never started: the client asks for another).

**The interrupt.** The client's heartbeat thread reads the connection every
``DROP_TICK_SECS`` (50 ms) for a speculative task's client; a drop for the block that runs in
the main thread sends :data:`DROP_SIGNAL` to that thread. Its handler (:class:`DropHandler`,
installed once, at the client's first block in the main thread) raises :class:`BlockDropped` in
the block body if that block still runs and the signal came while the block's own code ran; one
that came while the client itself or ``contextlib`` ran is left pending and sent again at the
next tick; one for a block that has ended is ignored. A body in another thread is not
interrupted: its end counts for nothing at the scheduler.

**A signal of its own.** :data:`DROP_SIGNAL` is a real-time signal (``SIGRTMIN + 7``; ``SIGUSR2``
where there are none), not ``SIGINT``: the program's ``SIGINT`` stays as it found it, Ctrl-C
and the run's end included, and so does the disposition the programs it starts inherit (a
job started with ``SIGINT`` ignored starts its children with it ignored). A drop signal that is
not a drop (sent by someone else) goes to the handler it replaced: called, ignored, or the
default action.

Standard library only: worker programs import this.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from typing import Any

from daisy_nb.runtime.net import wire

__all__ = ["DROP_SIGNAL", "DROP_TICK_SECS", "BlockDropped", "DropHandler", "Drops"]

DROP_TICK_SECS = 0.05  # a speculative task's client reads DROP frames this often while a block runs
# the signal that interrupts a dropped block's body (module docstring): not SIGINT, so that the
# program's SIGINT stays its own
DROP_SIGNAL = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2


class BlockDropped(BaseException):  # noqa: N818 - what happened, as KeyboardInterrupt
    """Raised in a block body whose block the scheduler dropped: a backup copy of it, in
    another job, succeeded first (``Task(speculative=...)``). ``acquire_block`` takes it."""


class Drops:
    """One client's drops (module docstring). ``running``: the block whose body runs in the main
    thread (None: none); ``now``: a drop that came for it, its :data:`DROP_SIGNAL` sent; ``early``: blocks
    dropped before they started."""

    __slots__ = ("__weakref__", "early", "now", "running")

    def __init__(self) -> None:
        self.running: int | None = None
        self.now: int | None = None
        self.early: set[int] = set()

    def begin(self, index: int) -> None:
        """The main thread starts block ``index``'s body (the handler is armed for it)."""
        _HANDLER.arm(self)
        self.now = None
        self.running = index

    def end(self) -> None:
        """The body ended: a drop signal that comes now finds no block and is ignored."""
        self.running = None

    def take(self, inbox) -> None:
        """The ``D`` frames in ``inbox`` (the connection's; the caller holds its ``reading`` lock):
        the running block is interrupted, any other never started."""
        for m in [m for m in inbox if isinstance(m, wire.Drop)]:
            inbox.remove(m)
            if m.block == self.running and _HANDLER.armed:
                self.now = m.block
            else:
                self.early.add(m.block)
        if self.now is not None and self.now == self.running:  # again if it came at a bad moment
            signal.pthread_kill(threading.main_thread().ident, DROP_SIGNAL)  # type: ignore[arg-type]

    def skip(self, msg) -> bool:
        """A message the client takes between blocks: True for a drop (noted) or a block dropped
        before it started (never started); False for anything else."""
        if isinstance(msg, wire.Drop):
            self.early.add(msg.block)
            return True
        if isinstance(msg, wire.BlockRow) and msg.block in self.early:
            self.early.discard(msg.block)
            return True
        return False


class DropHandler:
    """The :data:`DROP_SIGNAL` handler of a speculative task's client (module docstring)."""

    def __init__(self) -> None:
        self.armed = False
        self.drops: weakref.ref | None = None
        self.prev: Any = None

    def arm(self, drops: Drops) -> None:
        self.drops = weakref.ref(drops)
        if not self.armed:
            self.prev = signal.signal(DROP_SIGNAL, self)
            self.armed = True

    def __call__(self, signum, frame) -> None:
        d = None if self.drops is None else self.drops()
        if d is not None and d.now is not None:  # ours: the scheduler dropped a block
            if d.now != d.running:
                d.now = None
                return  # its body ended before the signal came: nothing to stop
            if frame is not None and frame.f_code.co_filename in OUR_FILES:
                return  # not in the block's code: the heartbeat thread sends it again
            index, d.now = d.now, None
            raise BlockDropped(f"block {index}: a backup copy of it finished first")
        prev = self.prev
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL:  # the default action (a real-time signal's: the process ends)
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            signal.signal(signum, self)  # a default action that let the process live: ours again


_HANDLER = DropHandler()
# the client's own code (client.py, this module, the context manager): a drop that comes while
# it runs waits for the next tick
OUR_FILES = {os.path.join(os.path.dirname(__file__), "client.py"), __file__, contextlib.__file__}
