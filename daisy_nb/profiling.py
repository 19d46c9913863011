"""Per-block resource measurement: daisy 2.0 wheel's ``resource_tracking``.

``with daisy.profile_block(block):`` measures the body and attaches a
:class:`BlockStats` to ``block.stats`` (the first measurement attached wins, so a
profile the block function opens itself is not overwritten by the worker's).
Workers of a ``Task(resource_tracking=True)`` wrap every block in it; the stats
travel back through the worker's shared-memory segment (``runtime/_shm.py``) and
are folded into one :class:`TaskResourceStats` per task in the scheduler process.

Imported by worker processes only when a task tracks resources: no numpy here.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, NamedTuple

__all__ = ["BlockStats", "TaskResourceStats", "profile_block"]

try:
    import resource as _resource

    _RUSAGE_SELF = _resource.RUSAGE_SELF
    _getrusage = _resource.getrusage
except ImportError:  # pragma: no cover - Windows
    _getrusage = None  # type: ignore[assignment]
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
_IO_PATH = "/proc/self/io"
_io_ok = os.path.exists(_IO_PATH)
_STATUS_PATH = "/proc/self/status"
_hwm_ok = os.path.exists(_STATUS_PATH)
_RSS_MAX_AGE = 0.005  # seconds: blocks shorter than 1 ms reuse a peak read this recently
_rss_cache = [0, -math.inf]  # last peak RSS read, perf_counter() of that read


class BlockStats(NamedTuple):
    """What :func:`profile_block` measured for one block.

    ``cpu_seconds`` is this process's CPU time (all threads) during the block;
    ``peak_rss_bytes`` is the process's peak resident set *so far*, not the block's
    own (Linux: ``VmHWM`` of ``/proc/self/status``; elsewhere ``ru_maxrss``; for
    blocks shorter than 1 ms a reading up to 5 ms old is reused); ``io_*_bytes`` are the storage bytes of ``/proc/self/io``
    (0 where that file cannot be read). The GPU fields are reserved: NaN and 0.
    """

    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    io_read_bytes: int = 0
    io_write_bytes: int = 0
    gpu_util_pct: float = math.nan
    gpu_mem_bytes: int = 0


def _read_proc(path: str, size: int) -> bytes:
    """One ``/proc`` file's first ``size`` bytes (raw ``os`` calls: this runs per block)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def _io() -> tuple[int, int]:
    """``(read_bytes, write_bytes)`` of this process so far, or ``(0, 0)``."""
    global _io_ok
    if not _io_ok:
        return 0, 0
    try:
        data = _read_proc(_IO_PATH, 4096)
        i = data.index(b"\nread_bytes:") + 12
        j = data.index(b"\nwrite_bytes:") + 13
        return int(data[i : data.index(b"\n", i)]), int(data[j : data.index(b"\n", j)])
    except (OSError, ValueError):
        _io_ok = False
        return 0, 0


def _peak_rss() -> int:
    """This process's peak RSS in bytes.

    On Linux ``VmHWM``, not ``ru_maxrss``: the kernel carries ``ru_maxrss`` across
    ``execve``, so a worker exec'd by a 500 MB scheduler process would report 500 MB
    (measured: a 13 MB child of a 408 MB parent reports 408 MB). ~12 µs per call.
    """
    global _hwm_ok
    if _hwm_ok:
        try:
            data = _read_proc(_STATUS_PATH, 16384)
            i = data.index(b"VmHWM:") + 6
            return int(data[i : data.index(b"kB", i)]) * 1024
        except (OSError, ValueError):
            _hwm_ok = False
    if _getrusage is None:  # pragma: no cover
        return 0
    return int(_getrusage(_RUSAGE_SELF).ru_maxrss) * _RSS_UNIT


class _Profile:
    """The context manager behind :func:`profile_block` (``start``/``stop`` for callers without ``with``)."""

    __slots__ = ("block", "stats", "_t0", "_c0", "_r0", "_w0")

    def __init__(self, block):
        self.block = block
        self.stats: BlockStats | None = None

    def start(self) -> _Profile:
        self._r0, self._w0 = _io()
        self._c0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> BlockStats:
        """End the measurement (once), attach it unless the block already has stats; returns it."""
        if self.stats is None:
            wall = time.perf_counter() - self._t0
            cpu = time.process_time() - self._c0
            r, w = _io()
            now = self._t0 + wall
            if wall >= 0.001 or now - _rss_cache[1] >= _RSS_MAX_AGE:  # reading it is ~12 µs
                _rss_cache[0], _rss_cache[1] = _peak_rss(), now
            self.stats = BlockStats(wall, cpu, int(_rss_cache[0]), max(0, r - self._r0), max(0, w - self._w0))
            b = self.block
            if b is not None and getattr(b, "stats", None) is None:
                try:
                    b.stats = self.stats
                except AttributeError:  # a block-like object without a stats attribute
                    pass
        return self.stats

    __enter__ = start

    def __exit__(self, *exc) -> None:
        self.stop()


