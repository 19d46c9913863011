"""Pictures of block states for the dashboard: small uint8 grids, computed on request.

A task's block grid is reduced to at most a few ten thousand *pixels* (the same
layouts as :func:`daisy_nb.plot_block_states`: 1-D as a wrapped strip, 2-D as an
image, 3-D and more as panels of consecutive slices along axis 0). A pixel keeps
the *worst* state of its blocks (``FAILED > ORPHANED > PROCESSING > WAITING >
DONE > SKIPPED``) and the fraction of its blocks that are done, so a lone failed
block in a 10^8-block task stays visible and a half-done region looks half done.
The two layers travel as zlib-compressed, base64 uint8 arrays in the JSON (block
states compress to a few hundred bytes); the page draws them on a ``<canvas>``.
No image library is needed, and nothing is sent block by block.

Sources of codes, both streamed in slabs along axis 0 (a few MiB at a time):

* :func:`live_slabs`: the scheduler's status bytes. A task's rows are stored
  level by level (``enumerate_all_dependencies`` order); level ``l`` is the
  strided sub-grid ``level_offsets[l] + j * period`` with ``j`` in C order over
  ``level_counts[l]``, so each level is scattered into the slab with one strided
  numpy assignment (no per-block Python, no kernel).
* :func:`tracking_slabs`: a block-tracking store (``done`` / ``failures``).

This module reads the scheduler's arrays without locking: a byte may change
while it is read, which at worst shows a block one state late.
"""

from __future__ import annotations

import base64
import math
import zlib

import numpy as np

from daisy_nb.kernels import tables as kt

__all__ = ["CODE_NAMES", "PictureLayout", "live_slabs", "picture", "tracking_slabs"]

# display codes, in priority order (a reduced pixel shows the maximum)
NONE, SKIPPED, DONE, WAITING, PROCESSING, ORPHANED, FAILED = range(7)
CODE_NAMES = ["none", "skipped", "done", "waiting", "processing", "orphaned", "failed"]

# scheduler status byte (kernels/tables.py) -> code
# index: status | (preskip != 0) << 3 ; a done block with a preskip flag was skipped
_PRESKIP_SHIFT = 3
_LIVE_LUT = np.full(256, WAITING, np.uint8)
for _status, _code in (
    (kt.PENDING, WAITING),
    (kt.READY, WAITING),
    (kt.PROCESSING, PROCESSING),
    (kt.DONE, DONE),
    (kt.FAILED, FAILED),
    (kt.ORPHANED, ORPHANED),
):
    _LIVE_LUT[_status] = _code
    _LIVE_LUT[_status | 1 << _PRESKIP_SHIFT] = SKIPPED if _status == kt.DONE else _code
del _status, _code

