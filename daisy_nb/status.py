"""Status of block-tracking stores: what is done, what failed, what never ran.

``python -m daisy_nb status PATH [PATH...]`` and :func:`tracking_status` read the
tracking groups that :class:`daisy_nb.Task` (and daisy 2.0.0) write (docs/reference/tracking-format.md#layout)
and count, per task:

* ``done``: cells whose ``done`` byte is set;
* ``failed``: cells with ``failures > 0`` that are not done (``Task.failed_blocks()``);
* ``never``: cells that are neither (never run, orphaned, or interrupted);
* the histogram of recorded failure counts (failed attempts -> number of blocks).

**What is counted.** A tracking directory only records the *tracking grid*
``ceil(total_roi.shape / write_roi.shape)``, which is larger than the real block
grid when blocks have context (50x30 total, 10x10 write, context 5: 5x3 cells
for 4x2 blocks). From a bare directory every cell of that grid is counted as a
block (``counted == "cells"``), so cells that can never be blocks show up as
"never finished". When the task is known (a :class:`~daisy_nb.Task`, or the CLI's
``--total-roi/--read-roi/--write-roi``), only the real blocks are counted
(``counted == "blocks"``: cells ``g + cul // write_shape``) and the other cells
are reported separately as ``outside_cells``. A known task's ``skip_mask``
blocks are never written to tracking (daisy 2.0.0 does the same), so they are
counted as ``skipped_by_mask``, not as "never".

When the task is known and its store was written for a smaller volume of the same
grid (the volume grew; ``docs/tracking-growth.md``), the store is counted as a resume
would migrate it: the marks of the blocks whose write ROI did not change, on the
task's grid (``grown_from`` says from what). Nothing is written.

The arrays are streamed from the chunk files in pieces of :data:`CHUNK_CELLS`
cells with plain file reads (not a memory map, whose pages would count towards
the process's resident memory), so a 10^8-cell store needs a few MB. Stores in a
non-canonical layout (e.g. compressed by a caller; daisy never writes those) are
read whole through zarr.

This module does not import numba, zarr (except for such foreign layouts) or
matplotlib.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .tracking import (
    DONE_ARRAY,
    FAILURES_ARRAY,
    HASH_ATTRIBUTE,
    get_tracking_basedir,
    layout_record,
    read_tracking,
    task_hash,
)
from .tracking._grow import GrownSource, grown_view
from .tracking._io import side_paths

__all__ = [
    "CHUNK_CELLS",
    "TrackingTarget",
    "find_tracking_stores",
    "format_status",
    "resolve_target",
    "task_status",
    "tracking_status",
]

#: cells read per step when streaming a store (1 MiB of ``done`` + 4 MiB of ``failures``)
CHUNK_CELLS = 1 << 20

_DONE = np.dtype("u1")
_FAILURES = np.dtype("<u4")


class StatusError(Exception):
    """A path or task that cannot be inspected (the CLI exits with code 2)."""


# ---------------------------------------------------------------------------
# reading a store in pieces
# ---------------------------------------------------------------------------


class _ArraySource:
    """Flat C-order reads ``[start, start + count)`` of one tracking array."""

    def __init__(self, arr, dtype: np.dtype, size: int):
        self.dtype = dtype
        self.size = size
        self._file = None
        self._filename: str | None = None
        self._offset = 0
        self._data: np.ndarray | None = None
        self._zarr = None
        if arr is None:
            self._data = None  # absent array (e.g. a caller-provided group): all zeros
        elif isinstance(arr, np.memmap):
            # canonical raw chunk: read it with file reads, drop the mapping
            self._filename = os.fspath(arr.filename)
            self._offset = int(arr.offset)
        elif isinstance(arr, np.ndarray):
            # missing chunk (lazy zeros) or a chunk of the wrong size (already a copy)
            self._data = arr.reshape(-1)
        else:
            self._zarr = arr  # non-canonical layout: loaded whole on first read

    def read(self, start: int, count: int) -> np.ndarray:
        if self._filename is not None:
            if self._file is None:
                self._file = open(self._filename, "rb")  # noqa: SIM115 - closed in close()
            out = np.empty(count, self.dtype)
            buf = memoryview(out.view(np.uint8))
            self._file.seek(self._offset + start * self.dtype.itemsize)
            got = 0
            while got < len(buf):
                n = self._file.readinto(buf[got:])
                if not n:
                    break
                got += n
            if got < len(buf):  # truncated chunk: the rest reads as fill (0)
                buf[got:] = b"\0" * (len(buf) - got)
            return out
        if self._zarr is not None:
            self._data = np.asarray(self._zarr[...], dtype=self.dtype).reshape(-1)
            self._zarr = None
        if self._data is None:
            return np.zeros(count, self.dtype)
        return np.asarray(self._data[start : start + count], dtype=self.dtype)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _StoreReader:
    """A tracking group opened for streaming reads of ``done`` and ``failures``."""

    def __init__(self, path: Path, growth=None):
        try:
            info = read_tracking(path)
        except FileNotFoundError as e:
            raise StatusError(str(e)) from None
        except (OSError, ValueError, RuntimeError) as e:
            raise StatusError(f"cannot read block tracking at {path}: {e}") from None
        if info["grid_shape"] is None:
            raise StatusError(
                f"{path} is a zarr group but holds no '{DONE_ARRAY}' or '{FAILURES_ARRAY}' array: "
                "not a block-tracking store"
            )
        self.path = Path(path)
        self.task_hash: str | None = info["task_hash"]
        self.grid_shape: tuple[int, ...] = tuple(int(v) for v in info["grid_shape"])
        self.size = math.prod(self.grid_shape)
        self.arrays: list[str] = list(info["arrays"])
        self.done: _ArraySource | GrownSource = _ArraySource(info["done"], _DONE, self.size)
        self.failures: _ArraySource | GrownSource = _ArraySource(info["failures"], _FAILURES, self.size)
        del info  # release the memory maps read_tracking made
        #: the store is for a smaller volume of the task's grid: reads show it remapped, as a
        #: resume would migrate it (:mod:`daisy_nb.tracking._grow`); ``grown`` is the Growth
        self.grown = growth
        if growth is not None:
            self.done.close()
            self.failures.close()
            self.grid_shape = tuple(growth.new_grid)
            self.size = math.prod(self.grid_shape)
            self.done = GrownSource(self.path, DONE_ARRAY, growth, _DONE)
            self.failures = GrownSource(self.path, FAILURES_ARRAY, growth, _FAILURES)

    def read(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(done, failures)`` of the flat cells ``[start, start + count)``."""
        return self.done.read(start, count), self.failures.read(start, count)

    def slabs(
        self, lo: tuple[int, ...], hi: tuple[int, ...], chunk_cells: int = CHUNK_CELLS
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Yield ``(r0, done, failures)`` for rows ``[r0, r1)`` of axis 0 within ``[lo0, hi0)``.

        Each piece has shape ``(r1 - r0, *grid_shape[1:])`` (the whole rows, not
        cropped to the box) and holds at most ``max(chunk_cells, row size)`` cells.
        """
        inner = math.prod(self.grid_shape[1:])
        rows = max(1, chunk_cells // max(inner, 1))
        for r0 in range(lo[0], hi[0], rows):
            r1 = min(hi[0], r0 + rows)
            d, f = self.read(r0 * inner, (r1 - r0) * inner)
            shape = (r1 - r0, *self.grid_shape[1:])
            yield r0, d.reshape(shape), f.reshape(shape)

    def close(self) -> None:
        self.done.close()
        self.failures.close()

    def __enter__(self) -> _StoreReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------
# what to look at: a path, a Task, a TaskState
# ---------------------------------------------------------------------------


class TrackingTarget:
    """One task's tracking store, with its real block grid when the task is known.

    Attributes
    ----------
    name : str
        Task id (or the directory name).
    path : Path
        The tracking group.
    block_lo, block_hi : tuple of int or None
        The real block grid as a box ``[lo, hi)`` of tracking cells
        (``lo = cul // write_shape``), None when only the directory is known.
    skip_mask : ndarray or None
        The task's ``skip_mask`` (block-grid shape), if any.
    expected_hash : str or None
        The task's layout hash, checked against the stored one.
    expected_layout : dict or None
        The task's layout record (:func:`daisy_nb.tracking.layout_record`): a store
        written for a smaller volume of the same grid is then read as a resume would
        migrate it (the marks of unchanged blocks, on the task's grid) instead of
        being refused.
    """

    def __init__(
        self,
        name: str,
        path,
        *,
        block_lo=None,
        block_hi=None,
        skip_mask=None,
        expected_hash=None,
        expected_layout=None,
    ):
        self.name = str(name)
        self.path = Path(os.fspath(path))
        self.block_lo = None if block_lo is None else tuple(int(v) for v in block_lo)
        self.block_hi = None if block_hi is None else tuple(int(v) for v in block_hi)
        self.skip_mask = skip_mask
        self.expected_hash = expected_hash
        self.expected_layout = expected_layout

    @classmethod
    def from_layout(cls, name: str, path, layout, skip_mask=None, expected_hash=None) -> TrackingTarget:
        """Target whose block grid comes from a :class:`daisy_nb.layout.BlockLayout`."""
        lo = np.asarray(layout.id_offset, np.int64)
        hi = lo + np.asarray(layout.grid_shape, np.int64)
        rec = layout_record(
            layout.total_roi_t, layout.read_roi_t, layout.write_roi_t, layout.fit, layout.read_write_conflict
        )
        return cls(
            name,
            path,
            block_lo=lo,
            block_hi=hi,
            skip_mask=skip_mask,
            expected_hash=expected_hash,
            expected_layout=rec,
        )

    @property
    def knows_blocks(self) -> bool:
        return self.block_lo is not None

    def open(self) -> _StoreReader:
        """Open the store; check the layout hash and clip the block box to the grid."""
        reader = _StoreReader(self.path)
        if self.expected_hash is not None and reader.task_hash not in (None, self.expected_hash):
            growth, reason = (None, None)
            if self.expected_layout is not None:
                growth, reason = grown_view(self.path, self.expected_layout)
            reader.close()
            if growth is None:
                why = f": {reason}" if reason else ""
                raise StatusError(
                    f"block tracking at {self.path} was written for a different task layout "
                    f"(stored hash = {reader.task_hash}, expected = {self.expected_hash}){why}"
                )
            reader = _StoreReader(self.path, growth)
        if self.block_lo is not None:
            if len(self.block_lo) != len(reader.grid_shape):
                reader.close()
                raise StatusError(
                    f"block tracking at {self.path} has a {len(reader.grid_shape)}-D grid, "
                    f"the task is {len(self.block_lo)}-D"
                )
            g = reader.grid_shape
            self.block_lo = tuple(min(max(0, v), s) for v, s in zip(self.block_lo, g))
            self.block_hi = tuple(min(max(lo, v), s) for v, lo, s in zip(self.block_hi, self.block_lo, g))
        return reader

    def __repr__(self) -> str:
        box = "" if self.block_lo is None else f", blocks={list(self.block_lo)}..{list(self.block_hi)}"
        return f"TrackingTarget({self.name!r}, {str(self.path)!r}{box})"


def _is_store(p: Path) -> bool:
    try:
        with open(p / "zarr.json", "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(meta, dict)
        and meta.get("node_type") == "group"
        and (
            HASH_ATTRIBUTE in (meta.get("attributes") or {})
            or (p / DONE_ARRAY / "zarr.json").exists()
            or (p / FAILURES_ARRAY / "zarr.json").exists()
        )
    )


def find_tracking_stores(path) -> list[Path]:
    """Tracking stores at ``path``: the path itself, or its task subdirectories.

    Raises :class:`StatusError` if ``path`` does not exist or holds no store.
    """
    p = Path(os.fspath(path))
    if not p.exists():
        raise StatusError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise StatusError(f"{p}: not a directory (expected a task's tracking directory or a basedir)")
    if _is_store(p):
        return [p]
    if (p / "zarr.json").exists():
        raise StatusError(f"{p}: has a zarr.json but is not a block-tracking group")
    found = sorted(c for c in p.iterdir() if c.is_dir() and not _side_dir(c) and _is_store(c))
    if not found:
        raise StatusError(
            f"{p}: no block tracking here (expected {p}/zarr.json, or task directories "
            f"{p}/<task_id>/zarr.json as written with set_tracking_basedir)"
        )
    return found


def _task_target(task, name: str | None = None) -> TrackingTarget:
    path = task.resolved_tracking_path()
    if path is None:
        raise StatusError(
            f"task {task.task_id!r} has block tracking off (tracking_path=False, or None without "
            "set_tracking_basedir())"
        )
    return TrackingTarget.from_layout(
        name or task.task_id,
        path,
        task.layout,
        skip_mask=task.skip_mask,
        expected_hash=task_hash(task.total_roi, task.read_roi, task.write_roi, task.fit),
    )


def resolve_target(obj, name: str | None = None) -> TrackingTarget:
    """What :func:`task_status` and :func:`~daisy_nb.plot_block_states` accept.

    * a :class:`~daisy_nb.Task`: its resolved tracking path, counted over its real
      block grid (and its ``skip_mask``); the stored layout hash must match;
    * a str / ``os.PathLike``: one task's tracking directory (tracking grid only);
    * an object with a ``tracking_path`` (str/Path) or a ``task`` (a Task) attribute;
    * a ``TaskState`` (from ``run_blockwise(..., return_states=True)``): found at
      ``<tracking basedir>/<task_id>``, so this needs ``set_tracking_basedir()``
      and a task that used the default ``tracking_path=None`` (a TaskState does
      not know an explicit path: pass the Task instead); tracking grid only;
    * a ``{task_id: TaskState}`` dict with exactly one entry;
    * a :class:`TrackingTarget` (returned as is).
    """
    if isinstance(obj, TrackingTarget):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        p = Path(os.fspath(obj))
        return TrackingTarget(name or p.resolve().name or str(p), p)
    if hasattr(obj, "resolved_tracking_path") and hasattr(obj, "layout"):
        return _task_target(obj, name)
    if isinstance(obj, Mapping):
        if len(obj) != 1:
            raise StatusError(
                f"got a dict of {len(obj)} task states; pass one of them (e.g. states[{next(iter(obj), 'task')!r}])"
            )
        ((key, value),) = obj.items()
        return resolve_target(value, name or str(key))
    tp = getattr(obj, "tracking_path", None)
    if isinstance(tp, (str, os.PathLike)):
        return resolve_target(tp, name or getattr(obj, "task_id", None))
    task = getattr(obj, "task", None)
    if task is not None and hasattr(task, "resolved_tracking_path"):
        return _task_target(task, name)
    tid = getattr(obj, "task_id", None)
    if isinstance(tid, str):
        base = get_tracking_basedir()
        if base is None:
            raise StatusError(
                f"cannot find the block tracking of task state {tid!r}: no tracking basedir is set "
                "(set_tracking_basedir()); pass the Task or its tracking path instead"
            )
        return TrackingTarget(name or tid, Path(base) / tid)
    raise TypeError(f"expected a Task, a tracking path, or a TaskState, got {type(obj).__name__}")


# ---------------------------------------------------------------------------
# counting
# ---------------------------------------------------------------------------


class _Histogram:
    """Counts of failure values > 0 (bincount while they are small)."""

    _DENSE_MAX = 1 << 16

    def __init__(self):
        self.dense = np.zeros(0, np.int64)
        self.sparse: dict[int, int] = {}

    def add(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        if int(values.max()) < self._DENSE_MAX:
            b = np.bincount(values, minlength=self.dense.size)
            if b.size > self.dense.size:
                b[: self.dense.size] += self.dense
                self.dense = b
            else:
                self.dense += b
        else:
            v, c = np.unique(values, return_counts=True)
            for vi, ci in zip(v.tolist(), c.tolist()):
                self.sparse[vi] = self.sparse.get(vi, 0) + ci

    def as_dict(self) -> dict[int, int]:
        out = {int(i): int(c) for i, c in enumerate(self.dense.tolist()) if c and i > 0}
        for k, c in self.sparse.items():
            out[k] = out.get(k, 0) + c
        return dict(sorted(out.items()))


def _count_into(acc: dict[str, Any], d: np.ndarray, f: np.ndarray, mask: np.ndarray | None) -> None:
    done = d != 0
    failed = f != 0
    acc["cells"] += d.size
    acc["done"] += int(np.count_nonzero(done))
    fnd = failed & ~done
    acc["failed"] += int(np.count_nonzero(fnd))
    if failed.any():
        acc["done_after_failures"] += int(np.count_nonzero(failed & done))
        acc["hist"].add(f[failed])
    if mask is not None:
        acc["skipped_by_mask"] += int(np.count_nonzero(mask & ~done & ~failed))


def _new_acc() -> dict[str, Any]:
    return {"cells": 0, "done": 0, "failed": 0, "done_after_failures": 0, "skipped_by_mask": 0, "hist": _Histogram()}


def task_status(task_or_path, *, chunk_cells: int = CHUNK_CELLS) -> dict[str, Any]:
    """Status of one task's tracking store (see the module docstring for what is counted).

    Parameters
    ----------
    task_or_path : Task, str, Path, TaskState or TrackingTarget
        See :func:`resolve_target`.
    chunk_cells : int
        Cells read per step.

    Returns
    -------
    dict
        ``task``, ``path``, ``task_hash``, ``grid_shape`` (tracking grid),
        ``block_grid_shape`` (None if unknown), ``counted`` (``"blocks"`` or
        ``"cells"``), ``total``, ``done``, ``failed`` (failures > 0 and not done),
        ``never`` (neither), ``skipped_by_mask``, ``percent_done``,
        ``done_after_failures`` (done, with failures recorded),
        ``failure_histogram`` ({failed attempts: blocks}, over counted blocks
        with failures), ``outside_cells`` (tracking cells that are not blocks; 0
        when unknown), ``outside_marked`` (of those, cells with a done byte or
        failures: should be 0), ``complete`` (every counted block done or
        skipped by mask) and ``extra_arrays`` (other arrays in the group).

    Raises
    ------
    StatusError
        If there is no readable tracking store (or its layout hash differs).
    """
    target = resolve_target(task_or_path)
    with target.open() as reader:
        grid = reader.grid_shape
        acc = _new_acc()
        outside = _new_acc()
        full = not target.knows_blocks or (target.block_lo == (0,) * len(grid) and target.block_hi == grid)
        if full and target.skip_mask is None:
            for s in range(0, reader.size, chunk_cells):
                d, f = reader.read(s, min(chunk_cells, reader.size - s))
                _count_into(acc, d, f, None)
        else:
            lo = target.block_lo if target.knows_blocks else (0,) * len(grid)
            hi = target.block_hi if target.knows_blocks else grid
            inner_box = tuple(slice(a, b) for a, b in zip(lo[1:], hi[1:]))
            mask = None if target.skip_mask is None else np.asarray(target.skip_mask) != 0
            # whole-grid totals come from the slabs of the box rows plus the rows outside
            all_acc = _new_acc()
            for r0, d, f in reader.slabs((0,) * len(grid), grid, chunk_cells):
                _count_into(all_acc, d, f, None)
                a, b = max(lo[0], r0), min(hi[0], r0 + d.shape[0])
                if a >= b:
                    continue
                sel = (slice(a - r0, b - r0), *inner_box)
                m = None
                if mask is not None:
                    m = mask[(slice(a - lo[0], b - lo[0]), *(slice(0, y - x) for x, y in zip(lo[1:], hi[1:])))]
                _count_into(acc, d[sel], f[sel], m)
            for k in ("cells", "done", "failed", "done_after_failures"):
                outside[k] = all_acc[k] - acc[k]
    total = acc["cells"]
    done = acc["done"]
    failed = acc["failed"]
    skipped = acc["skipped_by_mask"]
    never = total - done - failed - skipped
    outside_marked = outside["done"] + outside["failed"] + outside["done_after_failures"]
    return {
        "task": target.name,
        "path": str(target.path),
        "task_hash": reader.task_hash,
        "grid_shape": list(grid),
        "block_grid_shape": (
            [b - a for a, b in zip(target.block_lo, target.block_hi)] if target.knows_blocks else None
        ),
        "counted": "blocks" if target.knows_blocks else "cells",
        "total": total,
        "done": done,
        "failed": failed,
        "never": never,
        "skipped_by_mask": skipped,
        "percent_done": _percent(done, total),
        "done_after_failures": acc["done_after_failures"],
        "failure_histogram": acc["hist"].as_dict(),
        "outside_cells": outside["cells"],
        "outside_marked": outside_marked,
        "complete": done + skipped == total,
        "extra_arrays": [a for a in reader.arrays if a not in (DONE_ARRAY, FAILURES_ARRAY)],
        "grown_from": _grown_info(reader.grown),
    }


def _grown_info(growth) -> dict[str, Any] | None:
    """What a resume of the grown volume starts from (None: the store is for this layout)."""
    if growth is None:
        return None
    return {
        "total_roi": growth.old["total_roi"],
        "grid_shape": list(growth.old_grid),
        "shift": list(growth.shift),
        "old_blocks": growth.old_blocks,
        "describe": growth.describe(),
    }


def _percent(done: int, total: int) -> float:
    """Percent done, rounded down to 0.1 so that 100.0 means everything."""
    if total == 0:
        return 100.0
    return math.floor(1000 * done / total) / 10


def tracking_status(path, *, geometry=None, chunk_cells: int = CHUNK_CELLS) -> dict[str, dict[str, Any]]:
    """``{task: status}`` for a task's tracking directory or a basedir of several.

    Parameters
    ----------
    path : str, Path, Task or TaskState
        A tracking directory, a basedir (every ``<path>/<task_id>/`` store), or
        anything :func:`resolve_target` accepts (then one entry).
    geometry : BlockLayout, optional
        The task layout of every store found (e.g. from the CLI's ROI options):
        counts only its real blocks and checks the stored layout hash.
    chunk_cells : int
        Cells read per step.

    Returns
    -------
    dict
        Task name -> :func:`task_status` dict, in directory order.
    """
    if not isinstance(path, (str, os.PathLike)):
        t = resolve_target(path)
        return {t.name: task_status(t, chunk_cells=chunk_cells)}
    out = {}
    for p in find_tracking_stores(path):
        target = _geometry_target(p, geometry) if geometry is not None else TrackingTarget(p.name, p)
        out[target.name] = task_status(target, chunk_cells=chunk_cells)
    return out


def _geometry_target(p: Path, geometry) -> TrackingTarget:
    lay = geometry
    tr, rd, wr = lay.total_roi_t, lay.read_roi_t, lay.write_roi_t
    return TrackingTarget.from_layout(p.name, p, lay, expected_hash=task_hash(tr, rd, wr, lay.fit))


def _side_dir(p: Path) -> bool:
    """A migration's build or parked store beside a task's store (not a task of its own)."""
    if not p.name.startswith("."):
        return False
    for suffix in side_paths(p.parent, "x"):
        tail = suffix.name[len(".x") :]
        if p.name.endswith(tail):
            return True
    return False


# ---------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------


def _shape(s) -> str:
    return " x ".join(str(v) for v in s)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_status(status) -> str:
    """Human-readable text of one :func:`task_status` dict, or of a ``{task: status}`` dict."""
    if isinstance(status, Mapping) and "task" not in status:
        return "\n\n".join(format_status(s) for s in status.values())
    s = status
    unit = "blocks" if s["counted"] == "blocks" else "cells"
    total = s["total"]
    lines = [f"task {s['task']}  ({s['path']})"]
    if s["counted"] == "blocks":
        dims = f"{_shape(s['block_grid_shape'])} = " if len(s["block_grid_shape"]) > 1 else ""
        grid = f"{dims}{total} blocks"
        extra = s["outside_cells"]
        if extra:
            grid += f" (tracking grid {_shape(s['grid_shape'])}; {extra} cells that are not blocks not counted"
            grid += f", {s['outside_marked']} of them marked)" if s["outside_marked"] else ")"
    else:
        dims = f"{_shape(s['grid_shape'])} = " if len(s["grid_shape"]) > 1 else ""
        grid = (
            f"{dims}{total} tracking cells (block grid unknown: every cell counts "
            "as a block; with context some cells are never blocks)"
        )
    w = 18
    lines.append(f"  {'grid':<{w}}{grid}")
    lines.append(f"  {'done':<{w}}{s['done']} / {total} {unit} ({s['percent_done']:.1f}%)")
    lines.append(f"  {'failed, not done':<{w}}{s['failed']}")
    lines.append(f"  {'never finished':<{w}}{s['never']}")
    if s["skipped_by_mask"]:
        lines.append(f"  {'skipped (mask)':<{w}}{s['skipped_by_mask']}")
    hist = s["failure_histogram"]
    if hist:
        text = "; ".join(f"{_plural(k, 'attempt')}: {_plural(c, 'block')}" for k, c in hist.items())
        if s["done_after_failures"]:
            text += f" ({s['done_after_failures']} of these blocks done since)"
    else:
        text = "none recorded"
    lines.append(f"  {'failure counts':<{w}}{text}")
    if s["extra_arrays"]:
        lines.append(f"  {'other arrays':<{w}}{', '.join(s['extra_arrays'])}")
    g = s.get("grown_from")
    if g:
        lines.append(
            f"  {'grown volume':<{w}}the store is for a smaller volume ({g['describe']}): a resume "
            f"migrates it and skips the {s['done']} blocks counted done here (changed blocks at the old "
            "far edge run again)"
        )
    lines.append(f"  {'status':<{w}}{'complete' if s['complete'] else 'INCOMPLETE'}")
    return "\n".join(lines)
