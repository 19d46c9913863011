"""Hypothesis strategies for daisy task geometry (single tasks and small pipelines).

Configs are plain dicts of Python ints and tuples, so both the reference twins
(``tests/reference``), the Numba layer and a daisy 2.0.0 comparison script can
consume them:

* :func:`graph_configs` draws one task:
  ``{"total_roi", "read_roi", "write_roi", "read_write_conflict", "fit"}`` with
  ROIs as ``((offset...), (shape...))``;
* :func:`pipeline_configs` draws 1-3 task DAGs (single task, chain, fan-in,
  fan-out, diamond): ``{"tasks": {task_id: config | {"max_retries": int}},
  "edges": [(up, down), ...]}``.

Contexts are non-negative (the block write ROI lies inside the read ROI), as
daisy users write them; daisy 2.0 accepts negative contexts but then produces
duplicate block IDs (CORE 8.6), which no test here relies on.
"""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

try:  # imported as ``tests.strategies``
    from .reference.graph import FITS, RefGraph
except ImportError:  # imported as top-level ``strategies`` (pytest rootdir-relative sys.path)
    from reference.graph import FITS, RefGraph

__all__ = ["graph_configs", "num_blocks_of", "pipeline_configs", "ref_graph"]


def ref_graph(config: dict) -> RefGraph:
    """Build the reference graph (CORE 3) of a config drawn by :func:`graph_configs`."""
    return RefGraph(
        config["total_roi"], config["read_roi"], config["write_roi"], config["read_write_conflict"], config["fit"]
    )


def num_blocks_of(config: dict) -> int:
    """Analytic number of blocks of a config (CORE 3.7), without enumerating."""
    return ref_graph(config).num_blocks


@st.composite
def _axis(draw, max_blocks_axis: int, allow_degenerate: bool):
    """One axis: ``(ws, cul, clr, write extent Ts, total offset, template read offset)`` (CORE 0)."""
    ws = draw(st.integers(1, 6))
    if draw(st.booleans()):
        cul = clr = draw(st.integers(0, ws + 3))
    else:
        cul = draw(st.integers(0, ws + 3))
        clr = draw(st.integers(0, ws + 3))
    n = draw(st.integers(0 if allow_degenerate else 1, max_blocks_axis))
    rem = draw(st.integers(0, ws - 1))
    ts = n * ws + rem
    if allow_degenerate and draw(st.integers(0, 19)) == 0:
        # TW empty or inverted: the total is smaller than the context (CORE 9).
        ts = -draw(st.integers(0, cul + clr)) if cul + clr > 0 else 0
    offset = draw(st.integers(-30, 30))
    template = draw(st.integers(-20, 20))
    return ws, cul, clr, ts, offset, template


@st.composite
def graph_configs(
    draw,
    max_ndim: int = 3,
    max_blocks: int = 500,
    allow_4d: bool = True,
    allow_degenerate: bool = True,
    fits=FITS,
    conflict=None,
):
    """Draw a valid single-task config (dict of plain tuples; the inputs of CORE 3.1).

    1 to ``max_ndim`` axes (plus, now and then, 4 axes when ``allow_4d``); write
    shape 1-6 per axis; context per side 0..ws+3, symmetric about half the
    time; total and template offsets in [-30, 30] and [-20, 20]; any fit
    (restricted to ``fits``); conflict drawn unless ``conflict`` is given.
    Configs with more than ``max_blocks`` blocks are rejected with ``assume``.
    With ``allow_degenerate`` the write extent may be smaller than one block,
    zero or negative (zero-block and zero-level graphs, CORE 9).
    """
    ndim = draw(st.integers(1, max_ndim))
    if allow_4d and draw(st.integers(0, 9)) == 0:
        ndim = 4
    per_axis_cap = max(1, round(max_blocks ** (1.0 / ndim)) + 1)
    axes = [draw(_axis(per_axis_cap, allow_degenerate)) for _ in range(ndim)]
    ws = tuple(a[0] for a in axes)
    cul = tuple(a[1] for a in axes)
    clr = tuple(a[2] for a in axes)
    ts = tuple(a[3] for a in axes)
    total_offset = tuple(a[4] for a in axes)
    template = tuple(a[5] for a in axes)
    config = {
        "total_roi": (total_offset, tuple(t + a + b for t, a, b in zip(ts, cul, clr))),
        "read_roi": (template, tuple(w + a + b for w, a, b in zip(ws, cul, clr))),
        "write_roi": (tuple(o + a for o, a in zip(template, cul)), ws),
        "read_write_conflict": draw(st.booleans()) if conflict is None else bool(conflict),
        "fit": draw(st.sampled_from(list(fits))),
    }
    assume(num_blocks_of(config) <= max_blocks)
    return config


_SHAPES = {
    1: [("single", [])],
    2: [("chain", [("a", "b")])],
    3: [
        ("chain", [("a", "b"), ("b", "c")]),
        ("fan_in", [("a", "c"), ("b", "c")]),
        ("fan_out", [("a", "b"), ("a", "c")]),
        ("diamond", [("a", "b"), ("a", "c"), ("b", "c")]),
    ],
    4: [("diamond", [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])],
}


@st.composite
def pipeline_configs(draw, max_tasks: int = 3, max_blocks_per_task: int = 60, max_ndim: int = 2, symmetric=None):
    """Draw a small pipeline (CORE 4): 1..``max_tasks`` tasks with ids ``"a", "b", ...``.

    DAG shapes: single task; chain a->b (a->b->c); fan-in a,b->c; fan-out
    a->b,c; diamond a->b, a->c, b->c (with ``max_tasks >= 4`` also the
    4-task a->b,c->d). All tasks share ``ndim`` (1..``max_ndim``); each has
    its own block shape, context, fit and conflict flag, a total ROI placed
    near a common origin so the tasks overlap, at least one block, at most
    ``max_blocks_per_task`` blocks, and ``max_retries`` in 0..2.
    ``symmetric=True`` forces ``cul == clr`` on every axis (daisy's
    downstream is only correct then, CORE 10.1); ``False`` forces nothing.
    """
    n_tasks = draw(st.integers(1, max_tasks))
    shape_name, edges = draw(st.sampled_from(_SHAPES[n_tasks]))
    del shape_name
    ndim = draw(st.integers(1, max_ndim))
    per_axis_cap = max(1, round(max_blocks_per_task ** (1.0 / ndim)) + 1)
    tasks = {}
    for tid in "abcd"[:n_tasks]:
        axes = [draw(_axis(per_axis_cap, False)) for _ in range(ndim)]
        ws = tuple(a[0] for a in axes)
        cul = tuple(a[1] for a in axes)
        clr = cul if symmetric else tuple(a[2] for a in axes)
        ts = tuple(a[3] for a in axes)
        template = tuple(a[5] for a in axes)
        # Small offsets around a shared origin so that the tasks overlap.
        total_offset = tuple(draw(st.integers(-8, 8)) for _ in range(ndim))
        config = {
            "total_roi": (total_offset, tuple(t + a + b for t, a, b in zip(ts, cul, clr))),
            "read_roi": (template, tuple(w + a + b for w, a, b in zip(ws, cul, clr))),
            "write_roi": (tuple(o + a for o, a in zip(template, cul)), ws),
            "read_write_conflict": draw(st.booleans()),
            "fit": draw(st.sampled_from(list(FITS))),
        }
        n = num_blocks_of(config)
        assume(1 <= n <= max_blocks_per_task)
        config["max_retries"] = draw(st.integers(0, 2))
        tasks[tid] = config
    return {"tasks": tasks, "edges": list(edges)}
