"""Low-level files of a tracking store: metadata documents, atomic writes, raw chunks.

No numba; zarr only for arrays whose layout is not the canonical raw one.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

HASH_ATTRIBUTE = "daisy_task_hash"
DONE_ARRAY = "done"
FAILURES_ARRAY = "failures"

_DONE_DTYPE = np.dtype("u1")
_FAILURES_DTYPE = np.dtype("<u4")
_ZARR_DTYPE_NAMES = {_DONE_DTYPE: "uint8", _FAILURES_DTYPE: "uint32"}
_TMP_MARK = ".daisy_nb-tmp-"


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


def _group_metadata(hash_: str, extra: dict | None = None) -> dict:
    attrs = {HASH_ATTRIBUTE: hash_}
    if extra:
        attrs.update(extra)
    return {"attributes": attrs, "node_type": "group", "zarr_format": 3}


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


def _resized(chunk: Path, size: int, nbytes: int) -> np.ndarray:
    """The ``size`` bytes of ``chunk`` zero-extended or truncated to ``nbytes`` (as daisy 2.0.0 resizes)."""
    raw = np.fromfile(chunk, dtype=np.uint8, count=min(size, nbytes))
    fixed = np.zeros(nbytes, np.uint8)
    fixed[: raw.size] = raw
    return fixed


def _map_chunk(chunk: Path, shape: tuple[int, ...], dtype: np.dtype, mode: str):
    """Map a raw chunk read-only (``"r"``) or copy-on-write (``"c"``).

    Read-only, a missing chunk means all fill (zeros) and one of the wrong size is
    read resized, the file left alone. Copy-on-write maps the chunk that
    :func:`_prepare_chunk` has just made exactly the array's size.
    """
    if mode == "r":
        nbytes = math.prod(shape) * dtype.itemsize
        try:
            size = chunk.stat().st_size
        except FileNotFoundError:
            return np.zeros(shape, dtype)
        if nbytes == 0:
            return np.zeros(shape, dtype)
        if size != nbytes:
            return _resized(chunk, size, nbytes).view(dtype).reshape(shape)
    if os.name == "nt":  # pragma: no cover - os.replace over a mapped file fails there
        return np.fromfile(chunk, dtype=dtype).reshape(shape)
    return np.memmap(chunk, dtype=dtype, mode=mode, shape=shape, order="C")


def zarr3():
    """The ``zarr`` package (>= 3), needed only for non-canonical (e.g. compressed) tracking
    arrays a caller provides; daisy_nb reads and writes its own stores without it. An optional
    dependency (``daisy_nb[zarr]``), so that daisy_nb installs next to libraries that pin
    ``zarr<3`` (dacapo-ml's fibsem-tools)."""
    what = "reading a compressed (non-canonical) block-tracking array needs zarr>=3 (pip install 'zarr>=3')"
    try:
        import zarr
    except ImportError:
        raise ImportError(f"{what}; zarr is not installed") from None
    version = str(getattr(zarr, "__version__", "0"))
    if not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 3:
        raise ImportError(f"{what}; zarr {version} is installed")
    return zarr


def _read_via_zarr(array_dir: Path) -> np.ndarray:
    return np.asarray(zarr3().open_array(store=str(array_dir), mode="r")[...])


def _allocate(fd: int, offset: int, length: int) -> None:
    """Reserve disk blocks under ``[offset, offset + length)`` of a (sparse) chunk file.

    A write through a shared map into a hole needs a new disk block when the page is
    written back; on a full disk that is a SIGBUS at the write, not an error. Reserving
    the blocks first turns it into an ``OSError(ENOSPC)`` here. File systems without
    fallocate (glibc then writes a zero byte per block) or without the call at all
    are left as they are.
    """
    if length <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise


def _prepare_chunk(chunk: Path, nbytes: int, *, durable: bool = True) -> None:
    """Make ``chunk`` a file of exactly ``nbytes`` bytes, keeping what it holds.

    A missing chunk (all fill) is created sparse; a chunk of the wrong size is
    zero-extended or truncated, as daisy 2.0.0 does. Both are written aside and
    renamed, so a crash leaves either the old file or the new one.
    """
    try:
        size = chunk.stat().st_size
    except FileNotFoundError:
        _atomic_write(chunk, lambda f: f.truncate(nbytes), durable=durable)
        return
    if size == nbytes:
        return
    fixed = _resized(chunk, size, nbytes)
    _atomic_write(chunk, lambda f: _write_array(f, fixed), durable=durable)


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
        "arrays": sorted(c.name for c in p.iterdir() if c.is_dir() and (c / "zarr.json").exists()),
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
            out[name] = zarr3().open_array(store=str(p / name), mode="r")
    return out
