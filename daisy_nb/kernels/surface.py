"""The ready surface on arrays: which blocks of a pipeline are ready, done or orphaned.

daisy keeps two sets (surface and boundary) and asks the dependency graph for
upstream/downstream lists on every step (docs/explanation/algorithms.md#ready-surface). Here the state of
every block of every task lives in flat arrays indexed by a *global* block index
``gi = block_base[t] + row``:

* ``status``  uint8[N]   PENDING, READY, PROCESSING, DONE, FAILED, ORPHANED (``tables.py``)
* ``n_met``   int32[N]   how many of the block's upstream blocks succeeded
* ``retries`` uint8[N]   failed attempts so far
* ``preskip`` uint8[N]   non-zero: skip at acquire (recorded done / skip_mask)
* ``queue``   int64[N]   one FIFO ring buffer per task, in that task's slice
* ``cnt``     int64[T, N_CNT]  per-task counters and queue pointers
* ``tcfg``    int64[T, N_CFG]  per-task settings (max_retries, run state)

A block becomes ready when ``n_met`` reaches its upstream count, computed on the
fly from the geometry (intra-task conflicts plus, per upstream task, the product of
per-axis interval lengths), so no dependency lists are stored. Downstream blocks
are found the same way: intra-task through the conflict offsets of the next
level, inter-task through per-axis interval tables (``e_dn``) that are the exact
inverse of the upstream tables (``e_up``); this fixes daisy's asymmetric-context
and far-edge defects (docs/explanation/defects.md#downstream-context) by construction.

Orphans: a permanent failure orphans exactly the PENDING blocks that transitively
depend on it; a block is orphaned at most once (fixes docs/explanation/defects.md#orphans).

The Scheduler calls :func:`step` (acquire, release, and their one-block forms) and
:func:`fail_block`; the arrays above are views into two packed buffers (see the
section "packed state" below for why).
"""

import numpy as np

from ._jit import flat_kernel, inline_kernel, kernel, plain_twin
from .graph import cantor, describe_rows_into, grid_to_row, row_level, row_to_counter
from .surface_plain import PlainSurface, of_buffers
from .tables import (
    C_COMPLETED,
    C_FAILED,
    C_GIVEN,
    C_NEXT_ROOT,
    C_ORPHANED,
    C_PROC,
    C_QHEAD,
    C_QLEN,
    C_READY,
    C_ROOTS_LEFT,
    C_SKIPPED,
    C_STARTED,
    DONE,
    F_MAX_RETRIES,
    F_STATE,
    FAILED,
    G_GRID,
    G_IDOFF,
    G_PERIOD,
    I_BLOCK_BASE,
    I_LEVEL_BASE,
    I_NBLOCKS,
    I_NDIM,
    I_NLEVELS,
    I_NROOTS,
    OP_ACQUIRE,
    OP_ACQUIRE_ONE,
    OP_RELEASE_ONE,
    ORPHANED,
    P_BUF_ID,
    P_BUF_J,
    P_BUF_LEV,
    P_BUF_ROW,
    P_BUF_T,
    P_CNT,
    P_CONF_JUMP,
    P_CONF_PTR,
    P_E_DN,
    P_E_DN_OFF,
    P_E_UP,
    P_E_UP_OFF,
    P_E_UV,
    P_GEO,
    P_INFO,
    P_LVL_CNT,
    P_LVL_OFF,
    P_LVL_START,
    P_N,
    P_QUEUE,
    P_ROW1,
    P_SCR,
    P_TCFG,
    P_TIN_E,
    P_TIN_PTR,
    P_TOUT_E,
    P_TOUT_PTR,
    PENDING,
    PROCESSING,
    R_FAILED,
    R_SKIPPED,
    R_SUCCESS,
    RC_FAILED_AT,
    RC_SCRATCH,
    READY,
    RETRIES_MAX,
    RUNNING,
    U8_CODE1,
    U8_PRESKIP,
    U8_RETRIES,
    U8_STATUS,
)


@kernel
def _grid_of_row(geo, info, lvl_off, lvl_cnt, lvl_start, t, row, j, g):
    """Fill counter ``j`` and grid position ``g`` of ``row``; return its level."""
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    lev = row_to_counter(info, lvl_cnt, lvl_start, t, row, j)
    for d in range(nd):
        g[d] = lvl_off[lb + lev, d] + j[d] * geo[t, G_PERIOD, d]
    return lev


