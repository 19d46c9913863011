"""The tracking store: ``done`` and ``failures`` mapped shared onto their chunk files.

Each array of the group is one raw chunk file (see :mod:`daisy_nb.tracking`). It is
mapped with ``MAP_SHARED``: setting a done byte or a failure count writes straight
into the page cache of the file, so the record survives a SIGKILL of this process
the moment it is made (the kernel writes the page back), and a flush is one
``msync`` of the mapping, which writes only the pages that changed. A done byte
cannot tear; a failure count is an aligned 4-byte store.

That is the ``mmap`` path, taken where reserved blocks are overwritten in place
(ext4, XFS, tmpfs). On other file systems (copy-on-write, network, FUSE: a mapped
write-back there can fail late, as a SIGBUS) the arrays are held in memory and
every change is written at once with ``os.pwrite``, a flush being ``fdatasync``
(the ``pwrite`` path; :mod:`._io` picks the path, ``DAISY_NB_TRACKING_IO`` forces
one). A write error on either path is raised by the next :meth:`TrackingStore.flush`
as a :class:`~._io.TrackingWriteError` naming the chunk.

Files are created full-size once (sparse, written aside and renamed, like the
metadata documents, so a crash leaves no half-made store). ``done`` is then
allocated on disk (``posix_fallocate``) and each page of ``failures`` is allocated
before its first count, so a full disk is an ``OSError`` instead of a SIGBUS.

When a chunk file cannot be opened for writing (a read-only file, Windows) or
mapped, or when a caller-provided array is compressed, the array is held
privately instead and each flush rewrites the whole chunk aside + ``os.replace``
(the previous strategy); a foreign layout is replaced by the raw one at its first
flush (built beside and swapped in, :func:`._io.convert_array`) and mapped shared
(or held for pwrite) from then on.

What survives what: a SIGKILL (or any death) of this process keeps every mark
made (the page cache belongs to the file); a crash of the machine keeps the
marks up to the last flush (the runtimes flush about once a second). On NFS the
client's page cache is written to the server by the flush's ``msync`` (or the
kernel's own writeback), and other clients see the marks once they revalidate
(close-to-open), as with any NFS file. A second process that replaces a chunk
file (``os.replace``) while it is mapped here is not seen by this process.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._files import (
    _DONE_DTYPE,
    _FAILURES_DTYPE,
    DONE_ARRAY,
    FAILURES_ARRAY,
    _allocate,
    _array_metadata,
    _atomic_write,
    _chunk_path,
    _fsync_dir,
    _is_canonical,
    _map_chunk,
    _prepare_chunk,
    _read_json,
    _read_via_zarr,
    _remove_stale_tmp,
    _write_array,
    _write_json,
)
from ._grid import grid_shape, task_hash
from ._io import (
    _XFS,
    TrackingWriteError,
    convert_array,
    io_mode,
    pages_to_write,
    pwrite_all,
    read_sparse,
    recover_conversion,
    step,
    unshare,
)
from ._layout import layout_record
from ._open import load_group

#: Map chunks shared (the default). False holds every array privately and rewrites
#: whole chunks on flush, the fallback strategy; ``benchmarks/bench_tracking.py``
#: compares the two.
SHARED_MAPS = True

_PAGE = mmap.PAGESIZE
_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class _TrackedArray:
    """One array of the group: metadata + chunk + its data.

    ``io`` says how writes reach the chunk: ``"mmap"`` (mapped shared),
    ``"pwrite"`` (held in memory, each change written with ``os.pwrite``) or
    ``"private"`` (held in memory, the chunk rewritten whole at a flush).
    """

    __slots__ = (
        "allocate_all",
        "chunk",
        "data",
        "dir",
        "dirty",
        "dtype",
        "error",
        "fd",
        "flat",
        "fs",
        "io",
        "mm",
        "name",
        "pending",
        "reserved",
        "rewrite_meta",
        "shape",
        "whole",
    )

    def __init__(self, root: Path, name: str, dtype: np.dtype, shape: tuple[int, ...], allocate_all: bool):
        self.name = name
        self.dir = root / name
        self.dtype = dtype
        self.shape = shape
        self.chunk = _chunk_path(self.dir, len(shape))
        self.data: np.ndarray | None = None
        self.flat: np.ndarray | None = None
        self.dirty = False
        self.rewrite_meta = False
        self.io = "private"
        self.fs: int | None = None  # statfs f_type of the chunk's file system
        self.mm: mmap.mmap | None = None  # set while mapped shared
        self.fd: int | None = None  # kept open to reserve pages (failures) or to pwrite
        self.reserved: set[int] = set()  # pages of the chunk known to be allocated
        self.pending: set[int] = set()  # pages (pwrite) whose write failed: retried at flush
        self.error: OSError | None = None  # the first write error since the last flush
        self.whole = False  # pwrite: direct writes into the array (mark_dirty): write it all
        self.allocate_all = allocate_all

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def _is_raw(self, array_dir: Path) -> bool:
        """Whether ``array_dir`` holds a complete array of the raw layout (conversion's result)."""
        try:
            meta = _read_json(array_dir / "zarr.json")
            chunk = _chunk_path(array_dir, len(self.shape))
            return (
                tuple(meta.get("shape", ())) == self.shape
                and _is_canonical(meta, self.shape, self.dtype)
                and chunk.stat().st_size == self.nbytes
            )
        except (OSError, ValueError):
            return False

    def load(self, path: Path, durable: bool) -> None:
        meta_path = self.dir / "zarr.json"
        recover_conversion(path, self.name, self._is_raw)
        _remove_stale_tmp(self.dir)
        if not meta_path.exists():
            # absent (fresh store, or a caller-provided group without it): chunk
            # first, metadata last, so a crash in between leaves no array document
            _prepare_chunk(self.chunk, self.nbytes, durable=durable)
            _write_json(self.dir / "zarr.json", _array_metadata(self.shape, self.dtype))
            self._map()
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
            _prepare_chunk(self.chunk, self.nbytes, durable=durable)
            self._map()
        else:
            data = _read_via_zarr(self.dir).astype(self.dtype, copy=False)
            self._set(np.ascontiguousarray(data))
            self.rewrite_meta = True
            self.dirty = True

    def _map(self) -> None:
        """Map the chunk shared, or hold it for pwrite, or privately if it cannot be written."""
        if SHARED_MAPS and os.name != "nt":
            try:
                fd = os.open(self.chunk, os.O_RDWR)
            except OSError:  # read-only file or file system: the private fallback
                fd = None
            if fd is not None:
                try:
                    how, self.fs = io_mode(self.chunk)
                    if how == "mmap" and self.fs == _XFS and not unshare(fd, self.nbytes):
                        how = "pwrite"  # reflinked blocks cannot be unshared: copy-on-write
                    if how == "pwrite":
                        self._hold(fd)
                        return
                    if self._map_shared(fd):
                        return
                except OSError as e:
                    os.close(fd)
                    if e.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise RuntimeError(f"no disk space for block tracking at {self.chunk}: {e}") from e
                    if self.io == "pwrite":
                        raise
                except BaseException:
                    os.close(fd)
                    raise
        self.io = "private"
        self._set(_map_chunk(self.chunk, self.shape, self.dtype, "c"))

    def _map_shared(self, fd: int) -> bool:
        st = os.fstat(fd)
        # pages of a chunk with nothing on disk cost no read: fault them in one
        # by one (see below); a chunk with data is read ahead (a resumed run's
        # scan of 10^8 done bytes: ~0.1 s instead of ~2 s of 4 KiB reads)
        one_by_one = st.st_blocks == 0 or not self.allocate_all
        if self.allocate_all and st.st_blocks * 512 < st.st_size:
            _allocate(fd, 0, self.nbytes)
        try:
            mm = mmap.mmap(fd, self.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            os.close(fd)
            return False  # a file system without shared writable maps
        if one_by_one and hasattr(mmap, "MADV_RANDOM"):
            # No readahead on faults: pages come in one by one as small page-cache
            # folios, so a changed byte dirties (and a flush writes) one 4 KiB
            # page; pages read ahead may sit in large folios (up to 2 MiB on
            # Linux >= 6.x file systems), which are written whole.
            mm.madvise(mmap.MADV_RANDOM)
        self.mm = mm
        self.io = "mmap"
        if self.allocate_all:
            os.close(fd)
        else:
            self.fd = fd
        self.reserved.clear()
        self._set(np.frombuffer(mm, dtype=self.dtype).reshape(self.shape))
        return True

    def _hold(self, fd: int) -> None:
        """The pwrite path: read the chunk into memory, keep ``fd`` to write changes."""
        self.io = "pwrite"
        if self.allocate_all:
            # reserve done's blocks now: a full disk refuses the run before it starts
            # (where blocks are overwritten in place, no later write needs space)
            st = os.fstat(fd)
            if st.st_blocks * 512 < st.st_size:
                _allocate(fd, 0, self.nbytes)
        if hasattr(os, "posix_fadvise"):
            # no readahead: the pages read come in as 4 KiB page-cache folios, so a
            # changed byte dirties (and write-back writes) one page, not a 2 MiB folio
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        raw = np.zeros(self.nbytes, np.uint8)
        read_sparse(fd, raw)
        self.fd = fd
        self.pending.clear()
        self._set(raw.view(self.dtype).reshape(self.shape))

    def _set(self, data) -> None:
        arr = data.view(np.ndarray) if isinstance(data, np.memmap) else data
        self.data = arr
        self.flat = arr.reshape(-1)  # a view: C-contiguous

    def reserve(self, idx: np.ndarray) -> bool:
        """Allocate the pages holding elements ``idx`` before they are first written.

        Only for a shared, sparse array (``failures``). Returns False when the disk
        is full (the error is kept in :attr:`error`, for the next flush to raise).
        """
        if self.fd is None or self.io != "mmap":
            return True
        per_page = _PAGE // self.dtype.itemsize
        if idx.size == 1:
            pages = (int(idx[0]) // per_page,)
        else:
            pages = np.unique(idx // per_page).tolist()
        for page in pages:
            if page in self.reserved:
                continue
            try:
                _allocate(self.fd, page * _PAGE, min(_PAGE, self.nbytes - page * _PAGE))
            except OSError as e:
                self.error = self.error or e
                self.dirty = True
                return False
            self.reserved.add(page)
        return True

    def write_through(self, idx: np.ndarray) -> None:
        """pwrite path: write elements ``idx`` (just changed in memory) to the chunk.

        One ``os.pwrite`` per page touched (from its first to its last changed
        element). A failed write keeps its pages for the flush to retry and the
        error for it to raise.
        """
        fd = self.fd
        if fd is None or self.io != "pwrite":
            return
        flat, isz = self.flat, self.dtype.itemsize
        if idx.size == 1:
            spans = [(int(idx[0]), int(idx[0]))]
        else:
            u = np.unique(idx)
            pg = u // (_PAGE // isz)
            first = np.flatnonzero(np.concatenate(([True], pg[1:] != pg[:-1])))
            last = np.concatenate((first[1:], [u.size])) - 1
            spans = list(zip(u[first].tolist(), u[last].tolist()))
        for a, b in spans:
            try:
                pwrite_all(fd, flat[a : b + 1], a * isz)
            except OSError as e:
                self.error = self.error or e
                self.pending.update(range(a * isz // _PAGE, b * isz // _PAGE + 1))

    def _write_pending(self) -> None:
        fd = self.fd
        assert fd is not None
        raw = self.flat.view(np.uint8)
        if self.whole:  # direct writes into the array (mark_dirty): every page that may differ
            self.pending.update(pages_to_write(fd, raw, _PAGE))
            self.whole = False
        for page in sorted(self.pending):
            pwrite_all(fd, raw[page * _PAGE : (page + 1) * _PAGE], page * _PAGE)
            self.pending.discard(page)

    def flush(self, durable: bool) -> bool:
        if not self.dirty:
            return False
        if self.error is not None:
            e, self.error = self.error, None
            if self.io == "pwrite":
                self._write_pending()  # the space may be back: retry before reporting
            else:
                raise e
        if self.rewrite_meta:
            # Replace a foreign layout (e.g. compressed) by the canonical one, built
            # beside and swapped in (see _io.convert_array: no instant without a
            # complete array; a leftover is finished or rolled back on open).
            data = self.data
            shape, dtype = self.shape, self.dtype

            def build(d: Path) -> None:
                _atomic_write(_chunk_path(d, len(shape)), lambda f: _write_array(f, data), durable=durable)
                step("chunk")
                _write_json(d / "zarr.json", _array_metadata(shape, dtype))

            convert_array(self.dir.parent, self.name, build, _fsync_dir if durable else lambda d: None)
            self.rewrite_meta = False
            self._map()  # shared (or pwrite) from now on
        elif self.io == "mmap":
            if durable:
                self.mm.flush()  # msync(MS_SYNC): writes back the dirty pages only
        elif self.io == "pwrite":
            self._write_pending()
            if durable:
                _datasync(self.fd)  # reports write-back errors (NFS, a full disk)
        else:
            data = self.data
            _atomic_write(self.chunk, lambda f: _write_array(f, data), durable=durable)
        self.dirty = False
        return True

    def release(self) -> None:
        """Close the descriptor; the map itself goes with the last view of it."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class TrackingStore:
    """A task's block-tracking group (daisy 2.0.0 layout), mapped from its chunk files.

    Use :meth:`open`. ``done`` (uint8) and ``failures`` (uint32) are writable
    C-order arrays of shape :attr:`grid_shape`; index blocks by their C-order
    linear grid index (see :func:`grid_linear_indices`). Marks go straight into
    the shared file maps (they survive a SIGKILL of this process at once);
    :meth:`flush` makes them durable against a crash of the machine (``msync``
    of the changed pages; nothing when nothing changed) and :meth:`close`
    flushes a last time. If you write into ``done``/``failures`` directly, call
    :meth:`mark_dirty`.
    """

    def __init__(self, path: Path, grid: tuple[int, ...], hash_: str, durable: bool = True, layout=None):
        self.path = Path(path)
        self.layout: dict | None = layout  # the layout record (see _layout.layout_record)
        #: set when opening migrated the store from a smaller volume: ``{"kept", "had",
        #: "failures", "dropped_arrays", "growth"}`` (see :func:`._grow.migrate`)
        self.grown_from: dict | None = None
        self.grid_shape = tuple(grid)
        self.task_hash = hash_
        self.durable = durable
        # done: allocated on disk up front (1 byte/block); failures (4 bytes/block,
        # mostly zero) stays sparse and gets each page allocated before its first count
        self._done = _TrackedArray(self.path, DONE_ARRAY, _DONE_DTYPE, self.grid_shape, True)
        self._failures = _TrackedArray(self.path, FAILURES_ARRAY, _FAILURES_DTYPE, self.grid_shape, False)
        self._closed = False
        self._held_back: list[tuple[np.ndarray, Any]] = []  # failure counts without a reserved page
        self._reported = False  # a write error was raised by flush and not cleared since
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
        read_write_conflict=None,
        require_hash: bool = False,
        durable: bool = True,
    ) -> TrackingStore:
        """Open the tracking group at ``path``, creating it if absent.

        Raises ``RuntimeError`` if it exists but was written for a different
        task layout (stored ``daisy_task_hash`` differs), has an array of the
        wrong grid shape, or is not a zarr group.

        A group *without* a hash attribute is accepted as a caller-provided
        store, as daisy 2.0.0 does (its arrays are then shape-checked and
        missing ones created; the hash is not added). ``require_hash=True``
        rejects it instead. ``durable=False`` skips fsync (tests, scratch runs).

        The group also records the layout (:func:`._layout.layout_record`, with
        ``read_write_conflict``), beside the hash. A store written for a smaller
        volume on the same grid is migrated to this one, keeping the marks of the
        blocks that did not change (:mod:`._grow`; :attr:`grown_from` then says
        what was kept); any other layout change raises ``RuntimeError`` saying what
        changed and what to do.
        """
        p = Path(os.fspath(path))
        h = task_hash(total_roi, read_roi, write_roi, fit)
        grid = grid_shape(total_roi, write_roi)
        rec = layout_record(total_roi, read_roi, write_roi, fit, read_write_conflict)
        store = cls(p, grid, h, durable=durable, layout=rec)
        try:
            store._load(p, h, require_hash)
        except OSError as e:
            store._done.release()
            store._failures.release()
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise RuntimeError(f"no disk space for block tracking at {p}: {e}") from e
            raise
        except BaseException:
            store._done.release()
            store._failures.release()
            raise
        return store

    def _load(self, p: Path, h: str, require_hash: bool) -> None:
        """Check (or create) the group (:func:`._open.load_group`), then map its arrays."""

        def load_arrays() -> None:
            self._done.load(p, self.durable)
            self._failures.load(p, self.durable)

        self.grown_from = load_group(p, h, self.layout, require_hash, self.durable, load_arrays)

    # -- arrays ---------------------------------------------------------------

    @property
    def done(self) -> np.ndarray:
        return self._done.data

    @property
    def failures(self) -> np.ndarray:
        return self._failures.data

    @property
    def io(self) -> str:
        """How marks reach the ``done`` chunk: ``"mmap"``, ``"pwrite"`` or ``"private"``
        (see :mod:`daisy_nb.tracking._io`)."""
        return self._done.io

    @property
    def size(self) -> int:
        return math.prod(self.grid_shape)

    @property
    def dirty(self) -> bool:
        return self._done.dirty or self._failures.dirty

    def mark_dirty(self, done: bool = True, failures: bool = True) -> None:
        """Declare direct writes into ``done``/``failures`` so flush writes them."""
        for arr, flag in ((self._done, done), (self._failures, failures)):
            if flag:
                arr.dirty = True
                arr.whole = arr.io == "pwrite"

    def _idx(self, linear_indices) -> np.ndarray:
        """1-D int64 indices, dropping out-of-grid ones (-1 etc., docs/reference/tracking-format.md#grid)."""
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
                self._done.write_through(idx)
            return
        if not np.all(flat[idx] == 1):
            flat[idx] = 1
            self._done.dirty = True
            self._done.write_through(idx)

    def add_failures(self, linear_indices, counts=1) -> None:
        """Add ``counts`` (default 1) failed attempts to the given blocks.

        Repeated indices accumulate; out-of-grid indices are ignored. On a full disk
        (a page of the mapped ``failures`` chunk cannot be reserved) the counts are
        held back: the next :meth:`flush` retries them and raises if it cannot.
        """
        raw = np.asarray(linear_indices, dtype=np.int64).reshape(-1)
        idx = self._idx(raw)
        if idx.size == 0:
            return
        c: int | np.ndarray
        if np.ndim(counts) == 0:
            c = int(counts)
            if c == 0:
                return
        else:
            c = np.broadcast_to(np.asarray(counts, dtype=np.uint32).reshape(-1), raw.shape)
            if idx.size != raw.size:
                c = c[(raw >= 0) & (raw < self._failures.flat.size)]
        if not self._failures.reserve(idx):
            self._held_back.append((idx.copy(), c if isinstance(c, int) else np.array(c)))
            return
        self._add_failures(idx, c)

    def _add_failures(self, idx: np.ndarray, c) -> None:
        flat = self._failures.flat
        if isinstance(c, int):
            if idx.size == 1:
                i = int(idx[0])
                flat[i] = min(int(flat[i]) + c, 0xFFFFFFFF)
            else:
                np.add.at(flat, idx, np.uint32(c))
        else:
            np.add.at(flat, idx, c)
        self._failures.dirty = True
        self._failures.write_through(idx)

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

        A shared map is ``msync``-ed, which writes back only the pages that
        changed (without fsync when the store is not ``durable``: the page cache
        already holds the marks). A privately held array (read-only chunk file,
        foreign layout) is written whole to a temp file next to its chunk and moved
        over it with ``os.replace``. Returns False (and does nothing) if nothing
        changed.
        """
        if self._closed or not self.dirty:
            return False
        t0 = time.perf_counter()
        held, self._held_back = self._held_back, []
        for idx, c in held:  # failure counts a full disk held back: room for them now?
            if self._failures.reserve(idx):
                self._add_failures(idx, c)
            else:
                self._held_back.append((idx, c))
        wrote = False
        for arr in (self._done, self._failures):  # done first: the marks a rerun skips
            try:
                wrote |= arr.flush(self.durable)
            except OSError as e:
                if self._reported:
                    return False  # raised once already: the run is ending
                self._reported = True
                raise TrackingWriteError(e.errno or errno.EIO, e.strerror or str(e), str(arr.chunk)) from None
        self._reported = False
        t1 = time.perf_counter()
        self._last_flush_secs = t1 - t0
        self._last_flush_end = t1
        return wrote

    def maybe_flush(self, min_interval: float = 1.0, max_overhead: float = 0.1) -> bool:
        """Flush if dirty and due, keeping flush time to ``max_overhead`` of wall time.

        A privately held array is rewritten whole on flush (1 byte/block for
        ``done``); this spaces flushes at least ``min_interval`` seconds apart and at least
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
        try:
            self.flush()
        finally:
            self._closed = True
            self._done.release()
            self._failures.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> TrackingStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrackingStore({str(self.path)!r}, grid_shape={list(self.grid_shape)})"
