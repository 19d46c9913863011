"""Task geometry as small int64 arrays: the input of every kernel.

:class:`BlockLayout` validates one task's ROIs once (bad input raises here,
before any work starts) and derives daisy's block grid (docs/explanation/algorithms.md#levels):
the total write ROI, the level stride, the level offsets and the conflict
offsets between consecutive levels. Everything is expressed in *blocks*
(grid steps of the write shape), so kernels never divide by the write shape.

:func:`pack_layouts` packs the layouts of several tasks into the flat
"task tables" that the kernels take (one table for the whole pipeline).

A block is addressed inside its task by its **row**: its position in
``enumerate_all_dependencies()`` order (level by level, rightmost axis
fastest). Roots are therefore rows ``0 .. num_roots-1``.

This module does not import numba.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .block import cantor_number
from .kernels.tables import (
    FIT_OVERHANG,
    FIT_SHRINK,
    FIT_VALID,
    G_GRID,
    G_IDOFF,
    G_PERIOD,
    G_RS,
    G_TR_OFF,
    G_TR_SHAPE,
    G_TRACK,
    G_TW_OFF,
    G_TW_SHAPE,
    G_WS,
    I_BLOCK_BASE,
    I_FIT,
    I_LEVEL_BASE,
    I_NBLOCKS,
    I_NDIM,
    I_NLEVELS,
    I_NROOTS,
    N_GEO,
    N_INFO,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BlockLayout", "FITS", "TaskTables", "block_id_to_grid", "inverse_cantor", "pack_layouts", "roi_tuple"]

FITS = {"valid": FIT_VALID, "overhang": FIT_OVERHANG, "shrink": FIT_SHRINK}
FIT_NAMES = {v: k.capitalize() for k, v in FITS.items()}


_INT64_MAX = 2**63 - 1


def _prod(values: Iterable[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def _is_numpy_bool(x: object) -> bool:
    """``numpy.bool_`` without importing numpy (no numpy loaded: ``x`` cannot be one)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.bool_)


