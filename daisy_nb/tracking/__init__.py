"""Per-task block tracking, on-disk compatible with daisy 2.0.0.

A tracking store is a Zarr v3 *group* (docs/reference/tracking-format.md#layout)::

    <path>/zarr.json                 {"attributes": {"daisy_task_hash": ...}, "node_type": "group", ...}
    <path>/done/zarr.json            uint8 array, shape = grid, one chunk = whole grid
    <path>/done/c/0/.../0            raw C-order bytes, 1 = block done
    <path>/failures/zarr.json        uint32 little-endian array, same shape
    <path>/failures/c/0/.../0        failed-attempt count per block (accumulates across runs)

The metadata documents are written exactly as daisy 2.0.0 writes them (pretty
JSON, sorted keys, trailing newline), once, when the store is made (aside +
rename); the chunks are raw bytes (codec ``bytes``, little endian, no
compression), which zarr-python reads as is.

Modules: :mod:`._grid` (task hash, grid shape, where a store lives, reset),
:mod:`._files` (metadata documents, atomic writes, raw chunks, :func:`read_tracking`),
:mod:`._io` (which write path a file system takes, ``DAISY_NB_TRACKING_IO``,
:class:`TrackingWriteError`, the crash-safe conversion of a foreign array),
:mod:`._layout` (the layout record beside the hash), :mod:`._open` (whose store is
it: fresh, the same task's, or grown), :mod:`._grow` (a store for a volume that grew
migrated to the grown grid, keeping the marks of unchanged blocks; loaded only then) and
:mod:`._store` (:class:`TrackingStore`: the chunks mapped shared, or held in memory
and written with ``pwrite``, so a mark is in the file at once and a flush writes
only the pages that changed).

This package is imported by the CLI and by worker-side code: it must not import
numba (nor ``daisy_nb.kernels``). zarr is only imported for stores whose layout
is not the canonical one (e.g. a caller-provided, compressed ``done`` array).
"""

from __future__ import annotations

from ._files import (  # noqa: F401 - re-exported (status.py, tests)
    _SPARSE_MIN_BYTES,
    _SPARSE_SEGMENT,
    _TMP_MARK,
    DONE_ARRAY,
    FAILURES_ARRAY,
    HASH_ATTRIBUTE,
    read_tracking,
)
from ._grid import (
    TRACKING_HASH_PREFIX,
    get_done_marker_basedir,
    get_tracking_basedir,
    grid_linear_indices,
    grid_shape,
    reset,
    resolve_tracking_path,
    set_done_marker_basedir,
    set_tracking_basedir,
    task_hash,
)
from ._io import ENV_IO, TrackingWriteError
from ._layout import LAYOUT_ATTRIBUTE, layout_record
from ._store import TrackingStore

__all__ = [
    "ENV_IO",
    "LAYOUT_ATTRIBUTE",
    "TRACKING_HASH_PREFIX",
    "TrackingWriteError",
    "TrackingStore",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "grid_linear_indices",
    "grid_shape",
    "layout_record",
    "read_tracking",
    "reset",
    "resolve_tracking_path",
    "set_done_marker_basedir",
    "set_tracking_basedir",
    "task_hash",
]
