"""The ready surface's per-call work in plain Python: what ``surface.step`` is in plain mode.

Plain mode (small runs, ``kernels/_jit.py``) ran ``step``'s kernels as Python functions on the
Scheduler's numpy arrays. Each ``arr[i]`` there costs 100-150 ns and yields a numpy scalar whose
arithmetic costs as much again, and the kernels pass a dozen arrays per call: a block acquired
and released one by one took ~50 µs (1-D) to ~135 µs (3-D, conflicts), against daisy 2.0.0's
~14 µs. :class:`PlainSurface` (the state and what acquiring and releasing do to it) and
:class:`PlainBlocks` (where the blocks are) do the same work on the same buffers, reading

* the tables (geometry, levels, conflict jumps, task edges: written once, when the Scheduler is
  built) as nested Python lists (~25 ns a read), and
* the state (status, ``n_met``, retries, preskip, FIFO, counters, settings) through memoryviews of
  the Scheduler's own arrays (~50 ns a read or write, plain ints): nothing is copied or kept in
  sync, and every other reader or writer of the state (the Scheduler's counts,
  ``surface.fail_block``, abandonment, skip flags) sees the same bytes.

It follows the kernels statement by statement wherever order shows (the FIFO and its give-backs,
roots before queued blocks, newly ready blocks queued by (task, spatial id)); the downstream and
upstream counts are the kernels' (``_down_lj``, ``_n_up_lj``) without their scratch arrays, which
lists replace. tests/test_surface_plain.py drives it in lockstep with ``surface.step`` (compiled,
or its body as Python) and compares the state after every call.

Deliberately not here: failing a block for good (``surface.fail_block``, once per permanent
failure, on the arrays), the one-off set-up kernels (seeding, skip flags), and ``RC_SCRATCH``
(lists grow, so no call runs out of scratch).
"""

from __future__ import annotations

from array import array

from ..block import cantor_of_ints
from .tables import (
    C_COMPLETED,
    C_GIVEN,
    C_NEXT_ROOT,
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
    FIT_SHRINK,
    G_IDOFF,
    G_PERIOD,
    G_RS,
    G_TR_OFF,
    G_TR_SHAPE,
    G_TW_OFF,
    G_TW_SHAPE,
    G_WS,
    I_BLOCK_BASE,
    I_FIT,
    I_LEVEL_BASE,
    I_NBLOCKS,
    I_NDIM,
    I_NLEVELS,
    N_CFG,
    N_CNT,
    OP_ACQUIRE,
    OP_ACQUIRE_ONE,
    OP_RELEASE_ONE,
    P_N,
    PENDING,
    PROCESSING,
    R_FAILED,
    R_SKIPPED,
    R_SUCCESS,
    RC_FAILED_AT,
    READY,
    RETRIES_MAX,
    RUNNING,
    groups,
    unpack_int64,
)

__all__ = ["PlainBlocks", "PlainSurface"]


class _Task:
    """One task's constants, read once from the tables (attributes are faster than table reads)."""

    __slots__ = ("nd", "lb", "sb", "nlevels", "base", "nt", "shrink", "period", "idoff", "tr_off", "tr_end", "tw_off",
                 "tw_end", "rs", "ws", "lone")  # fmt: skip

    def __init__(self, t: int, info: list, geo: list, t_out_ptr: list) -> None:
        nd = self.nd = info[t][I_NDIM]
        self.lb = info[t][I_LEVEL_BASE]  # into lvl_off, lvl_cnt
        self.sb = self.lb + t  # into lvl_start, conf_ptr: one extra entry per task (layout.pack_layouts)
        self.nlevels = info[t][I_NLEVELS]
        self.base = info[t][I_BLOCK_BASE]
        self.nt = info[t][I_NBLOCKS]
        self.shrink = info[t][I_FIT] == FIT_SHRINK
        g = geo[t]
        self.period = g[G_PERIOD][:nd]
        self.idoff = g[G_IDOFF][:nd]
        self.tr_off = g[G_TR_OFF][:nd]
        self.tr_end = [a + b for a, b in zip(g[G_TR_OFF][:nd], g[G_TR_SHAPE][:nd])]
        self.tw_off = g[G_TW_OFF][:nd]
        self.tw_end = [a + b for a, b in zip(g[G_TW_OFF][:nd], g[G_TW_SHAPE][:nd])]
        self.rs = g[G_RS][:nd]
        self.ws = g[G_WS][:nd]
        # no block of this task has anything downstream: one level, no outgoing task edge
        self.lone = self.nlevels <= 1 and t_out_ptr[t] == t_out_ptr[t + 1]


