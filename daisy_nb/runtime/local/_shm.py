"""Layout of one worker's shared-memory segment (int64 words, no numpy needed).

The segment holds ``SLOTS`` batch slots of ``words(capacity, ndim)`` words each, so
that the parent can queue the next batch while the worker runs the current one
(slots are used round-robin and run in the order they were sent). One slot::

    header[8]   n, cur, cur_start_ns, batch_elapsed_ns, limit, drop, -, -
    index[C]    task-local block index          (parent writes)
    spatial[C]  spatial block id                 (parent writes)
    status[C]   0 not started, 1 running, 2 success, 3 failed   (worker writes)
    read_offset[C*nd] read_shape[C*nd] write_offset[C*nd] write_shape[C*nd]
    secs[C]     ns from a block's start to its end, before its status (worker writes;
                a Task(speculative=...)'s workers only: their backups' block times)
    stats[C*NSTATS]   float64 per block, only for a Task(resource_tracking=True):
                      wall s, cpu s, peak RSS bytes, IO read, IO write   (worker writes)

The worker writes a block's stats before its status, so a block whose status is 2
or 3 has its stats in place (also when the worker dies later in the batch).

``limit`` (parent writes: ``n`` with the batch, lowered later) is the give-back of a batch's
unstarted blocks (``daisy_nb/runtime/local/giveback.py``): the worker starts block ``i`` only
while ``i < limit``, read just before it starts it; the blocks it did not start keep status 0.

``drop`` (parent writes: 0 with the batch) is ``i + 1`` once the copy of block ``i`` that the
worker runs lost to its twin (``Task(speculative=...)``, ``daisy_nb/runtime/local/backups.py``):
the parent then sends the worker ``DROP_SIGNAL``, whose handler interrupts the block only if
``drop`` names the block it runs, so a late signal finds nothing to stop.

``cur``/``cur_start_ns`` (``time.monotonic_ns``, one clock for all processes on a
machine) let the parent find the block a worker is running and enforce the task's
timeout without asking the worker; the worker writes ``cur_start_ns`` before
``cur``, so a parent that sees ``cur >= 0`` never pairs it with a stale start.
Only the parent creates segments (:class:`Segment`: an inherited ``memfd`` on
Linux, a named segment elsewhere); workers map them (:func:`attach`) without a
resource tracker and, on Linux, without importing ``multiprocessing``, which is
a good part of a worker's start-up time.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SLOTS = 2
HDR = 8
NAME_PREFIX = "dnb_"  # named segments (no memfd): /dev/shm/dnb_<creator pid>_<random> on Linux
MEMFD_NAME = "daisy_nb_worker"  # memfd segments: "/memfd:daisy_nb_worker (deleted)" in /proc/<pid>/maps
H_N, H_CUR, H_START, H_ELAPSED, H_LIMIT, H_DROP = 0, 1, 2, 3, 4, 5


NSTATS = 5  # per-block stats words: BlockStats' first five fields


def words(capacity: int, ndim: int, stats: bool = False) -> int:
    """Words of one slot (with the stats region when ``stats``)."""
    return HDR + 4 * capacity + 4 * capacity * ndim + (NSTATS * capacity if stats else 0)


def segment_bytes(capacity: int, ndim: int, stats: bool = False) -> int:
    return 8 * SLOTS * words(capacity, ndim, stats)


def offsets(capacity: int, ndim: int, stats: bool = False) -> dict[str, int]:
    """Word offsets of each array within a slot (``"stats"`` only when ``stats``)."""
    c, cn = capacity, capacity * ndim
    o = {"index": HDR, "spatial": HDR + c, "status": HDR + 2 * c}
    base = HDR + 3 * c
    for i, name in enumerate(("read_offset", "read_shape", "write_offset", "write_shape")):
        o[name] = base + i * cn
    o["secs"] = base + 4 * cn
    if stats:
        o["stats"] = base + 4 * cn + c
    return o


class Segment:
    """The parent's side of one worker's segment.

    On Linux an anonymous ``memfd`` that the worker inherits (``pass_fds``): it
    has no name, so nothing can leak when any process dies, and no
    ``multiprocessing`` resource tracker is needed. Starting that tracker is a
    whole interpreter start-up, which on a small machine competes for the CPUs
    with the workers that are starting at the same moment. Elsewhere a named
    ``multiprocessing.shared_memory`` segment, unlinked by :meth:`close`.
    """

    def __init__(self, nbytes: int):
        self.fd = -1
        self.name: str | None = None
        self._shm: Any = None  # a multiprocessing.shared_memory.SharedMemory (not Linux)
        self._mmap: Any = None  # an mmap.mmap of the memfd (Linux)
        self.buf: Any = None  # the segment's bytes (None once closed)
        if hasattr(os, "memfd_create"):
            import mmap

            fd = os.memfd_create(MEMFD_NAME)  # close-on-exec; Popen(pass_fds=) hands it to the worker
            try:
                os.ftruncate(fd, nbytes)
                self._mmap = mmap.mmap(fd, nbytes)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            self.buf = self._mmap
        else:  # not Linux (tests force this path)
            import secrets
            from multiprocessing import shared_memory

            while self._shm is None:
                try:  # a recognisable name (NAME_PREFIX) with its creator's pid: leak checks look for these
                    name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"  # macOS: 31 characters at most
                    self._shm = shared_memory.SharedMemory(name, create=True, size=nbytes)
                except FileExistsError:  # pragma: no cover - 48 random bits, in this process
                    pass
            self.name = self._shm.name
            self.buf = self._shm.buf

    def worker_setup(self) -> dict:
        """What the worker needs to map the segment (``attach(**worker_setup())``)."""
        return {"shm_fd": self.fd} if self.fd >= 0 else {"shm_name": self.name}

    def close_fd(self) -> None:
        """The worker has its own copy of the fd (after spawning): the mapping keeps the memory."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -2  # mapped, fd closed

    def close(self) -> None:
        """Unmap (views of ``buf`` must be gone) and, for a named segment, unlink."""
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1
        try:
            if self._mmap is not None:
                self._mmap.close()
            if self._shm is not None:
                self._shm.close()
        except BufferError:  # a numpy view is still alive: unmapped when it goes
            pass
        self._mmap = self.buf = None
        if self._shm is not None:
            self._shm.unlink()
            self._shm = None


