"""A tracking store for a volume that grew: the rule, the remap.

A store written by daisy_nb records the layout it was made for beside daisy 2.0.0's
``daisy_task_hash`` (:mod:`._layout`). This module is what opening a store whose hash
differs from its task's needs; a run whose stores match never loads it.

**When a store is migrated.** Opening a store whose hash differs from the task's is
refused (``LayoutMismatch``) unless the task's grid is the stored grid *extended*:

* the same write shape (stride), read shape and context (``cul``, ``clr``), ``fit``
  and number of dimensions (the ROIs' template offsets may differ: blocks start at
  ``total_roi.begin`` whatever they are);
* the new ``total_roi`` contains the old one, and its begin differs from the old
  begin by whole write strides on every axis, so every block of the old volume is a
  block of the new one, at the same place. Growth towards negative coordinates is
  supported: the grid index of an old block then shifts by the number of strides the
  volume grew by (``g' = g + d``; ``g = (W.begin - total_roi.begin) div ws``); its
  Cantor ``block_id`` changes with it (the id is that of the grid index), while a
  volume that only grew at its far end keeps every block id.

``read_write_conflict`` is recorded but not compared: it is not in daisy's hash
either, and it changes the order blocks run in, not what a block writes.

**Which marks survive (the rule).** A block's mark (its ``done`` byte and its
failure count) is carried over iff the block's *effective write ROI* is unchanged,
where the effective write ROI is ``write_roi & total_write_roi``: the write ROI for
``valid`` and ``shrink`` blocks, the part inside the volume for ``overhang`` blocks.
Since ``total_roi`` is the total write ROI grown by the context, the effective read
ROI (``read_roi & total_roi``) is then unchanged as well: the block read the same
data and wrote the same voxels, so its result stands. At the old far edge, a
``shrink`` block that was clipped, or an ``overhang`` block that stuck out of the old
volume, is a different block once the volume grew on that axis (it writes more, or
it computed its voxels from data that did not exist yet): it starts with no marks
and runs again. Such a block stays done when the volume grew on other axes only
(nothing changed for it). Cells of the old tracking grid that were not blocks
(the grid is ``ceil(total / write)``, larger than the block grid with context) are
dropped. ``docs/tracking-growth.md`` discusses the rule and the alternatives.

With ``read_write_conflict`` the blocks kept done all finished before any block of
the resumed run starts, so no two overlapping blocks ever run at the same time,
which is what the conflict levels guarantee; which of two overlapping blocks ran
first is not part of that guarantee (in daisy it already depends on where
``total_roi`` begins).

**The remap** is a shift of the old grid into the new one (``new[g + d] = old[g] *
keep[g]``, ``keep`` the outer product of per-axis masks), done with numpy in
pieces of :data:`PIECE_CELLS` cells read with ``pread`` and written with ``pwrite``
(all-zero pieces are left as holes): O(blocks) time, a few tens of MB of memory
whatever the grid. It builds a complete store beside the old one
(``.<name>.daisy_nb-new``, group document last) and swaps it in by an atomic
exchange (or two renames); :func:`recover` finishes or rolls back an interrupted
migration on the next open (:mod:`._io`'s conversion does the same for one array).

No numba, no zarr (except for a caller's compressed array).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._files import (
    _DONE_DTYPE,
    _FAILURES_DTYPE,
    DONE_ARRAY,
    FAILURES_ARRAY,
    HASH_ATTRIBUTE,
    _array_metadata,
    _chunk_path,
    _fsync_dir,
    _is_canonical,
    _read_json,
    _read_via_zarr,
    _write_json,
)
from ._grid import _fit_name, grid_shape
from ._io import _exchange, convert_array, pwrite_all, side_paths, step
from ._layout import LAYOUT_ATTRIBUTE, MIGRATED_FROM, record_hash, stored_record

logger = logging.getLogger("daisy_nb.tracking")

#: cells per piece of the remap (4 MiB of ``done``, 16 MiB of ``failures``)
PIECE_CELLS = 1 << 22


# ---------------------------------------------------------------------------
# the rule
# ---------------------------------------------------------------------------


class _Axes:
    """Per-axis geometry of a record: total read ROI, total write ROI, stride, context."""

    def __init__(self, rec: dict):
        t, r, w = rec["total_roi"], rec["read_roi"], rec["write_roi"]
        self.nd = len(t["offset"])
        self.tr_b = [int(v) for v in t["offset"]]
        self.tr_s = [int(v) for v in t["shape"]]
        self.ws = [int(v) for v in w["shape"]]
        self.rs = [int(v) for v in r["shape"]]
        self.cul = [int(wo) - int(ro) for wo, ro in zip(w["offset"], r["offset"])]
        self.clr = [int(rs) - int(ws) - c for rs, ws, c in zip(self.rs, self.ws, self.cul)]
        self.tw_b = [b + c for b, c in zip(self.tr_b, self.cul)]
        self.tw_e = [b + s - c for b, s, c in zip(self.tr_b, self.tr_s, self.clr)]
        self.fit = _fit_name(rec.get("fit", "valid")).lower()
        self.grid = grid_shape((self.tr_b, self.tr_s), (w["offset"], self.ws))

    def positions(self, d: int) -> tuple[int, int]:
        """``(first, count)``: grid indices of the blocks along axis ``d`` (docs/explanation/algorithms.md#level-blocks)."""
        ts = self.tw_e[d] - self.tw_b[d]
        ws = self.ws[d]
        if self.fit == "valid":
            n = ts // ws if ts >= ws else 0
        else:
            n = -(-ts // ws) if ts > 0 else 0
        return self.cul[d] // ws, n

    def num_blocks(self) -> int:
        return math.prod(self.positions(d)[1] for d in range(self.nd))


@dataclass
class Growth:
    """How a store's grid maps into a grown task's grid (see the module docstring).

    ``shift``: grid cells the old grid moves by on each axis (the volume grew that
    many strides towards negative coordinates); ``keep``: per axis, a bool per old
    grid index, True for the blocks whose marks survive.
    """

    old: dict
    new: dict
    old_hash: str
    new_hash: str
    old_grid: tuple[int, ...]
    new_grid: tuple[int, ...]
    shift: tuple[int, ...]
    keep: list[np.ndarray]
    old_blocks: int
    new_blocks: int
    dropped_axes: list[int] = field(default_factory=list)  # axes whose old far-edge blocks changed

    def validate(self) -> None:
        """Invariants: raise ``AssertionError`` if the mapping is not a growth of the grid.

        Same dimensions; a non-negative shift; one keep mask per axis of the old grid's
        length; every kept cell a block of the old volume whose cell, shifted, lies in the
        new grid; the new volume at least as large in blocks as the kept ones.
        """
        nd = len(self.old_grid)
        assert len(self.new_grid) == nd == len(self.shift) == len(self.keep), "dimensions"
        a, b = _Axes(self.old), _Axes(self.new)
        assert tuple(a.grid) == self.old_grid and tuple(b.grid) == self.new_grid, "grid shapes"
        for d in range(nd):
            k = self.keep[d]
            assert self.shift[d] >= 0, f"negative shift on axis {d}"
            assert k.shape == (self.old_grid[d],) and k.dtype == bool, f"keep mask of axis {d}"
            idx = np.flatnonzero(k)
            if idx.size:
                first, n = a.positions(d)
                assert idx[0] >= first and idx[-1] < first + n, f"a kept cell of axis {d} is not a block"
                nfirst, nn = b.positions(d)
                assert idx[0] + self.shift[d] >= nfirst, f"axis {d}: kept cells below the new blocks"
                assert idx[-1] + self.shift[d] < min(nfirst + nn, self.new_grid[d]), f"axis {d}: beyond the new grid"
        kept = math.prod(int(k.sum()) for k in self.keep)
        assert kept <= self.old_blocks and kept <= self.new_blocks, "more kept blocks than blocks"

    def keep_box(self) -> np.ndarray:
        """The keep mask as a bool array of the old grid's shape (tests; small grids)."""
        m = np.ones(self.old_grid, bool)
        for d, k in enumerate(self.keep):
            shape = [1] * len(self.old_grid)
            shape[d] = -1
            m &= k.reshape(shape)
        return m

    def describe(self) -> str:
        o, n = self.old["total_roi"], self.new["total_roi"]
        return (
            f"total_roi {_roi_text(o)} -> {_roi_text(n)}, tracking grid {list(self.old_grid)} -> "
            f"{list(self.new_grid)}" + (f", grid shifted by {list(self.shift)}" if any(self.shift) else "")
        )


def _roi_text(r: dict) -> str:
    return f"{list(r['offset'])}+{list(r['shape'])}"


def compare(old: dict, new: dict) -> Growth | str:
    """A :class:`Growth` if ``new``'s grid is ``old``'s extended, else why not (a sentence)."""
    a, b = _Axes(old), _Axes(new)
    if a.nd != b.nd:
        return f"the number of dimensions changed ({a.nd} -> {b.nd})"
    what = []
    if a.ws != b.ws:
        what.append(f"the write shape (block stride) changed ({a.ws} -> {b.ws})")
    if a.rs != b.rs or a.cul != b.cul or a.clr != b.clr:
        what.append(
            f"the read/write context changed (read shape {a.rs} -> {b.rs}, context below "
            f"{a.cul} -> {b.cul}, above {a.clr} -> {b.clr})"
        )
    if a.fit != b.fit:
        what.append(f"fit changed ({a.fit!r} -> {b.fit!r})")
    if what:
        return "; ".join(what)
    off = [x - y for x, y in zip(a.tr_b, b.tr_b)]
    if any(o % w for o, w in zip(off, a.ws)):
        return (
            f"the grid origin moved by a fraction of a block (total_roi begin {a.tr_b} -> {b.tr_b}, "
            f"write shape {a.ws}): the blocks of the two volumes do not line up"
        )
    a_end = [x + s for x, s in zip(a.tr_b, a.tr_s)]
    b_end = [x + s for x, s in zip(b.tr_b, b.tr_s)]
    if any(o < 0 for o in off) or any(y < x for x, y in zip(a_end, b_end)):
        return (
            f"the volume shrank or moved (total_roi {_roi_text(old['total_roi'])} -> "
            f"{_roi_text(new['total_roi'])} does not contain the old one)"
        )
    shift = tuple(o // w for o, w in zip(off, a.ws))
    keep = []
    dropped = []
    for d in range(a.nd):
        first, n = a.positions(d)
        ws = a.ws[d]
        g = np.arange(a.grid[d], dtype=np.int64)
        k = g - first
        exists = (k >= 0) & (k < n)
        begin = a.tw_b[d] + k * ws  # the block's write begin
        # the effective write ROI [begin, min(begin + ws, TW.end)) is unchanged iff the
        # block ends inside the old volume, or the volume did not grow at this end
        same = (begin + ws <= a.tw_e[d]) | (a.tw_e[d] == b.tw_e[d])
        kd = exists & same
        if np.any(exists & ~same):
            dropped.append(d)
        # every kept cell lands inside the new grid (a block of the new volume)
        keep.append(kd)
    growth = Growth(
        old=old,
        new=new,
        old_hash=record_hash(old),
        new_hash=record_hash(new),
        old_grid=tuple(a.grid),
        new_grid=tuple(b.grid),
        shift=shift,
        keep=keep,
        old_blocks=a.num_blocks(),
        new_blocks=b.num_blocks(),
        dropped_axes=dropped,
    )
    growth.validate()
    return growth


def what_to_do(path) -> str:
    return (
        "To start over, reset the task (Task.reset()) or give it another tracking_path; "
        f"or delete the store by hand. Delete it to start fresh:\n    rm -rf {path}"
    )


def mismatch_message(path, stored_hash, expected_hash, reason: str | None) -> str:
    """The ``LayoutMismatch`` text: daisy's sentence, then what changed and what to do."""
    head = (
        f"block tracking at {path} was written for a different task layout "
        f"(stored hash = {stored_hash if stored_hash is not None else '<missing>'}, expected = {expected_hash})"
    )
    if reason is None:
        return (
            f"{head}. The store does not record its layout (written by daisy 2.0.0, or by an older "
            "daisy_nb), so daisy_nb cannot tell whether only the volume grew. If it did, record the "
            "layout it was written for, then rerun:\n"
            f"    daisy-nb track migrate {path} --from-roi OFFSET:SHAPE --read-roi OFFSET:SHAPE "
            "--write-roi OFFSET:SHAPE [--fit FIT]\n(the ROIs exactly as given to the task that wrote it). "
            + what_to_do(path)
        )
    return f"{head}: {reason}. Only a volume that grew on the same grid keeps its marks. " + what_to_do(path)


# ---------------------------------------------------------------------------
# the remap
# ---------------------------------------------------------------------------


class _Source:
    """Flat reads of one old array: ``pread`` of a raw chunk, or a whole array (zarr, absent)."""

    def __init__(self, array_dir: Path, shape: tuple[int, ...], dtype: np.dtype):
        self.dtype = dtype
        self.fd: int | None = None
        self.data: np.ndarray | None = None
        meta_path = array_dir / "zarr.json"
        if not meta_path.exists():
            return  # absent array: zeros
        meta = _read_json(meta_path)
        if tuple(meta.get("shape", ())) != tuple(shape):
            raise RuntimeError(
                f"block tracking at {array_dir.parent} is invalid: array {array_dir.name!r} has shape "
                f"{meta.get('shape')}, the recorded layout's grid is {list(shape)}"
            )
        if _is_canonical(meta, tuple(shape), dtype):
            try:
                self.fd = os.open(_chunk_path(array_dir, len(shape)), os.O_RDONLY)
            except FileNotFoundError:
                pass  # no chunk yet: all fill
        else:
            self.data = np.ascontiguousarray(_read_via_zarr(array_dir).astype(dtype, copy=False)).reshape(-1)

    def has_data(self, start: int, count: int) -> bool:
        """False when cells ``[start, start + count)`` are surely all zero (absent, or a hole)."""
        if self.data is not None:
            return True
        if self.fd is None:
            return False
        seek_data = getattr(os, "SEEK_DATA", None)
        if seek_data is None:
            return True
        off = start * self.dtype.itemsize
        try:
            return os.lseek(self.fd, off, seek_data) < off + count * self.dtype.itemsize
        except OSError as e:
            return e.errno != errno.ENXIO  # ENXIO: no data after off

    def read(self, start: int, count: int) -> np.ndarray:
        out = np.zeros(count, self.dtype)
        if self.data is not None:
            out[:] = self.data[start : start + count]
        elif self.fd is not None:
            mv = memoryview(out.view(np.uint8))
            pos, off = 0, start * self.dtype.itemsize
            while pos < len(mv):
                n = os.preadv(self.fd, [mv[pos:]], off + pos)
                if n <= 0:
                    break  # a short chunk: the rest is fill (daisy zero-extends it)
                pos += n
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _strides(shape) -> list[int]:
    s = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        s[d] = s[d + 1] * shape[d + 1]
    return s


def remapped_pieces(
    growth: Growth, source: _Source, piece_cells: int | None = None, window: tuple[int, int] | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(flat start, values)`` of the new grid's non-zero pieces, in order.

    ``window``: only the pieces overlapping the flat range ``[lo, hi)`` of the new grid.

    Pieces are contiguous runs of the new grid's C order: for a split axis ``k`` (the
    first whose trailing axes hold at most ``piece_cells`` cells), a fixed index on
    the axes before ``k`` and a range of rows on ``k``. Each reads one contiguous run
    of the old grid, zeroes the cells whose marks do not survive and places it,
    shifted, in a zeroed piece: a few numpy operations per piece.
    """
    old, new, shift = growth.old_grid, growth.new_grid, growth.shift
    if piece_cells is None:
        piece_cells = PIECE_CELLS
    nd = len(new)
    k = 0
    while k < nd - 1 and math.prod(new[k + 1 :]) > piece_cells:
        k += 1
    inner_new = new[k + 1 :]
    inner_old = old[k + 1 :]
    n_inner_new = math.prod(inner_new)
    n_inner_old = math.prod(inner_old)
    rows = max(1, piece_cells // max(n_inner_new, 1))
    inner_keep = np.ones(inner_old, bool)
    for j, kj in enumerate(growth.keep[k + 1 :]):
        sh = [1] * len(inner_old)
        sh[j] = -1
        inner_keep &= kj.reshape(sh)
    if not inner_keep.any() or not growth.keep[k].any():
        return
    place = tuple(slice(s, s + o) for s, o in zip(shift[k + 1 :], inner_old))
    so, sn = _strides(old), _strides(new)
    for prefix in np.ndindex(*new[:k]):
        oprefix = [p - s for p, s in zip(prefix, shift[:k])]
        if any(not (0 <= q < o) or not growth.keep[j][q] for j, (q, o) in enumerate(zip(oprefix, old[:k]))):
            continue
        base_old = sum(q * s for q, s in zip(oprefix, so[:k]))
        base_new = sum(p * s for p, s in zip(prefix, sn[:k]))
        lo = shift[k]
        hi = shift[k] + old[k]
        for a_new in range(lo, hi, rows):
            b_new = min(a_new + rows, hi)
            if window is not None and (base_new + b_new * sn[k] <= window[0] or base_new + a_new * sn[k] >= window[1]):
                continue
            a, b = a_new - shift[k], b_new - shift[k]  # old rows
            kk = growth.keep[k][a:b]
            if not kk.any() or not source.has_data(base_old + a * so[k], (b - a) * n_inner_old):
                continue
            vals = source.read(base_old + a * so[k], (b - a) * n_inner_old).reshape((b - a, *inner_old))
            vals *= inner_keep
            vals[~kk] = 0
            if not vals.any():
                continue
            out = np.zeros((b_new - a_new, *inner_new), vals.dtype)
            out[(slice(None), *place)] = vals
            yield base_new + a_new * sn[k], out.reshape(-1)


class GrownSource:
    """Flat reads ``[start, start + count)`` of an array of the new grid, remapped from the old
    store on the fly (read only: what :mod:`daisy_nb.status` and the dry run show)."""

    def __init__(self, path: Path, name: str, growth: Growth, dtype):
        self.dtype = np.dtype(dtype)
        self.growth = growth
        self.source = _Source(Path(path) / name, growth.old_grid, self.dtype)

    def read(self, start: int, count: int) -> np.ndarray:
        out = np.zeros(count, self.dtype)
        lo, hi = start, start + count
        for s, vals in remapped_pieces(self.growth, self.source, max(count, 1 << 16), (lo, hi)):
            a, b = max(lo, s), min(hi, s + vals.size)
            if a < b:
                out[a - lo : b - lo] = vals[a - s : b - s]
        return out

    def close(self) -> None:
        self.source.close()


def grown_view(path, expected: dict) -> tuple[Growth | None, str | None]:
    """``(growth, None)`` if the store at ``path`` is for a smaller volume of ``expected``'s grid,
    ``(None, reason)`` if its recorded layout differs otherwise, ``(None, None)`` without a record."""
    try:
        meta = _read_json(Path(path) / "zarr.json")
    except (OSError, ValueError):
        return None, None
    rec = stored_record(meta)
    if rec is None:
        return None, None
    g = compare(rec, expected)
    return (None, g) if isinstance(g, str) else (g, None)


_SEGMENT = 4096  # bytes (a page): all-zero pages of a piece stay holes, as the store keeps them


def _pwrite_sparse(fd: int, vals: np.ndarray, offset: int) -> None:
    """``pwrite`` the non-zero :data:`_SEGMENT`-byte segments of ``vals`` (a file of holes
    beneath): a sparse ``failures`` stays sparse."""
    raw = vals.view(np.uint8)
    n = raw.size
    lead = (-offset) % _SEGMENT  # align segments to the file's, not to the piece
    cuts = [0, *range(min(lead, n) if lead else _SEGMENT, n, _SEGMENT), n] if n else [0]
    cuts = sorted(set(cuts))
    full = np.array(cuts, dtype=np.int64)
    if len(full) < 2:
        return
    nz = np.logical_or.reduceat(raw != 0, full[:-1]) if n else np.zeros(0, bool)
    i = 0
    m = len(nz)
    while i < m:
        if not nz[i]:
            i += 1
            continue
        j = i
        while j < m and nz[j]:
            j += 1
        pwrite_all(fd, raw[full[i] : full[j]], offset + int(full[i]))
        i = j


def _write_remapped(growth: Growth, src_dir: Path, dst_dir: Path, name: str, dtype, durable: bool) -> int:
    """Write array ``name`` of the new grid into ``dst_dir`` (chunk, then metadata); its non-zero count."""
    source = _Source(src_dir / name, growth.old_grid, np.dtype(dtype))
    chunk = _chunk_path(dst_dir / name, len(growth.new_grid))
    chunk.parent.mkdir(parents=True, exist_ok=True)
    nbytes = math.prod(growth.new_grid) * np.dtype(dtype).itemsize
    nonzero = 0
    fd = os.open(chunk, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, nbytes)  # sparse: pieces that stay zero are holes
        first = True
        for start, vals in remapped_pieces(growth, source):
            _pwrite_sparse(fd, vals, start * vals.itemsize)
            nonzero += int(np.count_nonzero(vals))
            if first:
                step(f"piece-{name}")  # tests: killed half-way through a chunk
                first = False
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
        source.close()
    _write_json(dst_dir / name / "zarr.json", _array_metadata(growth.new_grid, np.dtype(dtype)))
    step(f"array-{name}")
    return nonzero


def build_grown(growth: Growth, src: Path, dst: Path, group_attrs: dict, durable: bool) -> dict:
    """Build the grown store at ``dst`` (an empty directory); the group document last.

    Returns ``{"done": marks kept, "failures": failure cells kept}``.
    """
    dst.mkdir(parents=True, exist_ok=True)
    kept = {
        DONE_ARRAY: _write_remapped(growth, src, dst, DONE_ARRAY, _DONE_DTYPE, durable),
        FAILURES_ARRAY: _write_remapped(growth, src, dst, FAILURES_ARRAY, _FAILURES_DTYPE, durable),
    }
    if durable:
        _fsync_dir(dst)
    attrs = dict(group_attrs)
    attrs[HASH_ATTRIBUTE] = growth.new_hash
    attrs[LAYOUT_ATTRIBUTE] = growth.new
    attrs[MIGRATED_FROM] = growth.old_hash
    _write_json(dst / "zarr.json", {"attributes": attrs, "node_type": "group", "zarr_format": 3})
    return kept


def count_done(path: Path, growth: Growth) -> tuple[int, int]:
    """``(done marks that survive, done marks in the old store)``, read only."""
    src = _Source(Path(path) / DONE_ARRAY, growth.old_grid, _DONE_DTYPE)
    try:
        total = 0
        n = math.prod(growth.old_grid)
        for s in range(0, n, PIECE_CELLS):
            total += int(np.count_nonzero(src.read(s, min(PIECE_CELLS, n - s))))
        kept = sum(int(np.count_nonzero(v)) for _, v in remapped_pieces(growth, src))
    finally:
        src.close()
    return kept, total


def migrate(path: Path, growth: Growth, durable: bool = True) -> dict:
    """Replace the store at ``path`` by its remap onto the grown grid, crash-safely.

    Returns ``{"kept": done marks kept, "had": done marks before, "failures": failure
    cells kept}`` and logs what was resumed.
    """
    p = Path(path)
    meta = _read_json(p / "zarr.json")
    attrs = {
        k: v
        for k, v in (meta.get("attributes") or {}).items()
        if k not in (HASH_ATTRIBUTE, LAYOUT_ATTRIBUTE, MIGRATED_FROM)
    }
    extra = sorted(
        c.name
        for c in p.iterdir()
        if c.is_dir() and c.name not in (DONE_ARRAY, FAILURES_ARRAY) and (c / "zarr.json").exists()
    )
    had = count_done(p, growth)[1]
    kept: dict = {}

    def build(d: Path) -> None:
        kept.update(build_grown(growth, p, d, attrs, durable))

    convert_array(p.parent, p.name, build, _fsync_dir if durable else lambda d: None)
    info = {"kept": kept[DONE_ARRAY], "had": had, "failures": kept[FAILURES_ARRAY], "dropped_arrays": extra}
    dropped = had - kept[DONE_ARRAY]
    logger.info(
        "block tracking at %s: resumed %s of %s blocks from a smaller volume (%s)%s%s",
        p,
        f"{kept[DONE_ARRAY]:,}",
        f"{growth.new_blocks:,}",
        growth.describe(),
        f"; {dropped:,} done marks not kept (blocks at the old far edge that are larger now)" if dropped else "",
        f"; arrays not carried over: {', '.join(extra)}" if extra else "",
    )
    return info


def recover(path: Path, target_hash: str | None) -> None:
    """Finish or roll back a migration of the store at ``path`` that a crash interrupted.

    The built store (``.<name>.daisy_nb-new``, complete once its group document exists)
    is swapped in if it was built from the store now at ``path`` (or parked beside it
    by the first of two renames) and is what the opener asks for (``target_hash``, or
    anything when None); otherwise the old store stays (or is put back) and the
    leftovers are removed. Never resurrects a store over one made since.
    """
    p = Path(path)
    new, old = side_paths(p.parent, p.name)
    if not new.exists() and not old.exists():
        return

    def meta(d: Path) -> dict | None:
        try:
            m = _read_json(d / "zarr.json")
        except (OSError, ValueError):
            return None
        return m if m.get("node_type") == "group" else None

    def h(m: dict | None) -> str | None:
        return None if m is None else (m.get("attributes") or {}).get(HASH_ATTRIBUTE)

    m_new, m_dst, m_old = meta(new), meta(p), meta(old)
    src = None if m_new is None else (m_new.get("attributes") or {}).get(MIGRATED_FROM)
    wanted = m_new is not None and src is not None and target_hash in (None, h(m_new))
    if m_dst is not None:
        if wanted and h(m_dst) == src:
            if not _exchange(new, p):
                os.rename(p, old)
                os.rename(new, p)
    elif m_old is not None:  # between the two renames: the old store is parked
        if wanted and h(m_old) == src:
            if p.exists():
                shutil.rmtree(p)
            os.rename(new, p)
        else:
            if p.exists():
                shutil.rmtree(p)
            os.rename(old, p)
    shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(p.parent)