@kernel
def n_upstream(geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_up, e_up_off, t_in_ptr, t_in_e, t, row):
    """Number of upstream blocks (intra-task + every upstream task) of ``row`` in task ``t``."""
    j = np.empty((1, info[t, I_NDIM]), dtype=np.int64)
    lev = row_to_counter(info, lvl_cnt, lvl_start, t, row, j[0])
    return _n_up_lj(geo, info, lvl_off, lvl_cnt, conf_ptr, conf_jump, e_up, e_up_off, t_in_ptr, t_in_e, t, lev, j, 0)


@inline_kernel
def _push_back(queue, cnt, info, t, row):
    nt = info[t, I_NBLOCKS]
    base = info[t, I_BLOCK_BASE]
    queue[base + (cnt[t, C_QHEAD] + cnt[t, C_QLEN]) % nt] = row
    cnt[t, C_QLEN] += 1


@kernel
def _push_front(queue, cnt, info, t, row):
    nt = info[t, I_NBLOCKS]
    base = info[t, I_BLOCK_BASE]
    h = (cnt[t, C_QHEAD] - 1) % nt
    cnt[t, C_QHEAD] = h
    queue[base + h] = row
    cnt[t, C_QLEN] += 1


@inline_kernel
def _pop(queue, cnt, info, t):
    """Next block of task ``t``: given-back blocks (the first ``C_GIVEN`` FIFO entries),
    then roots (lazily, in order), then the FIFO; -1 if none."""
    if cnt[t, C_GIVEN] > 0:
        cnt[t, C_GIVEN] -= 1
    elif cnt[t, C_ROOTS_LEFT] > 0:
        row = cnt[t, C_NEXT_ROOT]
        cnt[t, C_NEXT_ROOT] += 1
        cnt[t, C_ROOTS_LEFT] -= 1
        return row
    if cnt[t, C_QLEN] > 0:
        h = cnt[t, C_QHEAD]
        row = queue[info[t, I_BLOCK_BASE] + h]
        cnt[t, C_QHEAD] = (h + 1) % info[t, I_NBLOCKS]
        cnt[t, C_QLEN] -= 1
        return row
    return -1


@inline_kernel
def _n_up_lj(geo, info, lvl_off, lvl_cnt, conf_ptr, conf_jump, e_up, e_up_off, t_in_ptr, t_in_e, t, lev, jarr, ji):
    """Upstream count of the block at level ``lev`` with in-level counter ``jarr[ji]`` (no allocation)."""
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    n = 0
    if lev > 0:
        pl = lb + lev - 1
        for c in range(conf_ptr[lb + t + lev], conf_ptr[lb + t + lev + 1]):
            ok = True
            for d in range(nd):
                jj = jarr[ji, d] + conf_jump[c, d]
                if jj < 0 or jj >= lvl_cnt[pl, d]:
                    ok = False
                    break
            if ok:
                n += 1
    for k in range(t_in_ptr[t], t_in_ptr[t + 1]):
        e = t_in_e[k]
        p = 1
        for d in range(nd):
            o = e_up_off[e, d] + lvl_off[lb + lev, d] + jarr[ji, d] * geo[t, G_PERIOD, d]
            p *= e_up[o, 1] - e_up[o, 0]
            if p == 0:
                break
        n += p
    return n


