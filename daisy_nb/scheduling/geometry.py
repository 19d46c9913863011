"""Where a pipeline's blocks are: :class:`PipelineGeometry`, read-only after construction.

It owns the tasks' layouts packed for the kernels (:func:`daisy_nb.layout.pack_layouts`),
the task DAG with its per-edge interval tables (:func:`edge_tables`), and the length of
the scratch one block's downstream list needs. It answers where a row is (ids and ROIs),
which row a block or block id is, and which rows lie in a grid box. It holds no block
state: the :class:`~daisy_nb.Scheduler` owns that, and decides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daisy_nb.block import Block
from daisy_nb.kernels import graph as kg
from daisy_nb.layout import BlockLayout, block_id_to_grid, pack_layouts
from daisy_nb.task import Pipeline, Task

__all__ = ["PipelineGeometry", "edge_tables"]


def edge_tables(lu: BlockLayout, ld: BlockLayout) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-axis interval tables of an edge U -> D (docs/explanation/algorithms.md#inter-task-dependencies).

    up[d]: for each D grid position j along axis d, the U grid interval [lo, hi) of
    ``U.get_subgraph_blocks(D block's read ROI)`` (daisy 2.0's exact procedure);
    dn[d]: for each U position i, the D interval {j : lo_j <= i < hi_j}, its exact
    inverse (both endpoints are non-decreasing in j, so the inverse is an interval).
    """
    ups, dns = [], []
    for d in range(lu.ndim):
        j = np.arange(int(ld.grid_shape[d]), dtype=np.int64)
        rb = ld.total_offset[d] + j * ld.write_shape[d]
        re = rb + ld.read_shape[d]
        if ld.fit == "shrink":
            re = np.minimum(re, ld.total_offset[d] + ld.total_shape[d])
        twb, twe = lu.tw_offset[d], lu.tw_offset[d] + lu.tw_shape[d]
        b = np.maximum(rb, twb)
        e = np.maximum(b, np.minimum(re, twe))
        ws, gu = lu.write_shape[d], int(lu.grid_shape[d])
        lo = np.clip((b - twb) // ws, 0, gu)
        hi = np.clip(-(-(e - twb) // ws), 0, gu)
        hi = np.maximum(hi, lo)
        if len(j) > 1 and (np.any(np.diff(lo) < 0) or np.any(np.diff(hi) < 0)):
            raise AssertionError("inter-task intervals must be monotone")  # geometry guarantees it
        i = np.arange(gu, dtype=np.int64)
        dlo = np.searchsorted(hi, i, side="right")
        dhi = np.searchsorted(lo, i, side="right")
        dhi = np.maximum(dhi, dlo)
        ups.append(np.stack([lo, hi], axis=1))
        dns.append(np.stack([dlo, dhi], axis=1))
    return ups, dns


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros((0, 2), np.int64), dtype=np.int64)


def downstream_entries(dns) -> int:
    """Entries of every upstream block's downstream list over one task edge, from the edge's
    per-axis intervals (:func:`edge_tables`' ``dn``): the lists are products of the per-axis
    intervals, so their lengths sum to the product of the per-axis sums."""
    total = 1
    for d in dns:
        total *= int((d[:, 1] - d[:, 0]).sum()) if len(d) else 0
    return total


def conflict_entries(lay) -> int:
    """Entries of a task's conflict lists (later-level neighbours), counted as if every block of
    a level had all of its level's neighbours (only boundary blocks have fewer)."""
    if not lay.num_levels:
        return 0
    return int(np.dot(np.diff(lay.level_start), np.diff(lay.conf_indptr)))


class PipelineGeometry:
    """The blocks of a pipeline's tasks, as the kernels index them (see the module docstring).

    Tasks are numbered ``t`` in ``task_ids`` order (``pipeline.validate()``: upstream first);
    a task's blocks are its rows ``0..nblocks[t]-1``.

    Raises
    ------
    TypeError, ValueError
        Bad tasks (duplicate ids, cycles, connected tasks of different dimensions).
    """

    def __init__(self, pipeline: Pipeline) -> None:
        order = pipeline.validate()
        by_id = {t.task_id: t for t in pipeline.tasks}
        self.task_ids: list[str] = order
        self.tasks: dict[str, Task] = {tid: by_id[tid] for tid in order}
        self.tindex = {tid: i for i, tid in enumerate(order)}
        self.layouts = layouts = [self.tasks[tid].layout for tid in order]
        self.tt = pack_layouts(layouts)
        self.ndim = [lay.ndim for lay in layouts]
        self.nblocks = [lay.num_blocks for lay in layouts]
        self.num_blocks_total = sum(self.nblocks)
        T = len(order)

        # the task DAG and, per edge and axis, its interval tables (concatenated for the kernels)
        self.edges = edges = [(self.tindex[u.task_id], self.tindex[d.task_id]) for u, d in pipeline.edges]
        self.up_tasks = [[u for u, d in edges if d == t] for t in range(T)]
        self.down_tasks = [[d for u, d in edges if u == t] for t in range(T)]
        maxnd = self.tt.geo.shape[2]
        up_parts, dn_parts = [], []
        e_up_off = np.zeros((len(edges), maxnd), dtype=np.int64)
        e_dn_off = np.zeros((len(edges), maxnd), dtype=np.int64)
        nup = ndn = 0
        self.edge_max_down = np.zeros(len(edges), dtype=np.int64)
        edge_pairs = 0  # downstream entries of all blocks over the task edges
        for k, (u, d) in enumerate(edges):
            lu, ld = layouts[u], layouts[d]
            if lu.ndim != ld.ndim:
                raise ValueError(
                    f"tasks {order[u]!r} and {order[d]!r} are connected but have {lu.ndim} and {ld.ndim} dimensions"
                )
            ups, dns = edge_tables(lu, ld)
            edge_pairs += downstream_entries(dns)
            prod = 1
            for ax in range(lu.ndim):
                e_up_off[k, ax] = nup
                e_dn_off[k, ax] = ndn
                nup += len(ups[ax])
                ndn += len(dns[ax])
                up_parts.append(ups[ax])
                dn_parts.append(dns[ax])
                prod *= int((dns[ax][:, 1] - dns[ax][:, 0]).max()) if len(dns[ax]) else 0
            self.edge_max_down[k] = prod
        e_uv = np.array(edges, dtype=np.int64).reshape(len(edges), 2)
        # (edges, up intervals, their offsets, down intervals, their offsets)
        self.e = (e_uv, _concat(up_parts), e_up_off, _concat(dn_parts), e_dn_off)
        in_ptr = np.zeros(T + 1, dtype=np.int64)
        out_ptr = np.zeros(T + 1, dtype=np.int64)
        in_e: list[int] = []
        out_e: list[int] = []
        for t in range(T):
            in_e += [k for k, (u, d) in enumerate(edges) if d == t]
            out_e += [k for k, (u, d) in enumerate(edges) if u == t]
            in_ptr[t + 1] = len(in_e)
            out_ptr[t + 1] = len(out_e)
        # per task: its incoming and outgoing edges (CSR)
        self.tptr = (in_ptr, np.array(in_e, dtype=np.int64), out_ptr, np.array(out_e, dtype=np.int64))

        # scratch for one block's downstream list: the exact maximum from the geometry
        cap = 1
        for t in range(T):
            lay = layouts[t]
            m = int(np.diff(lay.conf_indptr).max()) if lay.num_levels else 0
            m += sum(int(self.edge_max_down[k]) for k in self.tptr[3][self.tptr[2][t] : self.tptr[2][t + 1]])
            cap = max(cap, m)
        self.down_cap = cap
        # entries of every block's downstream list (task edges and conflicts), all blocks together:
        # what a run's releases walk in all (the compile decision weighs it, scheduling/pace.py)
        self.downstream_entries = edge_pairs + sum(conflict_entries(lay) for lay in layouts)

    def kernel_tables(self) -> dict[str, np.ndarray]:
        """The geometry tables the state kernels take, by their names in ``kernels/tables.py``."""
        tt, e, p = self.tt, self.e, self.tptr
        names = ("geo", "info", "lvl_off", "lvl_cnt", "lvl_start", "conf_ptr", "conf_jump")
        tables = dict(zip(names, (tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.conf_ptr, tt.conf_jump)))
        tables.update(e_uv=e[0], e_up=e[1], e_up_off=e[2], e_dn=e[3], e_dn_off=e[4])
        tables.update(t_in_ptr=p[0], t_in_e=p[1], t_out_ptr=p[2], t_out_e=p[3])
        return tables

    def may_have_free_blocks(self, t: int) -> bool:
        """False when every block of task ``t`` surely reads some upstream block."""
        for k, (_u, d) in enumerate(self.edges):
            if d != t:
                continue
            for ax in range(self.layouts[t].ndim):
                o = self.e[2][k, ax]
                iv = self.e[1][o : o + int(self.layouts[t].grid_shape[ax])]
                if np.any(iv[:, 1] <= iv[:, 0]):
                    return True
        return False

    def describe(self, t: int, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(block ids, read offsets, read shapes, write offsets, write shapes)`` of task ``t``'s ``rows``."""
        nd = self.ndim[t]
        n = len(rows)
        ids = np.empty(n, np.int64)
        ro, wo, rs, ws = (np.empty((n, nd), np.int64) for _ in range(4))
        tt = self.tt
        kg.describe_rows(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, t, rows, ids, ro, wo, rs, ws)
        return ids, ro, rs, wo, ws

    def row_of_id(self, t: int, block_id: int) -> int | None:
        """The row of the block with id ``block_id`` in task ``t``, or None if it is not one of its blocks."""
        g = block_id_to_grid(self.layouts[t], int(block_id))
        if g is None:
            return None
        tt = self.tt
        return int(kg.grid_to_row(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, t, np.asarray(g, np.int64)))

    def row_of_block(self, t: int, block: Block) -> int:
        """The row of ``block`` (by its write ROI) in task ``t``; ``ValueError`` if it is none of its blocks."""
        g = self.layouts[t].grid_of_write_offset(block._write[0])
        if g is None:
            raise ValueError(f"block {block.block_id} is not a block of task {self.task_ids[t]!r}")
        tt = self.tt
        return int(kg.grid_to_row(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, t, g))

    def rows_in_grid_box(self, t: int, lo: Sequence[int], hi: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, block ids)`` of task ``t``'s blocks at grid positions in ``[lo, hi)`` (C order), clipped."""
        lay = self.layouts[t]
        nd = lay.ndim
        lo_c = [max(0, min(int(lo[d]), int(lay.grid_shape[d]))) for d in range(nd)]
        hi_c = [max(lo_c[d], min(int(hi[d]), int(lay.grid_shape[d]))) for d in range(nd)]
        n = 1
        for d in range(nd):
            n *= hi_c[d] - lo_c[d]
        tt = self.tt
        maxnd = tt.geo.shape[2]
        lo_a, hi_a = np.zeros(maxnd, np.int64), np.zeros(maxnd, np.int64)
        lo_a[:nd], hi_a[:nd] = lo_c, hi_c
        rows, ids = np.empty(n, np.int64), np.empty(n, np.int64)
        if not n:
            return rows, ids
        k = kg.grid_box_rows(tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, t, lo_a, hi_a, rows, ids)
        return rows[:k], ids[:k]

    def block_rois(self, t: int, block_id: int) -> dict | None:
        """``{"read_roi", "write_roi"}`` (offset/shape lists) of block ``block_id`` of task ``t``, or None."""
        row = self.row_of_id(t, block_id)
        if row is None:
            return None
        _, ro, rs, wo, ws = self.describe(t, np.full(1, row, np.int64))
        return {
            "read_roi": {"offset": ro[0].tolist(), "shape": rs[0].tolist()},
            "write_roi": {"offset": wo[0].tolist(), "shape": ws[0].tolist()},
        }
