"""Block tracking: the task hash, the tracking grid and where a task's store lives.

The hash and grid follow daisy 2.0.0 (docs/reference/tracking-format.md#grid); the store itself is in
:mod:`daisy_nb.tracking._store`. No numba, no zarr.
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import warnings
from pathlib import Path

import numpy as np

TRACKING_HASH_PREFIX = "daisy-tracking:v1"
_FIT_NAMES = {"valid": "Valid", "overhang": "Overhang", "shrink": "Shrink"}


# ---------------------------------------------------------------------------
# task hash and grid shape
# ---------------------------------------------------------------------------


def _roi_parts(roi, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(offset, shape)`` of a funlib Roi, anything with .offset/.shape, or a pair."""
    if isinstance(roi, tuple) and len(roi) == 2 and not hasattr(roi, "offset"):
        offset, shape = roi
    else:
        try:
            offset, shape = roi.offset, roi.shape
        except AttributeError:
            raise TypeError(f"{name} must be a Roi (or have .offset and .shape), got {roi!r}") from None
    try:
        off = tuple(int(v) for v in offset)
        shp = tuple(int(v) for v in shape)
    except TypeError:
        raise ValueError(f"{name} must be bounded with integer coordinates, got {roi!r}") from None
    if len(off) != len(shp):
        raise ValueError(f"{name}: offset and shape have different dimensions: {roi!r}")
    return off, shp


def _fit_name(fit) -> str:
    if isinstance(fit, str):
        key = fit.strip().lower()
    else:
        # enum-likes (e.g. a Fit enum with .name / .value)
        key = str(getattr(fit, "name", None) or getattr(fit, "value", fit)).lower()
    try:
        return _FIT_NAMES[key]
    except KeyError:
        raise ValueError(f"unknown fit {fit!r}; expected 'valid', 'overhang' or 'shrink'") from None


def _i64le(values) -> bytes:
    return b"".join(struct.pack("<q", v) + b"," for v in values)


def _sha256():
    """A SHA-256 object from CPython's own implementation, which ``hashlib`` falls back on: not
    ``hashlib``'s, whose import loads OpenSSL's libcrypto into the process (~0.6 MB of a main
    process that keeps it through what the program does after the run) for one short digest
    per task. ``hashlib`` where the interpreter was built without it."""
    try:
        if sys.version_info >= (3, 12):
            from _sha2 import sha256
        else:
            from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
    return sha256()


def task_hash(total_roi, read_roi, write_roi, fit="valid") -> str:
    """SHA-256 (lowercase hex) identifying a task's block layout (docs/reference/tracking-format.md#task-hash).

    The ROIs are taken exactly as the user gave them (template offsets
    included); ``fit`` is ``"valid"``, ``"overhang"`` or ``"shrink"``. This is the
    ``daisy_task_hash`` attribute daisy 2.0.0 stores in a tracking group.
    """
    h = _sha256()
    h.update(TRACKING_HASH_PREFIX.encode() + b"\n")
    for label, roi in (("total", total_roi), ("read", read_roi), ("write", write_roi)):
        off, shp = _roi_parts(roi, f"{label}_roi")
        h.update(label.encode() + b":offset=" + _i64le(off))
        h.update(b";shape=" + _i64le(shp) + b";")
    h.update(b"fit=" + _fit_name(fit).encode())
    return h.hexdigest()


