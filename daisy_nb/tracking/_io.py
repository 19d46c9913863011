"""How tracking writes reach the disk: the file system, the write path, errors, conversion.

Two write paths for a tracking chunk (see :mod:`daisy_nb.tracking._store`):

* ``mmap``: the chunk is mapped ``MAP_SHARED`` and a mark is a store into the map.
  Safe only where the file's blocks, once reserved with ``posix_fallocate``, are
  overwritten in place: ext2/3/4, XFS (after unsharing reflinked extents, see
  :func:`unshare`) and tmpfs. Elsewhere a write-back can need new blocks (btrfs,
  ZFS, overlayfs's copy-up, F2FS) or fail on a server (NFS, Lustre, GPFS, CIFS,
  ceph, FUSE), and a failed write-back of a mapped page is a SIGBUS or a lost page.
* ``pwrite``: the arrays live in process memory; each mark is also written with
  ``os.pwrite`` at once (one call per page touched), so a SIGKILL of the process
  keeps it (the page cache belongs to the file), and a flush is ``fdatasync``.
  Every error is an ``OSError`` at the call that meets it.

:func:`io_mode` picks one from ``statfs(2)``'s ``f_type`` (read through ctypes:
``os.statvfs`` does not report the type; ``/proc/self/mountinfo`` would need the
path resolved to its mount, bind mounts and escaped names handled). Unknown file
systems and other systems than Linux take ``pwrite``. ``DAISY_NB_TRACKING_IO``
(``auto``, ``mmap`` or ``pwrite``) forces a path.

:func:`convert_array` replaces a caller-provided (foreign, e.g. compressed) array
by the raw layout crash-safely: built beside, swapped in by an atomic exchange
(``renameat2(RENAME_EXCHANGE)``) or two renames, a leftover finished or rolled
back by :func:`recover_conversion` on the next open.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from daisy_nb import config

ENV_IO = config.TRACKING_IO.name
IO_MODES = ("auto", "mmap", "pwrite")

# statfs(2) f_type magic numbers (linux/magic.h and the file systems' sources)
_EXT = 0xEF53  # ext2, ext3, ext4
_XFS = 0x58465342
_TMPFS = 0x01021994
FS_NAMES = {
    _EXT: "ext4",
    _XFS: "xfs",
    _TMPFS: "tmpfs",
    0x9123683E: "btrfs",
    0x2FC12FC1: "zfs",
    0x6969: "nfs",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x65735546: "fuse",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x00C36400: "ceph",
    0x794C7630: "overlayfs",
    0xF2F52010: "f2fs",
    0x858458F6: "ramfs",
}
# where a write into reserved (fallocate-d) blocks is an overwrite in place
_IN_PLACE = {_EXT, _XFS, _TMPFS}

_libc: ctypes.CDLL | None | bool = False  # False: not loaded yet; None: not available


def _lib() -> ctypes.CDLL | None:
    global _libc
    if _libc is False:
        try:
            # the process's own symbols, the C library's among them: not ctypes.util.find_library,
            # which runs ldconfig (a subprocess of the scheduler) and stays imported
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:  # pragma: no cover - no C library to load
            _libc = None
    return _libc  # type: ignore[return-value]


def fs_type(path) -> int | None:
    """``statfs(2)``'s ``f_type`` of the file system holding ``path`` (Linux), else None."""
    lib = _lib() if sys.platform.startswith("linux") else None
    if lib is None or not hasattr(lib, "statfs"):
        return None
    buf = ctypes.create_string_buffer(512)  # struct statfs is 120 bytes on 64-bit Linux
    if lib.statfs(os.fsencode(os.fspath(path)), buf) != 0:
        return None
    # f_type is the first member, a __fsword_t (a C long on every Linux ABI)
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def fs_name(ftype: int | None) -> str:
    if ftype is None:
        return "unknown"
    return FS_NAMES.get(ftype, f"0x{ftype:08x}")


