"""Per-task block tracking, on-disk compatible with daisy 2.0.0.

A tracking store is a Zarr v3 *group* (CORE.md 7.3)::

    <path>/zarr.json                 {"attributes": {"daisy_task_hash": ...}, "node_type": "group", ...}
    <path>/done/zarr.json            uint8 array, shape = grid, one chunk = whole grid
    <path>/done/c/0/.../0            raw C-order bytes, 1 = block done
    <path>/failures/zarr.json        uint32 little-endian array, same shape
    <path>/failures/c/0/.../0        failed-attempt count per block (accumulates across runs)

The metadata documents are written exactly as daisy 2.0.0 writes them (pretty
JSON, sorted keys, trailing newline), and the chunks are written as raw bytes
(codec ``bytes``, little endian, no compression), which zarr-python reads as is.

Chunks are mapped copy-on-write (``np.memmap(mode="c")``): opening a store costs
no memory up front, pages are only copied when a block in them changes, and
:meth:`TrackingStore.flush` writes each changed array in one sequential write to
a temporary file in the chunk's directory, fsyncs it and ``os.replace``s it over
the chunk, so an interrupted flush never leaves a torn chunk behind.

This module is imported by the CLI and by worker-side code: it must not import
numba (nor ``daisy_nb.kernels``). zarr is only imported for stores whose layout
is not the canonical one (e.g. a caller-provided, compressed ``done`` array).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "TRACKING_HASH_PREFIX",
    "TrackingStore",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "grid_linear_indices",
    "grid_shape",
    "read_tracking",
    "reset",
    "resolve_tracking_path",
    "set_done_marker_basedir",
    "set_tracking_basedir",
    "task_hash",
]

TRACKING_HASH_PREFIX = "daisy-tracking:v1"
HASH_ATTRIBUTE = "daisy_task_hash"
DONE_ARRAY = "done"
FAILURES_ARRAY = "failures"

_DONE_DTYPE = np.dtype("u1")
_FAILURES_DTYPE = np.dtype("<u4")
_ZARR_DTYPE_NAMES = {_DONE_DTYPE: "uint8", _FAILURES_DTYPE: "uint32"}
_TMP_MARK = ".daisy_nb-tmp-"

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
            raise TypeError(
                f"{name} must be a Roi (or have .offset and .shape), got {roi!r}"
            ) from None
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
        raise ValueError(
            f"unknown fit {fit!r}; expected 'valid', 'overhang' or 'shrink'"
        ) from None


def _i64le(values) -> bytes:
    return b"".join(struct.pack("<q", v) + b"," for v in values)


def task_hash(total_roi, read_roi, write_roi, fit="valid") -> str:
    """SHA-256 (lowercase hex) identifying a task's block layout (CORE.md 7.1).

    The ROIs are taken exactly as the user gave them (template offsets
    included); ``fit`` is ``"valid"``, ``"overhang"`` or ``"shrink"``. This is the
    ``daisy_task_hash`` attribute daisy 2.0.0 stores in a tracking group.
    """
    h = hashlib.sha256()
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
    grid coordinate is ``(W.begin - total.begin) // write.shape`` (CORE.md 7.1);
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


def set_tracking_basedir(path) -> None:
    """Set the global base directory for per-task block tracking (``None`` unsets).

    A task with ``tracking_path=None`` then tracks at ``<basedir>/<task_id>``.
    Tracking is opt-in: without a basedir and without an explicit path nothing
    is written (as in daisy 2.0.0).
    """
    global _BASEDIR
    _BASEDIR = None if path is None else Path(os.fspath(path))


def get_tracking_basedir() -> Path | None:
    """The global block-tracking base directory, or None if unset."""
    return _BASEDIR


def set_done_marker_basedir(path) -> None:
    """Deprecated alias for :func:`set_tracking_basedir`."""
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
        "get_done_marker_basedir() is deprecated; use get_tracking_basedir().",
        DeprecationWarning,
        stacklevel=2,
    )
    return get_tracking_basedir()


def resolve_tracking_path(task_id: str, tracking_path) -> Path | None:
    """Where a task's tracking store lives, or None if tracking is off.

    ``False`` -> None; a str/Path -> that path; ``None`` -> ``<basedir>/<task_id>``
    when a basedir is set, else None. ``True`` raises ``TypeError``.
    """
    if tracking_path is True:
        raise TypeError(
            "tracking_path=True is not a valid value; use None (auto), "
            "False (disabled), or a str/Path"
        )
    if tracking_path is False:
        return None
    if tracking_path is None:
        base = _BASEDIR
        return None if base is None else base / str(task_id)
    if isinstance(tracking_path, (str, os.PathLike)):
        return Path(os.fspath(tracking_path))
    raise TypeError(
        f"tracking_path must be None, False, or a str/Path, got {type(tracking_path).__name__}"
    )


def reset(path) -> str | None:
    """Delete a tracking store directory (``Task.reset()``).

    Returns the path as a string, or None if ``path`` is None or nothing exists.
    """
    if path is None:
        return None
    p = Path(os.fspath(path))
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


# ---------------------------------------------------------------------------
# low-level file helpers
# ---------------------------------------------------------------------------


def _json_bytes(doc: dict) -> bytes:
    # serde_json pretty printer, sorted keys, plus a trailing newline (as daisy 2.0.0)
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _array_metadata(shape: tuple[int, ...], dtype: np.dtype) -> dict:
    return {
        "attributes": {},
        "chunk_grid": {"configuration": {"chunk_shape": list(shape)}, "name": "regular"},
        "chunk_key_encoding": {"configuration": {"separator": "/"}, "name": "default"},
        "codecs": [{"configuration": {"endian": "little"}, "name": "bytes"}],
        "data_type": _ZARR_DTYPE_NAMES[np.dtype(dtype)],
        "fill_value": 0,
        "node_type": "array",
        "shape": list(shape),
        "storage_transformers": [],
        "zarr_format": 3,
    }


def _group_metadata(hash_: str) -> dict:
    return {"attributes": {HASH_ATTRIBUTE: hash_}, "node_type": "group", "zarr_format": 3}


def _fsync_dir(d: Path) -> None:
    if os.name == "nt":  # pragma: no cover
        return
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _atomic_write(target: Path, writer, *, durable: bool = True) -> None:
    """Write ``target`` via a temp file in its directory + ``os.replace``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}{_TMP_MARK}{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            writer(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(target.parent)


def _write_json(target: Path, doc: dict) -> None:
    data = _json_bytes(doc)
    _atomic_write(target, lambda f: f.write(data))


_SPARSE_MIN_BYTES = 4 << 20  # arrays at least this big are written sparsely
_SPARSE_SEGMENT = 1 << 20  # ... skipping all-zero 1 MiB segments (holes read as 0)


def _write_array(f, arr: np.ndarray) -> None:
    a = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    if not a.size:
        return
    raw = a.view(np.uint8).reshape(-1)
    n = raw.size
    if n < _SPARSE_MIN_BYTES:
        f.write(memoryview(raw))
        return
    # Big tracking arrays are mostly zeros (failures always, done early in a
    # run): leave holes for all-zero segments, which saves both the write and
    # the disk space. Scanning for zeros is ~10x cheaper than writing them.
    seg = _SPARSE_SEGMENT
    nfull = n // seg
    if nfull:
        nonzero = raw[: nfull * seg].view(np.uint64).reshape(nfull, seg // 8).any(axis=1)
    else:  # pragma: no cover - n >= _SPARSE_MIN_BYTES > seg
        nonzero = np.zeros(0, bool)
    i = 0
    while i < nfull:
        if not nonzero[i]:
            i += 1
            continue
        j = i
        while j < nfull and nonzero[j]:
            j += 1
        f.seek(i * seg)
        f.write(memoryview(raw[i * seg : j * seg]))
        i = j
    tail = raw[nfull * seg :]
    if tail.size and tail.any():
        f.seek(nfull * seg)
        f.write(memoryview(tail))
    f.truncate(n)


def _write_zeros(f, nbytes: int) -> None:
    f.truncate(nbytes)  # sparse, reads back as zeros


def _chunk_path(array_dir: Path, ndim: int) -> Path:
    return array_dir.joinpath("c", *(["0"] * ndim))


def _read_json(p: Path) -> dict:
    with open(p, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def _pid_alive(pid_text: str) -> bool:
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # ours: no flush is running while we open
    if os.name == "nt":  # pragma: no cover - os.kill(pid, 0) would terminate it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale_tmp(array_dir: Path) -> None:
    try:
        for p in list(array_dir.rglob(f"*{_TMP_MARK}*")):
            if _pid_alive(p.name.rpartition(_TMP_MARK)[2]):
                continue  # another live process may be mid-flush
            try:
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                elif p.exists():
                    p.unlink()
            except OSError:
                pass
    except OSError:
        pass


def _is_canonical(meta: dict, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether an array's metadata is the raw single-chunk layout we can map."""
    try:
        if meta.get("data_type") != _ZARR_DTYPE_NAMES[dtype]:
            return False
        if tuple(meta["chunk_grid"]["configuration"]["chunk_shape"]) != shape:
            return False
        if meta["chunk_grid"].get("name") != "regular":
            return False
        cke = meta.get("chunk_key_encoding", {})
        if cke.get("name") != "default":
            return False
        if cke.get("configuration", {}).get("separator", "/") != "/":
            return False
        codecs = meta.get("codecs", [])
        if len(codecs) != 1 or codecs[0].get("name") != "bytes":
            return False
        endian = (codecs[0].get("configuration") or {}).get("endian")
        if dtype.itemsize > 1 and endian not in (None, "little"):
            return False
        if meta.get("storage_transformers"):
            return False
        fill = meta.get("fill_value", 0)
        return fill in (0, None)
    except (KeyError, TypeError, AttributeError):
        return False


def _map_chunk(chunk: Path, shape: tuple[int, ...], dtype: np.dtype, mode: str):
    """Map (or read) a raw chunk; a missing chunk means all fill (zeros)."""
    n = math.prod(shape)
    nbytes = n * dtype.itemsize
    try:
        size = chunk.stat().st_size
    except FileNotFoundError:
        size = None
    if size is None or nbytes == 0:
        if mode == "r":
            return np.zeros(shape, dtype)
        return None
    if size != nbytes:
        # daisy 2.0.0 silently resizes a chunk of the wrong size (zero-extended
        # or truncated); do the same, without touching the file when read-only
        raw = np.fromfile(chunk, dtype=np.uint8, count=min(size, nbytes))
        fixed = np.zeros(nbytes, np.uint8)
        fixed[: raw.size] = raw
        if mode == "r":
            return fixed.view(dtype).reshape(shape)
        _atomic_write(chunk, lambda f: f.write(memoryview(fixed)))
    if os.name == "nt":  # pragma: no cover - os.replace over a mapped file fails there
        return np.fromfile(chunk, dtype=dtype).reshape(shape)
    return np.memmap(chunk, dtype=dtype, mode=mode, shape=shape, order="C")


def _read_via_zarr(array_dir: Path) -> np.ndarray:
    import zarr  # only for non-canonical (e.g. compressed) caller-provided arrays

    return np.asarray(zarr.open_array(store=str(array_dir), mode="r")[...])


# ---------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------


class _TrackedArray:
    """One array of the group: metadata + chunk + in-memory (COW-mapped) data."""

    __slots__ = ("name", "dir", "dtype", "shape", "chunk", "data", "flat", "dirty", "rewrite_meta")

    def __init__(self, root: Path, name: str, dtype: np.dtype, shape: tuple[int, ...]):
        self.name = name
        self.dir = root / name
        self.dtype = dtype
        self.shape = shape
        self.chunk = _chunk_path(self.dir, len(shape))
        self.data: np.ndarray | None = None
        self.flat: np.ndarray | None = None
        self.dirty = False
        self.rewrite_meta = False

    def load(self, path: Path) -> None:
        meta_path = self.dir / "zarr.json"
        _remove_stale_tmp(self.dir)
        if not meta_path.exists():
            # absent (fresh store, or a caller-provided group without it)
            self._create()
            return
        meta = _read_json(meta_path)
        if meta.get("node_type") != "array":
            raise RuntimeError(
                f"block tracking metadata at {meta_path} is invalid: "
                f"{self.name!r} is not a zarr array (node_type = {meta.get('node_type')!r})"
            )
        stored = tuple(meta.get("shape", ()))
        if stored != self.shape:
            raise RuntimeError(
                f"block tracking metadata at {path} is invalid: array {self.name!r} has "
                f"shape {list(stored)}, expected the task's block-grid shape "
                f"{list(self.shape)}. Delete it to start fresh:\n    rm -rf {path}"
            )
        if _is_canonical(meta, self.shape, self.dtype):
            data = _map_chunk(self.chunk, self.shape, self.dtype, "c")
            if data is None:
                self._create_chunk()
                data = _map_chunk(self.chunk, self.shape, self.dtype, "c")
        else:
            data = _read_via_zarr(self.dir).astype(self.dtype, copy=False)
            data = np.ascontiguousarray(data)
            self.rewrite_meta = True
            self.dirty = True
        self._set(data)

    def _create(self) -> None:
        self._create_chunk()
        _write_json(self.dir / "zarr.json", _array_metadata(self.shape, self.dtype))
        self._set(_map_chunk(self.chunk, self.shape, self.dtype, "c"))

    def _create_chunk(self) -> None:
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        _atomic_write(self.chunk, lambda f: _write_zeros(f, nbytes))

    def _set(self, data) -> None:
        if data is None:  # zero-size (cannot happen: grid >= 1 per axis)
            data = np.zeros(self.shape, self.dtype)
        arr = data.view(np.ndarray) if isinstance(data, np.memmap) else data
        self.data = arr
        self.flat = arr.reshape(-1)  # a view: C-contiguous

    def flush(self, durable: bool) -> bool:
        if not self.dirty:
            return False
        data = self.data
        if self.rewrite_meta:
            # Replace a foreign layout (e.g. compressed) by the canonical one.
            # Write the raw chunk aside first so that the window in which the
            # old metadata meets the new chunk is just a rmtree + rename.
            staged = self.dir / f".c{_TMP_MARK}{os.getpid()}"
            shutil.rmtree(staged, ignore_errors=True)
            _atomic_write(_chunk_path(staged, len(self.shape)), lambda f: _write_array(f, data),
                          durable=durable)
            shutil.rmtree(self.dir / "c", ignore_errors=True)
            os.replace(staged / "c", self.dir / "c")
            shutil.rmtree(staged, ignore_errors=True)
            _write_json(self.dir / "zarr.json", _array_metadata(self.shape, self.dtype))
            self.rewrite_meta = False
        else:
            _atomic_write(self.chunk, lambda f: _write_array(f, data), durable=durable)
        self.dirty = False
        return True


class TrackingStore:
    """A task's block-tracking group (daisy 2.0.0 layout), held in memory.

    Use :meth:`open`. ``done`` (uint8) and ``failures`` (uint32) are writable
    C-order arrays of shape :attr:`grid_shape`; index blocks by their C-order
    linear grid index (see :func:`grid_linear_indices`). Changes are written by
    :meth:`flush` (cheap when nothing changed) and :meth:`close`.
    If you write into ``done``/``failures`` directly, call :meth:`mark_dirty`.
    """

    def __init__(self, path: Path, grid: tuple[int, ...], hash_: str, durable: bool = True):
        self.path = Path(path)
        self.grid_shape = tuple(grid)
        self.task_hash = hash_
        self.durable = durable
        self._done = _TrackedArray(self.path, DONE_ARRAY, _DONE_DTYPE, self.grid_shape)
        self._failures = _TrackedArray(self.path, FAILURES_ARRAY, _FAILURES_DTYPE, self.grid_shape)
        self._closed = False
        self._last_flush_end = 0.0
        self._last_flush_secs = 0.0

    # -- construction -------------------------------------------------------

    @classmethod
    def open(
        cls,
        path,
        total_roi,
        read_roi,
        write_roi,
        fit="valid",
        *,
        require_hash: bool = False,
        durable: bool = True,
    ) -> "TrackingStore":
        """Open the tracking group at ``path``, creating it if absent.

        Raises ``RuntimeError`` if it exists but was written for a different
        task layout (stored ``daisy_task_hash`` differs), has an array of the
        wrong grid shape, or is not a zarr group.

        A group *without* a hash attribute is accepted as a caller-provided
        store, as daisy 2.0.0 does (its arrays are then shape-checked and
        missing ones created; the hash is not added). ``require_hash=True``
        rejects it instead. ``durable=False`` skips fsync (tests, scratch runs).
        """
        p = Path(os.fspath(path))
        h = task_hash(total_roi, read_roi, write_roi, fit)
        grid = grid_shape(total_roi, write_roi)
        store = cls(p, grid, h, durable=durable)
        group_json = p / "zarr.json"
        if group_json.exists():
            try:
                meta = _read_json(group_json)
            except (OSError, ValueError) as e:
                raise RuntimeError(f"cannot open block tracking at {p}: {e}") from e
            if meta.get("node_type") != "group":
                raise RuntimeError(
                    f"tracking path {p} exists but is not a zarr group (node_type = "
                    f"{meta.get('node_type')!r}). A caller-provided tracking store must be a "
                    "zarr v3 group containing a `done` array of the task's block-grid shape; "
                    "either build it that way or delete the path so daisy can create it."
                )
            stored = (meta.get("attributes") or {}).get(HASH_ATTRIBUTE)
            if stored != h and (stored is not None or require_hash):
                raise RuntimeError(
                    f"block tracking at {p} was written for a different task layout "
                    f"(stored hash = {stored if stored is not None else '<missing>'}, "
                    f"expected = {h}). Delete it to start fresh:\n    rm -rf {p}"
                )
            store._done.load(p)
            store._failures.load(p)
        else:
            if p.exists() and not p.is_dir():
                raise RuntimeError(f"cannot open block tracking at {p}: not a directory")
            p.mkdir(parents=True, exist_ok=True)
            # arrays first, group document last: a directory without the group
            # document is treated as fresh on the next open
            store._done.load(p)
            store._failures.load(p)
            _write_json(group_json, _group_metadata(h))
        return store

    # -- arrays ---------------------------------------------------------------

    @property
    def done(self) -> np.ndarray:
        return self._done.data

    @property
    def failures(self) -> np.ndarray:
        return self._failures.data

    @property
    def size(self) -> int:
        return math.prod(self.grid_shape)

    @property
    def dirty(self) -> bool:
        return self._done.dirty or self._failures.dirty

    def mark_dirty(self, done: bool = True, failures: bool = True) -> None:
        """Declare direct writes into ``done``/``failures`` so flush writes them."""
        self._done.dirty |= bool(done)
        self._failures.dirty |= bool(failures)

    def _idx(self, linear_indices) -> np.ndarray:
        """1-D int64 indices, dropping out-of-grid ones (-1 etc., CORE.md 7.1)."""
        idx = np.asarray(linear_indices, dtype=np.int64).reshape(-1)
        n = self._done.flat.size
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            idx = idx[(idx >= 0) & (idx < n)]
        return idx

    def mark_done(self, linear_indices) -> None:
        """Set the done byte of the given C-order linear grid indices to 1.

        Out-of-grid indices (negative or >= the grid size) are ignored.
        """
        idx = self._idx(linear_indices)
        if idx.size == 0:
            return
        flat = self._done.flat
        if idx.size == 1:
            i = int(idx[0])
            if flat[i] != 1:
                flat[i] = 1
                self._done.dirty = True
            return
        if not np.all(flat[idx] == 1):
            flat[idx] = 1
            self._done.dirty = True

    def add_failures(self, linear_indices, counts=1) -> None:
        """Add ``counts`` (default 1) failed attempts to the given blocks.

        Repeated indices accumulate; out-of-grid indices are ignored.
        """
        raw = np.asarray(linear_indices, dtype=np.int64).reshape(-1)
        idx = self._idx(raw)
        if idx.size == 0:
            return
        flat = self._failures.flat
        if np.ndim(counts) == 0:
            c = int(counts)
            if c == 0:
                return
            if idx.size == 1:
                i = int(idx[0])
                flat[i] = min(int(flat[i]) + c, 0xFFFFFFFF)
            else:
                np.add.at(flat, idx, np.uint32(c))
        else:
            cnt = np.broadcast_to(np.asarray(counts, dtype=np.uint32).reshape(-1), raw.shape)
            if idx.size != raw.size:
                cnt = cnt[(raw >= 0) & (raw < flat.size)]
            np.add.at(flat, idx, cnt)
        self._failures.dirty = True

    def is_done(self, linear_indices) -> np.ndarray:
        """Bool array (same shape as the input): whether each block is recorded done.

        Out-of-grid indices report False.
        """
        idx = np.asarray(linear_indices, dtype=np.int64)
        flat = self._done.flat
        ok = (idx >= 0) & (idx < flat.size)
        if np.all(ok):
            return flat[idx] != 0
        out = np.zeros(idx.shape, dtype=bool)
        out[ok] = flat[idx[ok]] != 0
        return out

    def failed_blocks_mask(self) -> np.ndarray:
        """Bool grid: blocks with failures > 0 that are not done."""
        return (self._failures.data > 0) & (self._done.data == 0)

    # -- persistence ------------------------------------------------------------

    def flush(self) -> bool:
        """Durably write the arrays changed since the last flush.

        Each changed chunk is written in one go to a temp file next to it and
        moved over it with ``os.replace``. Returns False (and does nothing) if
        nothing changed.
        """
        if self._closed or not self.dirty:
            return False
        t0 = time.perf_counter()
        wrote = self._done.flush(self.durable)
        wrote |= self._failures.flush(self.durable)
        t1 = time.perf_counter()
        self._last_flush_secs = t1 - t0
        self._last_flush_end = t1
        return wrote

    def maybe_flush(self, min_interval: float = 1.0, max_overhead: float = 0.1) -> bool:
        """Flush if dirty and due, keeping flush time to ``max_overhead`` of wall time.

        For huge grids a flush rewrites whole chunks (1 byte/block for ``done``);
        this spaces flushes at least ``min_interval`` seconds apart and at least
        ``last_flush_duration / max_overhead`` apart.
        """
        if self._closed or not self.dirty:
            return False
        wait = max(min_interval, self._last_flush_secs / max(max_overhead, 1e-9))
        if time.perf_counter() - self._last_flush_end < wait:
            return False
        return self.flush()

    def close(self) -> None:
        """Flush and release the store (idempotent)."""
        if self._closed:
            return
        self.flush()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "TrackingStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrackingStore({str(self.path)!r}, grid_shape={list(self.grid_shape)})"


# ---------------------------------------------------------------------------
# read-only inspection
# ---------------------------------------------------------------------------


def read_tracking(path) -> dict[str, Any]:
    """Inspect a tracking store without loading it.

    Returns ``{"path", "task_hash", "grid_shape", "done", "failures", "arrays"}``
    where ``done``/``failures`` are read-only ``np.memmap`` views of the raw
    chunks (zeros if the chunk does not exist yet, a lazy ``zarr.Array`` for a
    non-canonical layout, None if the array is absent) and ``arrays`` lists
    every array in the group. Raises ``FileNotFoundError`` if ``path`` holds no
    tracking group.
    """
    p = Path(os.fspath(path))
    group_json = p / "zarr.json"
    if not group_json.exists():
        raise FileNotFoundError(f"no block tracking at {p} (missing {group_json})")
    meta = _read_json(group_json)
    if meta.get("node_type") != "group":
        raise RuntimeError(f"tracking path {p} is not a zarr group")
    out: dict[str, Any] = {
        "path": p,
        "task_hash": (meta.get("attributes") or {}).get(HASH_ATTRIBUTE),
        "grid_shape": None,
        "done": None,
        "failures": None,
        "arrays": sorted(
            c.name for c in p.iterdir() if c.is_dir() and (c / "zarr.json").exists()
        ),
    }
    for name, dtype in ((DONE_ARRAY, _DONE_DTYPE), (FAILURES_ARRAY, _FAILURES_DTYPE)):
        array_json = p / name / "zarr.json"
        if not array_json.exists():
            continue
        ameta = _read_json(array_json)
        shape = tuple(int(v) for v in ameta.get("shape", ()))
        if out["grid_shape"] is None:
            out["grid_shape"] = shape
        if _is_canonical(ameta, shape, dtype):
            out[name] = _map_chunk(_chunk_path(p / name, len(shape)), shape, dtype, "r")
        else:
            import zarr

            out[name] = zarr.open_array(store=str(p / name), mode="r")
    return out
