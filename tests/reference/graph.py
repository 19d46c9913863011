"""Reference twin of daisy's ``BlockwiseDependencyGraph`` (one task).

Implements CORE.md section 3 (with the ROI operations of section 1 and the
block IDs of section 2.2), following the published daisy 2.0.0 wheel:

* the level stride uses truncating division (3.2), so a negative context
  behaves as in daisy 2.0, not as 1.x's assertion;
* ``subgraph`` uses daisy 2.0's never-failing intersection (1, 3.9): an empty
  or disjoint query keeps a real offset and can still return one block;
* intra-task ``upstream``/``downstream`` lists are in conflict-offset order
  (daisy 2.0), not 1.x's set order (3.8).

Everything is computed by the most direct route (enumerate, then filter), so
this module is only meant for small graphs. It deliberately does not validate
its inputs beyond what the algorithms need: the same zero-level and
empty-graph outcomes as daisy (section 9) fall out of the formulas.
"""

from __future__ import annotations

from collections import namedtuple
from itertools import product

from .block_id import block_spatial_id

__all__ = [
    "FITS",
    "RefBlock",
    "RefGraph",
    "roi_begin",
    "roi_contains_point",
    "roi_contains_roi",
    "roi_end",
    "roi_grow",
    "roi_intersect",
    "roi_shift",
]

Coord = tuple[int, ...]
Roi = tuple[Coord, Coord]

FITS = ("valid", "overhang", "shrink")

RefBlock = namedtuple("RefBlock", "spatial_id read write level grid")
RefBlock.__doc__ = """One block of a task (CORE 2.1, 3.5).

``spatial_id``: the Cantor ID against the task's total read ROI (CORE 2.2),
computed on the unshrunk block; ``read``/``write``: ROI tuples after fit
(CORE 3.6); ``level``: index into ``level_offsets`` (CORE 3.8); ``grid``: the
0-based position of the block in the write grid, ``p // ws`` with ``p`` the
write begin relative to the total write ROI begin.
"""


# --------------------------------------------------------------------------
# ROI helpers (CORE 0 and 1), on plain ((offset...), (shape...)) tuples.
# --------------------------------------------------------------------------


def _vec(values) -> Coord:
    """An integer N-vector as a tuple of Python ints (CORE 0)."""
    return tuple(int(v) for v in values)


def roi_begin(roi: Roi) -> Coord:
    """``roi.begin`` = the offset (CORE 0)."""
    return roi[0]


def roi_end(roi: Roi) -> Coord:
    """``roi.end = offset + shape`` (CORE 0)."""
    return tuple(o + s for o, s in zip(roi[0], roi[1], strict=True))


def roi_grow(roi: Roi, neg: Coord, pos: Coord) -> Roi:
    """``grow(neg, pos)``: ``offset - neg``, ``shape + neg + pos`` (CORE 1); negative amounts shrink."""
    offset, shape = roi
    return (
        tuple(o - n for o, n in zip(offset, neg, strict=True)),
        tuple(s + n + p for s, n, p in zip(shape, neg, pos, strict=True)),
    )


def roi_shift(roi: Roi, by: Coord) -> Roi:
    """Translation ``roi + by`` (CORE 1): shifts the offset, keeps the shape."""
    return (tuple(o + b for o, b in zip(roi[0], by, strict=True)), roi[1])


def roi_intersect(a: Roi, b: Roi) -> Roi:
    """daisy 2.0's never-failing intersection (CORE 1).

    ``begin = max(begins)`` and ``shape = max(0, min(ends) - begin)`` per axis,
    so an empty result keeps a real offset (funlib would return a ``None``
    offset instead).
    """
    begin = tuple(max(x, y) for x, y in zip(roi_begin(a), roi_begin(b), strict=True))
    end = tuple(min(x, y) for x, y in zip(roi_end(a), roi_end(b), strict=True))
    return begin, tuple(max(0, e - o) for o, e in zip(begin, end, strict=True))


def roi_contains_point(roi: Roi, point: Coord) -> bool:
    """``contains(point)``: ``begin <= p < end`` on every axis (CORE 1)."""
    return all(o <= p < e for o, p, e in zip(roi_begin(roi), point, roi_end(roi), strict=True))


