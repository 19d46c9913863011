"""Dry run: what a run would do, computed without running it.

``run_blockwise(pipeline, dry_run=True)`` (and ``Server.run_blockwise(...,
dry_run=True)``) return a :class:`Plan` instead of running: per task the blocks,
levels, blocks block tracking already holds as done, blocks ``skip_mask`` skips,
blocks left to run, upstream tasks, workers and resources; for the pipeline the
scheduler's memory. ``daisy-nb run --dry-run script.py`` sets
:data:`DRY_RUN_ENV` in the program's environment: its first ``run_blockwise`` /
``Server.run_blockwise`` call prints the plan as a table and ends the program with
exit code 0 (:func:`exit_with_plan`).

A tracking store written for a smaller volume of the task's grid (a volume that
grew, see ``docs/tracking-growth.md``) is read as the run would migrate it:
``done_by_tracking`` counts the blocks whose write ROI did not change, and the task's
``tracking_note`` says so.

Nothing runs: no block, no worker process, no listener, no ``check_function``
call, and block tracking is only read (plain file reads of the ``done`` chunk in
pieces of :data:`daisy_nb.status.CHUNK_CELLS` cells, never created nor mapped
writable). Everything else comes from each task's geometry tables, so a
10^8-block task's plan takes well under a second plus the tracking read (~0.1 s
per 10^8 cells cached).

**The scheduler's memory** is what :class:`daisy_nb.Scheduler` allocates, computed
from the same shapes: per block 8 bytes of FIFO queue, 4 of the upstream count
(``n_met``) and 3 bytes of status, retries and pre-skip flags (15 B/block), plus
the geometry, edge tables and scratch (a few KB); and per tracked task the
``done`` chunk, mapped shared (1 B per tracking cell, in the page cache and the
process's RSS once the scheduler has scanned it). ``failures`` (4 B per cell) is
mapped too but stays sparse: only pages with failures count.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from daisy_nb import config

__all__ = ["DRY_RUN_ENV", "Plan", "TaskPlan", "exit_with_plan", "make_plan"]

#: Environment variable set by ``daisy-nb run --dry-run``: the first run prints its plan and exits 0.
DRY_RUN_ENV = config.DRY_RUN.name

STATE_BYTES_PER_BLOCK = 15  # queue int64 + n_met int32 + status, retries, preskip uint8


@dataclass
class TaskPlan:
    """One task of a :class:`Plan` (counts are blocks).

    Attributes
    ----------
    task_id : str
        The task.
    blocks, levels : int
        Its blocks and levels.
    roots : int
        Blocks of the first level (ready at once in a source task).
    grid_shape : list of int
        Blocks along each axis.
    done_by_tracking : int or None
        Blocks block tracking records as done; None: tracking is off for this task.
    skipped_by_mask : int
        Blocks the ``skip_mask`` skips that tracking does not already count as done.
    to_run : int
        ``blocks - done_by_tracking - skipped_by_mask``: an upper bound when the task
        has a ``check_function``.
    upstream : list of str
        The tasks it depends on.
    tracking_path : str or None
        Where it tracks its blocks.
    tracking_note : str
        ``""``, ``"none yet: the run creates it"``, or a problem the run would raise.
    check_function : bool
        It has one (decided per block at run time, not called by the plan).
    function : str
        The process function's name.
    kind : str
        ``"block function"``, ``"worker function (Client loop)"`` or ``"none"``.
    max_workers, max_retries : int
        As the task's parameters.
    timeout_secs : float or None
        The task's timeout in seconds.
    requires : dict of str to int
        Resources one worker holds.
    init_fn : str or None
        The ``init_fn``'s name.
    tracking_bytes : int
        The mapped ``done`` chunk (1 B per tracking cell); 0 without tracking.
    """

    task_id: str
    blocks: int
    levels: int
    roots: int
    grid_shape: list[int]
    done_by_tracking: int | None
    skipped_by_mask: int
    to_run: int
    upstream: list[str]
    tracking_path: str | None
    tracking_note: str
    check_function: bool
    function: str
    kind: str
    max_workers: int
    max_retries: int
    timeout_secs: float | None
    requires: dict[str, int]
    init_fn: str | None
    tracking_bytes: int


@dataclass
class Plan:
    """What a run would do (see the module docstring). ``str(plan)`` is a table, :meth:`to_dict` JSON-able.

    Attributes
    ----------
    tasks : list of TaskPlan
        One per task, in the pipeline's order.
    runtime : str
        ``"pool (worker processes)"``, ``"serial (this process)"`` or ``"dask (...)"``.
    resources : dict of str to int or None
        The run's resource budget.
    scheduler_bytes : int
        Exactly what the Scheduler allocates (state, tables and scratch).
    state_bytes : int
        Of which the per-block state (15 B per block).
    tracking_bytes : int
        The tracking maps of all tasks (page cache, counted in RSS).
    problems : list of str
        What would make the run raise at its start.
    seconds : float
        The time it took to make this plan.
    """

    tasks: list[TaskPlan]
    runtime: str
    resources: dict[str, int] | None
    scheduler_bytes: int
    state_bytes: int
    tracking_bytes: int
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def blocks(self) -> int:
        """Blocks of every task."""
        return sum(t.blocks for t in self.tasks)

    @property
    def to_run(self) -> int:
        """Blocks the run would process (not done by tracking, not masked)."""
        return sum(t.to_run for t in self.tasks)

    @property
    def expected_bytes(self) -> int:
        """The scheduler process's expected memory for the run's state: allocations plus tracking maps."""
        return self.scheduler_bytes + self.tracking_bytes

    def task(self, task_id: str) -> TaskPlan:
        """The plan of one task; ``KeyError`` if the pipeline has no such task."""
        for t in self.tasks:
            if t.task_id == task_id:
                return t
        raise KeyError(task_id)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON-able values (``dataclasses.asdict`` plus the totals)."""
        d = asdict(self)
        d.update(blocks=self.blocks, to_run=self.to_run, expected_bytes=self.expected_bytes)
        return d

    def __str__(self) -> str:
        return format_plan(self)