@inline_kernel
def _down_lj(geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_dn, e_dn_off, t_out_ptr, t_out_e, t, row,
             scr, out_t, out_row, out_lev, out_j):
    """All downstream blocks of ``row``: intra-task, then per downstream task.

    Writes (task, row, level, in-level counter) of each into the out arrays without
    allocating. ``scr``: int64[8, maxnd] scratch; row 0 holds the counter of the
    last row seen and row 7 its (task, row, level) memo (batches release runs of
    rows). Scratch rows are indexed in place, never sliced: every array view costs
    two atomic reference-count updates. Returns the count, or -needed when the out
    arrays are too small."""
    nd = info[t, I_NDIM]
    lb = info[t, I_LEVEL_BASE]
    L = info[t, I_NLEVELS]
    if scr[7, 0] == t and scr[7, 1] + 1 == row and row < lvl_start[lb + t + scr[7, 2] + 1]:
        lev = scr[7, 2]
        for d in range(nd - 1, -1, -1):
            scr[0, d] += 1
            if scr[0, d] < lvl_cnt[lb + lev, d]:
                break
            scr[0, d] = 0
    else:
        lev = row_level(info, lvl_start, t, row)
        rank = row - lvl_start[lb + t + lev]
        for d in range(nd - 1, -1, -1):
            c = lvl_cnt[lb + lev, d]
            scr[0, d] = rank % c
            rank //= c
    scr[7, 0] = t
    scr[7, 1] = row
    scr[7, 2] = lev
    cap = out_row.shape[0]
    n = 0
    if lev + 1 < L:
        nl = lb + lev + 1
        st = lvl_start[lb + t + lev + 1]
        for c in range(conf_ptr[lb + t + lev + 1], conf_ptr[lb + t + lev + 2]):
            ok = True
            rank = 0
            for d in range(nd):
                jd = scr[0, d] - conf_jump[c, d]
                if jd < 0 or jd >= lvl_cnt[nl, d]:
                    ok = False
                    break
                rank = rank * lvl_cnt[nl, d] + jd
            if ok:
                if n < cap:
                    out_t[n] = t
                    out_lev[n] = lev + 1
                    for d in range(nd):
                        out_j[n, d] = scr[0, d] - conf_jump[c, d]
                    out_row[n] = st + rank
                n += 1
    if t_out_ptr[t] < t_out_ptr[t + 1]:
        # scratch rows: 1 grid position, 3 lo, 4 hi, 5 running position
        for d in range(nd):
            scr[1, d] = lvl_off[lb + lev, d] + scr[0, d] * geo[t, G_PERIOD, d]
        for k in range(t_out_ptr[t], t_out_ptr[t + 1]):
            e = t_out_e[k]
            v = e_uv[e, 1]
            vnd = info[v, I_NDIM]
            vlb = info[v, I_LEVEL_BASE]
            vL = info[v, I_NLEVELS]
            total = 1
            for d in range(vnd):
                o = e_dn_off[e, d] + scr[1, d]
                scr[3, d] = e_dn[o, 0]
                scr[4, d] = e_dn[o, 1]
                scr[5, d] = scr[3, d]
                total *= max(0, scr[4, d] - scr[3, d])
            for _ in range(total):
                if n < cap:
                    idx = 0
                    for d in range(vnd):
                        kk = geo[v, G_PERIOD, d]
                        idx = idx * kk + scr[5, d] % kk
                    vlev = vL - 1 - idx
                    rank = 0
                    for d in range(vnd):
                        jd = (scr[5, d] - lvl_off[vlb + vlev, d]) // geo[v, G_PERIOD, d]
                        out_j[n, d] = jd
                        rank = rank * lvl_cnt[vlb + vlev, d] + jd
                    out_t[n] = v
                    out_lev[n] = vlev
                    out_row[n] = lvl_start[vlb + v + vlev] + rank
                n += 1
                for d in range(vnd - 1, -1, -1):
                    scr[5, d] += 1
                    if scr[5, d] < scr[4, d]:
                        break
                    scr[5, d] = scr[3, d]
    if n > cap:
        return -n
    return n