def roi_contains_roi(roi: Roi, other: Roi) -> bool:
    """daisy 2.0's ``contains(roi)``: ``self.begin <= o.begin`` and ``o.end <= self.end`` (CORE 1)."""
    return all(b <= ob for b, ob in zip(roi_begin(roi), roi_begin(other), strict=True)) and all(
        oe <= e for oe, e in zip(roi_end(other), roi_end(roi), strict=True)
    )


def _as_roi(roi) -> Roi:
    """Normalise a ``((offset...), (shape...))`` pair of int sequences to tuples (the ROI of CORE 0)."""
    offset, shape = roi
    offset, shape = _vec(offset), _vec(shape)
    if len(offset) != len(shape):
        raise ValueError(f"ROI offset and shape differ in length: {roi!r}")
    return offset, shape


class RefGraph:
    """Blocks, levels and intra-task dependencies of one task (CORE section 3).

    Parameters
    ----------
    total_roi : ROI tuple
        The task's total **read** ROI ``TR`` (CORE 0, 3.1).
    read_roi, write_roi : ROI tuple
        The block templates ``BR`` and ``BW``; only their shapes and relative
        placement matter (CORE 3.5).
    read_write_conflict : bool
        Whether blocks whose read ROI overlaps another block's write ROI must be
        ordered (CORE 3.2).
    fit : {"valid", "overhang", "shrink"}
        Boundary handling (CORE 3.6).

    Attributes
    ----------
    ndim, ws, cul, clr, total_roi, total_write_roi, rounding, stride,
    level_offsets, level_conflicts
        As defined in CORE 0 and 3.1-3.4. ``level_offsets`` is a list of tuples
        in daisy's order (reversed cartesian product, so level 0 is the largest
        offset); ``level_conflicts`` a list (one entry per level) of lists of
        offset tuples.
    """

    def __init__(self, total_roi: Roi, read_roi: Roi, write_roi: Roi, read_write_conflict: bool, fit: str):
        """Derive ``ws``, ``cul``, ``clr``, ``TW``, ``r`` (CORE 0, 3.1) and the level tables (CORE 3.2-3.4)."""
        if fit not in FITS:
            raise ValueError(f"unknown fit mode: {fit!r}")
        self.total_roi = _as_roi(total_roi)
        self.read_roi = _as_roi(read_roi)
        self.write_roi = _as_roi(write_roi)
        self.read_write_conflict = bool(read_write_conflict)
        self.fit = fit
        self.ndim = len(self.total_roi[0])
        if len(self.read_roi[0]) != self.ndim or len(self.write_roi[0]) != self.ndim:
            raise ValueError("total, read and write ROIs must have the same number of dimensions")

        # CORE 0: write shape = grid step, and the two context amounts.
        self.ws: Coord = self.write_roi[1]
        if any(w <= 0 for w in self.ws):
            raise ValueError(f"write shape must be positive, got {self.ws}")
        self.read_shape: Coord = self.read_roi[1]
        self.cul: Coord = tuple(w - r for w, r in zip(roi_begin(self.write_roi), roi_begin(self.read_roi)))
        self.clr: Coord = tuple(r - w for r, w in zip(roi_end(self.read_roi), roi_end(self.write_roi)))
        # TW = TR.grow(-cul, -clr)
        self.total_write_roi: Roi = roi_grow(self.total_roi, tuple(-c for c in self.cul), tuple(-c for c in self.clr))
        self.tw_shape: Coord = self.total_write_roi[1]
        # CORE 3.1: rounding r.
        self.rounding: Coord = self.ws if fit == "valid" else (1,) * self.ndim

        self.stride: Coord = self._level_stride()
        self.level_offsets: list[Coord] = self._level_offsets()
        self.level_conflicts: list[list[Coord]] = self._level_conflicts()

        self._blocks: list[RefBlock] | None = None
        self._by_id: dict[int, RefBlock] | None = None

    # ------------------------------------------------------------------
    # Construction (CORE 3.2 - 3.4)
    # ------------------------------------------------------------------

    def _level_stride(self) -> Coord:
        """Level stride ``s`` of CORE 3.2.

        Without conflict ``s = ws`` (no clamp). With conflict,
        ``m = max(cul, clr) + ws`` rounded up to a multiple of ``ws`` with
        daisy 2's *truncating* division, then clamped by the write extent
        rounded to whole blocks (down for valid, up for overhang/shrink).
        """
        if not self.read_write_conflict:
            return self.ws
        stride = []
        for ws, cul, clr, ts in zip(self.ws, self.cul, self.clr, self.tw_shape):
            m = max(cul, clr) + ws
            s = (_trunc_div(m - 1, ws) + 1) * ws
            rounded = ts - (ts % ws) if self.fit == "valid" else ts + ((-ts) % ws)
            stride.append(min(s, rounded))
        return tuple(stride)

    def _level_offsets(self) -> list[Coord]:
        """``level_offsets`` of CORE 3.3.

        Per axis ``0, ws, 2 ws, ... < s``; cartesian product, rightmost axis
        fastest; then reversed. A stride ``<= 0`` on any axis gives no levels.
        """
        per_axis = [list(range(0, s, ws)) for s, ws in zip(self.stride, self.ws)]
        return list(reversed(list(product(*per_axis))))

    def _level_conflicts(self) -> list[list[Coord]]:
        """``level_conflicts`` of CORE 3.4 (upstream offsets into the previous level).

        ``conflicts[0] = []`` and every entry is ``[]`` without conflict. For
        level ``i >= 1`` with ``d = offsets[i-1] - offsets[i]``, per axis:
        ``d < 0 -> (d, d+s)``, ``d == 0 -> (0,)``, ``d > 0 -> (d-s, d)``;
        cartesian product, rightmost fastest.
        """
        conflicts: list[list[Coord]] = []
        for i in range(len(self.level_offsets)):
            if i == 0 or not self.read_write_conflict:
                conflicts.append([])
                continue
            per_axis = []
            for prev, cur, s in zip(self.level_offsets[i - 1], self.level_offsets[i], self.stride):
                d = prev - cur
                if d < 0:
                    per_axis.append((d, d + s))
                elif d == 0:
                    per_axis.append((0,))
                else:
                    per_axis.append((d - s, d))
            conflicts.append(list(product(*per_axis)))
        return conflicts

    # ------------------------------------------------------------------
    # Counts (CORE 3.7), analytic
    # ------------------------------------------------------------------

    @property
    def num_levels(self) -> int:
        """Number of levels, ``prod(s / ws)`` (CORE 3.3); 0 if the stride is not positive."""
        return len(self.level_offsets)

    def num_level_blocks(self, level: int) -> int:
        """Analytic block count of one level (CORE 3.7).

        Per axis ``n = floor((Ts - lo + s - r) / s)``, clamped at 0; the product.
        """
        lo = self.level_offsets[level]
        count = 1
        for ts, lo_d, s, r in zip(self.tw_shape, lo, self.stride, self.rounding):
            count *= max(0, (ts - lo_d + s - r) // s)
        return count

    @property
    def num_blocks(self) -> int:
        """Sum of the analytic level counts (CORE 3.7)."""
        return sum(self.num_level_blocks(i) for i in range(self.num_levels))

    @property
    def num_roots(self) -> int:
        """Analytic size of level 0 (CORE 3.7); 0 for a zero-level graph."""
        return self.num_level_blocks(0) if self.num_levels > 0 else 0

    @property
    def grid_shape(self) -> Coord:
        """Number of block positions per axis over all levels.

        The levels partition the positions ``p = k * ws``, ``0 <= p <= Ts - r``
        (CORE 3.5), so per axis this is ``max(0, (Ts - r) // ws + 1)`` and
        ``prod(grid_shape) == num_blocks``. All zeros for a zero-level graph.
        """
        if self.num_levels == 0:
            return (0,) * self.ndim
        return tuple(max(0, (ts - r) // ws + 1) for ts, r, ws in zip(self.tw_shape, self.rounding, self.ws))

    # ------------------------------------------------------------------
    # Blocks (CORE 3.5, 3.6)
    # ------------------------------------------------------------------

    def _candidate(self, p: Coord) -> RefBlock | None:
        """The block at write-grid position ``p`` (relative to ``TW.begin``), or None.

        CORE 3.5 step 3 and 3.6: ``read.begin = TR.begin + p``,
        ``write.begin = TW.begin + p`` with the full template shapes; the ID
        is computed against ``TR`` on the unshrunk write ROI; then the inclusion
        test (valid: ``TW`` contains the write ROI; overhang/shrink: ``TW``
        contains the write begin) and the fit (shrink clips write to ``TW`` and
        read to ``TR``, independently).
        """
        tr, tw = self.total_roi, self.total_write_roi
        read = (tuple(b + x for b, x in zip(roi_begin(tr), p)), self.read_shape)
        write = (tuple(b + x for b, x in zip(roi_begin(tw), p)), self.ws)
        spatial_id = block_spatial_id(tr, write)
        if self.fit == "valid":
            if not roi_contains_roi(tw, write):
                return None
        elif not roi_contains_point(tw, roi_begin(write)):
            return None
        if self.fit == "shrink":
            write = roi_intersect(tw, write)
            read = roi_intersect(tr, read)
        grid = tuple(x // ws for x, ws in zip(p, self.ws))
        level = self._level_index(p)
        return RefBlock(spatial_id, read, write, level, grid)

    def _level_index(self, p: Coord) -> int:
        """Index of ``p mod s`` in ``level_offsets`` (CORE 3.8)."""
        key = tuple(x % s for x, s in zip(p, self.stride))
        try:
            return self.level_offsets.index(key)
        except ValueError:
            raise ValueError(f"block offset {key} not found in level offsets {self.level_offsets}") from None

    def level_blocks(self, level: int) -> list[RefBlock]:
        """Blocks of one level in daisy's order (CORE 3.5).

        Per axis ``p in range(lo, Ts + 1 - r, s)``; cartesian product with the
        rightmost axis fastest; inclusion filter and fit (the filter always
        passes for these positions, but is applied like daisy 2 does).
        """
        lo = self.level_offsets[level]
        per_axis = [range(lo_d, ts + 1 - r, s) for lo_d, ts, r, s in zip(lo, self.tw_shape, self.rounding, self.stride)]
        blocks = []
        for p in product(*per_axis):
            block = self._candidate(p)
            if block is not None:
                blocks.append(block)
        return blocks

    def blocks(self) -> list[RefBlock]:
        """All blocks in ``enumerate_all_dependencies()`` order: level 0, 1, ... (CORE 3.5)."""
        if self._blocks is None:
            self._blocks = [b for level in range(self.num_levels) for b in self.level_blocks(level)]
            self._by_id = {}
            for b in self._blocks:
                self._by_id.setdefault(b.spatial_id, b)
        return list(self._blocks)

    def root_blocks(self) -> list[RefBlock]:
        """Level 0, i.e. daisy's ``root_gen()`` (CORE 3.5); empty for a zero-level graph."""
        return self.level_blocks(0) if self.num_levels > 0 else []

    def block_by_id(self, spatial_id: int) -> RefBlock:
        """The enumerated block (CORE 3.5) with this spatial ID (CORE 2.2); KeyError if there is none."""
        self.blocks()
        assert self._by_id is not None
        return self._by_id[spatial_id]

    def block_at_grid(self, grid: Coord) -> RefBlock | None:
        """The block at 0-based write-grid position ``grid`` (CORE 3.5 step 3, 3.6), or None if there is none."""
        grid = _vec(grid)
        if len(grid) != self.ndim or not all(0 <= g < n for g, n in zip(grid, self.grid_shape)):
            return None
        return self._candidate(tuple(g * ws for g, ws in zip(grid, self.ws)))

    def level_of(self, block: RefBlock) -> int:
        """``level(b)`` (CORE 3.8): index of ``(b.read.begin - TR.begin) mod s`` in ``level_offsets``.

        Raises ValueError if the offset is not a level offset (daisy 2 panics).
        """
        p = tuple(b - t for b, t in zip(roi_begin(block.read), roi_begin(self.total_roi)))
        return self._level_index(p)

    # ------------------------------------------------------------------
    # Dependencies (CORE 3.8)
    # ------------------------------------------------------------------

    def _neighbours(self, block: RefBlock, offsets: list[Coord], sign: int) -> list[RefBlock]:
        """Candidates ``block + sign * c`` for ``c`` in ``offsets``: inclusion, fit, dedupe by ID, in order (CORE 3.8).

        The candidate uses the full template shapes even if ``block`` was shrunk
        (its begin is unaffected by the shrink).
        """
        p = tuple(w - t for w, t in zip(roi_begin(block.write), roi_begin(self.total_write_roi)))
        out: list[RefBlock] = []
        seen: set[int] = set()
        for c in offsets:
            cand = self._candidate(tuple(x + sign * y for x, y in zip(p, c)))
            if cand is not None and cand.spatial_id not in seen:
                seen.add(cand.spatial_id)
                out.append(cand)
        return out

    def upstream(self, block: RefBlock) -> list[RefBlock]:
        """Intra-task upstream blocks of ``block`` in conflict-offset order (CORE 3.8, daisy 2)."""
        return self._neighbours(block, self.level_conflicts[self.level_of(block)], +1)

    def downstream(self, block: RefBlock) -> list[RefBlock]:
        """Intra-task downstream blocks of ``block`` (CORE 3.8, daisy 2 order).

        Candidates ``block - c`` for ``c`` in ``conflicts[level + 1]``; ``[]``
        on the last level. This is the exact inverse of :meth:`upstream` (tested).
        """
        level = self.level_of(block)
        if level + 1 >= self.num_levels:
            return []
        return self._neighbours(block, self.level_conflicts[level + 1], -1)

    # ------------------------------------------------------------------
    # Sub-graph queries (CORE 3.9)
    # ------------------------------------------------------------------

    def subgraph(self, sub_roi: Roi, read_roi: bool = False) -> list[RefBlock]:
        """daisy 2.0's ``get_subgraph_blocks(sub_roi, read_roi)`` (CORE 3.9).

        1. If ``read_roi``: grow ``sub`` by **this** graph's ``(cul, clr)``
           (daisy's choice; see CORE 10.1 for why that is wrong for
           asymmetric contexts; the pipeline twin does not use it).
        2. ``sub = sub ∩ TW`` with the never-failing intersection.
        3. ``lo = (sub.begin - TW.begin) // ws``,
           ``hi = ceil((sub.end - TW.begin) / ws)``.
        4. Positions ``lo*ws, (lo+1)*ws, ... < hi*ws`` per axis, rightmost
           fastest; inclusion test and fit as for enumerated blocks.

        Because of step 2, an empty query whose clipped begin is not on the
        grid still returns the one cell containing that begin (daisy does the
        same).
        """
        sub = _as_roi(sub_roi)
        if read_roi:
            sub = roi_grow(sub, self.cul, self.clr)
        tw = self.total_write_roi
        sub = roi_intersect(sub, tw)
        per_axis = []
        for sb, se, tb, ws in zip(roi_begin(sub), roi_end(sub), roi_begin(tw), self.ws):
            lo = (sb - tb) // ws
            hi = -((tb - se) // ws)  # ceil((se - tb) / ws)
            per_axis.append(range(lo * ws, hi * ws, ws))
        out = []
        for p in product(*per_axis):
            block = self._candidate(p)
            if block is not None:
                out.append(block)
        return out

    def __repr__(self) -> str:
        """The constructor call (inputs of CORE 3.1)."""
        return (
            f"RefGraph(total_roi={self.total_roi}, read_roi={self.read_roi}, write_roi={self.write_roi}, "
            f"read_write_conflict={self.read_write_conflict}, fit={self.fit!r})"
        )


def _trunc_div(a: int, b: int) -> int:
    """Integer division truncating toward zero (Rust ``/``), used by CORE 3.2 step 2."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q
