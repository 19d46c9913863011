"""Kernels over one task's block grid: enumeration, IDs, ROIs and intra-task neighbours.

All take the packed :class:`daisy_nb.layout.TaskTables` arrays (``geo, info, lvl_off,
lvl_cnt, lvl_start, conf_ptr, conf_off, conf_jump``) and a task number ``t``. A block
is addressed by its *row* (its position in ``enumerate_all_dependencies()`` order);
its grid position ``g`` (per axis, in blocks from the total write ROI's begin) is
``level_offset + j * period`` where ``j`` is the block's counter inside its level.
"""

import numpy as np

from ._jit import kernel, plain_twin
from .block_id import cantor
from .tables import (
    FIT_SHRINK,
    G_IDOFF,
    G_PERIOD,
    G_RS,
    G_TR_OFF,
    G_TR_SHAPE,
    G_TW_OFF,
    G_TW_SHAPE,
    G_WS,
    I_FIT,
    I_LEVEL_BASE,
    I_NDIM,
    I_NLEVELS,
)


@kernel
def row_level(info, lvl_start, t, row):
    """Level of ``row`` in task ``t`` (binary search over the level start rows)."""
    L = info[t, I_NLEVELS]
    sb = info[t, I_LEVEL_BASE] + t
    lo = 0
    hi = L - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if lvl_start[sb + mid] <= row:
            lo = mid
        else:
            hi = mid - 1
    return lo


@kernel
def row_to_counter(info, lvl_cnt, lvl_start, t, row, out_j):
    """Level and in-level counter (int64[nd], written to ``out_j``) of ``row``."""
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    lev = row_level(info, lvl_start, t, row)
    rank = row - lvl_start[lb + t + lev]
    for d in range(nd - 1, -1, -1):
        c = lvl_cnt[lb + lev, d]
        out_j[d] = rank % c
        rank //= c
    return lev


@kernel
def grid_to_row(geo, info, lvl_off, lvl_cnt, lvl_start, t, g):
    """Row of the block at grid position ``g`` (assumed inside the grid)."""
    nd = info[t, I_NDIM]
    L = info[t, I_NLEVELS]
    lb = info[t, I_LEVEL_BASE]
    idx = 0
    for d in range(nd):
        k = geo[t, G_PERIOD, d]
        idx = idx * k + g[d] % k
    lev = L - 1 - idx
    rank = 0
    for d in range(nd):
        k = geo[t, G_PERIOD, d]
        rank = rank * lvl_cnt[lb + lev, d] + (g[d] - lvl_off[lb + lev, d]) // k
    return lvl_start[lb + t + lev] + rank


@kernel
def counter_to_row(info, lvl_cnt, lvl_start, t, lev, j):
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    rank = 0
    for d in range(nd):
        rank = rank * lvl_cnt[lb + lev, d] + j[d]
    return lvl_start[lb + t + lev] + rank