SLAB_CELLS = 1 << 22  # cells per slab (4 MiB of codes)
STRIP_W = 400
STRIP_ROWS = 100
MAX_PANELS = 8


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class PictureLayout:
    """How a grid of ``shape`` is reduced: ``panels x h x w`` pixels.

    ``kind`` is ``"strip"`` (1-D), ``"image"`` (2-D) or ``"slices"`` (3-D and
    more; leading axes are flattened into ``z``, ``z_factor`` slices per panel).
    ``factor`` is blocks per pixel along each displayed axis.
    """

    def __init__(self, shape):
        self.shape = tuple(int(v) for v in shape)
        nd = len(self.shape)
        self.nd = nd
        if nd == 1:
            n = self.shape[0]
            self.kind = "strip"
            self.factor = max(1, _ceil(n, STRIP_W * STRIP_ROWS))
            m = _ceil(n, self.factor)
            self.w = max(1, min(m, STRIP_W))
            self.h = max(1, _ceil(m, self.w))
            self.nz, self.z_factor, self.panels = 1, 1, 1
        elif nd == 2:
            y, x = self.shape
            self.kind = "image"
            self.factor = max(1, _ceil(y, 320), _ceil(x, 480))
            self.h, self.w = max(1, _ceil(y, self.factor)), max(1, _ceil(x, self.factor))
            self.nz, self.z_factor, self.panels = 1, 1, 1
        else:
            self.kind = "slices"
            self.nz = math.prod(self.shape[:-2])
            y, x = self.shape[-2:]
            p = max(1, min(self.nz, MAX_PANELS))
            self.z_factor = max(1, _ceil(self.nz, p))
            self.panels = max(1, _ceil(self.nz, self.z_factor))
            side = 320 if self.panels <= 2 else (220 if self.panels <= 4 else 160)
            self.factor = max(1, _ceil(y, side), _ceil(x, side))
            self.h, self.w = max(1, _ceil(y, self.factor)), max(1, _ceil(x, self.factor))

    def rows_per_slab(self, cells: int = SLAB_CELLS) -> int:
        """Rows of axis 0 per slab; a multiple of ``factor`` for 1-D and 2-D grids."""
        inner = math.prod(self.shape[1:]) if self.nd > 1 else 1
        k = max(1, cells // max(1, inner))
        if self.nd <= 2:
            k = max(self.factor, k - k % self.factor)
        else:  # whole panels per slab: z0 = a0 * per is then a multiple of z_factor
            per = math.prod(self.shape[1:-2])
            step = self.z_factor // math.gcd(self.z_factor, per)
            k = max(step, k - k % step)
        return k

    def panel_label(self, k: int) -> str:
        if self.kind != "slices":
            return ""
        a, b = k * self.z_factor, min(self.nz, (k + 1) * self.z_factor) - 1
        name = "z" if self.nd == 3 else "slice"
        return f"{name} {a}" if a == b else f"{name} {a}–{b}"

    def pixel_box(self, panel: int, r: int, c: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The grid boxes ``(lo, hi)`` a pixel covers (several for grids of more than 3 axes)."""
        f, s = self.factor, self.shape
        if not (0 <= panel < self.panels and 0 <= r < self.h and 0 <= c < self.w):
            raise IndexError("pixel outside the picture")
        if self.kind == "strip":
            j = r * self.w + c
            lo = j * f
            if lo >= s[0]:
                return []
            return [((lo,), (min(s[0], lo + f),))]
        y0, x0 = r * f, c * f
        y1, x1 = min(s[-2], y0 + f), min(s[-1], x0 + f)
        if y0 >= y1 or x0 >= x1:
            return []
        if self.kind == "image":
            return [((y0, x0), (y1, x1))]
        z0, z1 = panel * self.z_factor, min(self.nz, (panel + 1) * self.z_factor)
        if self.nd == 3:
            return [((z0, y0, x0), (z1, y1, x1))]
        out = []
        for z in range(z0, z1):
            lead = np.unravel_index(z, s[:-2])
            lo = tuple(int(v) for v in lead) + (y0, x0)
            out.append((lo, tuple(v + 1 for v in lo[:-2]) + (y1, x1)))
        return out


class _Reducer:
    def __init__(self, lay: PictureLayout):
        self.lay = lay
        self.worst = np.zeros((lay.panels, lay.h, lay.w), np.uint8)
        self.done = np.zeros((lay.panels, lay.h, lay.w), np.int32)
        self.counts = np.zeros(len(CODE_NAMES), np.int64)

    @staticmethod
    def _plane(a: np.ndarray, fy: int, fx: int):
        """(k, Y, X) codes -> per-pixel worst code and done count, (k, ceil(Y/fy), ceil(X/fx))."""
        if fy == 1 and fx == 1:
            return a, ((a >= SKIPPED) & (a <= DONE)).view(np.uint8)
        k, y, x = a.shape
        py, px = (-y) % fy, (-x) % fx
        if py or px:
            a = np.pad(a, ((0, 0), (0, py), (0, px)), constant_values=NONE)
        r = a.reshape(k, (y + py) // fy, fy, (x + px) // fx, fx)
        worst = r.max(axis=(2, 4))
        done = ((r >= SKIPPED) & (r <= DONE)).sum(axis=(2, 4), dtype=np.int32)
        return worst, done

    def add(self, a0: int, codes: np.ndarray) -> None:
        """Codes of rows ``[a0, a0 + len(codes))`` of axis 0 (shape ``(k, *shape[1:])``)."""
        lay = self.lay
        self.counts += np.bincount(codes.reshape(-1), minlength=len(CODE_NAMES))
        f = lay.factor
        if lay.nd == 1:
            worst, done = self._plane(codes.reshape(1, 1, -1), 1, f)
            j0 = a0 // f
            n = worst.shape[2]
            self.worst.reshape(-1)[j0 : j0 + n] = np.maximum(self.worst.reshape(-1)[j0 : j0 + n], worst[0, 0])
            self.done.reshape(-1)[j0 : j0 + n] += done[0, 0]
        elif lay.nd == 2:
            worst, done = self._plane(codes.reshape(1, *codes.shape), f, f)
            r0 = a0 // f
            n = worst.shape[1]
            self.worst[0, r0 : r0 + n] = np.maximum(self.worst[0, r0 : r0 + n], worst[0])
            self.done[0, r0 : r0 + n] += done[0]
        else:
            per = math.prod(lay.shape[1:-2])
            flat = codes.reshape(-1, *lay.shape[-2:])
            worst, done = self._plane(flat, f, f)
            z0, fz = a0 * per, lay.z_factor
            k = worst.shape[0]
            if z0 % fz == 0:  # slabs hold whole panels (rows_per_slab): group by a reshape
                pad = (-k) % fz
                if pad:
                    worst = np.concatenate([worst, np.zeros((pad, *worst.shape[1:]), worst.dtype)])
                    done = np.concatenate([done, np.zeros((pad, *done.shape[1:]), done.dtype)])
                wp = worst.reshape(-1, fz, *worst.shape[1:]).max(axis=1)
                dp = done.reshape(-1, fz, *done.shape[1:]).sum(axis=1, dtype=np.int32)
            else:
                starts = np.unique(np.r_[0, np.arange((-z0) % fz, k, fz)]).astype(np.intp)
                wp = np.maximum.reduceat(worst, starts, axis=0)
                dp = np.add.reduceat(done.astype(np.int32), starts, axis=0)
            g0 = z0 // fz
            g1 = g0 + len(wp)
            self.worst[g0:g1] = np.maximum(self.worst[g0:g1], wp)
            self.done[g0:g1] += dp

    def cells_per_pixel(self) -> np.ndarray:
        lay = self.lay

        def widths(n, f, m):
            w = np.full(m, f, np.int64)
            if m:
                w[-1] = n - f * (m - 1)
            return np.maximum(w, 0)

        if lay.nd == 1:
            m = _ceil(lay.shape[0], lay.factor)
            flat = np.zeros(lay.h * lay.w, np.int64)
            flat[:m] = widths(lay.shape[0], lay.factor, m)
            return flat.reshape(1, lay.h, lay.w)
        wy = widths(lay.shape[-2], lay.factor, lay.h)
        wx = widths(lay.shape[-1], lay.factor, lay.w)
        wz = widths(lay.nz, lay.z_factor, lay.panels) if lay.nd >= 3 else np.ones(1, np.int64)
        return wz[:, None, None] * wy[None, :, None] * wx[None, None, :]


def _pack(a: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.ascontiguousarray(a, np.uint8).tobytes(), 6)).decode("ascii")


def picture(shape, slabs) -> dict:
    """The JSON-ready picture of a grid of ``shape`` from ``slabs(layout)`` -> ``(a0, codes)`` pieces.

    Keys: ``kind``, ``shape``, ``factor``, ``z_factor``, ``panels`` (labels),
    ``h``, ``w``, ``codes`` (worst code per pixel) and ``done`` (done fraction
    x 255 per pixel), both ``panels x h x w`` uint8, zlib + base64; ``counts``
    (blocks per state name, unreduced) and ``legend`` (code names by value).
    """
    lay = PictureLayout(shape)
    red = _Reducer(lay)
    if math.prod(lay.shape):
        for a0, codes in slabs(lay):
            red.add(a0, codes)
    cells = red.cells_per_pixel()
    frac = np.where(cells > 0, (red.done * 255) // np.maximum(cells, 1), 0).astype(np.uint8)
    return {
        "kind": lay.kind,
        "shape": list(lay.shape),
        "factor": lay.factor,
        "z_factor": lay.z_factor,
        "panels": [lay.panel_label(k) for k in range(lay.panels)],
        "h": lay.h,
        "w": lay.w,
        "codes": _pack(red.worst),
        "done": _pack(frac),
        "counts": {name: int(red.counts[i]) for i, name in enumerate(CODE_NAMES) if i != NONE},
        "legend": CODE_NAMES,
    }


# ---------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------


def live_codes(layout, status: np.ndarray, preskip: np.ndarray, a0: int, a1: int) -> np.ndarray:
    """Display codes of grid rows ``[a0, a1)`` of axis 0, from one task's status bytes.

    ``layout`` is the task's :class:`~daisy_nb.layout.BlockLayout`; ``status`` and
    ``preskip`` are the task's slices (``num_blocks`` bytes, row order).
    """
    grid = tuple(int(v) for v in layout.grid_shape)
    out = np.full((a1 - a0, *grid[1:]), WAITING, np.uint8)
    per = layout.period
    for lev in range(layout.num_levels):
        off, cnt = layout.level_offsets[lev], layout.level_counts[lev]
        if not cnt.all():
            continue
        p0, o0 = int(per[0]), int(off[0])
        ja = max(0, _ceil(a0 - o0, p0))
        jb = min(int(cnt[0]), _ceil(a1 - o0, p0))
        if ja >= jb:
            continue
        inner = math.prod(int(v) for v in cnt[1:])
        start = int(layout.level_start[lev])
        st = status[start + ja * inner : start + jb * inner]
        sk = preskip[start + ja * inner : start + jb * inner]
        key = np.minimum(sk, 1)
        key <<= _PRESKIP_SHIFT
        key |= st
        codes = _LIVE_LUT.take(key)
        sel = [slice(o0 + ja * p0 - a0, o0 + (jb - 1) * p0 - a0 + 1, p0)]
        for d in range(1, len(grid)):
            o, p, c = int(off[d]), int(per[d]), int(cnt[d])
            sel.append(slice(o, o + (c - 1) * p + 1, p))
        out[tuple(sel)] = codes.reshape(jb - ja, *(int(v) for v in cnt[1:]))
    return out


def live_slabs(layout, status: np.ndarray, preskip: np.ndarray):
    """``slabs`` for :func:`picture` over one task's live status bytes."""

    def gen(lay: PictureLayout):
        n0 = lay.shape[0]
        k = lay.rows_per_slab()
        for a0 in range(0, n0, k):
            yield a0, live_codes(layout, status, preskip, a0, min(n0, a0 + k))

    return gen


def tracking_slabs(reader, lo=None, hi=None, failed_out: list | None = None, max_failed: int = 30):
    """``slabs`` for :func:`picture` over a tracking store (``daisy_nb.status`` reader).

    ``lo``/``hi``: the task's block box in tracking cells (None: the whole tracking grid).
    Done cells are DONE, cells with failures and not done FAILED, the rest WAITING.
    ``failed_out`` collects ``(cell, failures)`` of the first ``max_failed`` FAILED cells.
    """
    grid = reader.grid_shape
    lo = tuple(lo) if lo is not None else (0,) * len(grid)
    hi = tuple(hi) if hi is not None else tuple(grid)
    inner = math.prod(grid[1:])
    crop = tuple(slice(a, b) for a, b in zip(lo[1:], hi[1:]))

    def gen(lay: PictureLayout):
        for r0, d, f in reader.slabs(lo, hi, lay.rows_per_slab() * inner):
            a0 = r0 - lo[0]
            d, f = d[(slice(None), *crop)], f[(slice(None), *crop)]
            codes = np.where(d != 0, DONE, np.where(f != 0, FAILED, WAITING)).astype(np.uint8)
            if failed_out is not None and len(failed_out) < max_failed:
                for idx in np.argwhere(codes == FAILED)[: max_failed - len(failed_out)]:
                    cell = tuple(int(v) + int(o) for v, o in zip((idx[0] + a0, *idx[1:]), lo))
                    failed_out.append((cell, int(f[tuple(idx)])))
            yield a0, codes

    return gen
