"""``BlockwiseDependencyGraph``: one task's blocks, levels and intra-task dependencies.

Same blocks, IDs, ROIs and order as daisy 2.0.0 (docs/explanation/algorithms.md#levels). The bulk form is
:meth:`BlockwiseDependencyGraph.to_arrays`, computed by kernels; the object API
(``root_gen``, ``enumerate_all_dependencies``, ``upstream``...) builds ``Block``
objects lazily, in chunks, from the same kernels.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .block import Block
from .kernels import _jit
from .kernels import graph as kg
from .layout import BlockLayout, pack_layouts, roi_tuple

if TYPE_CHECKING:
    from funlib.geometry import Roi

__all__ = ["BlockwiseDependencyGraph", "GraphArrays"]

_CHUNK = 4096
_FIRST_CHUNK = 16
_EMPTY1 = np.zeros(0, dtype=np.int64)
# microseconds of kernel work in plain Python (kernels/_jit.py need(); measured on the
# 2-core machine, 3-D with conflicts: to_arrays 16 µs per block, describing a block 12 µs,
# one neighbour query a few µs; `benchmarks/bench_small.py --calibrate`)
_US_FILL = 16
_US_DESCRIBE = 12
_US_QUERY = 5


class GraphArrays(NamedTuple):
    """A task's blocks as flat arrays, rows in ``enumerate_all_dependencies()`` order."""

    block_id: np.ndarray  # int64[n]
    level: np.ndarray  # int64[n]
    read_offset: np.ndarray  # int64[n, ndim]
    read_shape: np.ndarray  # int64[n, ndim] (a read-only broadcast view unless fit="shrink")
    write_offset: np.ndarray  # int64[n, ndim]
    write_shape: np.ndarray  # int64[n, ndim] (likewise)
    upstream_indptr: np.ndarray  # int64[n + 1]
    upstream_indices: np.ndarray  # int64[m], rows of each block's intra-task upstream blocks


class _CountInt(int):
    """An int that can also be called: ``g.num_roots`` and daisy 2.0's ``g.num_roots()``."""

    def __call__(self) -> int:
        return int(self)


class _LazyBlocks(Sequence):
    """A read-only sequence of items built on demand, chunk by chunk."""

    def __init__(self, n: int, make_chunk):
        self._n = n
        self._make_chunk = make_chunk  # (start, stop) -> list

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator:
        # Chunks grow from _FIRST_CHUNK to _CHUNK: a first chunk of 4096 blocks allocates
        # enough objects to trigger a full garbage collection, which takes 0.2-2 s in a
        # process holding numba's compiled kernels, so the first block would not come "at once".
        start, size = 0, _FIRST_CHUNK
        while start < self._n:
            stop = min(self._n, start + size)
            yield from self._make_chunk(start, stop)
            start = stop
            size = min(2 * size, _CHUNK)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._make_chunk(i, i + 1)[0]

    def __repr__(self):
        return f"<{self._n} blocks, built lazily>"


def _one_of(a, b, name_a: str, name_b: str):
    """The ROI given under either name (daisy 1.x / 2.0); exactly one must be given."""
    if a is not None and b is not None:
        raise TypeError(f"pass either {name_a} or {name_b}, not both")
    if a is None and b is None:
        raise TypeError(f"missing the block ROI {name_b} (or {name_a})")
    return a if a is not None else b


