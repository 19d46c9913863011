"""Scheduler benchmark: daisy_nb's per-block and batch APIs against daisy 2.0.0's ``Scheduler``.

    python benchmarks/bench_scheduler.py --daisy-python /work/venvs/daisy2/bin/python [--quick] [--repeat 3]

The scheduler is driven in-process, with no workers, every block released as a
success, by the same loop for both libraries: round-robin over the task ids,
``acquire_block(tid)``, ``block.status = SUCCESS``, ``release_block(block)``, until
a round hands out nothing (or a block budget is reached). The batch API does the
same with ``acquire_blocks(tid, 4096)`` / ``release_blocks(tid, batch.index, codes)``.
Block tracking is off on both sides (``tracking_path=False``). Times are
wall-clock around the loop (JIT warm-up done before, scheduler construction timed
separately).

Cases (3-D, write block 10, read block 10 + 2c, fit "valid", conflict on):

* **1M conflict**: CORE.md 3.11's "1M with conflict" task (1000³, c = 2), 970,299
  blocks. daisy 2.0.0 is timed on the first 200,000 blocks; daisy_nb's per-block
  API on the same window, its batch API on the whole task (the window time is
  recorded on the way; the ratio uses it).
* **chain 3x100³**: three tasks a -> b -> c over the same 100³-block volume,
  context 1 (3,000,000 blocks). Every block of b reads 27 blocks of a, so b starts
  late: the first 10,000 blocks (the window daisy is timed on, it runs < 1.5k
  blocks/s here) are all a's, each release updating b. The batch API runs the
  whole pipeline.
* **chain 3x16³ (complete)**: the same pipeline over a 16³-block volume (12,288
  blocks), run to completion by every API, so all three tasks are active.

Every (case, library, API) measurement runs in its own fresh interpreter, and the
repeats are interleaved in rounds (daisy, daisy_nb per-block, daisy_nb batch, then
again), so a load burst on the shared machine hits all sides alike. Speedups are
best / best; the bracket is the range of the per-round ratios.

``--huge`` runs only a complete batch run of a 10^8-block task (400 x 500 x 500
blocks) and reports its peak RSS and time.

Memory: a 10^7-block task (200 x 200 x 250 blocks, context 1, conflict) in a fresh
child: Scheduler construction plus a complete batch run, peak RSS above the RSS
before (peak mark reset, see ``_util.py``) and, in a second child, the tracemalloc
peak; reported in bytes per block, with the construction time.

``--quick`` runs tiny grids (a CI smoke test of a few seconds); without
``--daisy-python`` the daisy side is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402

SCRIPT = os.path.abspath(__file__)
BATCH = 4096
PER_BLOCK_TARGET = 3.0
BATCH_TARGET = 50.0
BYTES_TARGET = 32.0

# name: (grid per axis (or total read extent for "1M conflict"), context, tasks, window)
#   window = blocks daisy is timed on (None: the complete run)
CASES = {
    "1M conflict": dict(total=1000, c=2, tasks=1, window=None),  # complete: the first 120k are roots, cheap in daisy
    "chain 3x100³": dict(grid=100, c=1, tasks=3, window=10_000),
    "chain 3x16³ (complete)": dict(grid=16, c=1, tasks=3, window=None),
}
QUICK_CASES = {
    "1M conflict": dict(total=124, c=2, tasks=1, window=500),
    "chain 3x100³": dict(grid=10, c=1, tasks=3, window=300),
    "chain 3x16³ (complete)": dict(grid=5, c=1, tasks=3, window=None),
}
BIG_GRID = (200, 200, 250)  # 10^7 blocks
HUGE_GRID = (400, 500, 500)  # 10^8 blocks (--huge)
QUICK_BIG_GRID = (20, 20, 25)


def _tasks(daisy, spec, b=10):
    from funlib.geometry import Roi

    c = spec["c"]
    if "total" in spec:
        total = Roi((0,) * 3, (spec["total"],) * 3)
    else:
        g = spec["grid"]
        total = Roi((-c,) * 3, (g * b + 2 * c,) * 3)
    names = ["a", "b", "c"][: spec["tasks"]]
    return [
        daisy.Task(
            n,
            total,
            Roi((0,) * 3, (b + 2 * c,) * 3),
            Roi((c,) * 3, (b,) * 3),
            read_write_conflict=True,
            fit="valid",
            max_retries=2,
            tracking_path=False,
        )
        for n in names
    ]


def _pipeline(tasks):
    p = tasks[0]
    for t in tasks[1:]:
        p = p + t
    return p


# -- drivers (identical for both libraries) ----------------------------------------------
class _Clock:
    """Wall-clock and CPU time (this process, all threads) since construction; a window mark."""

    def __init__(self, window):
        self.window = window
        self.marked = None
        self.w0, self.c0 = time.perf_counter(), time.process_time()

    def mark(self, n):
        if self.marked is None and self.window is not None and n >= self.window:
            self.marked = (n, time.perf_counter() - self.w0, time.process_time() - self.c0)

    def result(self, n):
        secs, cpu = time.perf_counter() - self.w0, time.process_time() - self.c0
        nw, tw, cw = self.marked if self.marked else (n, secs, cpu)
        return {"n": n, "secs": secs, "cpu": cpu, "n_window": nw, "secs_window": tw, "cpu_window": cw}


def drive_per_block(s, tids, success, window, limit):
    """Round-robin acquire_block/release_block of single blocks."""
    acquire, release = s.acquire_block, s.release_block
    n = 0
    clock = _Clock(window)
    while True:
        got = False
        for tid in tids:
            blk = acquire(tid)
            if blk is None:
                continue
            got = True
            blk.status = success
            release(blk)
            n += 1
        clock.mark(n)
        if not got or n >= limit:
            break
    return clock.result(n)


def drive_batch(s, tids, window, limit, max_n=BATCH):
    """Round-robin acquire_blocks/release_blocks."""
    import numpy as np

    ok = np.full(max_n, 2, dtype=np.uint8)  # BlockStatus.SUCCESS
    n = 0
    clock = _Clock(window)
    while True:
        got = False
        for tid in tids:
            batch = s.acquire_blocks(tid, max_n)
            k = len(batch.index)
            if k == 0:
                continue
            got = True
            s.release_blocks(tid, batch.index, ok[:k])
            n += k
        clock.mark(n)
        if not got or n >= limit:
            break
    return clock.result(n)


# -- children ----------------------------------------------------------------------------
def worker_run(lib: str, api: str, case: str, quick: bool) -> dict:
    spec = (QUICK_CASES if quick else CASES)[case]
    if lib == "daisy":
        import daisy
    else:
        U.warm_daisy_nb()
        import daisy_nb as daisy
    tasks = _tasks(daisy, spec)
    tids = [t.task_id for t in tasks]
    p = _pipeline(tasks)
    t = time.perf_counter()
    s = daisy.Scheduler(p)
    construct = time.perf_counter() - t
    states = s.task_states
    total = sum(st.total_block_count for st in states.values())
    window = spec["window"]
    # daisy and the per-block API stop at the window; the batch API runs everything
    limit = total if (window is None or api == "batch") else window
    if api == "batch":
        out = drive_batch(s, tids, window, limit)
    else:
        out = drive_per_block(s, tids, daisy.BlockStatus.SUCCESS, window, limit)
    n = out["n"]
    states = s.task_states
    done = sum(st.completed_count for st in states.values())
    if done != n:
        raise SystemExit(f"{lib}/{api}/{case}: released {n} blocks but {done} are completed")
    if n == total and not all(st.is_done() for st in states.values()):
        raise SystemExit(f"{lib}/{api}/{case}: every block released but a task is not done")
    if limit == total and n != total:
        raise SystemExit(f"{lib}/{api}/{case}: the run stopped after {n} of {total} blocks")
    out.update(total=total, construct=construct, per_task={tid: states[tid].completed_count for tid in tids})
    return out


def worker_memory(method: str, grid: tuple) -> dict:
    U.warm_daisy_nb()
    from funlib.geometry import Roi

    import daisy_nb

    c, b = 1, 10
    total = Roi((-c,) * 3, tuple(g * b + 2 * c for g in grid))
    task = daisy_nb.Task(
        "big",
        total,
        Roi((0,) * 3, (b + 2 * c,) * 3),
        Roi((c,) * 3, (b,) * 3),
        read_write_conflict=True,
        tracking_path=False,
    )
    if method == "tracemalloc":
        import tracemalloc

        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    with U.PeakRss() as m:
        t = time.perf_counter()
        s = daisy_nb.Scheduler(task)
        construct = time.perf_counter() - t
        state_bytes = sum(int(a.nbytes) for a in (s.status, s.n_met, s.retries, s.preskip, s.queue))
        after_construct = U.rss() - m.before
        run = drive_batch(s, ["big"], None, 1 << 62)
    n, secs = run["n"], run["secs"]
    out = {
        "blocks": s.num_blocks_total,
        "n": n,
        "secs": secs,
        "construct": construct,
        "state_bytes": state_bytes,
        "rss_peak": m.delta,
        "rss_after_construct": after_construct,
        "exact": m.exact,
    }
    if method == "tracemalloc":
        out["tm_peak"] = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    return out


def worker_daisy_construct(grid: tuple) -> dict:
    import daisy
    from funlib.geometry import Roi

    c, b = 1, 10
    total = Roi((-c,) * 3, tuple(g * b + 2 * c for g in grid))
    task = daisy.Task(
        "big",
        total,
        Roi((0,) * 3, (b + 2 * c,) * 3),
        Roi((c,) * 3, (b,) * 3),
        read_write_conflict=True,
        tracking_path=False,
    )
    with U.PeakRss() as m:
        t = time.perf_counter()
        s = daisy.Scheduler(task)
        construct = time.perf_counter() - t
        blk = s.acquire_block("big")
        first = time.perf_counter() - t
    return {"construct": construct, "first_block": first, "rss_peak": m.delta, "ok": blk is not None}


# -- driver --------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daisy-python", default=None, help="a python with daisy==2.0.0 installed (omit to skip daisy)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke test)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds of measurements (default 3, quick 1)")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument(
        "--huge", action="store_true", help="only: a complete batch run of a 10^8-block task (memory, time)"
    )
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        kind, *rest = args.worker
        if kind == "run":
            lib, apis, quick, *names = rest
            U.emit(
                {f"{api}/{case}": worker_run(lib, api, case, quick == "1") for api in apis.split(",") for case in names}
            )
        elif kind == "memory":
            quick, *methods = rest
            grid = {"1": QUICK_BIG_GRID, "huge": HUGE_GRID}.get(quick, BIG_GRID)
            U.emit({m: worker_memory(m, grid) for m in methods})
        elif kind == "daisy_construct":
            (quick,) = rest
            U.emit(worker_daisy_construct(QUICK_BIG_GRID if quick == "1" else BIG_GRID))
        return

    if args.huge:
        r = U.spawn(sys.executable, SCRIPT, ["memory", "huge", "rss"])["rss"]
        n = r["blocks"]
        print(f"# bench_scheduler --huge ({U.machine_note()})\n")
        print(
            f"One task of {n:,} blocks (3-D, context 1, conflict), construction + a complete batch run: "
            f"peak RSS above the start {r['rss_peak'] / n:.1f} bytes/block ({r['rss_peak'] / 2**30:.2f} GiB), "
            f"construction {U.fmt_secs(r['construct'])}, run {U.fmt_secs(r['secs'])} = {r['n'] / r['secs']:,.0f} blocks/s, "
            f"{r['n']:,} blocks completed."
        )
        return

    repeat = args.repeat or (1 if args.quick else 3)
    cases = QUICK_CASES if args.quick else CASES
    names = [n.strip() for n in args.only.split(",")] if args.only else list(cases)
    ref = args.daisy_python
    q = "1" if args.quick else "0"
    print(f"# bench_scheduler ({'quick' if args.quick else 'full'}; {U.machine_note()}; rounds={repeat})\n", flush=True)

    runs = {name: {"daisy": [], "per_block": [], "batch": []} for name in names}
    # full runs: a fresh child per (case, library, API); --quick: one child per library and API
    groups = [names] if args.quick else [[n] for n in names]
    jobs = [(ref, "daisy", "per_block")] if ref else []
    jobs += (
        [(sys.executable, "daisy_nb", "per_block,batch")]
        if args.quick
        else [(sys.executable, "daisy_nb", "per_block"), (sys.executable, "daisy_nb", "batch")]
    )
    for r in range(repeat):
        for group in groups:
            for python, lib, apis in jobs:
                res = U.spawn(python, SCRIPT, ["run", lib, apis, q, *group])
                for key, val in res.items():
                    api, name = key.split("/", 1)
                    runs[name]["daisy" if lib == "daisy" else api].append(val)
            print(f"  round {r + 1}/{repeat}: {', '.join(group)}", file=sys.stderr, flush=True)

    def judge(x, target, higher=True):
        return " (quick: not judged)" if args.quick else f" ({U.verdict(x, target, higher)})"

    rows = []
    for name in names:
        R = runs[name]
        spec = cases[name]
        total = R["per_block"][0]["total"]
        win = spec["window"]
        wlabel = f"first {win:,}" if win else "all"

        def rates(results, full=False, cpu=False):
            if full:
                return [x["n"] / x["cpu" if cpu else "secs"] for x in results]
            return [x["n_window"] / x["cpu_window" if cpu else "secs_window"] for x in results]

        pb = rates(R["per_block"])
        bw = rates(R["batch"])
        bf = rates(R["batch"], full=True)
        row = [f"{name} ({total:,} blocks)", wlabel]
        if R["daisy"]:
            dr = rates(R["daisy"])
            # per-round ratios (same round = same load conditions)
            pr = [a / d for a, d in zip(pb, dr)]
            br = [a / d for a, d in zip(bw, dr)]
            sp_pb, sp_b = max(pb) / max(dr), max(bw) / max(dr)
            # the same ratios in CPU time (less sensitive to the other jobs on the machine)
            dc = max(rates(R["daisy"], cpu=True))
            cpu_pb, cpu_b = max(rates(R["per_block"], cpu=True)) / dc, max(rates(R["batch"], cpu=True)) / dc
            row += [
                _fmt_rates(dr),
                _fmt_rates(pb),
                _fmt_rates(bw),
                _fmt_rates(bf),
                U.fmt_ratio(sp_pb, min(pr), max(pr)) + judge(sp_pb, PER_BLOCK_TARGET),
                U.fmt_ratio(sp_b, min(br), max(br)) + judge(sp_b, BATCH_TARGET),
                f"{U.fmt_ratio(cpu_pb)} / {U.fmt_ratio(cpu_b)}",
            ]
        else:
            row += ["–", _fmt_rates(pb), _fmt_rates(bw), _fmt_rates(bf), "–", "–", "–"]
        per_task = R["batch"][0]["per_task"]
        row.append(
            ", ".join(f"{k}: {v:,}" for k, v in R["per_block"][0]["per_task"].items()) if len(per_task) > 1 else ""
        )
        rows.append(row)

    print("## Scheduler throughput, blocks/s (in-process, no workers, every block a success)\n")
    print(
        U.table(
            [
                "case",
                "window",
                "daisy 2.0.0 per-block",
                "daisy_nb per-block",
                f"daisy_nb batch ({BATCH})",
                "daisy_nb batch, complete run",
                f"per-block speedup [per-round range] (target >= {PER_BLOCK_TARGET:.0f}x)",
                f"batch speedup [range] (target >= {BATCH_TARGET:.0f}x)",
                "CPU-time speedup per-block / batch",
                "window's blocks per task (per-block)",
            ],
            rows,
        )
    )
    print(
        f"\nRates: wall-clock, best of {repeat} rounds, with the worst in brackets. Speedups: best / best, with the range "
        "of the per-round ratios; batch speedup = daisy_nb batch over the same window (same number of blocks) / "
        "daisy 2.0.0 per-block. CPU-time speedup: the same from `time.process_time()` (best rounds), which the "
        "other jobs on a shared machine disturb much less than wall-clock.\n"
    )

    if not args.no_memory:
        if args.quick:  # one child for both methods (the figures are not judged)
            mem = U.spawn(sys.executable, SCRIPT, ["memory", q, "rss", "tracemalloc"])
        else:
            mem = {
                **U.spawn(sys.executable, SCRIPT, ["memory", q, "rss"]),
                **U.spawn(sys.executable, SCRIPT, ["memory", q, "tracemalloc"]),
            }
        rss, tm = mem["rss"], mem["tracemalloc"]
        dc = U.spawn(ref, SCRIPT, ["daisy_construct", q]) if ref else None
        n = rss["blocks"]
        bpb = max(rss["rss_peak"], tm["tm_peak"]) / n
        print(f"## Memory: one task of {n:,} blocks (3-D, context 1, conflict), construction + a complete batch run\n")
        mrows = [
            [
                "peak RSS above the RSS before construction",
                f"{rss['rss_peak'] / n:.1f}" + ("" if rss["exact"] else " (upper bound)"),
                f"{rss['rss_peak'] / 2**20:,.0f} MiB",
            ],
            [
                "tracemalloc peak (its own fresh child; one child with --quick)",
                f"{tm['tm_peak'] / n:.1f}",
                f"{tm['tm_peak'] / 2**20:,.0f} MiB",
            ],
            [
                "state arrays (status, n_met, retries, preskip, queue: nbytes)",
                f"{rss['state_bytes'] / n:.1f}",
                f"{rss['state_bytes'] / 2**20:,.0f} MiB",
            ],
            [
                "RSS right after construction (untouched pages not resident)",
                f"{rss['rss_after_construct'] / n:.1f}",
                f"{rss['rss_after_construct'] / 2**20:,.0f} MiB",
            ],
        ]
        print(U.table(["measure", "bytes/block", "total"], mrows))
        verdict = "not judged in --quick" if args.quick else U.verdict(bpb, BYTES_TARGET, False)
        print(f"\nTarget < {BYTES_TARGET:.0f} bytes/block: {verdict} (worst of the two methods: {bpb:.1f}).")
        print(
            f"Construction: {U.fmt_secs(rss['construct'])} (tracemalloc child: {U.fmt_secs(tm['construct'])}); "
            f"complete batch run of {rss['n']:,} blocks: {U.fmt_secs(rss['secs'])} = {rss['n'] / rss['secs']:,.0f} blocks/s."
        )
        if dc:
            print(
                f"daisy 2.0.0, same task: construction {U.fmt_secs(dc['construct'])}, first block after "
                f"{U.fmt_secs(dc['first_block'])}, peak RSS {dc['rss_peak'] / 2**20:,.0f} MiB so far "
                "(a complete daisy run of 10^7 blocks is not timed: ~2 min)."
            )
    print()


def _fmt_rates(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:,.0f}"
    return f"{max(xs):,.0f} ({min(xs):,.0f})"


if __name__ == "__main__":
    main()
