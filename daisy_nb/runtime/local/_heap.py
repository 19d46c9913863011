"""A block worker's heap: what a block freed stays for the next block (glibc's ``mallopt``).

A block function allocates and frees large buffers block after block: the zarr chunks read
from disk and decompressed, the block's arrays, its results. glibc's malloc gives such
memory back to the system and takes it again: a buffer above its mmap threshold (128 KiB,
raised to the largest buffer freed so far, up to 32 MiB) is ``mmap``-ed and unmapped when
freed, and the heap is shrunk whenever more than twice that threshold is free at its top (as
when a block's buffers are freed together at its end). A block then faults the pages of its
buffers in again, and the kernel zeroes each one. A profile of the
README's demo (six tasks on a 320³ zarr volume, 64³ blocks, 2 workers) puts those faults in
the reads of chunk files, zstd's decompression, numpy's copies and casts: 690,000 minor page
faults in the workers, 2.5 s of the kernel's time.

:func:`keep_freed_memory` (``DAISY_NB_WORKER_HEAP_MIB``, 64 by default) sets glibc's
``M_MMAP_THRESHOLD`` and ``M_TOP_PAD`` to that size: buffers up to it come from the heap,
and the heap keeps that much of what was freed at its top. The same demo's workers took
125,000 page faults, and the demo ran in 8.0 instead of 8.7 s, on a 512³ volume in 28.8
instead of 32.8 s (``benchmarks/bench_main_job.py``, whole process, medians of 3). What
it costs: between two blocks a worker holds up to that much of what its last block freed
(resident while the block ran anyway, so the run's peak does not change), and glibc no
longer moves its thresholds itself (the setting covers every buffer up to its size; a larger
one is mapped and unmapped, as glibc does past 32 MiB anyway).

Set in the worker template before its imports, so the block workers it forks inherit it,
and in a worker started by exec; the scheduler's process keeps glibc's settings. Only on Linux
with glibc; elsewhere, and with ``0``, malloc stays as it is. Standard library only (the worker side).

The scheduler's process instead hands back what a run freed when the run ends
(:func:`give_back_freed_memory`, ``malloc_trim``; ~1 ms): glibc returns freed memory to the
system only from the top of its heap, so the run's freed tables, messages and state stay
resident below what is still in use, through the program's next phase. After the README's
demo at 128³ that was ~0.45 MiB; after a second run of 1.3 million blocks, 16.5 MiB.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["M_MMAP_THRESHOLD", "M_TOP_PAD", "give_back_freed_memory", "keep_freed_memory"]

M_TOP_PAD = -2  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3


def keep_freed_memory(mib: int) -> bool:
    """Let malloc serve buffers up to ``mib`` MiB from the heap and keep that much of the freed
    memory at its top, for the next block (0: nothing changes).

    Returns
    -------
    bool
        Whether malloc took both (False: ``mib`` is 0, not Linux, or no glibc ``mallopt``).
    """
    if mib <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    size = min(mib, 2047) << 20
    return mallopt(M_MMAP_THRESHOLD, size) == 1 and mallopt(M_TOP_PAD, size) == 1


def give_back_freed_memory() -> bool:
    """Return the memory malloc holds free, in every arena, to the system (glibc's ``malloc_trim``).

    Returns
    -------
    bool
        Whether there was glibc's ``malloc_trim`` to call (False: not Linux, or another libc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    trim(0)
    return True