@kernel
def fill_rows(
    geo,
    info,
    lvl_off,
    lvl_cnt,
    lvl_start,
    conf_ptr,
    conf_jump,
    t,
    row_start,
    row_stop,
    out_id,
    out_level,
    out_read_off,
    out_write_off,
    out_read_shape,
    out_write_shape,
    out_up_ptr,
    out_up_idx,
):
    """Describe rows ``[row_start, row_stop)`` of task ``t`` in enumeration order.

    Outputs (all written, first axis = row - row_start; pass size-0 arrays to skip one):
    out_id int64[n] spatial IDs; out_level int64[n]; out_read_off/out_write_off
    int64[n, nd]; out_read_shape/out_write_shape int64[n, nd] (fit="shrink" only);
    out_up_ptr int64[n + 1] CSR pointers of the intra-task upstream rows, and
    out_up_idx int64[m] the upstream rows in daisy's order (conflict-offset order).
    With ``out_up_idx`` of size 0 only the pointers are written (a counting pass).
    Returns the number of upstream entries.
    """
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    shrink = info[t, I_FIT] == FIT_SHRINK
    n = row_stop - row_start
    want_id = out_id.shape[0] > 0
    want_level = out_level.shape[0] > 0
    want_read = out_read_off.shape[0] > 0
    want_write = out_write_off.shape[0] > 0
    want_shapes = out_read_shape.shape[0] > 0
    want_ptr = out_up_ptr.shape[0] > 0
    want_up = out_up_idx.shape[0] > 0
    j = np.zeros(nd, dtype=np.int64)
    g = np.zeros(nd, dtype=np.int64)
    x = np.zeros(nd, dtype=np.int64)
    m = 0
    if n <= 0:
        if want_ptr:
            out_up_ptr[0] = 0
        return 0
    lev = row_to_counter(info, lvl_cnt, lvl_start, t, row_start, j)
    level_end = lvl_start[lb + t + lev + 1]
    # strides of the previous level's counter, for upstream rows
    pstride = np.zeros(nd, dtype=np.int64)
    if want_ptr:
        out_up_ptr[0] = 0
    for i in range(n):
        row = row_start + i
        while row >= level_end:  # next (non-empty) level
            lev += 1
            level_end = lvl_start[lb + t + lev + 1]
            for d in range(nd):
                j[d] = 0
        if want_id or want_read or want_write or want_shapes:
            for d in range(nd):
                g[d] = lvl_off[lb + lev, d] + j[d] * geo[t, G_PERIOD, d]
                x[d] = g[d] + geo[t, G_IDOFF, d]
        if want_id:
            out_id[i] = cantor(x, nd)
        if want_level:
            out_level[i] = lev
        if want_read or want_write or want_shapes:
            for d in range(nd):
                ro = geo[t, G_TR_OFF, d] + g[d] * geo[t, G_WS, d]
                wo = geo[t, G_TW_OFF, d] + g[d] * geo[t, G_WS, d]
                if want_read:
                    out_read_off[i, d] = ro
                if want_write:
                    out_write_off[i, d] = wo
                if want_shapes:
                    rs = geo[t, G_RS, d]
                    ws = geo[t, G_WS, d]
                    if shrink:
                        rs = min(rs, geo[t, G_TR_OFF, d] + geo[t, G_TR_SHAPE, d] - ro)
                        ws = min(ws, geo[t, G_TW_OFF, d] + geo[t, G_TW_SHAPE, d] - wo)
                    out_read_shape[i, d] = rs
                    out_write_shape[i, d] = ws
        if want_ptr and lev > 0:
            c0 = conf_ptr[lb + t + lev]
            c1 = conf_ptr[lb + t + lev + 1]
            pl = lb + lev - 1
            acc = 1
            for d in range(nd - 1, -1, -1):
                pstride[d] = acc
                acc *= lvl_cnt[pl, d]
            pbase = lvl_start[lb + t + lev - 1]
            for c in range(c0, c1):
                ok = True
                r = pbase
                for d in range(nd):
                    jj = j[d] + conf_jump[c, d]
                    if jj < 0 or jj >= lvl_cnt[pl, d]:
                        ok = False
                        break
                    r += jj * pstride[d]
                if ok:
                    if want_up:
                        out_up_idx[m] = r
                    m += 1
        if want_ptr:
            out_up_ptr[i + 1] = m
        # advance the in-level counter, rightmost axis fastest
        for d in range(nd - 1, -1, -1):
            j[d] += 1
            if j[d] < lvl_cnt[lb + lev, d]:
                break
            j[d] = 0
    return m


@kernel
def intra_neighbours(geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, t, row, downstream, out_rows):
    """Intra-task upstream (``downstream=False``) or downstream rows of one block.

    Order: the conflict offsets' order (daisy's). out_rows int64[>= 2**nd], written.
    Returns the count.
    """
    nd = info[t, I_NDIM]
    L = info[t, I_NLEVELS]
    lb = info[t, I_LEVEL_BASE]
    j = np.zeros(nd, dtype=np.int64)
    lev = row_to_counter(info, lvl_cnt, lvl_start, t, row, j)
    if downstream:
        other = lev + 1
        sign = -1
        cl = lev + 1
    else:
        other = lev - 1
        sign = 1
        cl = lev
    if other < 0 or other >= L:
        return 0
    c0 = conf_ptr[lb + t + cl]
    c1 = conf_ptr[lb + t + cl + 1]
    n = 0
    jj = np.zeros(nd, dtype=np.int64)
    for c in range(c0, c1):
        ok = True
        for d in range(nd):
            jj[d] = j[d] + sign * conf_jump[c, d]
            if jj[d] < 0 or jj[d] >= lvl_cnt[lb + other, d]:
                ok = False
                break
        if ok:
            out_rows[n] = counter_to_row(info, lvl_cnt, lvl_start, t, other, jj)
            n += 1
    return n