@kernel
def _on_success(T, S, W, t, row):
    """Propagate a success: count it at every downstream block; queue those now ready.

    ``n_met[gi]`` holds 0 until a block is first reached, then (unmet upstream
    blocks + 1): the upstream count is computed once per block, not once per
    upstream success. Newly ready blocks are appended to their task's FIFO in
    increasing spatial ID order (daisy sorts ``downstream()`` by spatial ID).
    Returns 0, or -needed when the scratch buffers are too small (nothing changed then).
    """
    (tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_up, e_up_off, e_dn, e_dn_off,
     t_in_ptr, t_in_e, t_out_ptr, t_out_e) = T
    status, n_met, retries, preskip, queue, cnt, tcfg = S
    scr, buf_t, buf_row, buf_id, buf_lev, buf_j = W
    n = _down_lj(tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_dn, e_dn_off, t_out_ptr, t_out_e, t, row,
                 scr, buf_t, buf_row, buf_lev, buf_j)
    if n < 0:
        return n
    m = 0
    for i in range(n):
        v = buf_t[i]
        gi = info[v, I_BLOCK_BASE] + buf_row[i]
        if status[gi] != PENDING or tcfg[v, F_STATE] != RUNNING:
            continue
        rem = n_met[gi]
        if rem == 0:
            rem = _n_up_lj(tt_geo, info, lvl_off, lvl_cnt, conf_ptr, conf_jump, e_up, e_up_off, t_in_ptr, t_in_e, v, buf_lev[i], buf_j, i) + 1
        rem -= 1
        n_met[gi] = rem
        if rem == 1:
            buf_t[m] = v
            buf_row[m] = buf_row[i]
            buf_lev[m] = buf_lev[i]
            for d in range(info[v, I_NDIM]):
                buf_j[m, d] = buf_j[i, d]
            m += 1
    if m > 1:
        # order by (task, spatial id): IDs only for the few blocks that became ready
        x = scr[6]
        for i in range(m):
            v = buf_t[i]
            vnd = info[v, I_NDIM]
            vlb = info[v, I_LEVEL_BASE]
            for d in range(vnd):
                x[d] = lvl_off[vlb + buf_lev[i], d] + buf_j[i, d] * tt_geo[v, G_PERIOD, d] + tt_geo[v, G_IDOFF, d]
            buf_id[i] = cantor(x, vnd)
        for i in range(1, m):  # insertion sort: m is small
            kt = buf_t[i]
            kid = buf_id[i]
            kr = buf_row[i]
            p = i - 1
            while p >= 0 and (buf_t[p] > kt or (buf_t[p] == kt and buf_id[p] > kid)):
                buf_t[p + 1] = buf_t[p]
                buf_id[p + 1] = buf_id[p]
                buf_row[p + 1] = buf_row[p]
                p -= 1
            buf_t[p + 1] = kt
            buf_id[p + 1] = kid
            buf_row[p + 1] = kr
    for i in range(m):
        v = buf_t[i]
        status[info[v, I_BLOCK_BASE] + buf_row[i]] = READY
        _push_back(queue, cnt, info, v, buf_row[i])
        cnt[v, C_READY] += 1
    return 0


@kernel
def fail_block(T, S, W, t, row):
    """Fail ``row`` of task ``t`` for good (it is PROCESSING): orphan every PENDING block
    that transitively depends on it, then count it failed. Returns the orphan count, or
    ``RC_SCRATCH`` if the scratch buffers were too small (nothing is counted failed then).

    Not part of :func:`step`: the walk needs a stack that grows, so this kernel keeps
    numba's runtime. The Scheduler calls it with the ``(T, S, W)`` tuples of views of
    the packed buffers (``tables.groups``), the same tuples ``step`` builds.
    """
    (tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_up, e_up_off, e_dn, e_dn_off,
     t_in_ptr, t_in_e, t_out_ptr, t_out_e) = T
    status, n_met, retries, preskip, queue, cnt, tcfg = S
    scr, buf_t, buf_row, buf_id, buf_lev, buf_j = W
    scr[7, 0] = -1  # no memo of a previous row
    stack_t = np.empty(16, dtype=np.int64)
    stack_r = np.empty(16, dtype=np.int64)
    stack_t[0] = t
    stack_r[0] = row
    sp = 1
    total = 0
    while sp > 0:
        sp -= 1
        u = stack_t[sp]
        r = stack_r[sp]
        n = _down_lj(tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_dn, e_dn_off, t_out_ptr, t_out_e, u, r,
                     scr, buf_t, buf_row, buf_lev, buf_j)
        if n < 0:
            return RC_SCRATCH
        for i in range(n):
            v = buf_t[i]
            gi = info[v, I_BLOCK_BASE] + buf_row[i]
            if status[gi] == PENDING:
                status[gi] = ORPHANED
                if tcfg[v, F_STATE] == RUNNING:
                    cnt[v, C_ORPHANED] += 1
                total += 1
                if sp == stack_t.shape[0]:
                    stack_t = np.concatenate((stack_t, np.empty(sp, dtype=np.int64)))
                    stack_r = np.concatenate((stack_r, np.empty(sp, dtype=np.int64)))
                stack_t[sp] = v
                stack_r[sp] = buf_row[i]
                sp += 1
    status[info[t, I_BLOCK_BASE] + row] = FAILED
    cnt[t, C_PROC] -= 1
    cnt[t, C_FAILED] += 1
    return total