def _periods(
    conflict: bool, fit_code: int, cul: Sequence[int], clr: Sequence[int], ws: Sequence[int], ts: Sequence[int]
) -> list[int]:
    """The level stride in blocks per axis (docs/explanation/algorithms.md#level-stride): 1 without conflicts; with them a
    stride that rounds to zero is 0 and leaves no levels (no blocks)."""
    if not conflict:
        return [1] * len(ws)
    out = []
    for c, d, w, t in zip(cul, clr, ws, ts):
        m = max(c, d) + w
        s = ((m - 1) // w + 1) * w
        rounded = t - (t % w) if fit_code == FIT_VALID else t + ((-t) % w)
        s = min(s, rounded)
        out.append(s // w if s > 0 else 0)
    return out


def roi_tuple(roi: Any, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(offset, shape)`` of a ROI as int tuples; a clear error for anything else."""
    if roi is None:
        raise TypeError(f"{name} is required (a funlib.geometry Roi), got None")
    try:
        offset, shape = roi.offset, roi.shape
    except AttributeError:
        raise TypeError(
            f"{name} must be a Roi (anything with integer offset and shape), got {type(roi).__name__}"
        ) from None
    if offset is None or shape is None:
        raise ValueError(f"{name} must be bounded, got {roi!r}")
    offset, shape = tuple(offset), tuple(shape)
    if any(v is None for v in offset) or any(v is None for v in shape):
        raise ValueError(f"{name} must be bounded (no None/unbounded dimensions), got {roi!r}")
    try:
        off = tuple(int(v) for v in offset)
        shp = tuple(int(v) for v in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must have integer offset and shape, got {roi!r}") from None
    if any(o != v for o, v in zip(off + shp, offset + shape)):
        raise TypeError(f"{name} must have integer offset and shape, got {roi!r}")
    if len(off) != len(shp) or len(off) == 0:
        raise ValueError(f"{name} must have as many offset as shape dimensions (and at least one), got {roi!r}")
    return off, shp


class BlockLayout:
    """Validated geometry of one task (docs/explanation/algorithms.md#notation).

    Parameters are daisy's: ``total_roi`` is the total *read* ROI, ``read_roi`` and
    ``write_roi`` the block templates (only their relative placement and shapes
    matter), ``read_write_conflict`` and ``fit`` in ``valid/overhang/shrink``.
    Raises ``ValueError``/``TypeError`` naming the parameter on bad input.
    """

    def __init__(
        self,
        total_roi: Any,
        read_roi: Any,
        write_roi: Any,
        read_write_conflict: bool = True,
        fit: str = "valid",
        total_write_roi: Any = None,
    ) -> None:
        if total_roi is None and total_write_roi is None:
            raise ValueError("either total_roi (total_read_roi) or total_write_roi must be provided")
        rd = roi_tuple(read_roi, "read_roi")
        wr = roi_tuple(write_roi, "write_roi")
        nd = len(rd[0])
        if len(wr[0]) != nd:
            raise ValueError(
                f"read_roi and write_roi must have the same number of dimensions, got {nd} and {len(wr[0])}"
            )
        if any(s <= 0 for s in wr[1]):
            raise ValueError(f"write_roi must have a positive shape on every axis, got {wr[1]}")
        cul = tuple(w - r for w, r in zip(wr[0], rd[0]))
        clr = tuple((r + rs) - (w + ws) for r, rs, w, ws in zip(rd[0], rd[1], wr[0], wr[1]))
        if any(c < 0 for c in cul + clr):
            raise ValueError(f"write_roi {write_roi!r} must lie inside read_roi {read_roi!r}")
        if total_roi is not None:
            tr = roi_tuple(total_roi, "total_roi")
            if len(tr[0]) != nd:
                raise ValueError(
                    f"total_roi must have the same number of dimensions as read_roi/write_roi ({nd}), got {len(tr[0])}"
                )
            if total_write_roi is not None:
                tw = roi_tuple(total_write_roi, "total_write_roi")
                if (
                    len(tw[0]) != nd
                    or tuple(t + c for t, c in zip(tr[0], cul)) != tw[0]
                    or tuple(s - a - b for s, a, b in zip(tr[1], cul, clr)) != tw[1]
                ):
                    raise ValueError("total_roi and total_write_roi must differ by exactly the block context")
        else:
            tw = roi_tuple(total_write_roi, "total_write_roi")
            if len(tw[0]) != nd:
                raise ValueError(f"total_write_roi must have {nd} dimensions, got {len(tw[0])}")
            tr = (tuple(o - c for o, c in zip(tw[0], cul)), tuple(s + a + b for s, a, b in zip(tw[1], cul, clr)))
        if any(s < 0 for s in tr[1]):
            raise ValueError(f"total_roi must not have a negative shape, got {tr[1]}")
        if not isinstance(fit, str) or fit not in FITS:
            raise ValueError(f"fit must be one of 'valid', 'overhang', 'shrink', got {fit!r}")
        if not isinstance(read_write_conflict, (bool, int)) and not _is_numpy_bool(read_write_conflict):
            raise TypeError(f"read_write_conflict must be a bool, got {type(read_write_conflict).__name__}")

        self.ndim = nd
        self.total_roi_t, self.read_roi_t, self.write_roi_t = tr, rd, wr
        self.fit = fit
        self.fit_code = FITS[fit]
        self.read_write_conflict = bool(read_write_conflict)
        # The grid, the level stride, the block count and the ID range in plain ints, so
        # that a grid too large for int64 IDs raises here; the arrays are derived from
        # them on first use (see __getattr__): building a Task does not import numpy, and
        # a run can start its worker template while numpy loads.
        ts = [s - a - b for s, a, b in zip(tr[1], cul, clr)]
        r = wr[1] if self.fit_code == FIT_VALID else (1,) * nd
        # number of block positions per axis: p = 0, ws, 2ws, ... <= Ts - r (docs/explanation/algorithms.md#level-blocks)
        grid = [(t - q) // w + 1 if t - q >= 0 else 0 for t, q, w in zip(ts, r, wr[1])]
        periods = _periods(self.read_write_conflict, self.fit_code, cul, clr, wr[1], ts)
        n = 0 if 0 in periods else _prod(grid)
        if n > _INT64_MAX:
            raise ValueError("task has more blocks than fit in 64 bits")
        if n:
            _check_cantor_fits([g - 1 + c // w for g, c, w in zip(grid, cul, wr[1])])
        self.num_blocks = n
        self._cul_t, self._clr_t = cul, clr
        self._ts, self._grid, self._periods = ts, grid, periods

    def __getattr__(self, name: str) -> Any:
        """The derived arrays (``grid_shape``, ``level_offsets``, ...), computed on first access."""
        d = self.__dict__
        if name.startswith("__") or "_cul_t" not in d or "grid_shape" in d:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._derive()
        return d[name] if name in d else object.__getattribute__(self, name)

    def _derive(self) -> None:
        import numpy as np

        nd, (tr, rd, wr) = self.ndim, (self.total_roi_t, self.read_roi_t, self.write_roi_t)
        cul, clr = self._cul_t, self._clr_t
        ws = np.array(wr[1], dtype=np.int64)
        self.write_shape = ws
        self.read_shape = np.array(rd[1], dtype=np.int64)
        self.cul = np.array(cul, dtype=np.int64)
        self.clr = np.array(clr, dtype=np.int64)
        self.total_offset = np.array(tr[0], dtype=np.int64)
        self.total_shape = np.array(tr[1], dtype=np.int64)
        self.tw_offset = self.total_offset + self.cul
        self.tw_shape = np.array(self._ts, dtype=np.int64)
        grid_shape = np.array(self._grid, dtype=np.int64)
        self.id_offset = self.cul // ws  # grid index = position + cul div ws (docs/explanation/algorithms.md#block-ids)
        # tracking grid (docs/reference/tracking-format.md#grid): ceil(TR.shape / ws), at least 1
        self.track_shape = np.maximum(1, -(-self.total_shape // ws)).astype(np.int64)

        # level stride in blocks (docs/explanation/algorithms.md#level-stride)
        self.period = np.array(self._periods, dtype=np.int64)
        self.zero_levels = 0 in self._periods

        if self.zero_levels:
            self.num_levels = 0
            self.level_offsets = np.zeros((0, nd), dtype=np.int64)
            conflicts: list[list[tuple[int, ...]]] = []
        else:
            # level offsets: cartesian product (rightmost fastest), reversed (docs/explanation/algorithms.md#level-offsets)
            offs = np.indices(tuple(self.period)).reshape(nd, -1).T[::-1]
            self.level_offsets = np.ascontiguousarray(offs, dtype=np.int64)
            self.num_levels = len(offs)
            conflicts = [[]]
            k = self.period
            for i in range(1, self.num_levels):
                delta = self.level_offsets[i - 1] - self.level_offsets[i]
                per_axis: list[tuple[int, ...]] = []
                for d in range(nd):
                    dv = int(delta[d])
                    if dv < 0:
                        per_axis.append((dv, dv + int(k[d])))
                    elif dv == 0:
                        per_axis.append((0,))
                    else:
                        per_axis.append((dv - int(k[d]), dv))
                conflicts.append(list(itertools.product(*per_axis)) if self.read_write_conflict else [])
        self.conflicts = conflicts
        self.conf_indptr = np.zeros(self.num_levels + 1, dtype=np.int64)
        for i, level_conflicts in enumerate(conflicts):
            self.conf_indptr[i + 1] = self.conf_indptr[i] + len(level_conflicts)
        flat = [c for cs in conflicts for c in cs]
        self.conf_offsets = np.array(flat, dtype=np.int64).reshape(len(flat), nd)
        # The same offsets in steps of the previous level's own block counter: a block
        # at level l with in-level counter j has its upstream conflict c at counter
        # j + (c - delta) / period of level l-1 (delta = lo[l-1] - lo[l]; docs/explanation/algorithms.md#conflicts makes
        # c - delta one of -period, 0, +period). Lets kernels find neighbour rows with
        # multiplications only.
        jumps = []
        for i, cs in enumerate(conflicts):
            for c in cs:
                delta = self.level_offsets[i - 1] - self.level_offsets[i]
                jumps.append(tuple(int(v) for v in (np.array(c) - delta) // self.period))
        self.conf_jumps = np.array(jumps, dtype=np.int64).reshape(len(jumps), nd)

        # blocks per level and axis (docs/explanation/algorithms.md#level-blocks), level start rows
        lo = self.level_offsets
        g = grid_shape
        if self.num_levels:
            counts = np.where(
                g[None, :] > lo, (g[None, :] - lo + self.period[None, :] - 1) // np.maximum(self.period, 1)[None, :], 0
            )
        else:
            counts = np.zeros((0, nd), dtype=np.int64)
        self.level_counts = np.ascontiguousarray(counts, dtype=np.int64)
        self.level_sizes = [_prod(int(v) for v in row) for row in counts]
        self.level_start = np.zeros(self.num_levels + 1, dtype=np.int64)
        total = 0
        for i, n in enumerate(self.level_sizes):
            total += n
            self.level_start[i + 1] = total
        self.num_roots = self.level_sizes[0] if self.num_levels else 0
        self.grid_shape = grid_shape  # last: its presence marks the derivation done (__getattr__)

    # -- convenience -------------------------------------------------------------
    @property
    def block_grid_shape(self) -> list[int]:
        return list(self._grid)

    def task_hash_fields(self) -> tuple[Any, Any, Any, str]:
        return self.total_roi_t, self.read_roi_t, self.write_roi_t, FIT_NAMES[self.fit_code]

    def grid_of_write_offset(self, write_offset: Any) -> np.ndarray | None:
        """Grid position of a block given its write ROI offset, or None if no block starts there."""
        import numpy as np

        rel = np.asarray(write_offset, dtype=np.int64) - self.tw_offset
        if np.any(rel % self.write_shape):
            return None
        g = rel // self.write_shape
        if np.any(g < 0) or np.any(g >= self.grid_shape):
            return None
        return g


def inverse_cantor(n: int, nd: int) -> tuple[int, ...]:
    """The grid index whose :func:`daisy_nb.block.cantor_number` is ``n`` (exact integers)."""
    from math import comb

    out = [0] * nd
    rem = int(n)
    for k in range(nd, 1, -1):
        # largest s with C(s + k - 1, k) <= rem
        lo, hi = 0, 1
        while comb(hi + k - 1, k) <= rem:
            hi *= 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if comb(mid + k - 1, k) <= rem:
                lo = mid
            else:
                hi = mid
        rem -= comb(lo + k - 1, k)
        out[k - 1] = lo  # temporarily the partial sum S_k
    if nd:
        out[0] = rem
        # partial sums -> coordinates: x_{k-1} = S_k - S_{k-1}, S_1 = x_0
        sums = [rem] + out[1:]
        out = [sums[0]] + [sums[i] - sums[i - 1] for i in range(1, nd)]
    return tuple(out)


def block_id_to_grid(layout: BlockLayout, block_id: int) -> tuple[int, ...] | None:
    """Grid position of a block id in a task's block grid, or None if it is not a block.

    The inverse of the ids a layout gives (``cantor_number`` of the grid index plus
    ``id_offset``); the Scheduler's ``block_rois`` and the dashboard use it."""
    return _id_in_box(block_id, layout.id_offset, layout.grid_shape)


def _id_in_box(block_id: int, offset: Any, shape: Any) -> tuple[int, ...] | None:
    """Position of the cell ``block_id`` in the box of ``shape`` at ``offset`` (cells), or None outside it."""
    cell = inverse_cantor(block_id, len(shape))
    g = tuple(int(c - o) for c, o in zip(cell, offset))
    if any(not 0 <= v < s for v, s in zip(g, shape)):
        return None
    return g


def _check_cantor_fits(x: list[int]) -> None:
    """Raise if the kernel's int64 Cantor arithmetic could overflow at grid index ``x``."""
    s = 0
    for n in range(1, len(x) + 1):
        s += x[n - 1]
        c = 1
        for i in range(1, n + 1):
            if c * (s + i - 1) > _INT64_MAX:
                raise ValueError(f"block grid too large: block IDs at grid index {x} exceed 64 bits")
            c = c * (s + i - 1) // i
    if cantor_number(x) > _INT64_MAX:
        raise ValueError(f"block grid too large: block IDs at grid index {x} exceed 64 bits")


class TaskTables(NamedTuple):
    """The geometry of T tasks packed for the kernels.

    geo : int64[T, N_GEO, maxnd]   per-axis vectors (rows G_*)
    info : int64[T, N_INFO]        scalars (columns I_*)
    lvl_off, lvl_cnt : int64[sum L, maxnd]   level offsets / blocks per axis, in blocks
    lvl_start : int64[sum L + T]   start row of each level, plus one end entry per task
    conf_ptr : int64[sum L + T]    CSR into conf_off, one extra entry per task
    conf_off : int64[C, maxnd]     conflict offsets in blocks
    conf_jump : int64[C, maxnd]    the same conflicts as steps of the previous level's counter
    """

    geo: np.ndarray
    info: np.ndarray
    lvl_off: np.ndarray
    lvl_cnt: np.ndarray
    lvl_start: np.ndarray
    conf_ptr: np.ndarray
    conf_off: np.ndarray
    conf_jump: np.ndarray


def pack_layouts(layouts: list[BlockLayout]) -> TaskTables:
    """Pack per-task layouts into one :class:`TaskTables` (level base indices per task)."""
    import numpy as np

    T = len(layouts)
    maxnd = max((lay.ndim for lay in layouts), default=1)
    geo = np.zeros((T, N_GEO, maxnd), dtype=np.int64)
    info = np.zeros((T, N_INFO), dtype=np.int64)
    lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_off, conf_jump = [], [], [], [], [], []
    level_base = 0
    conf_base = 0
    block_base = 0
    for t, lay in enumerate(layouts):
        nd = lay.ndim
        for row, vec in (
            (G_TR_OFF, lay.total_offset),
            (G_TR_SHAPE, lay.total_shape),
            (G_RS, lay.read_shape),
            (G_WS, lay.write_shape),
            (G_TW_OFF, lay.tw_offset),
            (G_TW_SHAPE, lay.tw_shape),
            (G_GRID, lay.grid_shape),
            (G_PERIOD, lay.period),
            (G_IDOFF, lay.id_offset),
            (G_TRACK, lay.track_shape),
        ):
            geo[t, row, :nd] = vec
        for col, v in (
            (I_NDIM, nd),
            (I_FIT, lay.fit_code),
            (I_NLEVELS, lay.num_levels),
            (I_LEVEL_BASE, level_base),
            (I_NBLOCKS, lay.num_blocks),
            (I_BLOCK_BASE, block_base),
            (I_NROOTS, lay.num_roots),
        ):
            info[t, col] = v
        pad = np.zeros((lay.num_levels, maxnd), dtype=np.int64)
        pad[:, :nd] = lay.level_offsets
        lvl_off.append(pad)
        pad = np.zeros((lay.num_levels, maxnd), dtype=np.int64)
        pad[:, :nd] = lay.level_counts
        lvl_cnt.append(pad)
        # level_base indexes lvl_off/lvl_cnt; lvl_start and conf_ptr carry one extra
        # entry per task, so they are indexed with level_base + t
        lvl_start.append(lay.level_start)
        conf_ptr.append(lay.conf_indptr + conf_base)
        pad = np.zeros((len(lay.conf_offsets), maxnd), dtype=np.int64)
        pad[:, :nd] = lay.conf_offsets
        conf_off.append(pad)
        pad = np.zeros((len(lay.conf_jumps), maxnd), dtype=np.int64)
        pad[:, :nd] = lay.conf_jumps
        conf_jump.append(pad)
        conf_base += len(lay.conf_offsets)
        level_base += lay.num_levels
        block_base += lay.num_blocks
    cat = lambda xs, shape: np.ascontiguousarray(
        np.concatenate(xs) if xs else np.zeros(shape, dtype=np.int64), dtype=np.int64
    )  # noqa: E731
    return TaskTables(
        geo,
        info,
        cat(lvl_off, (0, maxnd)),
        cat(lvl_cnt, (0, maxnd)),
        cat(lvl_start, (0,)),
        cat(conf_ptr, (0,)),
        cat(conf_off, (0, maxnd)),
        cat(conf_jump, (0, maxnd)),
    )
