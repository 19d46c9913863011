"""Layout of one worker's shared-memory segment (int64 words, no numpy needed).

::

    header[8]   n, cur, cur_start_ns, batch_elapsed_ns, n_done, -, -, -
    index[C]    task-local block index          (parent writes)
    spatial[C]  spatial block id                 (parent writes)
    status[C]   0 not started, 1 running, 2 success, 3 failed   (worker writes)
    read_offset[C*nd] read_shape[C*nd] write_offset[C*nd] write_shape[C*nd]

``cur``/``cur_start_ns`` (``time.monotonic_ns``, one clock for all processes on a
machine) let the parent find the block a worker is running and enforce the task's
timeout without asking the worker. Only the parent creates and unlinks segments;
workers attach by name without registering with a resource tracker.
"""

from __future__ import annotations

import sys
from multiprocessing import shared_memory

HDR = 8
H_N, H_CUR, H_START, H_ELAPSED, H_DONE = 0, 1, 2, 3, 4


def words(capacity: int, ndim: int) -> int:
    return HDR + 3 * capacity + 4 * capacity * ndim


def offsets(capacity: int, ndim: int) -> dict[str, int]:
    """Word offsets of each array."""
    c, cn = capacity, capacity * ndim
    o = {"index": HDR, "spatial": HDR + c, "status": HDR + 2 * c}
    base = HDR + 3 * c
    for i, name in enumerate(("read_offset", "read_shape", "write_offset", "write_shape")):
        o[name] = base + i * cn
    return o


def attach(name: str) -> shared_memory.SharedMemory:
    """Attach to an existing segment without resource-tracker registration.

    On Python < 3.13 attaching registers the segment with a resource tracker that
    this (child) process would start, which unlinks the segment when the child
    exits and warns about a "leak". The parent owns the segment, so skip that.
    """
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    from multiprocessing import resource_tracker

    orig = resource_tracker.register
    resource_tracker.register = lambda *a, **k: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = orig