@kernel
def _release(T, S, W, t, rows, codes, start):
    """Release blocks ``rows[start:]`` (int64[k]) of task ``t`` with ``codes`` (uint8[k]).

    Codes: R_SUCCESS, R_SKIPPED (success, also counted as skipped), R_FAILED (an attempt
    failed: retried at the back of the FIFO until ``max_retries`` is used up, then
    permanently failed and its dependents orphaned), R_GIVE_BACK (never started:
    back to the front of the FIFO, no attempt counted). Releases of blocks not in
    PROCESSING, or of an abandoned task, are ignored (daisy's typestate gate).

    A block that fails for good stops the release: it returns ``RC_FAILED_AT - i`` with
    block ``i`` still PROCESSING, and the caller runs :func:`fail_block` on it (the
    orphan walk needs a stack this allocation-free kernel cannot grow), then calls
    again with ``start = i + 1``. Give-backs are handled once every other block is
    released. Returns the number of blocks, or ``RC_SCRATCH`` if the scratch buffers
    were too small for a downstream list (the scheduler sizes them from the geometry
    so that this cannot happen).
    """
    (tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_up, e_up_off, e_dn, e_dn_off,
     t_in_ptr, t_in_e, t_out_ptr, t_out_e) = T
    status, n_met, retries, preskip, queue, cnt, tcfg = S
    scr, buf_t, buf_row, buf_id, buf_lev, buf_j = W
    scr[7, 0] = -1  # no memo of a previous row
    for i in range(start, rows.shape[0]):
        r = rows[i]
        gi = info[t, I_BLOCK_BASE] + r
        code = codes[i]
        if code != R_SUCCESS and code != R_SKIPPED and code != R_FAILED:
            continue  # give back: below
        if status[gi] != PROCESSING or tcfg[t, F_STATE] != RUNNING:
            continue
        if code == R_SUCCESS or code == R_SKIPPED:
            if _on_success(T, S, W, t, r) < 0:
                return RC_SCRATCH
            status[gi] = DONE
            cnt[t, C_PROC] -= 1
            cnt[t, C_COMPLETED] += 1
            if code == R_SKIPPED:
                cnt[t, C_SKIPPED] += 1
        elif code == R_FAILED:
            if retries[gi] >= tcfg[t, F_MAX_RETRIES]:
                return RC_FAILED_AT - i
            else:
                if retries[gi] < RETRIES_MAX:
                    retries[gi] += 1
                status[gi] = READY
                _push_back(queue, cnt, info, t, r)
                cnt[t, C_PROC] -= 1
                cnt[t, C_READY] += 1
    # give-backs last and in reverse, so that they come out next and in their order
    for i in range(rows.shape[0] - 1, -1, -1):
        code = codes[i]
        if code == R_SUCCESS or code == R_SKIPPED or code == R_FAILED:
            continue
        r = rows[i]
        gi = info[t, I_BLOCK_BASE] + r
        if status[gi] != PROCESSING or tcfg[t, F_STATE] != RUNNING:
            continue
        status[gi] = READY
        _push_front(queue, cnt, info, t, r)
        cnt[t, C_GIVEN] += 1  # handed out before the remaining roots (see _pop)
        cnt[t, C_PROC] -= 1
        cnt[t, C_READY] += 1
    return rows.shape[0]


