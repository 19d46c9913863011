"""What the worker timeline and the run report cost, and how large a report gets.

    python benchmarks/bench_timeline.py [--quick] [--blocks 100000] [--block-ms 1] [--reps 3]
                                        [--report-sizes 10000,100000,1000000]

1. **Cost on a run** (one fresh interpreter, the JIT warmed before the clock): blocks of
   ``--block-ms`` (1 ms: a busy loop, so the 2 workers keep both cores busy and the
   scheduler competes for them, where its own cost shows), ``--blocks`` (100k), 2 workers.
   Cases, in an order rotated per cycle, ``--reps`` cycles:

   off        ``run_blockwise(...)``
   dash       ``dashboard=dash`` with the timeline detached (the dashboard as before it),
              a poller process fetching ``/api/state`` + ``/api/pictures`` every 0.25 s
   timeline   the same with the timeline attached and ``/api/timeline`` fetched too
   report     ``report=run.html``: the timeline attached, no server, the report written
              at the end (inside the timed call)

   Ratios are taken against the "off" run of the same cycle.

2. ``Timeline.bar``: seconds per call (a batch that extends the previous bar, and one that
   starts a new bar); the pool makes one call per batch: on a real run of
   ``min(--blocks, 20000)`` blocks, the calls and the time spent in them, counted.

3. **The report** of no-op runs (real pool runs, 2 workers, 30 blocks failing with two kinds
   of error) at each of ``--report-sizes``: the time to write it (``write_report`` on the
   run's dashboard source after the run) and its size; then the same 10^6-block report with
   its timeline filled to the bound (256 workers x 3000 bars, gaps between all bars: what a
   long run of slow blocks on many workers leaves), which is the largest a report gets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _util import ROOT, emit, spawn  # noqa: E402

CASES = ("off", "dash", "timeline", "report")
BLOCK_SECS = 0.001


def busy(block):
    t = time.perf_counter() + BLOCK_SECS
    while time.perf_counter() < t:
        pass


def noop_failing(block):
    i = block.block_id[1]
    if i % 1000 == 7 and i < 15_000:
        raise ValueError(f"value {i * 3} out of range for block {i}")
    if i % 1000 == 9 and i < 15_000:
        raise KeyError(f"chunk/{i}")


def _poller(url: str, secs: float, timeline: bool) -> None:
    import urllib.request

    base, _, query = url.partition("?")  # the printed URL: http://host:port/?token=...
    paths = ("api/state", "api/pictures") + (("api/timeline",) if timeline else ())
    while True:
        for path in paths:
            try:
                with urllib.request.urlopen(f"{base}{path}?{query}", timeout=5) as r:
                    r.read()
            except OSError:
                pass
        time.sleep(secs)


def _task(n, fn, name="bench", **kw):
    from funlib.geometry import Roi

    import daisy_nb as daisy

    return daisy.Task(
        name,
        total_roi=Roi((0,), (n * 10,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=2,
        max_retries=0,
        **kw,
    )


def cost_worker(n: int, reps: int, block_ms: float) -> dict:
    global BLOCK_SECS
    BLOCK_SECS = block_ms / 1e3
    sys.path.insert(0, ROOT)
    import daisy_nb as daisy
    import daisy_nb.dashboard
    from daisy_nb.dashboard import live
    from daisy_nb.warmup import warmup

    warmup()
    daisy_nb.dashboard.Dashboard(quiet=True).start().close()
    real_attach = live.LiveSource.attach_runtime

    def attach_without_timeline(self, runtime):
        self.runtime = runtime

    tmp = tempfile.mkdtemp(prefix="bench_tl_")
    dash = daisy_nb.dashboard.Dashboard(quiet=True).start()
    pollers = {
        k: subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--poller", dash.url, "0.25", str(int(k == "timeline"))],
            start_new_session=True,
        )
        for k in ("dash", "timeline")
    }
    for p in pollers.values():
        os.killpg(p.pid, signal.SIGSTOP)
    times: dict = {c: [] for c in CASES}
    try:
        for rep in range(reps):
            k = rep % len(CASES)
            for case in CASES[k:] + CASES[:k]:
                kw: dict = {}
                live.LiveSource.attach_runtime = attach_without_timeline if case == "dash" else real_attach
                if case in ("dash", "timeline"):
                    kw["dashboard"] = dash
                    os.killpg(pollers[case].pid, signal.SIGCONT)
                if case == "report":
                    kw["report"] = os.path.join(tmp, "run.html")
                t0 = time.perf_counter()
                ok = daisy.run_blockwise([_task(n, busy)], progress=False, summary=False, **kw)
                times[case].append(time.perf_counter() - t0)
                if case in ("dash", "timeline"):
                    os.killpg(pollers[case].pid, signal.SIGSTOP)
                assert ok
    finally:
        live.LiveSource.attach_runtime = real_attach
        for p in pollers.values():
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        dash.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"times": times}


def bar_worker(n_run: int, block_ms: float) -> dict:
    global BLOCK_SECS
    sys.path.insert(0, ROOT)
    import daisy_nb as daisy
    from daisy_nb.dashboard.timeline import Timeline
    from daisy_nb.warmup import warmup

    out = {}
    for kind, gap in (("extends the previous bar", 0.0), ("starts a new bar", 1.0)):
        tl = Timeline()
        tl.t0 = 0.0
        tl.worker(("w", 0), "t", t=0.0)
        n = 200_000
        t = 1000.0
        t0 = time.perf_counter()
        for _ in range(n):
            tl.bar(("w", 0), "t", t, t + 0.01, 40, 0)
            t += 0.01 + gap
        out[kind] = (time.perf_counter() - t0) / n
    # a real run: how many calls, and the time spent in them (the scheduler's whole cost of the timeline)
    warmup()
    BLOCK_SECS = block_ms / 1e3
    real = Timeline.bar
    acc = {"calls": 0, "secs": 0.0}

    def counted(self, *a, **k):
        t0 = time.perf_counter()
        real(self, *a, **k)
        acc["secs"] += time.perf_counter() - t0
        acc["calls"] += 1

    Timeline.bar = counted  # type: ignore[method-assign]
    tmp = tempfile.mkdtemp(prefix="bench_tl_bar_")
    t0 = time.perf_counter()
    try:
        daisy.run_blockwise([_task(n_run, busy)], progress=False, summary=False, report=os.path.join(tmp, "r.html"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["run"] = {"blocks": n_run, "wall_s": time.perf_counter() - t0, **acc}
    return out


def report_worker(sizes: list[int]) -> dict:
    sys.path.insert(0, ROOT)
    import daisy_nb as daisy
    import daisy_nb.dashboard
    from daisy_nb.dashboard.report import write_report
    from daisy_nb.dashboard.timeline import MAX_BARS, MAX_ROWS
    from daisy_nb.warmup import warmup

    warmup()
    tmp = tempfile.mkdtemp(prefix="bench_report_")
    daisy_nb.logging.set_log_basedir(os.path.join(tmp, "logs"))
    res = []
    for n in sizes:
        dash = daisy_nb.dashboard.Dashboard(quiet=True).start()
        t0 = time.perf_counter()
        states = daisy.run_blockwise(
            [_task(n, noop_failing, max_worker_restarts=100)],
            dashboard=dash,
            progress=False,
            summary=False,
            return_states=True,
        )
        t_run = time.perf_counter() - t0
        path = os.path.join(tmp, f"run_{n}.html")
        t0 = time.perf_counter()
        write_report(path, dash.source)
        t_write = time.perf_counter() - t0
        row = {
            "blocks": n,
            "run_s": t_run,
            "write_s": t_write,
            "bytes": os.path.getsize(path),
            "failed": states["bench"].failed_count,
            "groups": len(states["bench"].error_groups),
        }
        if n == max(sizes):  # the timeline at its bound
            tl = dash.source.timeline
            base = time.monotonic() - 3600
            for w in range(MAX_ROWS):
                for i in range(MAX_BARS):
                    t = base + i * 0.2
                    tl.bar(("x", w), "bench", t, t + 0.1, 3, 0)
            t0 = time.perf_counter()
            write_report(path, dash.source)
            row["full_timeline_write_s"] = time.perf_counter() - t0
            row["full_timeline_bytes"] = os.path.getsize(path)
            row["timeline_records"] = tl.size()
        dash.close()
        res.append(row)
    daisy_nb.logging.set_log_basedir(None)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"reports": res}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2k blocks, 1 rep, reports at 10^4 (smoke run)")
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--block-ms", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3, help="cycles of the four cases")
    ap.add_argument("--report-sizes", default="10000,100000,1000000")
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--poller", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poller:
        _poller(args.poller[0], float(args.poller[1]), args.poller[2] == "1")
        return
    if args.worker:
        kind, *rest = args.worker
        if kind == "cost":
            emit(cost_worker(int(rest[0]), int(rest[1]), float(rest[2])))
        elif kind == "bar":
            emit(bar_worker(int(rest[0]), float(rest[1])))
        else:
            emit(report_worker([int(v) for v in rest[0].split(",")]))
        return
    n, reps, sizes = (2_000, 1, "10000") if args.quick else (args.blocks, args.reps, args.report_sizes)
    me = os.path.abspath(__file__)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    if not args.skip_cost:
        times = spawn(sys.executable, me, ["cost", n, reps, args.block_ms], timeout=7200)["times"]
        print(f"{n:,} blocks of {args.block_ms:g} ms (busy loop), 2 workers, {reps} cycles of the 4 cases\n")
        print("| case | median wall | blocks/s | ratio to off (median of cycles) | all ratios |")
        print("|---|---|---|---|---|")
        names = {
            "off": "no dashboard",
            "dash": "dashboard without the timeline, polled every 0.25 s",
            "timeline": "dashboard with the timeline, polled every 0.25 s (+ /api/timeline)",
            "report": "report=run.html (timeline, no server; report written in the call)",
        }
        for c in CASES:
            med = statistics.median(times[c])
            ratios = [t / o for t, o in zip(times[c], times["off"])]
            print(
                f"| {names[c]} | {med:.2f} s | {n / med:,.0f} | {statistics.median(ratios):.3f} | "
                f"{', '.join(f'{r:.3f}' for r in ratios)} |"
            )
        print()
    bar = spawn(sys.executable, me, ["bar", min(n, 20_000), args.block_ms], timeout=7200)
    run = bar.pop("run")
    for k, v in bar.items():
        print(f"Timeline.bar, a batch that {k}: {v * 1e6:.2f} µs per call")
    print(
        f"a run of {run['blocks']:,} blocks of {args.block_ms:g} ms with report=: {run['calls']:,} calls "
        f"({run['blocks'] / max(1, run['calls']):.1f} blocks per bar call), {run['secs'] * 1e3:.1f} ms in them, "
        f"{100 * run['secs'] / run['wall_s']:.3f} % of the run's {run['wall_s']:.1f} s"
    )
    bar["run"] = run
    print()
    rep = spawn(sys.executable, me, ["report", sizes], timeout=7200)["reports"]
    print("| blocks | run (no-op, 2 workers) | failed / error kinds | report write | report size |")
    print("|---|---|---|---|---|")
    for r in rep:
        print(
            f"| {r['blocks']:,} | {r['run_s']:.2f} s | {r['failed']} / {r['groups']} | {r['write_s'] * 1e3:.0f} ms | "
            f"{r['bytes'] / 1024:.0f} KiB |"
        )
    last = rep[-1]
    print(
        f"\n{last['blocks']:,} blocks with the timeline at its bound ({last['timeline_records']:,} records): "
        f"write {last['full_timeline_write_s'] * 1e3:.0f} ms, {last['full_timeline_bytes'] / 1024:.0f} KiB"
    )
    print("\nRESULT_JSON " + json.dumps({"bar": bar, "reports": rep, "load": load}))


if __name__ == "__main__":
    main()