class PlainSurface:
    """``surface.step`` in plain Python, on the buffers ``b``, ``u8`` and ``n_met`` of one Scheduler.

    Built once per Scheduler (:func:`of_buffers` keeps the last one); :meth:`step` takes
    ``step``'s arguments after the buffers and returns what it returns.
    """

    __slots__ = ("b", "u8", "n_met", "status", "nmet", "retries", "preskip", "queue", "cnt", "tcfg", "tasks", "blocks",
                 "describe", "_out")  # fmt: skip

    def __init__(self, b, u8, n_met) -> None:
        self.b, self.u8, self.n_met = b, u8, n_met  # what the cache compares (by identity)
        views = unpack_int64(b)
        status, nmet, retries, preskip, queue, cnt, tcfg = groups(views, u8, n_met, int(b[P_N]))[1]
        self.status = memoryview(status)
        self.retries = memoryview(retries)
        self.preskip = memoryview(preskip)
        self.nmet = memoryview(nmet)
        self.queue = memoryview(queue)
        self.cnt = memoryview(cnt.reshape(-1))  # flat: t * N_CNT + column
        self.tcfg = memoryview(tcfg.reshape(-1))  # flat: t * N_CFG + column
        self.blocks = PlainBlocks(views)
        self.tasks = self.blocks.tasks
        self.describe = self.blocks.describe  # [row, spatial id, *ro, *rs, *wo, *ws] of a row
        self._out: dict[int, tuple] = {}  # id -> (array, its memoryview): the Scheduler's one-block rows

    # -- step's dispatch ------------------------------------------------------------------
    def step(self, op, t, x, y, rows, codes) -> int:
        """As ``surface.step`` (same operations, same results), without ``RC_SCRATCH``."""
        if op == OP_RELEASE_ONE:
            return self.release(t, (x,), (y,), 0)
        if op == OP_ACQUIRE_ONE:
            got = self.acquire(t, 1)
            if not got:
                return 0
            out = self._out.get(id(rows))
            if out is None or out[0] is not rows:  # a memoryview per output row: a third of a numpy slice's cost
                if len(self._out) > 64:
                    self._out.clear()
                mv = memoryview(rows)
                out = self._out[id(rows)] = (rows, mv, mv.format)  # int64: "l" on Linux, "q" on Windows
            d = self.describe(t, got[0])
            out[1][: len(d)] = array(out[2], d)
            return 1
        t = int(t)
        if op == OP_ACQUIRE:
            got = self.acquire(t, int(x))
            rows[: len(got)] = got
            return len(got)
        return self.release(t, rows.tolist(), codes.tolist(), int(x))

    def acquire_described(self, t: int, max_n: int) -> list[list[int]]:
        """Up to ``max_n`` ready blocks of task ``t``, each as :meth:`describe` gives it."""
        describe = self.describe
        out = []
        for r in self.acquire(t, max_n):
            out.append(describe(t, r))
        return out

    # -- the FIFO (kernels: _pop, _push_back, _push_front) ------------------------------------
    def _pop(self, t: int) -> int:
        cnt, c = self.cnt, t * N_CNT
        if cnt[c + C_GIVEN] > 0:
            cnt[c + C_GIVEN] -= 1
        elif cnt[c + C_ROOTS_LEFT] > 0:
            row = cnt[c + C_NEXT_ROOT]
            cnt[c + C_NEXT_ROOT] = row + 1
            cnt[c + C_ROOTS_LEFT] -= 1
            return row
        qlen = cnt[c + C_QLEN]
        if qlen > 0:
            tk = self.tasks[t]
            h = cnt[c + C_QHEAD]
            cnt[c + C_QHEAD] = (h + 1) % tk.nt
            cnt[c + C_QLEN] = qlen - 1
            return self.queue[tk.base + h]
        return -1

    def _push_back(self, t: int, row: int) -> None:
        cnt, c, tk = self.cnt, t * N_CNT, self.tasks[t]
        qlen = cnt[c + C_QLEN]
        self.queue[tk.base + (cnt[c + C_QHEAD] + qlen) % tk.nt] = row
        cnt[c + C_QLEN] = qlen + 1

    def _push_front(self, t: int, row: int) -> None:
        cnt, c, tk = self.cnt, t * N_CNT, self.tasks[t]
        h = (cnt[c + C_QHEAD] - 1) % tk.nt
        cnt[c + C_QHEAD] = h
        self.queue[tk.base + h] = row
        cnt[c + C_QLEN] += 1

    # -- acquire and release (kernels: _acquire, _release) ----------------------------------
    def acquire(self, t: int, max_n: int) -> list[int]:
        """Up to ``max_n`` ready rows of task ``t``, now PROCESSING (preskipped ones completed on the way)."""
        out: list[int] = []
        if self.tcfg[t * N_CFG + F_STATE] != RUNNING:
            return out
        cnt, c, status, preskip = self.cnt, t * N_CNT, self.status, self.preskip
        base = self.tasks[t].base
        while len(out) < max_n:
            r = self._pop(t)
            if r < 0:
                break
            gi = base + r
            cnt[c + C_READY] -= 1
            cnt[c + C_PROC] += 1
            cnt[c + C_STARTED] = 1
            if preskip[gi] != 0:
                self._on_success(t, r)
                status[gi] = DONE
                cnt[c + C_PROC] -= 1
                cnt[c + C_COMPLETED] += 1
                cnt[c + C_SKIPPED] += 1
                continue
            status[gi] = PROCESSING
            out.append(r)
        return out

    def release(self, t: int, rows, codes, start: int) -> int:
        """``_release``: ``rows[start:]`` with ``codes``; ``RC_FAILED_AT - i`` when block ``i`` fails for good."""
        cnt, c, status, retries = self.cnt, t * N_CNT, self.status, self.retries
        base = self.tasks[t].base
        running = self.tcfg[t * N_CFG + F_STATE] == RUNNING
        for i in range(start, len(rows)):
            code = codes[i]
            if code != R_SUCCESS and code != R_SKIPPED and code != R_FAILED:
                continue  # give back: below
            r = rows[i]
            gi = base + r
            if status[gi] != PROCESSING or not running:
                continue
            if code == R_FAILED:
                if retries[gi] >= self.tcfg[t * N_CFG + F_MAX_RETRIES]:
                    return RC_FAILED_AT - i
                if retries[gi] < RETRIES_MAX:
                    retries[gi] += 1
                status[gi] = READY
                self._push_back(t, r)
                cnt[c + C_PROC] -= 1
                cnt[c + C_READY] += 1
            else:
                self._on_success(t, r)
                status[gi] = DONE
                cnt[c + C_PROC] -= 1
                cnt[c + C_COMPLETED] += 1
                if code == R_SKIPPED:
                    cnt[c + C_SKIPPED] += 1
        # give-backs last and in reverse, so that they come out next and in their order
        for i in range(len(rows) - 1, -1, -1):
            code = codes[i]
            if code == R_SUCCESS or code == R_SKIPPED or code == R_FAILED:
                continue
            r = rows[i]
            gi = base + r
            if status[gi] != PROCESSING or not running:
                continue
            status[gi] = READY
            self._push_front(t, r)
            cnt[c + C_GIVEN] += 1  # handed out before the remaining roots (see _pop)
            cnt[c + C_PROC] -= 1
            cnt[c + C_READY] += 1
        return len(rows)

    # -- success: downstream counts (kernels: _on_success, _down_lj, _n_up_lj) ----------------
    def _on_success(self, t: int, row: int) -> None:
        if self.tasks[t].lone:
            return
        status, nmet, tcfg, tasks = self.status, self.nmet, self.tcfg, self.tasks
        ready = []
        blocks = self.blocks
        for v, vrow, vlev, vj in blocks.downstream(t, row):
            gi = tasks[v].base + vrow
            if status[gi] != PENDING or tcfg[v * N_CFG + F_STATE] != RUNNING:
                continue
            rem = nmet[gi]
            if rem == 0:
                rem = blocks.n_upstream(v, vlev, vj) + 1
            rem -= 1
            nmet[gi] = rem
            if rem == 1:
                ready.append((v, vrow, vlev, vj))
        if len(ready) > 1:  # daisy's order: by task, then spatial id (a stable sort, as the kernel's)
            ready.sort(key=blocks.order_key)
        cnt = self.cnt
        for v, vrow, _, _ in ready:
            status[tasks[v].base + vrow] = READY
            self._push_back(v, vrow)
            cnt[v * N_CNT + C_READY] += 1