def grid_shape(total_roi, write_roi) -> tuple[int, ...]:
    """Shape of the tracking grid: ``ceil(total.shape / write.shape)``, at least 1.

    Computed from the total *read* ROI, so it is often larger than the real
    block grid (50x30 total, 10x10 write with context 5 -> (5, 3) for 4x2 blocks).
    """
    _, tshape = _roi_parts(total_roi, "total_roi")
    _, wshape = _roi_parts(write_roi, "write_roi")
    if len(tshape) != len(wshape):
        raise ValueError("total_roi and write_roi have different dimensions")
    out = []
    for t, w in zip(tshape, wshape):
        if w <= 0:
            raise ValueError(f"write_roi must have a positive shape, got {wshape}")
        out.append(max(1, -(-t // w)) if t > 0 else 1)
    return tuple(out)


def grid_linear_indices(total_roi, write_roi, write_begins) -> np.ndarray:
    """C-order linear tracking indices of blocks given their absolute write begins.

    ``write_begins`` is an ``(N, ndim)`` integer array (or one coordinate). The
    grid coordinate is ``(W.begin - total.begin) // write.shape`` (docs/reference/tracking-format.md#grid);
    blocks outside the grid get ``-1``.
    """
    toff, _ = _roi_parts(total_roi, "total_roi")
    _, wshape = _roi_parts(write_roi, "write_roi")
    shape = grid_shape(total_roi, write_roi)
    wb = np.asarray(write_begins, dtype=np.int64)
    single = wb.ndim == 1
    wb = np.atleast_2d(wb)
    g = (wb - np.asarray(toff, dtype=np.int64)) // np.asarray(wshape, dtype=np.int64)
    ok = np.all((g >= 0) & (g < np.asarray(shape, dtype=np.int64)), axis=1)
    strides = np.ones(len(shape), dtype=np.int64)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    lin = np.where(ok, g @ strides, -1).astype(np.int64)
    return lin[0] if single else lin


# ---------------------------------------------------------------------------
# path resolution
# ---------------------------------------------------------------------------

_BASEDIR: Path | None = None


def set_tracking_basedir(path: str | os.PathLike[str] | None) -> None:
    """Set the global base directory for per-task block tracking (``None`` unsets).

    A task with ``tracking_path=None`` then tracks at ``<basedir>/<task_id>``.
    Tracking is opt-in: without a basedir and without an explicit path nothing
    is written (as in daisy 2.0.0).

    Parameters
    ----------
    path : str, os.PathLike or None
        The base directory (created when a task first tracks there); None unsets it.
    """
    global _BASEDIR
    _BASEDIR = None if path is None else Path(os.fspath(path))


def get_tracking_basedir() -> Path | None:
    """The global block-tracking base directory, or None if unset."""
    return _BASEDIR


def set_done_marker_basedir(path: str | os.PathLike[str] | None) -> None:
    """Deprecated alias for :func:`set_tracking_basedir`.

    Parameters
    ----------
    path : str, os.PathLike or None
        As :func:`set_tracking_basedir`'s ``path``.
    """
    warnings.warn(
        "set_done_marker_basedir() is deprecated; use set_tracking_basedir(). "
        "The directory now holds failure counts and resource measurements "
        "alongside the done markers.",
        DeprecationWarning,
        stacklevel=2,
    )
    set_tracking_basedir(path)


def get_done_marker_basedir() -> Path | None:
    """Deprecated alias for :func:`get_tracking_basedir`."""
    warnings.warn(
        "get_done_marker_basedir() is deprecated; use get_tracking_basedir().", DeprecationWarning, stacklevel=2
    )
    return get_tracking_basedir()


def resolve_tracking_path(task_id: str, tracking_path) -> Path | None:
    """Where a task's tracking store lives, or None if tracking is off.

    ``False`` -> None; a str/Path -> that path; ``None`` -> ``<basedir>/<task_id>``
    when a basedir is set, else None. ``True`` raises ``TypeError``.
    """
    if tracking_path is True:
        raise TypeError("tracking_path=True is not a valid value; use None (auto), False (disabled), or a str/Path")
    if tracking_path is False:
        return None
    if tracking_path is None:
        base = _BASEDIR
        return None if base is None else base / str(task_id)
    if isinstance(tracking_path, (str, os.PathLike)):
        return Path(os.fspath(tracking_path))
    raise TypeError(f"tracking_path must be None, False, or a str/Path, got {type(tracking_path).__name__}")


def reset(path) -> str | None:
    """Delete a tracking store directory (``Task.reset()``).

    Also removes what an interrupted migration to a grown volume left beside it
    (``.<name>.daisy_nb-new``/``-old``, see :mod:`._grow`). Returns the path as a
    string, or None if ``path`` is None or nothing exists.
    """
    if path is None:
        return None
    p = Path(os.fspath(path))
    from ._io import side_paths

    for side in side_paths(p.parent, p.name):
        if side.is_dir() and not side.is_symlink():
            shutil.rmtree(side, ignore_errors=True)
    if not os.path.lexists(p):
        return None
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    except OSError as e:
        raise RuntimeError(f"failed to clear block tracking at {p}: {e}") from e
    return str(p)