@kernel
def _acquire(T, S, W, t, max_n, out_rows):
    """Hand out up to ``max_n`` ready blocks of task ``t`` (rows written to ``out_rows``).

    Order: roots first, then FIFO (daisy's ProcessingQueue). Blocks flagged in
    ``preskip`` (recorded done, or masked) are skipped on the way: counted as
    completed and skipped, and their success propagated, as daisy's precheck does.
    Returns the count, or ``RC_SCRATCH`` when the scratch buffers were too small (the
    block that needed them is given back first; cannot happen with the sizes the
    scheduler computes).
    """
    (tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_up, e_up_off, e_dn, e_dn_off,
     t_in_ptr, t_in_e, t_out_ptr, t_out_e) = T
    status, n_met, retries, preskip, queue, cnt, tcfg = S
    scr, buf_t, buf_row, buf_id, buf_lev, buf_j = W
    if tcfg[t, F_STATE] != RUNNING:
        return 0
    scr[7, 0] = -1
    n = 0
    while n < max_n:
        r = _pop(queue, cnt, info, t)
        if r < 0:
            break
        gi = info[t, I_BLOCK_BASE] + r
        cnt[t, C_READY] -= 1
        cnt[t, C_PROC] += 1
        cnt[t, C_STARTED] = 1
        if preskip[gi] != 0:
            if _on_success(T, S, W, t, r) < 0:
                # scratch buffers too small (cannot happen with the sizes the scheduler
                # computes): undo the pop and report
                _push_front(queue, cnt, info, t, r)
                cnt[t, C_GIVEN] += 1
                cnt[t, C_READY] += 1
                cnt[t, C_PROC] -= 1
                return RC_SCRATCH
            status[gi] = DONE
            cnt[t, C_PROC] -= 1
            cnt[t, C_COMPLETED] += 1
            cnt[t, C_SKIPPED] += 1
            continue
        status[gi] = PROCESSING
        out_rows[n] = r
        n += 1
    return n


@kernel
def seed_free_blocks(tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_up, e_up_off, t_in_ptr, t_in_e,
                     status, queue, cnt, t):
    """Queue the level-0 blocks of a downstream task that have no upstream block at all.

    daisy never runs them (docs/explanation/defects.md#unread-blocks); here they are ready from the start, in
    enumeration order. Returns how many were queued.
    """
    n = 0
    for r in range(info[t, I_NROOTS]):
        if n_upstream(tt_geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_up, e_up_off, t_in_ptr, t_in_e, t, r) == 0:
            status[info[t, I_BLOCK_BASE] + r] = READY
            _push_back(queue, cnt, info, t, r)
            cnt[t, C_READY] += 1
            n += 1
    return n


@kernel
def flag_grid_cells(tt_geo, info, lvl_off, lvl_cnt, lvl_start, t, cells, cell_shape, shift, flags, value):
    """Set ``flags[gi] |= value`` for every block whose cell in ``cells`` is non-zero.

    cells: uint8[prod(cell_shape)] C-order over a grid of shape cell_shape (int64[nd]);
    a cell c maps to grid position ``c - shift`` (shift = the ID offset for tracking
    arrays, 0 for skip masks). Cells outside the block grid are ignored. Returns the
    number of blocks flagged.
    """
    nd = info[t, I_NDIM]
    c = np.zeros(nd, dtype=np.int64)
    g = np.zeros(nd, dtype=np.int64)
    base = info[t, I_BLOCK_BASE]
    n = 0
    for i in range(cells.shape[0]):
        if cells[i] != 0:
            rem = i
            inside = True
            for d in range(nd - 1, -1, -1):
                c[d] = rem % cell_shape[d]
                rem //= cell_shape[d]
                g[d] = c[d] - shift[d]
                if g[d] < 0 or g[d] >= tt_geo[t, G_GRID, d]:
                    inside = False
            if inside:
                flags[base + grid_to_row(tt_geo, info, lvl_off, lvl_cnt, lvl_start, t, g)] |= value
                n += 1
    return n


@kernel
def rows_to_cells(tt_geo, info, lvl_off, lvl_cnt, lvl_start, t, rows, cell_shape, shift, out):
    """C-order cell index (in a grid of ``cell_shape``, cell = grid + shift) of each row; -1 if outside."""
    nd = info[t, I_NDIM]
    j = np.empty(nd, dtype=np.int64)
    g = np.empty(nd, dtype=np.int64)
    for i in range(rows.shape[0]):
        _grid_of_row(tt_geo, info, lvl_off, lvl_cnt, lvl_start, t, rows[i], j, g)
        lin = 0
        for d in range(nd):
            cd = g[d] + shift[d]
            if cd < 0 or cd >= cell_shape[d]:
                lin = -1
                break
            lin = lin * cell_shape[d] + cd
        out[i] = lin
    return rows.shape[0]