class PlainBlocks:
    """Where the blocks of a pipeline are, from the packed tables as Python lists (read only): a
    row's level and counter, its ids and ROIs, its downstream blocks and upstream count.

    The kernels' geometry (``graph.row_to_counter``, ``graph.describe_rows_into``,
    ``surface._down_lj``, ``surface._n_up_lj``) for :class:`PlainSurface`, which owns the state.
    """

    __slots__ = ("tasks", "lvl_off", "lvl_cnt", "lvl_start", "conf_ptr", "conf_jump", "e_uv", "e_up", "e_up_off",
                 "e_dn", "e_dn_off", "t_in_ptr", "t_in_e", "t_out_ptr", "t_out_e")  # fmt: skip

    def __init__(self, views: dict) -> None:
        self.lvl_off = views["lvl_off"].tolist()
        self.lvl_cnt = views["lvl_cnt"].tolist()
        self.lvl_start = views["lvl_start"].tolist()
        self.conf_ptr = views["conf_ptr"].tolist()
        self.conf_jump = views["conf_jump"].tolist()
        self.e_uv = views["e_uv"].tolist()
        self.e_up = views["e_up"].tolist()
        self.e_up_off = views["e_up_off"].tolist()
        self.e_dn = views["e_dn"].tolist()
        self.e_dn_off = views["e_dn_off"].tolist()
        self.t_in_ptr = views["t_in_ptr"].tolist()
        self.t_in_e = views["t_in_e"].tolist()
        self.t_out_ptr = views["t_out_ptr"].tolist()
        self.t_out_e = views["t_out_e"].tolist()
        info, geo = views["info"].tolist(), views["geo"].tolist()
        self.tasks = [_Task(t, info, geo, self.t_out_ptr) for t in range(len(info))]

    def order_key(self, entry: tuple) -> tuple[int, int]:
        v, _, vlev, vj = entry
        tk = self.tasks[v]
        off = self.lvl_off[tk.lb + vlev]
        return v, cantor_of_ints([off[d] + vj[d] * tk.period[d] + tk.idoff[d] for d in range(tk.nd)])

    def counter(self, t: int, row: int) -> tuple[int, list[int]]:
        """Level and in-level counter of ``row`` (graph.row_to_counter)."""
        tk = self.tasks[t]
        starts = self.lvl_start
        sb = tk.sb
        lo = 0
        if tk.nlevels > 1:
            hi = tk.nlevels - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if starts[sb + mid] <= row:
                    lo = mid
                else:
                    hi = mid - 1
        rank = row - starts[sb + lo]
        cnt = self.lvl_cnt[tk.lb + lo]
        if tk.nd == 1:
            return lo, [rank % cnt[0]]
        j = [0] * tk.nd
        for d in range(tk.nd - 1, -1, -1):
            rank, j[d] = divmod(rank, cnt[d])
        return lo, j

    def downstream(self, t: int, row: int) -> list[tuple]:
        """(task, row, level, counter) of every downstream block of ``row``: intra-task in the
        conflict offsets' order, then per downstream task (``_down_lj``)."""
        tk = self.tasks[t]
        nd, lb, sb = tk.nd, tk.lb, tk.sb
        lev, j = self.counter(t, row)
        out = []
        if lev + 1 < tk.nlevels:
            ncnt = self.lvl_cnt[lb + lev + 1]
            st = self.lvl_start[sb + lev + 1]
            jumps = self.conf_jump
            for c in range(self.conf_ptr[sb + lev + 1], self.conf_ptr[sb + lev + 2]):
                jump = jumps[c]
                rank = 0
                jn = [0] * nd
                for d in range(nd):
                    jd = j[d] - jump[d]
                    if jd < 0 or jd >= ncnt[d]:
                        break
                    jn[d] = jd
                    rank = rank * ncnt[d] + jd
                else:
                    out.append((t, st + rank, lev + 1, jn))
        t_out_ptr = self.t_out_ptr
        if t_out_ptr[t] < t_out_ptr[t + 1]:
            off = self.lvl_off[lb + lev]
            g = [off[d] + j[d] * tk.period[d] for d in range(nd)]
            for k in range(t_out_ptr[t], t_out_ptr[t + 1]):
                e = self.t_out_e[k]
                v = self.e_uv[e][1]
                vt = self.tasks[v]
                vnd, vlb, vsb, vperiod = vt.nd, vt.lb, vt.sb, vt.period
                dn_off = self.e_dn_off[e]
                lo = [0] * vnd
                hi = [0] * vnd
                total = 1
                for d in range(vnd):
                    iv = self.e_dn[dn_off[d] + g[d]]
                    lo[d], hi[d] = iv[0], iv[1]
                    total *= max(0, iv[1] - iv[0])
                pos = lo[:]
                for _ in range(total):
                    idx = 0
                    for d in range(vnd):
                        kk = vperiod[d]
                        idx = idx * kk + pos[d] % kk
                    vlev = vt.nlevels - 1 - idx
                    voff, vcnt = self.lvl_off[vlb + vlev], self.lvl_cnt[vlb + vlev]
                    rank = 0
                    jn = [0] * vnd
                    for d in range(vnd):
                        jd = (pos[d] - voff[d]) // vperiod[d]
                        jn[d] = jd
                        rank = rank * vcnt[d] + jd
                    out.append((v, self.lvl_start[vsb + vlev] + rank, vlev, jn))
                    for d in range(vnd - 1, -1, -1):
                        pos[d] += 1
                        if pos[d] < hi[d]:
                            break
                        pos[d] = lo[d]
        return out

    def n_upstream(self, t: int, lev: int, j: list[int]) -> int:
        """Upstream blocks (intra-task and of every upstream task) of the block at ``lev``, ``j`` (``_n_up_lj``)."""
        tk = self.tasks[t]
        nd, lb, sb = tk.nd, tk.lb, tk.sb
        n = 0
        if lev > 0:
            pcnt = self.lvl_cnt[lb + lev - 1]
            jumps = self.conf_jump
            for c in range(self.conf_ptr[sb + lev], self.conf_ptr[sb + lev + 1]):
                jump = jumps[c]
                for d in range(nd):
                    jj = j[d] + jump[d]
                    if jj < 0 or jj >= pcnt[d]:
                        break
                else:
                    n += 1
        off = self.lvl_off[lb + lev]
        for k in range(self.t_in_ptr[t], self.t_in_ptr[t + 1]):
            e = self.t_in_e[k]
            up_off = self.e_up_off[e]
            p = 1
            for d in range(nd):
                iv = self.e_up[up_off[d] + off[d] + j[d] * tk.period[d]]
                p *= iv[1] - iv[0]
                if p == 0:
                    break
            n += p
        return n

    # -- one block described (graph.describe_rows_into) ----------------------------------------
    def describe(self, t: int, row: int) -> list[int]:
        """``[row, spatial id, *read offset, *read shape, *write offset, *write shape]`` of ``row``."""
        tk = self.tasks[t]
        lev, j = self.counter(t, row)
        off = self.lvl_off[tk.lb + lev]
        if tk.nd == 1:  # most small runs: no loops, no lists but the result; one axis's Cantor number is its index
            g = off[0] + j[0] * tk.period[0]
            w = tk.ws[0]
            r0 = tk.tr_off[0] + g * w
            w0 = tk.tw_off[0] + g * w
            if tk.shrink:
                return [row, g + tk.idoff[0], r0, min(tk.rs[0], tk.tr_end[0] - r0), w0, min(w, tk.tw_end[0] - w0)]
            return [row, g + tk.idoff[0], r0, tk.rs[0], w0, w]
        x, ro, rs, wo, ws = [], [], [], [], []
        for d in range(tk.nd):
            g = off[d] + j[d] * tk.period[d]
            x.append(g + tk.idoff[d])
            w = tk.ws[d]
            r0 = tk.tr_off[d] + g * w
            w0 = tk.tw_off[d] + g * w
            ro.append(r0)
            wo.append(w0)
            if tk.shrink:
                rs.append(min(tk.rs[d], tk.tr_end[d] - r0))
                ws.append(min(w, tk.tw_end[d] - w0))
            else:
                rs.append(tk.rs[d])
                ws.append(w)
        return [row, cantor_of_ints(x), *ro, *rs, *wo, *ws]


# -- the surface of the Scheduler that stepped last ------------------------------------------
# One entry: a Scheduler's plain calls find their surface here without rebuilding it. It lives
# here, not in ``surface``: when numba loads, the compiled world copies ``surface``'s globals
# (``_jit._compiled_twin``), and a copy taken during a run kept that run's buffers (~12 bytes
# a block) alive for the rest of the process. Its Scheduler drops it when it closes or is
# collected (:func:`forget`).
_last: PlainSurface | None = None


def of_buffers(b, u8, n_met) -> PlainSurface:
    """The :class:`PlainSurface` of these buffers: the last one built if it is theirs."""
    global _last
    p = _last
    if p is None or p.b is not b or p.u8 is not u8 or p.n_met is not n_met:
        p = _last = PlainSurface(b, u8, n_met)
    return p


def forget(b) -> None:
    """Drop the kept surface if it is over buffer ``b`` (its Scheduler is done with it)."""
    global _last
    if _last is not None and _last.b is b:
        _last = None