@kernel
def grid_box_rows(geo, info, lvl_off, lvl_cnt, lvl_start, t, lo, hi, out_rows, out_ids):
    """Rows and IDs of the blocks at grid positions in the box ``[lo, hi)``.

    Box positions are visited in C order (rightmost axis fastest); lo/hi int64[nd]
    must lie inside the grid. out_rows/out_ids int64[prod(hi - lo)]. Returns the count.
    """
    nd = info[t, I_NDIM]
    n = 1
    for d in range(nd):
        if hi[d] <= lo[d]:
            return 0
        n *= hi[d] - lo[d]
    g = lo.copy()
    x = np.zeros(nd, dtype=np.int64)
    for i in range(n):
        out_rows[i] = grid_to_row(geo, info, lvl_off, lvl_cnt, lvl_start, t, g)
        for d in range(nd):
            x[d] = g[d] + geo[t, G_IDOFF, d]
        out_ids[i] = cantor(x, nd)
        for d in range(nd - 1, -1, -1):
            g[d] += 1
            if g[d] < hi[d]:
                break
            g[d] = lo[d]
    return n


@kernel
def rows_to_grid(info, lvl_off, lvl_cnt, lvl_start, geo, t, rows, out_g):
    """Grid positions (int64[n, nd], written) of the given rows."""
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    j = np.zeros(nd, dtype=np.int64)
    for i in range(rows.shape[0]):
        lev = row_to_counter(info, lvl_cnt, lvl_start, t, rows[i], j)
        for d in range(nd):
            out_g[i, d] = lvl_off[lb + lev, d] + j[d] * geo[t, G_PERIOD, d]
    return rows.shape[0]


@kernel
def describe_rows(
    geo,
    info,
    lvl_off,
    lvl_cnt,
    lvl_start,
    t,
    rows,
    out_id,
    out_read_off,
    out_write_off,
    out_read_shape,
    out_write_shape,
):
    """IDs and ROIs of arbitrary rows (int64[n]); outputs as in :func:`fill_rows`, all written."""
    scr = np.zeros((2, info[t, I_NDIM]), dtype=np.int64)
    return describe_rows_into(
        geo,
        info,
        lvl_off,
        lvl_cnt,
        lvl_start,
        t,
        rows,
        out_id,
        out_read_off,
        out_write_off,
        out_read_shape,
        out_write_shape,
        scr,
    )


@kernel
def describe_rows_into(
    geo,
    info,
    lvl_off,
    lvl_cnt,
    lvl_start,
    t,
    rows,
    out_id,
    out_read_off,
    out_write_off,
    out_read_shape,
    out_write_shape,
    scr,
):
    """:func:`describe_rows` with caller-provided scratch ``scr`` (int64[2, >= nd]): allocates nothing."""
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    shrink = info[t, I_FIT] == FIT_SHRINK
    j = scr[0]
    x = scr[1]
    for i in range(rows.shape[0]):
        lev = row_to_counter(info, lvl_cnt, lvl_start, t, rows[i], j)
        for d in range(nd):
            g = lvl_off[lb + lev, d] + j[d] * geo[t, G_PERIOD, d]
            x[d] = g + geo[t, G_IDOFF, d]
            ro = geo[t, G_TR_OFF, d] + g * geo[t, G_WS, d]
            wo = geo[t, G_TW_OFF, d] + g * geo[t, G_WS, d]
            out_read_off[i, d] = ro
            out_write_off[i, d] = wo
            rs = geo[t, G_RS, d]
            ws = geo[t, G_WS, d]
            if shrink:
                rs = min(rs, geo[t, G_TR_OFF, d] + geo[t, G_TR_SHAPE, d] - ro)
                ws = min(ws, geo[t, G_TW_OFF, d] + geo[t, G_TW_SHAPE, d] - wo)
            out_read_shape[i, d] = rs
            out_write_shape[i, d] = ws
        out_id[i] = cantor(x, nd)
    return rows.shape[0]