class BlockwiseDependencyGraph:
    """The blocks of one task and their intra-task dependencies (daisy's API).

    ``BlockwiseDependencyGraph(task_id, block_read_roi, block_write_roi,
    read_write_conflict, fit, total_read_roi=None, total_write_roi=None)``; the
    block ROIs may also be passed as ``read_roi=``/``write_roi=`` (daisy 2.0's names).

    Parameters
    ----------
    task_id : str
        The task the blocks belong to.
    block_read_roi, block_write_roi : funlib.geometry.Roi
        One block's read and write ROIs (the write ROI inside the read ROI); exactly one
        of ``block_read_roi``/``read_roi`` and of ``block_write_roi``/``write_roi``.
    read_write_conflict : bool, optional
        Whether blocks whose read ROI meets another's write ROI run at different levels
        (default True).
    fit : {"valid", "overhang", "shrink"}, optional
        How blocks at the border of the total ROI are handled, as in :class:`daisy_nb.Task`.
    total_read_roi, total_write_roi : funlib.geometry.Roi, optional
        The task's whole read (or write) ROI; one of them is needed.
    read_roi, write_roi : funlib.geometry.Roi, optional
        daisy 2.0's names of ``block_read_roi`` and ``block_write_roi``.

    Raises
    ------
    TypeError
        ``task_id`` is not a str, or a block ROI is given under both names or none.
    ValueError
        The geometry is inconsistent (as :class:`daisy_nb.Task` reports it).
    """

    def __init__(
        self,
        task_id: str,
        block_read_roi: Roi | None = None,
        block_write_roi: Roi | None = None,
        read_write_conflict: bool = True,
        fit: str = "valid",
        total_read_roi: Roi | None = None,
        total_write_roi: Roi | None = None,
        *,
        read_roi: Roi | None = None,
        write_roi: Roi | None = None,
    ) -> None:
        block_read_roi = _one_of(block_read_roi, read_roi, "block_read_roi", "read_roi")
        block_write_roi = _one_of(block_write_roi, write_roi, "block_write_roi", "write_roi")
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        self.task_id = task_id
        self.layout = BlockLayout(
            total_read_roi, block_read_roi, block_write_roi, read_write_conflict, fit, total_write_roi
        )
        self._tt = pack_layouts([self.layout])

    # -- counts -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """The number of blocks of the task."""
        return self.layout.num_blocks

    @property
    def num_levels(self) -> int:
        """The number of levels (blocks of one level never conflict with each other)."""
        return self.layout.num_levels

    @property
    def num_roots(self) -> _CountInt:
        """The number of level-0 blocks (also callable, as daisy 2.0's ``num_roots()``)."""
        return _CountInt(self.layout.num_roots)

    @property
    def ndim(self) -> int:
        """The number of spatial dimensions."""
        return self.layout.ndim

    # -- rows <-> blocks ----------------------------------------------------------
    def _describe(self, rows: np.ndarray):
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        n, nd = len(rows), self.layout.ndim
        ids = np.empty(n, np.int64)
        ro, wo, rs, ws = (np.empty((n, nd), np.int64) for _ in range(4))
        _jit.need(n * _US_DESCRIBE)
        tt = self._tt
        kg.describe_rows(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, 0, rows, ids, ro, wo, rs, ws)
        return ids, ro, wo, rs, ws

    def _blocks(self, rows) -> list[Block]:
        ids, ro, wo, rs, ws = self._describe(rows)
        tid = self.task_id
        make = Block._make
        return [
            make(tid, i, (tuple(a), tuple(b)), (tuple(c), tuple(d)), r)
            for i, a, b, c, d, r in zip(
                ids.tolist(), ro.tolist(), rs.tolist(), wo.tolist(), ws.tolist(), np.asarray(rows).tolist()
            )
        ]

    def block_row(self, block: Block) -> int:
        """Row (enumeration position) of ``block``; ValueError if it is not a block of this graph."""
        woff, _ = roi_tuple(block.write_roi, "block.write_roi")
        g = self.layout.grid_of_write_offset(woff)
        if g is None or self.num_blocks == 0:
            raise ValueError(
                f"block {block!r} is not a block of task {self.task_id!r} (its write ROI is not on the block grid)"
            )
        _jit.need(_US_QUERY)
        tt = self._tt
        return int(kg.grid_to_row(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, 0, g))

    def level(self, block: Block) -> int:
        """The level of ``block``; ValueError if it is not a block of this graph."""
        row = self.block_row(block)
        return int(np.searchsorted(self.layout.level_start, row, side="right") - 1)

    # -- daisy's API --------------------------------------------------------------
    def root_gen(self) -> Sequence[Block]:
        """Level-0 blocks in order, built lazily (a 10^9-block task yields at once)."""
        return _LazyBlocks(self.layout.num_roots, lambda a, b: self._blocks(np.arange(a, b, dtype=np.int64)))

    def blocks(self) -> Sequence[Block]:
        """All blocks in enumeration order, built lazily."""
        return _LazyBlocks(self.num_blocks, lambda a, b: self._blocks(np.arange(a, b, dtype=np.int64)))

    def enumerate_all_dependencies(self) -> Sequence[tuple[Block, list[Block]]]:
        """``(block, [intra-task upstream blocks])`` for every block, level by level, lazily."""

        def chunk(a, b):
            arr = self._rows_arrays(a, b)
            blocks = self._blocks(np.arange(a, b, dtype=np.int64))
            ptr, idx = arr.upstream_indptr, arr.upstream_indices
            # upstream rows point to earlier rows, possibly outside this chunk
            ups = self._blocks(idx) if len(idx) else []
            out = []
            for i, blk in enumerate(blocks):
                out.append((blk, ups[ptr[i] : ptr[i + 1]]))
            return out

        return _LazyBlocks(self.num_blocks, chunk)

    def upstream(self, block: Block) -> list[Block]:
        """Intra-task upstream blocks of ``block`` (daisy's conflict-offset order)."""
        return self._neighbours(block, False)

    def downstream(self, block: Block) -> list[Block]:
        """Intra-task downstream blocks: the exact inverse of :meth:`upstream`."""
        return self._neighbours(block, True)

    def _neighbours(self, block, downstream: bool) -> list[Block]:
        if self.num_levels <= 1:
            self.block_row(block)  # validates
            return []
        row = self.block_row(block)
        out = np.empty(max(1, len(self.layout.conf_offsets)), dtype=np.int64)
        _jit.need(_US_QUERY)
        tt = self._tt
        n = kg.intra_neighbours(
            tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.conf_ptr, tt.conf_jump, 0, row, downstream, out
        )
        return self._blocks(out[:n])

    def subgraph_box(self, sub_roi: Roi, read_roi: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Grid box ``(lo, hi)`` of the blocks :meth:`get_subgraph_blocks` returns (docs/explanation/algorithms.md#subgraph)."""
        off, shp = roi_tuple(sub_roi, "sub_roi")
        lay = self.layout
        if len(off) != lay.ndim:
            raise ValueError(f"sub_roi must have {lay.ndim} dimensions, got {len(off)}")
        off_a = np.array(off, dtype=np.int64)
        end = off_a + np.array(shp, dtype=np.int64)
        if read_roi:
            off_a = off_a - lay.cul
            end = end + lay.clr
        return _subgraph_box(off_a, end, lay.tw_offset, lay.tw_shape, lay.write_shape, lay.grid_shape)

    def get_subgraph_blocks(self, sub_roi: Roi, read_roi: bool = False) -> list[Block]:
        """Blocks whose write cell meets ``sub_roi`` (grown by the context if ``read_roi``)."""
        lo, hi = self.subgraph_box(sub_roi, read_roi)
        n = int(np.prod(np.maximum(hi - lo, 0)))
        if n == 0:
            return []
        rows = np.empty(n, np.int64)
        ids = np.empty(n, np.int64)
        _jit.need(n * _US_DESCRIBE)
        tt = self._tt
        kg.grid_box_rows(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, 0, lo, hi, rows, ids)
        return self._blocks(rows)

    # -- arrays -------------------------------------------------------------------
    def _rows_arrays(self, start: int, stop: int) -> GraphArrays:
        lay, tt = self.layout, self._tt
        n, nd = stop - start, lay.ndim
        _jit.need(n * _US_FILL)
        ids = np.empty(n, np.int64)
        level = np.empty(n, np.int64)
        ro = np.empty((n, nd), np.int64)
        wo = np.empty((n, nd), np.int64)
        shrink = lay.fit == "shrink"
        if shrink:
            rs = np.empty((n, nd), np.int64)
            ws = np.empty((n, nd), np.int64)
        else:
            rs = np.broadcast_to(lay.read_shape, (n, nd))
            ws = np.broadcast_to(lay.write_shape, (n, nd))
        ptr = np.empty(n + 1, np.int64)
        empty2 = np.zeros((0, nd), np.int64)
        # Upper bound of the upstream entries: every block of a level with all of its
        # level's conflicts (only boundary blocks have fewer). One pass instead of a
        # counting pass; the few unused tail entries are sliced off (a view, no copy).
        bound = 0
        for lev in range(lay.num_levels):
            a = max(start, int(lay.level_start[lev]))
            b = min(stop, int(lay.level_start[lev + 1]))
            if b > a:
                bound += (b - a) * int(lay.conf_indptr[lev + 1] - lay.conf_indptr[lev])
        idx = np.empty(max(bound, 1), np.int64)
        args = (tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.conf_ptr, tt.conf_jump, 0, start, stop)
        m = kg.fill_rows(*args, ids, level, ro, wo, rs if shrink else empty2, ws if shrink else empty2, ptr, idx)
        return GraphArrays(ids, level, ro, rs, wo, ws, ptr, idx[:m])

    def to_arrays(self) -> GraphArrays:
        """Every block as flat arrays (see :class:`GraphArrays`), computed by kernels."""
        return self._rows_arrays(0, self.num_blocks)

    def __repr__(self):
        return f"BlockwiseDependencyGraph({self.task_id!r}, blocks={self.num_blocks}, levels={self.num_levels}, roots={int(self.num_roots)})"


def _subgraph_box(off, end, tw_off, tw_shape, ws, grid):
    """daisy 2.0's ``get_subgraph_blocks`` box (docs/explanation/algorithms.md#subgraph), including its never-failing intersection."""
    tw_end = tw_off + tw_shape
    b = np.maximum(off, tw_off)
    e = b + np.maximum(0, np.minimum(end, tw_end) - b)
    rb = b - tw_off
    re = e - tw_off
    lo = rb // ws
    hi = -(-re // ws)
    lo = np.clip(lo, 0, grid)
    hi = np.clip(hi, 0, grid)
    return lo.astype(np.int64), np.maximum(hi, lo).astype(np.int64)