def _fn_name(fn) -> str:
    if fn is None:
        return "-"
    mod = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{mod}.{name}" if mod and mod not in ("__main__", "builtins") else str(name)


def _bytes(n: int) -> str:
    v = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if v < 1000 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1000
    return f"{v:.1f} TB"  # pragma: no cover


def _runtime_name(multiprocessing: bool, executor) -> str:
    if executor is not None:
        what = executor if isinstance(executor, str) else type(executor).__name__
        return f"dask ({what})"
    return "pool (worker processes)" if multiprocessing else "serial (this process)"


def _scheduler_bytes(layouts, edges) -> int:
    """Bytes :class:`daisy_nb.Scheduler` allocates for these layouts: its packed buffers and ``n_met``.

    The same shapes as ``Scheduler.__init__`` (``kernels.tables.PACKED_INT64``); a test
    checks the two agree exactly.
    """
    import numpy as np

    from .kernels import tables as kt
    from .layout import pack_layouts
    from .scheduler import _edge_tables

    T = len(layouts)
    tt = pack_layouts(layouts)
    maxnd = tt.geo.shape[2]
    E = len(edges)
    nup = ndn = 0
    max_down = [0] * E
    for k, (u, d) in enumerate(edges):
        ups, dns = _edge_tables(layouts[u], layouts[d])
        prod = 1
        for ax in range(layouts[u].ndim):
            nup += len(ups[ax])
            ndn += len(dns[ax])
            prod *= int((dns[ax][:, 1] - dns[ax][:, 0]).max()) if len(dns[ax]) else 0
        max_down[k] = prod
    cap = 1
    for t, lay in enumerate(layouts):
        m = int(np.diff(lay.conf_indptr).max()) if lay.num_levels else 0
        m += sum(max_down[k] for k, (u, _d) in enumerate(edges) if u == t)
        cap = max(cap, m)
    N = sum(lay.num_blocks for lay in layouts)
    words = kt.P_HEADER
    words += sum(int(a.size) for a in (tt.geo, tt.info, tt.lvl_off, tt.lvl_cnt, tt.lvl_start, tt.conf_ptr))
    words += int(tt.conf_jump.size)
    words += 2 * E + 2 * nup + 2 * ndn + 2 * E * maxnd + 2 * (T + 1) + 2 * E  # edge and task-DAG tables
    words += max(N, 1) + T * kt.N_CNT + T * kt.N_CFG  # queue and counters
    words += 4 * cap + cap * maxnd + 8 * max(maxnd, 3) + 1  # scratch
    return 8 * words + (kt.U8_CODE1 * N + 1) + 4 * N