# Below this many rows the loop above is cheaper in plain Python than numpy's per-call overhead.
_VECTOR_ROWS = 8


def _describe_rows_plain(
    geo,
    info,
    lvl_off,
    lvl_cnt,
    lvl_start,
    t,
    rows,
    out_id,
    out_read_off,
    out_write_off,
    out_read_shape,
    out_write_shape,
    scr,
):
    """:func:`describe_rows_into` for plain mode: the same arithmetic as array operations over
    all rows at once. Run as plain Python, the loop above costs 10 µs per row of a 1-D task and
    33 µs of a 3-D one, mostly numpy scalar indexing; this costs 1-4 µs per row from ~20 rows
    (batches of a pool, a TCP server's releases). Every intermediate is the loop's, in int64,
    so the results are identical (tests/test_graph.py checks both against the reference)."""
    n = rows.shape[0]
    if n < _VECTOR_ROWS:
        return _LOOP[0](
            geo, info, lvl_off, lvl_cnt, lvl_start, t, rows, out_id, out_read_off, out_write_off,
            out_read_shape, out_write_shape, scr,
        )  # fmt: skip
    nd = int(info[t, I_NDIM])
    lb = int(info[t, I_LEVEL_BASE])
    starts = lvl_start[lb + t : lb + t + int(info[t, I_NLEVELS])]
    lev = np.searchsorted(starts, rows, side="right") - 1  # row_level's binary search
    np.clip(lev, 0, len(starts) - 1, out=lev)
    rank = rows - starts[lev]
    cnt = lvl_cnt[lb + lev, :nd]
    j = np.empty((n, nd), np.int64)
    for d in range(nd - 1, -1, -1):  # row_to_counter
        j[:, d] = rank % cnt[:, d]
        rank = rank // cnt[:, d]
    g = lvl_off[lb + lev, :nd] + j * geo[t, G_PERIOD, :nd]
    ws = geo[t, G_WS, :nd]
    ro = geo[t, G_TR_OFF, :nd] + g * ws
    wo = geo[t, G_TW_OFF, :nd] + g * ws
    out_read_off[:n, :nd] = ro
    out_write_off[:n, :nd] = wo
    if info[t, I_FIT] == FIT_SHRINK:
        out_read_shape[:n, :nd] = np.minimum(geo[t, G_RS, :nd], geo[t, G_TR_OFF, :nd] + geo[t, G_TR_SHAPE, :nd] - ro)
        out_write_shape[:n, :nd] = np.minimum(ws, geo[t, G_TW_OFF, :nd] + geo[t, G_TW_SHAPE, :nd] - wo)
    else:
        out_read_shape[:n, :nd] = geo[t, G_RS, :nd]
        out_write_shape[:n, :nd] = ws
    x = g + geo[t, G_IDOFF, :nd]  # cantor, term by term with the same divisions
    s = x[:, 0].copy()
    total = s.copy()
    for k in range(2, nd + 1):
        s += x[:, k - 1]
        c = np.ones(n, np.int64)
        for i in range(1, k + 1):
            c = c * (s + i - 1) // i
        total += c
    out_id[:n] = total
    return n


# The loop and its twin, out of _jit's reach: switching modes rebinds every module global
# that is a kernel or a twin (tests call the twin as PLAIN[0] in either mode).
_LOOP = (describe_rows_into,)
PLAIN_DESCRIBE = (_describe_rows_plain,)
describe_rows_into = plain_twin(describe_rows_into, _describe_rows_plain)
del _describe_rows_plain
