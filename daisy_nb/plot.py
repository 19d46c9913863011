"""A picture of block states (done, failed, never run) from block tracking.

:func:`plot_block_states` draws one task's tracking store over its block grid
(or over the whole tracking grid when only a directory is given, see
:mod:`daisy_nb.status`):

* 1-D grids as a strip (wrapped into rows when long);
* 2-D grids as an image, axis 0 downwards, axis 1 to the right;
* 3-D grids as a row of panels, one per group of consecutive z-slices (axis 0),
  each the *worst-state projection* of its slices: a pixel is "failed" if any
  of its blocks failed, else "never run" if any never finished, else "done".
  Grids with more than 3 axes flatten all but the last two axes into z.

Large grids are reduced the same way (square groups of ``f x f`` blocks per
pixel, worst state shown) so that failures stay visible in a 10^6-block run;
the store is streamed in slabs, never loaded whole.

matplotlib is an optional extra (``pip install 'daisy_nb[plot]'``); it is
imported on first use, and drawing uses the Agg canvas (no GUI, no change of
the global backend) unless you pass your own ``ax``.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .status import CHUNK_CELLS, StatusError, TrackingTarget, resolve_target

__all__ = [
    "STATE_COLORS",
    "STATE_DONE",
    "STATE_FAILED",
    "STATE_LABELS",
    "STATE_NEVER",
    "STATE_NONE",
    "STATE_SKIPPED",
    "BlockStateGrid",
    "BlockStatePlot",
    "MissingMatplotlib",
    "block_state_grid",
    "plot_block_states",
]

# State codes, ordered by display priority (a reduced pixel shows its maximum).
STATE_NONE = 0  # not a cell: padding, gaps between panels
STATE_SKIPPED = 1  # skipped by the task's skip_mask (never written to tracking)
STATE_DONE = 2
STATE_NEVER = 3  # not done, no failure recorded: never run, orphaned or interrupted
STATE_FAILED = 4  # failures > 0 and not done

STATE_COLORS = {
    STATE_NONE: "#ffffff",
    STATE_SKIPPED: "#9ecae1",
    STATE_DONE: "#2ca02c",
    STATE_NEVER: "#d0d0d0",
    STATE_FAILED: "#d62728",
}
STATE_LABELS = {
    STATE_DONE: "done",
    STATE_FAILED: "failed (not done)",
    STATE_NEVER: "never finished",
    STATE_SKIPPED: "skipped (skip_mask)",
}

_RGB = np.array([[int(STATE_COLORS[k][i : i + 2], 16) for i in (1, 3, 5)] for k in range(5)], dtype=np.uint8)

# image budget in reduced cells
_MAX_W = 1200
_MAX_H = 800
_MAX_PANELS = 8
_STRIP_W = 1000  # 1-D strips wrap after this many (reduced) cells
_MAX_STRIP_ROWS = 400
_GAP = 1  # blank cells between 3-D panels

# figure layout in pixels
_DPI = 100
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 30, 66, 84
_MIN_W = 560


class MissingMatplotlib(ImportError):
    """matplotlib is not installed (it is the optional ``plot`` extra)."""


def _matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError as e:
        raise MissingMatplotlib(
            f"plotting block states needs matplotlib, which is not installed ({e}); "
            "install the optional extra: pip install 'daisy_nb[plot]' (or pip install matplotlib)"
        ) from None
    return Figure, FigureCanvasAgg, Patch, FuncFormatter, MaxNLocator


# ---------------------------------------------------------------------------
# the state grid
# ---------------------------------------------------------------------------


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _block_max(a: np.ndarray, axis: int, f: int) -> np.ndarray:
    """Max over consecutive groups of ``f`` along ``axis`` (padding with STATE_NONE)."""
    if f == 1:
        return a
    n = a.shape[axis]
    pad = (-n) % f
    if pad:
        widths = [(0, 0)] * a.ndim
        widths[axis] = (0, pad)
        a = np.pad(a, widths, constant_values=STATE_NONE)
    shape = a.shape[:axis] + ((n + pad) // f, f) + a.shape[axis + 1 :]
    return a.reshape(shape).max(axis=axis + 1)


class BlockStateGrid:
    """Block states of one task, reduced for display, and where each block lands.

    Attributes
    ----------
    target : TrackingTarget
        What was read.
    shape : tuple of int
        The plotted grid: the block grid if the task is known, else the tracking grid.
        Cells passed to :meth:`cell_rc` are indices into this grid.
    kind : str
        ``"strip"`` (1-D), ``"image"`` (2-D) or ``"slices"`` (3-D and more).
    factor : int
        Blocks per pixel along each displayed axis (1 = one block per cell).
    z_factor : int
        Slices per panel (``"slices"`` only).
    panels : int
        Number of panels (``"slices"``), or 1.
    codes : ndarray of uint8
        The displayed 2-D array of state codes (``STATE_*``), ``mosaic`` layout.
    counts : dict
        Blocks per state name (``done``, ``failed``, ``never``, ``skipped``), unreduced.
    """

    def __init__(self, target: TrackingTarget, shape, kind, factor, z_factor, panels, codes, counts, strip_width):
        self.target = target
        self.shape = tuple(int(v) for v in shape)
        self.kind = kind
        self.factor = int(factor)
        self.z_factor = int(z_factor)
        self.panels = int(panels)
        self.codes = codes
        self.counts = counts
        self.strip_width = int(strip_width)

    @property
    def panel_width(self) -> int:
        return _ceil(self.shape[-1], self.factor) if self.kind == "slices" else self.codes.shape[1]

    def cell_rc(self, cell) -> tuple[int, int]:
        """(row, column) in :attr:`codes` of a cell of the plotted grid."""
        c = tuple(int(v) for v in np.atleast_1d(cell))
        if len(c) != len(self.shape) or any(not 0 <= v < s for v, s in zip(c, self.shape)):
            raise IndexError(f"cell {c} is outside the plotted grid {self.shape}")
        f = self.factor
        if self.kind == "strip":
            j = c[0] // f
            return j // self.strip_width, j % self.strip_width
        if self.kind == "image":
            return c[0] // f, c[1] // f
        z = int(np.ravel_multi_index(c[:-2], self.shape[:-2]))
        k = z // self.z_factor
        return c[-2] // f, k * (self.panel_width + _GAP) + c[-1] // f

    def panel_label(self, k: int) -> str:
        nz = math.prod(self.shape[:-2])
        a, b = k * self.z_factor, min(nz, (k + 1) * self.z_factor) - 1
        name = "z" if len(self.shape) == 3 else "slice"
        return f"{name} {a}" if a == b else f"{name} {a}-{b}"


def _layout_for(shape: tuple[int, ...]) -> dict[str, int]:
    nd = len(shape)
    if nd == 1:
        n = shape[0]
        f = max(1, _ceil(n, _STRIP_W * _MAX_STRIP_ROWS))
        return {"kind": "strip", "factor": f, "z_factor": 1, "panels": 1}
    if nd == 2:
        f = max(1, _ceil(shape[0], _MAX_H), _ceil(shape[1], _MAX_W))
        return {"kind": "image", "factor": f, "z_factor": 1, "panels": 1}
    nz, ny, nx = math.prod(shape[:-2]), shape[-2], shape[-1]
    p = max(1, min(nz, _MAX_PANELS))
    fz = max(1, _ceil(nz, p))
    p = max(1, _ceil(nz, fz))
    f = max(1, _ceil(ny, _MAX_H), _ceil(nx * p, max(1, _MAX_W - (p - 1) * _GAP)))
    while p * _ceil(nx, f) + (p - 1) * _GAP > _MAX_W and f < nx:
        f += 1
    return {"kind": "slices", "factor": f, "z_factor": fz, "panels": p}


def block_state_grid(task_or_path, *, chunk_cells: int = CHUNK_CELLS) -> BlockStateGrid:
    """Read a task's tracking store into a (reduced) :class:`BlockStateGrid`.

    Accepts what :func:`plot_block_states` accepts. Streams the store.
    """
    target = resolve_target(task_or_path)
    with target.open() as reader:
        grid = reader.grid_shape
        nd = len(grid)
        lo = target.block_lo if target.knows_blocks else (0,) * nd
        hi = target.block_hi if target.knows_blocks else grid
        box = tuple(b - a for a, b in zip(lo, hi))
        lay = _layout_for(box)
        f, fz = lay["factor"], lay["z_factor"]
        # collapsed shape: (n,), (y, x) or (z, y, x)
        if nd <= 2:
            coll = box
            per_row = 1
        else:
            coll = (math.prod(box[:-2]), box[-2], box[-1])
            per_row = math.prod(box[1:-2])
        f0 = fz if nd >= 3 else f
        red = np.zeros((_ceil(coll[0], f0), *(_ceil(n, f) for n in coll[1:])), np.uint8)
        counts = np.zeros(5, np.int64)
        mask = None if target.skip_mask is None else np.asarray(target.skip_mask) != 0
        inner = tuple(slice(a, b) for a, b in zip(lo[1:], hi[1:]))
        if math.prod(box):
            for r0, d, fl in reader.slabs(lo, hi, chunk_cells):
                sel = (slice(None), *inner)
                d, fl = d[sel], fl[sel]
                codes = np.where(d != 0, STATE_DONE, np.where(fl != 0, STATE_FAILED, STATE_NEVER)).astype(np.uint8)
                if mask is not None:
                    m = mask[(slice(r0 - lo[0], r0 - lo[0] + d.shape[0]), *(slice(0, n) for n in box[1:]))]
                    codes[m & (codes == STATE_NEVER)] = STATE_SKIPPED
                counts += np.bincount(codes.reshape(-1), minlength=5)
                s = codes.reshape(-1, *coll[1:])
                for ax in range(1, s.ndim):
                    s = _block_max(s, ax, f)
                a0 = (r0 - lo[0]) * per_row
                k = s.shape[0]
                first = (-a0) % f0
                starts = np.unique(np.r_[0, np.arange(first, k, f0)]).astype(np.intp)
                part = np.maximum.reduceat(s, starts, axis=0)
                g0 = a0 // f0
                red[g0 : g0 + len(starts)] = np.maximum(red[g0 : g0 + len(starts)], part)
    # the displayed 2-D array
    strip_w = 1
    if lay["kind"] == "strip":
        m = red.shape[0]
        strip_w = max(1, min(m, _STRIP_W))
        rows = _ceil(m, strip_w)
        flat = np.full(rows * strip_w, STATE_NONE, np.uint8)
        flat[:m] = red
        mosaic = flat.reshape(rows, strip_w)
    elif lay["kind"] == "image":
        mosaic = red
    else:
        p, pw = lay["panels"], red.shape[2]
        mosaic = np.full((red.shape[1], p * pw + (p - 1) * _GAP), STATE_NONE, np.uint8)
        for k in range(min(p, red.shape[0])):
            c0 = k * (pw + _GAP)
            mosaic[:, c0 : c0 + pw] = red[k]
    names = {"done": STATE_DONE, "failed": STATE_FAILED, "never": STATE_NEVER, "skipped": STATE_SKIPPED}
    cnt = {k: int(counts[v]) for k, v in names.items()}
    return BlockStateGrid(target, box, lay["kind"], f, fz, lay["panels"], mosaic, cnt, strip_w)


# ---------------------------------------------------------------------------
# drawing
# ---------------------------------------------------------------------------


class BlockStatePlot:
    """Result of :func:`plot_block_states`.

    Attributes
    ----------
    figure, ax
        The matplotlib figure and axes drawn into.
    grid : BlockStateGrid
        States, reduction factors, counts.
    file : str or None
        Where the picture was saved.
    size_px : tuple of int or None
        ``(width, height)`` of the saved image in pixels, when this function made
        the figure (None with your own ``ax``).
    cell_px : tuple of int or None
        ``(width, height)`` in pixels of one displayed cell (own figure only).
    """

    def __init__(self, figure, ax, grid: BlockStateGrid, file, size_px, cell_px):
        self.figure = figure
        self.ax = ax
        self.grid = grid
        self.file = file
        self.size_px = size_px
        self.cell_px = cell_px

    def pixel_of(self, cell) -> tuple[float, float]:
        """``(x, y)`` image pixel (from the top-left) at the centre of a plotted-grid cell.

        Valid for the figure as drawn and saved here (not after a
        ``bbox_inches="tight"`` save or a resize).
        """
        r, c = self.grid.cell_rc(cell)
        x, y = self.ax.transData.transform((c, r))
        return float(x), float(self.figure.bbox.height - y)

    def rgb_of(self, state: int) -> tuple[int, int, int]:
        """The colour of a ``STATE_*`` code as 0-255 RGB."""
        return tuple(int(v) for v in _RGB[state])


def _subtitle(g: BlockStateGrid) -> str:
    c = g.counts
    t = g.target
    unit = "blocks" if t.knows_blocks else "tracking cells"
    total = math.prod(g.shape)
    dims = " x ".join(map(str, g.shape))
    parts = [f"{dims} {unit}: {c['done']} done, {c['failed']} failed, {c['never']} never finished"]
    if c["skipped"]:
        parts[0] += f", {c['skipped']} skipped"
    if total and c["done"] + c["skipped"] == total:
        parts[0] += " (complete)"
    if g.factor > 1 or g.z_factor > 1:
        red = []
        if g.factor > 1:
            per = f"{g.factor}x{g.factor}" if g.kind != "strip" else f"{g.factor}"
            red.append(f"{per} blocks per pixel")
        if g.z_factor > 1:
            red.append(f"{g.z_factor} slices per panel")
        parts.append(", ".join(red) + "; worst state shown (failed > never > done)")
    elif g.kind == "slices" and math.prod(g.shape[:-2]) > 1:
        parts.append("one panel per slice along axis 0" if len(g.shape) == 3 else "one panel per slice")
    return "\n".join(parts)


def _decorate(ax, g: BlockStateGrid, FuncFormatter, MaxNLocator) -> None:
    f = g.factor
    for s in ax.spines.values():
        s.set_visible(False)
    ax.tick_params(labelsize=8, length=3)
    scaled = FuncFormatter(lambda v, _pos: f"{int(round(v)) * f}")
    if g.kind == "image":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
        ax.xaxis.set_major_formatter(scaled)
        ax.yaxis.set_major_formatter(scaled)
        ax.set_xlabel("block index, axis 1", fontsize=8)
        ax.set_ylabel("block index, axis 0", fontsize=8)
    elif g.kind == "strip":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
        ax.xaxis.set_major_formatter(scaled)
        if g.codes.shape[0] == 1:
            ax.set_yticks([])
            ax.set_xlabel("block index", fontsize=8)
        else:
            w = g.strip_width
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{int(round(v)) * w * f}"))
            ax.set_xlabel("block index (row start + offset)", fontsize=8)
    else:
        ax.set_xticks([])
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
        ax.yaxis.set_major_formatter(scaled)
        nd = len(g.shape)
        ax.set_ylabel(f"block index, axis {nd - 2}", fontsize=8)
        ax.set_xlabel(
            f"axis {nd - 1} (one panel per slice group of axis 0{'..' + str(nd - 3) if nd > 3 else ''})", fontsize=8
        )
        pw = g.panel_width
        for k in range(g.panels):
            xc = k * (pw + _GAP) + (pw - 1) / 2
            ax.text(
                xc, -0.5, g.panel_label(k), ha="center", va="bottom", fontsize=8, clip_on=False, transform=ax.transData
            )


def _ring_failures(ax, g: BlockStateGrid, cell_px: int) -> None:
    """Circle lone failed cells that are only a few pixels big, so that they are seen.

    Only failed cells without a failed neighbour get a ring (a cluster is visible
    as it is); the rings are hollow, the failed cell itself keeps its colour.
    """
    if cell_px >= 6:
        return
    failed = g.codes == STATE_FAILED
    if not failed.any():
        return
    p = np.pad(failed, 1)
    neighbours = np.zeros_like(failed)
    h, w = failed.shape
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            if dy != 1 or dx != 1:
                neighbours |= p[dy : dy + h, dx : dx + w]
    rows, cols = np.nonzero(failed & ~neighbours)
    if 0 < rows.size <= 2000:
        ax.scatter(
            cols, rows, s=60, facecolors="none", edgecolors=STATE_COLORS[STATE_FAILED], linewidths=1.0, clip_on=False
        )


def _handles(g: BlockStateGrid, Patch):
    states = [STATE_DONE, STATE_FAILED, STATE_NEVER] + ([STATE_SKIPPED] if g.counts["skipped"] else [])
    return [Patch(facecolor=STATE_COLORS[s], edgecolor="#555555", linewidth=0.5, label=STATE_LABELS[s]) for s in states]


def plot_block_states(
    task_or_path: Any,
    file: str | os.PathLike[str] | None = None,
    ax: Any = None,
    *,
    title: str | None = None,
    chunk_cells: int = CHUNK_CELLS,
) -> BlockStatePlot:
    """Draw the block states of one task: done, failed (not done), never finished.

    Parameters
    ----------
    task_or_path
        What to draw:

        * a :class:`~daisy_nb.Task` (uses its resolved tracking path; draws its
          real block grid, cells ``g + cul // write_shape`` of the tracking grid,
          and its ``skip_mask``);
        * a tracking directory (str or Path): draws the whole tracking grid, which
          with context includes cells that are never blocks (drawn "never finished");
        * a ``TaskState`` from ``run_blockwise(..., return_states=True)``, or that
          dict if it has one task: found at ``<tracking basedir>/<task_id>``, so
          it needs ``set_tracking_basedir()`` and the default ``tracking_path``
          (pass the Task when it had an explicit path); tracking grid only;
        * anything with a ``tracking_path`` or ``task`` attribute.
    file : str or Path, optional
        Save the picture there (PNG, or any format matplotlib knows by suffix).
    ax : matplotlib Axes, optional
        Draw into this axes (one image; the legend goes below it). Without it, a
        new figure sized so that each block (or group of blocks) covers whole
        pixels is made on the Agg canvas.
    title : str, optional
        Replaces the default title (``block states: <task>``).
    chunk_cells : int
        Cells read per step from the store.

    Returns
    -------
    BlockStatePlot
        The figure, axes, grid, and :meth:`~BlockStatePlot.pixel_of` to find a
        block in the saved image.

    Raises
    ------
    MissingMatplotlib
        If matplotlib is not installed.
    daisy_nb.status.StatusError
        If there is no tracking store to read.
    """
    Figure, FigureCanvasAgg, Patch, FuncFormatter, MaxNLocator = _matplotlib()
    g = block_state_grid(task_or_path, chunk_cells=chunk_cells)
    if g.codes.size == 0:
        raise StatusError(f"task {g.target.name!r} has no blocks (block grid {list(g.shape)}): nothing to draw")
    rgb = _RGB[g.codes]
    rows, cols = g.codes.shape
    head = title if title is not None else f"block states: {g.target.name}"
    sub = _subtitle(g)
    if ax is not None:
        ax.imshow(rgb, interpolation="nearest", aspect="auto")
        _decorate(ax, g, FuncFormatter, MaxNLocator)
        ax.set_title(f"{head}\n{sub}", fontsize=9)
        ax.legend(
            handles=_handles(g, Patch),
            loc="upper center",
            bbox_to_anchor=(0.5, -0.12),
            ncol=4,
            frameon=False,
            fontsize=8,
        )
        if file is not None:
            ax.figure.savefig(file)
        return BlockStatePlot(ax.figure, ax, g, None if file is None else str(file), None, None)

    # own figure: every displayed cell covers cw x ch whole pixels
    if g.kind == "strip":
        cw = max(1, min(40, 900 // cols))
        ch = max(1, min(40, max(cw, 160 // rows), 640 // rows))  # a 1-row strip gets some height
    else:
        cw = ch = max(1, min(40, 900 // cols, 640 // rows))
    img_w, img_h = cols * cw, rows * ch
    W = max(_MIN_W, _LEFT + img_w + _RIGHT)
    H = _TOP + img_h + _BOTTOM
    left = max(_LEFT, (W - img_w) // 2)
    # a hair over W x H: the canvas size is int(figsize * dpi)
    fig = Figure(figsize=((W + 1e-3) / _DPI, (H + 1e-3) / _DPI), dpi=_DPI, facecolor="white")
    FigureCanvasAgg(fig)
    ax = fig.add_axes((left / W, _BOTTOM / H, img_w / W, img_h / H))
    ax.imshow(rgb, interpolation="nearest", aspect="auto", resample=False)
    _decorate(ax, g, FuncFormatter, MaxNLocator)
    _ring_failures(ax, g, min(cw, ch))
    fig.text(0.5, 1 - 6 / H, head, ha="center", va="top", fontsize=11, fontweight="bold")
    fig.text(0.5, 1 - 24 / H, sub, ha="center", va="top", fontsize=8, linespacing=1.2)
    fig.legend(
        handles=_handles(g, Patch),
        loc="lower center",
        bbox_to_anchor=(0.5, 4 / H),
        ncol=4,
        frameon=False,
        fontsize=8,
        handlelength=1.2,
        columnspacing=1.2,
    )
    if file is not None:
        import matplotlib

        with matplotlib.rc_context({"savefig.bbox": "standard", "savefig.transparent": False}):
            fig.savefig(file, dpi=_DPI, facecolor="white")
    return BlockStatePlot(fig, ax, g, None if file is None else str(file), (W, H), (cw, ch))