def _count_skips(task, layout, block_tracking: bool) -> tuple[int | None, int, str, int]:
    """``(done by tracking or None, skipped by mask, note, tracking bytes)`` read without writing anything."""
    import numpy as np

    from .status import CHUNK_CELLS, StatusError, TrackingTarget
    from .tracking import task_hash

    mask = task.skip_mask
    mask_b = None if mask is None else np.asarray(mask).reshape(layout.grid_shape) != 0
    path = task.resolved_tracking_path() if block_tracking else None
    if path is None:
        return None, 0 if mask_b is None else int(np.count_nonzero(mask_b)), "", 0
    track_cells = int(np.prod(layout.track_shape))
    if not (path / "zarr.json").exists():
        if path.exists() and not path.is_dir():
            return 0, 0 if mask_b is None else int(np.count_nonzero(mask_b)), f"{path} is not a directory", 0
        return 0, 0 if mask_b is None else int(np.count_nonzero(mask_b)), "none yet: the run creates it", track_cells
    target = TrackingTarget.from_layout(
        task.task_id,
        path,
        layout,
        expected_hash=task_hash(task.total_roi, task.read_roi, task.write_roi, task.fit),
    )
    masked_all = 0 if mask_b is None else int(np.count_nonzero(mask_b))
    try:
        reader = target.open()
    except StatusError as e:
        return 0, masked_all, f"the run would raise: {e}", track_cells
    with reader:
        if tuple(reader.grid_shape) != tuple(int(v) for v in layout.track_shape):
            return (
                0,
                masked_all,
                f"the run would raise: tracking grid {list(reader.grid_shape)}, the task's is "
                f"{[int(v) for v in layout.track_shape]}",
                track_cells,
            )
        assert target.block_lo is not None and target.block_hi is not None  # from_layout: the box is known
        lo, hi = target.block_lo, target.block_hi
        grid = reader.grid_shape
        inner = int(np.prod(grid[1:])) if len(grid) > 1 else 1
        rows = max(1, CHUNK_CELLS // max(inner, 1))
        box = tuple(slice(a, b) for a, b in zip(lo[1:], hi[1:]))
        done = masked = 0
        for r0 in range(lo[0], hi[0], rows):
            r1 = min(hi[0], r0 + rows)
            d = reader.done.read(r0 * inner, (r1 - r0) * inner).reshape((r1 - r0, *grid[1:]))
            d = d[(slice(None),) + box] != 0
            done += int(np.count_nonzero(d))
            if mask_b is not None:
                m = mask_b[r0 - lo[0] : r1 - lo[0]]
                masked += int(np.count_nonzero(m & ~d))
        # blocks of the grid outside the stored box (cannot happen with a matching grid) are masked as is
        if mask_b is not None and hi[0] - lo[0] < mask_b.shape[0]:
            masked += int(np.count_nonzero(mask_b[hi[0] - lo[0] :]))
        note = ""
        if reader.grown is not None:  # a store for a smaller volume: the run migrates it first
            note = (
                f"grown volume: the run migrates the store ({reader.grown.describe()}) and skips the "
                f"{done} blocks whose write ROI did not change"
            )
    return done, masked, note, track_cells


def make_plan(
    tasks,
    *,
    multiprocessing: bool = True,
    resources=None,
    block_tracking: bool = True,
    executor=None,
) -> Plan:
    """The :class:`Plan` of ``run_blockwise(tasks, ...)`` with these arguments; runs nothing.

    Raises what the run would raise at its start for an invalid pipeline (cycles,
    mismatched dimensions); problems the run would meet later (a tracking store of
    another layout, a resource the budget lacks) are listed in ``plan.problems``.
    """
    t0 = time.perf_counter()
    from .task import as_pipeline

    pipeline = as_pipeline(tasks)
    order = pipeline.validate()
    by_id = {t.task_id: t for t in pipeline.tasks}
    index = {tid: i for i, tid in enumerate(order)}
    layouts = [by_id[tid].layout for tid in order]
    edges = [(index[u.task_id], index[d.task_id]) for u, d in pipeline.edges]
    for u, d in edges:
        if layouts[u].ndim != layouts[d].ndim:
            raise ValueError(
                f"tasks {order[u]!r} and {order[d]!r} are connected but have "
                f"{layouts[u].ndim} and {layouts[d].ndim} dimensions"
            )
    budget = None if resources is None else {str(k): int(v) for k, v in dict(resources).items()}
    problems: list[str] = []
    out = []
    for t, tid in enumerate(order):
        task = by_id[tid]
        lay = layouts[t]
        n = int(lay.num_blocks)
        done, masked, note, tbytes = _count_skips(task, lay, block_tracking)
        if note.startswith("the run would raise") or note.endswith("is not a directory"):
            problems.append(f"task {tid!r}: block tracking: {note}")
        arity = task.arity
        kind = "none" if arity is None else {1: "block function", 0: "worker function (Client loop)"}.get(arity, "none")
        requires = dict(task.requires)
        if executor is None and n and (task.process_function is None or (not multiprocessing and arity != 1)):
            problems.append(
                f"task {tid!r} has no {'' if multiprocessing else '1-argument '}process_function (the run raises)"
            )
        if executor is None and multiprocessing:
            for k, v in requires.items():
                have = (budget or {}).get(k, 0)
                if v > have:
                    problems.append(f"task {tid!r} requires {{{k}: {v}}} but the resources budget has {{{k}: {have}}}")
        elif executor is not None and arity == 0:
            problems.append(f"task {tid!r}: 0-argument worker functions do not run on dask (the run raises)")
        path = task.resolved_tracking_path() if block_tracking else None
        out.append(
            TaskPlan(
                task_id=tid,
                blocks=n,
                levels=int(lay.num_levels),
                roots=int(lay.num_roots),
                grid_shape=[int(v) for v in lay.grid_shape],
                done_by_tracking=done,
                skipped_by_mask=masked,
                to_run=n - (done or 0) - masked,
                upstream=[order[u] for u, d in edges if d == t],
                tracking_path=None if path is None else str(path),
                tracking_note=note,
                check_function=task.check_function is not None,
                function=_fn_name(task.process_function),
                kind=kind,
                max_workers=int(task.max_workers),
                max_retries=int(task.max_retries),
                timeout_secs=task.timeout_secs if task.timeout_secs not in (None, float("inf")) else None,
                requires=requires,
                init_fn=None if task.init_fn is None else _fn_name(task.init_fn),
                tracking_bytes=tbytes,
            )
        )
    N = sum(int(lay.num_blocks) for lay in layouts)
    return Plan(
        tasks=out,
        runtime=_runtime_name(multiprocessing, executor),
        resources=budget,
        scheduler_bytes=_scheduler_bytes(layouts, edges),
        state_bytes=STATE_BYTES_PER_BLOCK * N,
        tracking_bytes=sum(t.tracking_bytes for t in out),
        problems=problems,
        seconds=time.perf_counter() - t0,
    )


def _max_at_once(tp: TaskPlan, budget) -> str:
    """Workers of the task that can run at once: max_workers, capped by the resources budget."""
    n = tp.max_workers
    for k, v in tp.requires.items():
        if v > 0:
            n = min(n, (budget or {}).get(k, 0) // v)
    return str(n)


def format_plan(plan: Plan) -> str:
    """The plan as a table (what ``daisy-nb run --dry-run`` prints)."""
    heads = ["task", "blocks", "levels", "done (tracking)", "skipped (mask)", "to run", "upstream", "workers"]
    rows = []
    for tp in plan.tasks:
        done = "off" if tp.done_by_tracking is None else f"{tp.done_by_tracking:,}"
        run = f"{tp.to_run:,}" + ("*" if tp.check_function else "")
        workers = (
            f"{tp.max_workers}" if not tp.requires else f"{tp.max_workers} ({_max_at_once(tp, plan.resources)} at once)"
        )
        rows.append(
            [tp.task_id, f"{tp.blocks:,}", f"{tp.levels}", done, f"{tp.skipped_by_mask:,}", run,
             ", ".join(tp.upstream) or "-", workers]
        )  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
    lines = [
        f"Dry run (nothing was run): {len(plan.tasks)} task(s), {plan.blocks:,} blocks, {plan.to_run:,} to run, "
        f"on {plan.runtime}",
        "",
    ]
    fmt = lambda cells: (
        "    " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    )  # noqa: E731
    lines.append(fmt(heads))
    lines.append("    " + "  ".join("─" * w for w in widths))
    lines += [fmt(r) for r in rows]
    lines.append("")
    for tp in plan.tasks:
        extra = [f"{tp.kind} {tp.function}"]
        if tp.init_fn:
            extra.append(f"init_fn {tp.init_fn}")
        if tp.requires:
            extra.append("requires " + ", ".join(f"{k}={v}" for k, v in tp.requires.items()))
        extra.append(f"max_retries {tp.max_retries}")
        extra.append(f"timeout {tp.timeout_secs:g} s" if tp.timeout_secs else "no timeout")
        if tp.tracking_path:
            extra.append(f"tracking {tp.tracking_path}" + (f" ({tp.tracking_note})" if tp.tracking_note else ""))
        lines.append(f"    {tp.task_id}: " + "; ".join(extra))
    if any(tp.check_function for tp in plan.tasks):
        lines.append(
            "    * has a check_function: blocks it reports done are skipped at run time; it is not called "
            "in a dry run, so 'to run' is an upper bound"
        )
    lines.append("")
    per = plan.state_bytes / plan.blocks if plan.blocks else 0
    lines.append(
        f"Scheduler memory: {_bytes(plan.expected_bytes)} = {_bytes(plan.state_bytes)} block state "
        f"({per:.0f} B/block) + {_bytes(plan.scheduler_bytes - plan.state_bytes)} tables"
        + (f" + {_bytes(plan.tracking_bytes)} tracking maps (page cache)" if plan.tracking_bytes else "")
    )
    if plan.resources:
        lines.append("Resources budget: " + ", ".join(f"{k}={v}" for k, v in plan.resources.items()))
    for p in plan.problems:
        lines.append(f"PROBLEM: {p}")
    lines.append(f"(plan made in {plan.seconds:.2f} s)")
    return "\n".join(lines)


def requested() -> bool:
    """True when ``daisy-nb run --dry-run`` asked this program for a dry run (:data:`DRY_RUN_ENV`)."""
    return config.DRY_RUN.get()


def exit_with_plan(plan: Plan) -> None:
    """Print the plan on stdout and end the program with exit code 0 (``daisy-nb run --dry-run``)."""
    out = sys.stdout or sys.__stdout__
    try:
        print(plan, file=out, flush=True)
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass
    import threading

    if threading.current_thread() is threading.main_thread():
        raise SystemExit(0)
    os._exit(0)  # from another thread, SystemExit would end only that thread