def requested_mode() -> str:
    """The ``DAISY_NB_TRACKING_IO`` setting (``auto`` when unset)."""
    return config.TRACKING_IO.get()


def io_mode(path) -> tuple[str, int | None]:
    """``("mmap" | "pwrite", f_type)`` for a chunk file at ``path`` (``auto`` resolved)."""
    want = requested_mode()
    ftype = fs_type(path)
    if want != "auto":
        return want, ftype
    return ("mmap" if ftype in _IN_PLACE else "pwrite"), ftype


_FALLOC_FL_UNSHARE_RANGE = 0x40


def unshare(fd: int, length: int) -> bool:
    """Give a file on XFS private copies of its reflinked (shared) extents.

    A file copied with ``cp --reflink`` (coreutils' default since 9.0) shares blocks
    with the copy; a write into a shared block is copy-on-write, which a full disk
    fails at write-back. ``fallocate(FALLOC_FL_UNSHARE_RANGE)`` copies them now (an
    ``OSError(ENOSPC)`` on a full disk) and is a no-op for a file sharing nothing.
    Returns False where the call is not available (the caller then writes with
    ``pwrite``).
    """
    lib = _lib()
    fn = getattr(lib, "fallocate64", None) or getattr(lib, "fallocate", None) if lib else None
    if fn is None or length <= 0:
        return length <= 0
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    if fn(fd, _FALLOC_FL_UNSHARE_RANGE, 0, length) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
        raise OSError(e, os.strerror(e))
    return False


class TrackingWriteError(OSError):
    """Block tracking could not write its marks (a full disk, an I/O or server error).

    An ``OSError`` with the ``errno`` of the failed call and ``filename`` = the
    tracking chunk. The marks written before it are on disk; a rerun after the cause
    is fixed skips them.
    """

    __module__ = "daisy_nb.tracking"

    def __str__(self) -> str:
        return (
            f"block tracking at {self.filename}: cannot record block states "
            f"({self.strerror or 'error'}, errno {self.errno}). The run was stopped; the blocks "
            "recorded before this are kept: free space (or fix the file system) and rerun to "
            "resume from them."
        )


# -- the pwrite path -----------------------------------------------------------


def pwrite_all(fd: int, buf, offset: int) -> None:
    """``os.pwrite`` all of ``buf`` (a contiguous array or bytes) at ``offset``."""
    mv = memoryview(buf).cast("B")
    while mv.nbytes:
        n = os.pwrite(fd, mv, offset)
        if n <= 0:  # pragma: no cover - a regular file never writes 0 bytes
            raise OSError(errno.EIO, "short write")
        mv = mv[n:]
        offset += n


def read_sparse(fd: int, out) -> None:
    """Read a file into ``out`` (a zeroed uint8 array of its size), skipping its holes.

    Holes read as zeros, which ``out`` holds already (untouched pages of ``np.zeros``
    cost no memory: a mostly-zero ``failures`` chunk of 400 MB stays small).
    """
    mv = memoryview(out).cast("B")
    n = mv.nbytes
    pos = 0
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    while pos < n:
        start, end = pos, n
        if seek_data is not None and seek_hole is not None:
            try:
                start = os.lseek(fd, pos, seek_data)
                end = min(os.lseek(fd, start, seek_hole), n)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after pos
                    return
                seek_data = seek_hole = None  # a file system without them: read it all
                start, end = pos, n
        while start < end:
            piece = mv[start : min(end, start + (64 << 20))]
            if hasattr(os, "preadv"):
                got = os.preadv(fd, [piece], start)
            else:  # pragma: no cover - macOS < 11
                data = os.pread(fd, piece.nbytes, start)
                got = len(data)
                piece[:got] = data
            if got <= 0:  # the file is shorter than the array: the rest stays zero
                return
            start += got
        pos = end


