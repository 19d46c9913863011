"""What the live dashboard costs a run: the no-op benchmark with it off, on, and watched.

    python benchmarks/bench_dashboard.py [--quick] [--rounds 5] [--reps 6] [--poll-secs 0.25] [--browser]

The run is ``bench_runtime.py``'s no-op case: 100k blocks (1-D, no conflict,
``max_retries=0``), 2 workers, ``progress=False, summary=False``. Three cases:

  off     ``run_blockwise(...)``
  on      ``run_blockwise(..., dashboard=True)``: the server starts and stops inside
          the timed call; nobody looks
  polled  ``run_blockwise(..., dashboard=dash)`` while a watcher fetches
          ``/api/state`` and ``/api/pictures`` every ``--poll-secs`` (default 0.25 s,
          4x the page's rate) from another process; ``--browser`` uses headless
          chromium showing the page instead (it polls once a second)

Each round is a fresh interpreter (JIT warmed and ``http.server`` imported before
the clock, as the other benchmarks exclude one-off start-up costs) that runs
``--reps`` cycles of the three cases back to back, in an order rotated per cycle and
round; the watcher is stopped (SIGSTOP) outside the "polled" runs. A case's ratio is
taken against the "off" run of the same cycle (seconds apart), which cancels most of
the drift of a shared machine; the table gives the median and quartiles of these
ratios (targets: on <= 1.02, polled <= 1.05). ``--blocks`` changes the size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _util import ROOT, emit, spawn  # noqa: E402

CASES = ("off", "on", "polled")


def noop(block):
    pass


def _poller(url: str, secs: float) -> None:
    """Fetch the page's two endpoints every ``secs`` until killed (``--poller``)."""
    import urllib.request

    base, _, query = url.partition("?")  # the printed URL: http://host:port/?token=...
    while True:
        for path in ("api/state", "api/pictures"):
            try:
                with urllib.request.urlopen(f"{base}{path}?{query}", timeout=5) as r:
                    r.read()
            except OSError:
                pass
        time.sleep(secs)


def _start_watcher(url: str, secs: float, browser: bool):
    if browser:
        exe = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
        if exe is None:
            raise SystemExit("--browser: no chromium installed")
        profile = tempfile.mkdtemp(prefix="bench_dash_chromium_")
        proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return proc, profile
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--poller", url, str(secs)], start_new_session=True
    )
    return proc, None


def _wait_for_poll(dash, since: float, timeout: float = 60.0) -> None:
    """Until the watcher fetched /api/state after ``since`` (monotonic)."""
    from daisy_nb.dashboard.live import WANT_SECS

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if dash.source.wanted_until - WANT_SECS > since:
            return
        time.sleep(0.01)
    raise RuntimeError("the watcher never polled the dashboard")


def worker(n: int, reps: int, poll_secs: float, browser: bool, first: int) -> dict:
    """One round: ``reps`` cycles of the three cases (rotated), the watcher paused outside "polled"."""
    import signal

    sys.path.insert(0, ROOT)
    from funlib.geometry import Roi

    import daisy_nb as daisy
    import daisy_nb.dashboard
    from daisy_nb.warmup import warmup

    warmup()
    daisy_nb.dashboard.Dashboard(quiet=True).start().close()  # http.server's import: a one-off, untimed

    def task():
        return daisy.Task(
            "bench",
            total_roi=Roi((0,), (n * 10,)),
            read_roi=Roi((0,), (10,)),
            write_roi=Roi((0,), (10,)),
            process_function=noop,
            read_write_conflict=False,
            max_workers=2,
            max_retries=0,
        )

    dash = daisy_nb.dashboard.Dashboard(quiet=True).start()
    watcher, profile = _start_watcher(dash.url, poll_secs, browser)
    _wait_for_poll(dash, 0.0)
    os.killpg(watcher.pid, signal.SIGSTOP)
    times = {c: [] for c in CASES}
    try:
        for rep in range(reps):
            k = (first + rep) % 3
            for case in CASES[k:] + CASES[:k]:
                if case == "polled":
                    t = time.monotonic()
                    os.killpg(watcher.pid, signal.SIGCONT)
                    _wait_for_poll(dash, t)
                arg = {"off": None, "on": True, "polled": dash}[case]
                t0 = time.perf_counter()
                ok = daisy.run_blockwise([task()], progress=False, summary=False, dashboard=arg)
                times[case].append(time.perf_counter() - t0)
                if case == "polled":
                    os.killpg(watcher.pid, signal.SIGSTOP)
                assert ok
    finally:
        os.killpg(watcher.pid, signal.SIGKILL)
        watcher.wait()
        if profile is not None:
            shutil.rmtree(profile, ignore_errors=True)
        dash.close()
    return {"times": times}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="10k blocks, 2 rounds, 2 reps (smoke run)")
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=6, help="cycles of the three cases per round")
    ap.add_argument("--poll-secs", type=float, default=0.25)
    ap.add_argument("--browser", action="store_true", help="poll with headless chromium showing the page")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--poller", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poller:
        _poller(args.poller[0], float(args.poller[1]))
        return
    if args.worker:
        n, reps, secs, browser, first = args.worker
        emit(worker(int(n), int(reps), float(secs), browser == "1", int(first)))
        return
    n, rounds, reps = (10_000, 2, 2) if args.quick else (args.blocks, args.rounds, args.reps)
    times = {c: [] for c in CASES}
    for r in range(rounds):
        res = spawn(sys.executable, os.path.abspath(__file__), [n, reps, args.poll_secs, int(args.browser), r])
        for c in CASES:
            times[c] += res["times"][c]
    load = os.getloadavg()
    med = {c: statistics.median(v) for c, v in times.items()}
    pairs = {c: [t / o for t, o in zip(times[c], times["off"])] for c in CASES}  # same cycle: adjacent runs
    watcher = "headless chromium (1 Hz)" if args.browser else f"poller every {args.poll_secs:g} s"
    print(
        f"no-op blocks: {n:,}, 2 workers; {rounds} rounds (fresh interpreters) x {reps} cycles of the 3 "
        f"cases; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| case | median wall | blocks/s | ratio to off: median of cycles | ratio quartiles | target |")
    print("|---|---|---|---|---|---|")
    for c in CASES:
        q = statistics.quantiles(pairs[c], n=4) if len(pairs[c]) > 1 else [pairs[c][0]] * 3
        target = {"off": "", "on": "<= 1.02", "polled": "<= 1.05"}[c]
        name = {"off": "dashboard off", "on": "dashboard=True, nobody looks", "polled": f"dashboard, {watcher}"}[c]
        print(
            f"| {name} | {med[c] * 1e3:.1f} ms | {n / med[c]:,.0f} | {statistics.median(pairs[c]):.3f} | "
            f"{q[0]:.3f}-{q[2]:.3f} | {target} |"
        )
    print("\nRESULT_JSON " + json.dumps({"n": n, "times": times, "load": load}))


if __name__ == "__main__":
    main()