class _Mapped:
    """A worker's mapping of its segment, from the inherited memfd or from ``/dev/shm``."""

    def __init__(self, fd: int):
        import mmap

        try:
            self._mmap = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        try:
            self.buf.release()
            self._mmap.close()
        except BufferError:  # a view is still alive: the mapping goes with the process
            pass


def attach(shm_name: str | None = None, shm_fd: int | None = None):
    """Map the segment in a worker; returns an object with ``buf`` (a memoryview) and ``close()``.

    Never registers with a resource tracker: on Python < 3.13 attaching with
    ``SharedMemory`` registers the segment with a tracker that this (child)
    process would start, which unlinks the segment when the child exits and warns
    about a "leak". The parent owns the segment.
    """
    if shm_fd is not None:
        return _Mapped(shm_fd)
    if shm_name is None:
        raise ValueError("attach: neither shm_fd nor shm_name given")
    if sys.platform.startswith("linux") and "/" not in shm_name and os.path.isdir("/dev/shm"):
        try:
            return _Mapped(os.open(os.path.join("/dev/shm", shm_name), os.O_RDWR))
        except OSError:
            pass
    from multiprocessing import shared_memory

    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=shm_name, track=False)
    from multiprocessing import resource_tracker

    orig = resource_tracker.register
    resource_tracker.register = lambda *a, **k: None
    try:
        return shared_memory.SharedMemory(name=shm_name)
    finally:
        resource_tracker.register = orig