def pages_to_write(fd: int, raw, page: int) -> list[int]:
    """Pages of ``raw`` (the array's bytes) that may differ from the file: every page
    holding a non-zero byte or lying in the file's data (not in a hole).

    They are written one page per ``pwrite``: a larger write would put them in large
    page-cache folios, and a later one-byte change would dirty a whole folio.
    """
    n = raw.size
    npages = -(-n // page)
    full = n // page
    need = np.zeros(npages, bool)
    if full:
        need[:full] = raw[: full * page].reshape(full, page).any(axis=1)
    if npages > full:
        need[full] = raw[full * page :].any()
    seek_data = getattr(os, "SEEK_DATA", None)
    pos = 0
    while pos < n:
        try:
            if seek_data is None:
                raise OSError(errno.EINVAL, "no SEEK_DATA")
            start = os.lseek(fd, pos, seek_data)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), n)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            start, end = pos, n  # cannot tell the holes: all of it
        need[start // page : -(-end // page)] = True
        pos = end
    return np.flatnonzero(need).tolist()


# -- crash-safe conversion of a foreign array ------------------------------------

_NEW = ".daisy_nb-new"
_OLD = ".daisy_nb-old"

#: Tests set this to a callable; it is called with the name of each step of
#: :func:`convert_array` (``"chunk"``, ``"built"``, ``"swapped"``, ``"moved-old"``,
#: ``"moved-new"``, ``"cleaned"``), e.g. to SIGKILL the process there.
STEP_HOOK: Callable[[str], None] | None = None
#: False: never use the atomic exchange (tests of the two-rename path).
USE_EXCHANGE = True


def step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the paths ``a`` and ``b`` (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    lib = _lib() if USE_EXCHANGE and sys.platform.startswith("linux") else None
    fn = getattr(lib, "renameat2", None) if lib is not None else None
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
        return False  # a file system without the exchange: two renames
    raise OSError(e, os.strerror(e), str(a))


def side_paths(root: Path, name: str) -> tuple[Path, Path]:
    """Where :func:`convert_array` builds the new array and parks the old one."""
    return root / f".{name}{_NEW}", root / f".{name}{_OLD}"


def convert_array(root: Path, name: str, build: Callable[[Path], None], fsync_dir: Callable[[Path], None]) -> None:
    """Replace the array directory ``root/name`` by the one ``build(dir)`` makes.

    ``build`` writes a complete array (chunk first, ``zarr.json`` last) into an empty
    directory beside it. At every instant either the old array or the new one is
    complete, at ``root/name`` or, for the instant between two renames, at a side
    path :func:`recover_conversion` knows.
    """
    dst = root / name
    new, old = side_paths(root, name)
    shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    build(new)
    step("built")
    fsync_dir(root)
    if _exchange(new, dst):
        step("swapped")  # root/name is the new array, ``new`` holds the old one
        shutil.rmtree(new, ignore_errors=True)
    else:
        os.rename(dst, old)
        step("moved-old")
        os.rename(new, dst)
        step("moved-new")
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(root)
    step("cleaned")


def recover_conversion(root: Path, name: str, is_new: Callable[[Path], bool]) -> None:
    """Finish or roll back a conversion of ``root/name`` that a crash interrupted.

    ``is_new(dir)``: whether ``dir`` holds a complete array in the new (raw) layout.
    A complete new array beside an old one at ``root/name`` is swapped in (the marks
    it holds are a superset of the old ones); a half-built one is removed; an old
    array left beside the new one is removed; the old array parked by the first of
    two renames is put back if the new one is not complete.
    """
    dst = root / name
    new, old = side_paths(root, name)
    if not new.exists() and not old.exists():
        return
    have = (dst / "zarr.json").exists()
    if new.exists() and is_new(new) and not (have and is_new(dst)):
        # the build finished, the swap did not (or only its first rename)
        if have:
            if not _exchange(new, dst):
                os.rename(dst, old)
                os.rename(new, dst)
        else:
            os.rename(new, dst)
    elif not have and old.exists():
        if dst.exists():
            shutil.rmtree(dst)
        os.rename(old, dst)  # roll back
    shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
