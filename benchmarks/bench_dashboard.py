"""What the live dashboard costs a run: the no-op benchmark with it off, on, and watched.

    python benchmarks/bench_dashboard.py [--quick] [--rounds 7] [--poll-secs 0.25] [--browser]

The run is ``bench_runtime.py``'s no-op case: 100k blocks (1-D, no conflict,
``max_retries=0``), 2 workers, ``progress=False, summary=False``. Three cases,
each in a fresh interpreter (JIT warmed and ``daisy_nb.dashboard`` imported
before the clock, as the other benchmarks exclude one-off start-up costs):

  off     ``run_blockwise(...)``
  on      ``run_blockwise(..., dashboard=True)``: the server starts and stops inside
          the timed call; nobody looks
  polled  ``run_blockwise(..., dashboard=dash)`` while a poller process fetches
          ``/api/state`` and ``/api/pictures`` every ``--poll-secs`` (default 0.25 s,
          4x the page's rate); ``--browser`` uses headless chromium showing the page
          instead (it polls once a second)

Rounds interleave the cases (off, on, polled, then rotated), each child runs the
case ``--reps`` times and reports its best; the table gives the median over
rounds and the ratio to "off" (target: on <= 1.02, polled <= 1.05), plus the
ratio of every round. ``--blocks`` changes the size (a longer run sees more polls).
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

    while True:
        for path in ("api/state", "api/pictures"):
            try:
                with urllib.request.urlopen(url + path, timeout=5) as r:
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
        proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 f"--user-data-dir={profile}", url], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        return proc, profile
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--poller", url, str(secs)],
                            start_new_session=True)
    return proc, None


def _wait_for_poll(dash, timeout=60.0) -> None:
    src = dash.source
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if src.wanted_until > time.monotonic():  # a request for /api/state arrived
            return
        time.sleep(0.05)
    raise RuntimeError("the watcher never polled the dashboard")


def worker(case: str, n: int, reps: int, poll_secs: float, browser: bool) -> dict:
    sys.path.insert(0, ROOT)
    import daisy_nb as daisy
    import daisy_nb.dashboard
    from daisy_nb.warmup import warmup
    from funlib.geometry import Roi

    warmup()

    def task():
        return daisy.Task("bench", total_roi=Roi((0,), (n * 10,)), read_roi=Roi((0,), (10,)),
                          write_roi=Roi((0,), (10,)), process_function=noop, read_write_conflict=False,
                          max_workers=2, max_retries=0)

    dash = watcher = profile = None
    if case == "polled":
        dash = daisy_nb.dashboard.Dashboard(quiet=True).start()
    if case == "on":  # one untimed start, so that http.server's import is not in the first rep
        daisy_nb.dashboard.Dashboard(quiet=True).start().close()
    times = []
    try:
        for _ in range(reps):
            if dash is not None and watcher is None:
                watcher, profile = _start_watcher(dash.url, poll_secs, browser)
                _wait_for_poll(dash)
            arg = {"off": None, "on": True, "polled": dash}[case]
            t0 = time.perf_counter()
            ok = daisy.run_blockwise([task()], progress=False, summary=False, dashboard=arg)
            times.append(time.perf_counter() - t0)
            assert ok
    finally:
        if watcher is not None:
            os.killpg(watcher.pid, 9)
            watcher.wait()
        if profile is not None:
            shutil.rmtree(profile, ignore_errors=True)
        if dash is not None:
            dash.close()
    return {"case": case, "times": times, "best": min(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="10k blocks, 2 rounds, 2 reps (smoke run)")
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--poll-secs", type=float, default=0.25)
    ap.add_argument("--browser", action="store_true", help="poll with headless chromium showing the page")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--poller", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poller:
        _poller(args.poller[0], float(args.poller[1]))
        return
    if args.worker:
        case, n, reps, secs, browser = args.worker
        emit(worker(case, int(n), int(reps), float(secs), browser == "1"))
        return
    n, rounds, reps = (10_000, 2, 2) if args.quick else (args.blocks, args.rounds, args.reps)
    best = {c: [] for c in CASES}
    for r in range(rounds):
        order = CASES[r % 3 :] + CASES[: r % 3]
        for case in order:
            res = spawn(sys.executable, os.path.abspath(__file__),
                        [case, n, reps, args.poll_secs, int(args.browser)])
            best[case].append(res["best"])
    load = os.getloadavg()
    med = {c: statistics.median(v) for c, v in best.items()}
    watcher = "headless chromium (1 Hz)" if args.browser else f"poller every {args.poll_secs:g} s"
    print(f"no-op blocks: {n:,}, 2 workers; {rounds} rounds x {reps} reps; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print("| case | median best wall | blocks/s | ratio to off (median) | ratio per round | target |")
    print("|---|---|---|---|---|---|")
    for c in CASES:
        per = ", ".join(f"{b / o:.3f}" for b, o in zip(best[c], best["off"]))
        target = {"off": "", "on": "<= 1.02", "polled": "<= 1.05"}[c]
        name = {"off": "dashboard off", "on": "dashboard=True, nobody looks", "polled": f"dashboard, {watcher}"}[c]
        print(f"| {name} | {med[c] * 1e3:.1f} ms | {n / med[c]:,.0f} | {med[c] / med['off']:.3f} | {per} | {target} |")
    print("\nRESULT_JSON " + json.dumps({"n": n, "best": best, "load": load}))


if __name__ == "__main__":
    main()