# -- packed state: the scheduler's entry point ----------------------------------------
#
# numba unboxes every array argument on each call (~60 ns each), and the state above
# is 30 arrays: that alone cost more than the work of acquiring or releasing one
# block. The scheduler therefore keeps every int64 array (tables, FIFO, counters,
# scratch) in one buffer ``b`` and the uint8 state (status, retries, preskip, one
# release code) in another ``u8``; ``step`` takes those two plus ``n_met`` and
# rebuilds the views inside the kernel (a slice and a reshape each). The layout of
# both buffers is declared once, in ``tables.PACKED_INT64`` (slot numbers ``P_*``,
# header, Python-side views). The views are written out here: an inlined helper
# returning one would cost ~60 ms of compile time per use.


@flat_kernel
def step(b, u8, n_met, op, t, x, y, rows, codes):
    """The scheduler's one entry point, on packed state (one compiled body, one call per step).

    * ``OP_ACQUIRE``: up to ``x`` ready rows of task ``t`` into ``rows``; returns the count
      (as :func:`_acquire`).
    * ``OP_RELEASE``: release ``rows[x:]`` with ``codes``; returns as :func:`_release`
      (``<= RC_FAILED_AT``: run :func:`fail_block` on the block at ``tables.failed_at(rc)``,
      then step again after it).
    * ``OP_ACQUIRE_ONE``: one block, described in ``rows`` = int64[2 + 4 * nd] as (row,
      spatial id, read offset, read shape, write offset, write shape); returns 1, 0 when
      nothing is ready, or ``RC_SCRATCH`` as acquire.
    * ``OP_RELEASE_ONE``: release row ``x`` with code ``y`` (no arrays to build).
    """
    N = b[P_N]
    geo = b[b[4 * P_GEO] : b[4 * P_GEO + 1]].reshape((-1, b[4 * P_GEO + 2], b[4 * P_GEO + 3]))
    info = b[b[4 * P_INFO] : b[4 * P_INFO + 1]].reshape((-1, b[4 * P_INFO + 2]))
    lvl_off = b[b[4 * P_LVL_OFF] : b[4 * P_LVL_OFF + 1]].reshape((-1, b[4 * P_LVL_OFF + 2]))
    lvl_cnt = b[b[4 * P_LVL_CNT] : b[4 * P_LVL_CNT + 1]].reshape((-1, b[4 * P_LVL_CNT + 2]))
    lvl_start = b[b[4 * P_LVL_START] : b[4 * P_LVL_START + 1]]
    conf_ptr = b[b[4 * P_CONF_PTR] : b[4 * P_CONF_PTR + 1]]
    conf_jump = b[b[4 * P_CONF_JUMP] : b[4 * P_CONF_JUMP + 1]].reshape((-1, b[4 * P_CONF_JUMP + 2]))
    e_uv = b[b[4 * P_E_UV] : b[4 * P_E_UV + 1]].reshape((-1, b[4 * P_E_UV + 2]))
    e_up = b[b[4 * P_E_UP] : b[4 * P_E_UP + 1]].reshape((-1, b[4 * P_E_UP + 2]))
    e_up_off = b[b[4 * P_E_UP_OFF] : b[4 * P_E_UP_OFF + 1]].reshape((-1, b[4 * P_E_UP_OFF + 2]))
    e_dn = b[b[4 * P_E_DN] : b[4 * P_E_DN + 1]].reshape((-1, b[4 * P_E_DN + 2]))
    e_dn_off = b[b[4 * P_E_DN_OFF] : b[4 * P_E_DN_OFF + 1]].reshape((-1, b[4 * P_E_DN_OFF + 2]))
    t_in_ptr = b[b[4 * P_TIN_PTR] : b[4 * P_TIN_PTR + 1]]
    t_in_e = b[b[4 * P_TIN_E] : b[4 * P_TIN_E + 1]]
    t_out_ptr = b[b[4 * P_TOUT_PTR] : b[4 * P_TOUT_PTR + 1]]
    t_out_e = b[b[4 * P_TOUT_E] : b[4 * P_TOUT_E + 1]]
    queue = b[b[4 * P_QUEUE] : b[4 * P_QUEUE + 1]]
    cnt = b[b[4 * P_CNT] : b[4 * P_CNT + 1]].reshape((-1, b[4 * P_CNT + 2]))
    tcfg = b[b[4 * P_TCFG] : b[4 * P_TCFG + 1]].reshape((-1, b[4 * P_TCFG + 2]))
    buf_t = b[b[4 * P_BUF_T] : b[4 * P_BUF_T + 1]]
    buf_row = b[b[4 * P_BUF_ROW] : b[4 * P_BUF_ROW + 1]]
    buf_id = b[b[4 * P_BUF_ID] : b[4 * P_BUF_ID + 1]]
    scr = b[b[4 * P_SCR] : b[4 * P_SCR + 1]].reshape((-1, b[4 * P_SCR + 2]))
    buf_lev = b[b[4 * P_BUF_LEV] : b[4 * P_BUF_LEV + 1]]
    buf_j = b[b[4 * P_BUF_J] : b[4 * P_BUF_J + 1]].reshape((-1, b[4 * P_BUF_J + 2]))
    T = (geo, info, lvl_off, lvl_cnt, lvl_start, conf_ptr, conf_jump, e_uv, e_up, e_up_off, e_dn, e_dn_off,
         t_in_ptr, t_in_e, t_out_ptr, t_out_e)
    S = (u8[U8_STATUS * N : (U8_STATUS + 1) * N], n_met, u8[U8_RETRIES * N : (U8_RETRIES + 1) * N],
         u8[U8_PRESKIP * N : (U8_PRESKIP + 1) * N], queue, cnt, tcfg)
    W = (scr, buf_t, buf_row, buf_id, buf_lev, buf_j)
    if op == OP_ACQUIRE or op == OP_ACQUIRE_ONE:
        n = _acquire(T, S, W, t, x if op == OP_ACQUIRE else 1, rows)
        if op == OP_ACQUIRE or n != 1:
            return n
        nd = info[t, I_NDIM]
        describe_rows_into(geo, info, lvl_off, lvl_cnt, lvl_start, t, rows[:1], rows[1:2], rows[2 : 2 + nd].reshape((1, nd)),
                           rows[2 + 2 * nd : 2 + 3 * nd].reshape((1, nd)), rows[2 + nd : 2 + 2 * nd].reshape((1, nd)),
                           rows[2 + 3 * nd : 2 + 4 * nd].reshape((1, nd)), scr[:2])
        return 1
    if op == OP_RELEASE_ONE:
        one = b[b[4 * P_ROW1] : b[4 * P_ROW1 + 1]]
        one[0] = x
        code = u8[U8_CODE1 * N : U8_CODE1 * N + 1]
        code[0] = y
        # np.int64(0), not 0: a literal 0 types as Literal[int](0) on Python >= 3.12 and compiles
        # _release a second time (the call below passes an int64)
        return _release(T, S, W, t, one, code, np.int64(0))
    return _release(T, S, W, t, rows, codes, x)