def profile_block(block: Any) -> _Profile:  # a Block: daisy_nb.block imports this module
    """``with profile_block(block): ...`` measures the body into ``block.stats`` (first one wins).

    Measured also when the body raises. ``as p`` gives the profile; ``p.stats`` is the
    measurement after the ``with`` (also when ``block.stats`` kept an earlier one).

    Parameters
    ----------
    block : daisy_nb.Block
        The block the body processes; its ``stats`` attribute receives the measurement.

    Returns
    -------
    context manager
        Measures from ``__enter__`` to ``__exit__``.
    """
    return _Profile(block)


def measured_stats(profile: _Profile, block) -> BlockStats:
    """The stats to report for ``block``: the first attached (maybe the user's own), else ``profile``'s."""
    profile.stop()
    s = getattr(block, "stats", None)
    if isinstance(s, BlockStats):
        return s
    assert profile.stats is not None  # stop() measured
    return profile.stats


class TaskResourceStats:
    """One task's per-block measurements, folded as they are released (O(1) memory).

    ``blocks`` measured (``failed`` of them failed); sums of ``wall_seconds`` (in-block
    time), ``cpu_seconds`` and IO bytes; ``peak_rss_bytes`` is the largest process peak
    seen. ``mean_block_ms`` and ``block_ms_slope`` (OLS fit of the block duration in ms
    against the release index, in ms per block) cover successful blocks only; NaN
    when there are too few.
    """

    def __init__(self, task_id: str = ""):
        self.task_id = task_id
        self.blocks = 0
        self.failed = 0
        self.wall_seconds = 0.0
        self.cpu_seconds = 0.0
        self.peak_rss_bytes = 0
        self.io_read_bytes = 0
        self.io_write_bytes = 0
        self._n = 0  # successful blocks in the fit
        self._mx = self._my = self._sxx = self._sxy = 0.0

    def _fold(self, n: int, mx: float, my: float, sxx: float, sxy: float) -> None:
        """Chan et al.'s pairwise update of the centred sums (stable for long runs)."""
        na = self._n
        tot = na + n
        dx, dy = mx - self._mx, my - self._my
        f = na * n / tot
        self._sxx += sxx + dx * dx * f
        self._sxy += sxy + dx * dy * f
        self._mx += dx * n / tot
        self._my += dy * n / tot
        self._n = tot

    def add_one(self, stats, failed: bool) -> None:
        """One block: ``stats`` is a :class:`BlockStats` or a sequence of its first five fields."""
        wall, cpu, rss, r, w = stats[:5]
        x = self.blocks
        self.blocks += 1
        self.wall_seconds += float(wall)
        self.cpu_seconds += float(cpu)
        self.peak_rss_bytes = max(self.peak_rss_bytes, int(rss))
        self.io_read_bytes += int(r)
        self.io_write_bytes += int(w)
        if failed:
            self.failed += 1
        else:
            self._fold(1, float(x), float(wall) * 1e3, 0.0, 0.0)

    def add(self, rows, failed) -> None:
        """A batch in release order: ``rows`` an ``(n, 5)`` float array (or rows of 5 numbers),
        ``failed`` a bool array. Plain Python: this module is imported by workers and ``Client``
        programs, which never import numpy."""
        rows = rows.tolist() if hasattr(rows, "tolist") else [list(r) for r in rows]
        failed = failed.tolist() if hasattr(failed, "tolist") else list(failed)
        n = len(rows)
        if not n:
            return
        x0 = self.blocks
        self.blocks += n
        self.failed += sum(1 for f in failed if f)
        self.wall_seconds += math.fsum(float(r[0]) for r in rows)
        self.cpu_seconds += math.fsum(float(r[1]) for r in rows)
        self.peak_rss_bytes = max(self.peak_rss_bytes, max(int(r[2]) for r in rows))
        self.io_read_bytes += sum(int(r[3]) for r in rows)
        self.io_write_bytes += sum(int(r[4]) for r in rows)
        ok = [(float(x0 + i), float(r[0]) * 1e3) for i, (r, f) in enumerate(zip(rows, failed)) if not f]
        if ok:
            mx = math.fsum(x for x, _ in ok) / len(ok)
            my = math.fsum(y for _, y in ok) / len(ok)
            sxx = math.fsum((x - mx) ** 2 for x, _ in ok)
            sxy = math.fsum((x - mx) * (y - my) for x, y in ok)
            self._fold(len(ok), mx, my, sxx, sxy)

    @property
    def mean_block_ms(self) -> float:
        return self._my if self._n else math.nan

    @property
    def block_ms_slope(self) -> float:
        return self._sxy / self._sxx if self._n >= 2 and self._sxx > 0 else math.nan

    @property
    def cpu_per_block_second(self) -> float:
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else math.nan

    def as_dict(self) -> dict:
        keys = (
            "blocks",
            "failed",
            "wall_seconds",
            "cpu_seconds",
            "peak_rss_bytes",
            "io_read_bytes",
            "io_write_bytes",
            "mean_block_ms",
            "block_ms_slope",
            "cpu_per_block_second",
        )
        return {k: getattr(self, k) for k in keys}

    def __repr__(self):
        return (
            f"TaskResourceStats({self.task_id!r}, blocks={self.blocks}, failed={self.failed}, "
            f"wall={self.wall_seconds:.3f}s, cpu={self.cpu_seconds:.3f}s, peak_rss={self.peak_rss_bytes}, "
            f"io_read={self.io_read_bytes}, io_write={self.io_write_bytes})"
        )