# -- step in plain Python ---------------------------------------------------------------
# Plain mode (small runs, see _jit) runs step as surface_plain.PlainSurface: the same work on
# the same buffers, with Python lists and memoryviews where these kernels, run as Python, pay
# for numpy scalars (~50 of ~55 µs per block acquired and released one by one, 1-D; see that
# module). surface_plain keeps the surface of the last Scheduler that stepped (not this module:
# its globals are copied when numba loads). The kernel's own body stays reachable as _STEP[0]
# (tests compare the two).


def _step_plain(b, u8, n_met, op, t, x, y, rows, codes):
    """:func:`step` for plain mode (:class:`surface_plain.PlainSurface` of these buffers)."""
    return of_buffers(b, u8, n_met).step(op, t, x, y, rows, codes)


def plain_surface(b, u8, n_met) -> PlainSurface:
    """The :class:`surface_plain.PlainSurface` of these buffers, for plain mode (``step is
    PLAIN_STEP[0]``): the Scheduler's per-block and list calls use its list methods directly
    (no array to fill and read back)."""
    return of_buffers(b, u8, n_met)


# the kernel and its twin out of _jit's reach, as graph._LOOP and graph.PLAIN_DESCRIBE
_STEP = (step,)
PLAIN_STEP = (_step_plain,)
step = plain_twin(step, _step_plain)
