"""Runtime benchmark: daisy_nb's worker pool side by side with daisy 2.0.0's run_blockwise.

    python benchmarks/bench_runtime.py --daisy-python /work/venvs/daisy2/bin/python [--quick]
        [--cases noop,cpu,sleep,latency] [--repeat N]

Every case runs in a fresh interpreter (the same script with ``--case``), for both
libraries, with the same 1-D task (total = n * 10, block 10, no read/write
conflict, ``max_retries=0``) as daisy's own ``bench_worker_scaling.py``. Times are
wall-clock around ``run_blockwise`` (JIT warm-up for daisy_nb done before the
clock starts, as in the other benchmarks; the latency row also gives the cold
figure). Prints a markdown table.

Cases (``--cases`` picks some, comma-separated; ``--repeat N`` runs each daisy_nb
measurement N times and prints every run, the daisy side once):
  noop      100k no-op blocks, 2 workers: blocks/s (target >= 5x daisy 2.0.0)
  cpu       2k pure-Python ~1 ms blocks on 1 and 2 workers (target 2 workers >= 1.8x)
  sleep     5k ``time.sleep(0.001)`` blocks, 2 workers: fraction of ideal (target >= 90 %)
  latency   4 blocks, 1 worker: call -> first block running, last block done -> return
  many      ``time.sleep(0.005)`` blocks, 500 per worker, 16 and 32 workers: % of the ideal
            (500 x the sleep as measured in that child), daisy_nb and daisy 2.0.0 alternating
            (``--repeat`` pairs; target >= 90 % and ahead of daisy 2.0.0)
  client    the cluster-style worker program: ``python -c "import daisy_nb; daisy_nb.Client"``
            (and ``-X importtime``'s total) against ``import daisy; daisy.Client``, alternating
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CPU_ITERS = int(os.environ.get("BENCH_CPU_ITERS", "0"))


def noop(block):
    pass


def cpu_block(block, _n=None):
    n = _n if _n is not None else CPU_ITERS
    x = 0
    for i in range(n):
        x += i * i
    return x


def sleep_block(block):
    time.sleep(0.001)


def sleep5_block(block):
    time.sleep(0.005)


PROGRAM = """
import time
t_start = time.time()
import {lib} as daisy
client = daisy.Client()
t_client = time.time()
t_first = None
while True:
    with client.acquire_block() as block:
        if block is None:
            break
        if t_first is None:
            t_first = time.time()
with open({stamps!r}, "a") as f:
    f.write(f"{{t_start}} {{t_client}} {{t_first}}\\n")
"""


def launch_program():
    """0-argument worker function, cluster style: a separate program runs the Client loop."""
    t = time.time()
    subprocess.run([sys.executable, os.environ["BENCH_PROGRAM"]], check=True)
    with open(os.environ["BENCH_STAMP_FILE"], "a") as f:
        f.write(f"launch {t}\n")


def client_loop():
    """0-argument worker function running its own Client loop (daisy 1.x style)."""
    import importlib

    client = importlib.import_module(os.environ["BENCH_LIB"]).Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break


def stamp_block(block):
    path = os.environ["BENCH_STAMP_FILE"]
    with open(path, "a") as f:
        f.write(f"{time.time()}\n")


def calibrate_cpu_iters(target=0.001) -> int:
    n = 20000
    for _ in range(5):
        t = time.perf_counter()
        cpu_block(None, n)
        dt = time.perf_counter() - t
        n = max(1000, int(n * target / dt))
    return n


FUNCS = {
    "noop": noop,
    "cpu": cpu_block,
    "sleep": sleep_block,
    "stamp": stamp_block,
    "sleep5": sleep5_block,
    "cluster": launch_program,
    "clientloop": client_loop,
}
CASES = ("noop", "cpu", "sleep", "latency", "many", "client")


def measured_sleep(secs: float, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        time.sleep(secs)
    return (time.perf_counter() - t) / n


def run_case(lib: str, fn_name: str, n: int, workers: int) -> dict:
    """Run one case in this interpreter; returns timings."""
    if lib == "daisy":
        import daisy
        from funlib.geometry import Roi
    else:
        sys.path.insert(0, ROOT)
        from funlib.geometry import Roi

        import daisy_nb as daisy

        if os.environ.get("BENCH_COLD") != "1":
            from daisy_nb.warmup import warmup

            warmup()
    fn = FUNCS[fn_name]
    sleep_secs = measured_sleep(0.005, 100) if fn_name == "sleep5" else None  # this child's 5 ms sleep
    if fn_name == "cpu":
        iters = CPU_ITERS

        def fn(block, _n=iters):  # noqa: F811 - carries the calibrated count to the workers
            x = 0
            for i in range(_n):
                x += i * i

    task = daisy.Task(
        "bench",
        total_roi=Roi((0,), (n * 10,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=workers,
        max_retries=0,
    )
    t0 = time.time()
    ok = daisy.run_blockwise([task], progress=False, summary=False)
    t1 = time.time()
    return {"secs": t1 - t0, "ok": bool(ok), "t0": t0, "t1": t1, "sleep": sleep_secs}


def spawn_case(python: str, lib: str, fn_name: str, n: int, workers: int, env_extra=None) -> dict:
    env = dict(os.environ)
    env.update(env_extra or {})
    with tempfile.TemporaryDirectory(prefix="daisy_nb_bench_") as cwd:  # the run's worker logs land there
        r = subprocess.run(
            [python, os.path.abspath(__file__), "--case", lib, fn_name, str(n), str(workers)],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=900,
        )
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{lib} {fn_name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def import_secs(python: str, lib: str) -> tuple[float, float]:
    """(wall of ``python -c "import <lib>; <lib>.Client"``, the ``-X importtime`` total of that import)."""
    code = f"import {lib}; {lib}.Client"
    env = dict(os.environ)
    if lib == "daisy_nb":
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t = time.perf_counter()
    subprocess.run([python, "-c", code], check=True, env=env, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t
    r = subprocess.run(
        [python, "-X", "importtime", "-c", code],
        check=True,
        env=env,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    us = 0
    for line in r.stderr.splitlines():  # top-level imports have no indentation in the name column
        parts = line.split("|")
        if len(parts) == 3 and parts[2].startswith(" ") and not parts[2].startswith("  "):
            try:
                us += int(parts[1])
            except ValueError:
                pass
    return wall, us / 1e6


def cluster(python: str, lib: str) -> tuple[float, float]:
    """Worker programs (2 workers, 8 blocks): medians of (import + ``Client()`` connected inside the
    program, worker function's launch -> the program's first block)."""
    with tempfile.TemporaryDirectory() as d:
        stamps, prog = os.path.join(d, "stamps"), os.path.join(d, "prog.py")
        with open(prog, "w") as f:
            f.write(PROGRAM.format(lib=lib, stamps=stamps))
        spawn_case(python, lib, "cluster", 8, 2, {"BENCH_STAMP_FILE": stamps, "BENCH_PROGRAM": prog})
        with open(stamps) as f:
            lines = [line.split() for line in f]
    launches = sorted(float(x[1]) for x in lines if x[0] == "launch")
    progs = sorted((float(x[0]), float(x[1]), float(x[2])) for x in lines if x[0] != "launch" and x[2] != "None")
    # pair each program with the latest launch before it started (launch order = start order)
    conn, first = [], []
    for p in progs:
        t = max((x for x in launches if x <= p[0]), default=p[0])
        conn.append(p[1] - p[0])
        first.append(p[2] - t)
    return sorted(conn)[len(conn) // 2], sorted(first)[len(first) // 2]


def latency(python: str, lib: str, cold: bool = False) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile("r", suffix=".stamps", delete=False) as f:
        path = f.name
    try:
        res = spawn_case(python, lib, "stamp", 4, 1, {"BENCH_STAMP_FILE": path, "BENCH_COLD": "1" if cold else "0"})
        stamps = [float(x) for x in open(path).read().split()]
        return min(stamps) - res["t0"], res["t1"] - max(stamps)
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daisy-python", default=None, help="a python with daisy==2.0.0 installed")
    ap.add_argument("--quick", action="store_true", help="10x fewer blocks (smoke run)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=1, help="daisy_nb runs per case (each one is printed)")
    ap.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        lib, fn_name, n, w = args.case
        print("RESULT " + json.dumps(run_case(lib, fn_name, int(n), int(w))), flush=True)
        return

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        ap.error(f"unknown case(s) {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    me = sys.executable
    ref = args.daisy_python
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _util

    bc = _util.as_installed()
    if bc:
        print(bc)
    scale = 10 if args.quick else 1
    reps = max(1, args.repeat)
    iters = calibrate_cpu_iters()
    os.environ["BENCH_CPU_ITERS"] = str(iters)
    rows = []

    def each(fmt, values):
        return "; ".join(fmt(v) for v in values)

    if "noop" in cases:
        n = 100_000 // scale
        nbs = [spawn_case(me, "daisy_nb", "noop", n, 2) for _ in range(reps)]
        line = {
            "case": f"no-op, {n:,} blocks, 2 workers",
            "daisy_nb": each(lambda r: f"{n / r['secs']:,.0f} blocks/s ({r['secs']:.2f} s)", nbs),
        }
        if ref:
            d = spawn_case(ref, "daisy", "noop", n, 2)
            line["daisy 2.0.0"] = f"{n / d['secs']:,.0f} blocks/s ({d['secs']:.2f} s)"
            line["ratio"] = each(lambda r: f"{d['secs'] / r['secs']:.1f}x", nbs) + " (target >= 5x)"
        rows.append(line)

    if "cpu" in cases:
        n = 2_000 // scale
        pairs = [
            (spawn_case(me, "daisy_nb", "cpu", n, 1), spawn_case(me, "daisy_nb", "cpu", n, 2)) for _ in range(reps)
        ]
        line = {
            "case": f"~1 ms pure-Python CPU, {n:,} blocks",
            "daisy_nb": each(lambda p: f"1 worker {p[0]['secs']:.2f} s, 2 workers {p[1]['secs']:.2f} s", pairs),
            "ratio": each(lambda p: f"{p[0]['secs'] / p[1]['secs']:.2f}x", pairs) + " 2w/1w (target >= 1.8x)",
        }
        if ref:
            d1 = spawn_case(ref, "daisy", "cpu", n, 1)
            d2 = spawn_case(ref, "daisy", "cpu", n, 2)
            line["daisy 2.0.0"] = (
                f"1 worker {d1['secs']:.2f} s, 2 workers {d2['secs']:.2f} s ({d1['secs'] / d2['secs']:.2f}x)"
            )
        rows.append(line)

    if "sleep" in cases:
        n = 5_000 // scale
        ideal = n * 0.001 / 2
        # time.sleep(0.001) really sleeps longer (timer slack, wake-up latency): measure it, and give
        # the fraction both of the nominal ideal and of what two back-to-back sleepers can achieve
        t = time.perf_counter()
        for _ in range(500):
            time.sleep(0.001)
        real_sleep = (time.perf_counter() - t) / 500
        achievable = n * real_sleep / 2
        runs = [spawn_case(me, "daisy_nb", "sleep", n, 2) for _ in range(reps)]
        line = {
            "case": f"1 ms sleep, {n:,} blocks, 2 workers (sleep(0.001) takes {real_sleep * 1000:.3f} ms here)",
            "daisy_nb": each(
                lambda r: (
                    f"{r['secs']:.2f} s = {ideal / r['secs']:.0%} of nominal ideal {ideal:.2f} s, "
                    f"{achievable / r['secs']:.0%} of achievable {achievable:.2f} s"
                ),
                runs,
            ),
            "ratio": "(target >= 90 %)",
        }
        if ref:
            d = spawn_case(ref, "daisy", "sleep", n, 2)
            line["daisy 2.0.0"] = (
                f"{d['secs']:.2f} s = {ideal / d['secs']:.0%} nominal, {achievable / d['secs']:.0%} achievable"
            )
        rows.append(line)

    if "latency" in cases:
        warm = [latency(me, "daisy_nb") for _ in range(reps)]
        ca, cb = latency(me, "daisy_nb", cold=True)
        line = {
            "case": "call -> first block / last block -> return (4 blocks, 1 worker)",
            "daisy_nb": each(lambda ab: f"{ab[0] * 1000:.0f} ms / {ab[1] * 1000:.0f} ms", warm)
            + f" (without JIT warm-up: {ca * 1000:.0f} ms / {cb * 1000:.0f} ms)",
        }
        if ref:
            a, b = latency(ref, "daisy")
            line["daisy 2.0.0"] = f"{a * 1000:.0f} ms / {b * 1000:.0f} ms"
        rows.append(line)

    if "many" in cases:
        per = 50 if args.quick else 500
        for w in (4,) if args.quick else (16, 32):
            nbs, ds = [], []
            for _ in range(reps):  # alternating, so that a burst of load hits both
                nbs.append(spawn_case(me, "daisy_nb", "sleep5", per * w, w))
                if ref:
                    ds.append(spawn_case(ref, "daisy", "sleep5", per * w, w))

            def pct(r, per=per):
                return per * r["sleep"] / r["secs"]

            def fmt(r, per=per):
                return f"{r['secs']:.2f} s = {pct(r):.0%} (sleep {r['sleep'] * 1000:.2f} ms)"

            line = {
                "case": f"5 ms sleep, {per} blocks per worker, {w} workers: % of ideal",
                "daisy_nb": each(fmt, nbs),
                "ratio": "(target >= 90 % and ahead of daisy 2.0.0)",
            }
            if ds:
                line["daisy 2.0.0"] = each(fmt, ds)
                line["ratio"] = each(lambda p: f"{pct(p[0]) / pct(p[1]):.2f}x", zip(nbs, ds)) + " " + line["ratio"]
            rows.append(line)

    if "client" in cases:
        nb_t, d_t = [], []
        for _ in range(max(reps, 1 if args.quick else 5)):
            nb_t.append(import_secs(me, "daisy_nb"))
            if ref:
                d_t.append(import_secs(ref, "daisy"))

        def med(xs, i):
            return sorted(x[i] for x in xs)[len(xs) // 2]

        line = {
            "case": "worker program start: python -c 'import X; X.Client' (wall / importtime total, median)",
            "daisy_nb": f"{med(nb_t, 0) * 1000:.0f} ms / {med(nb_t, 1) * 1000:.0f} ms",
        }
        if d_t:
            line["daisy 2.0.0"] = f"{med(d_t, 0) * 1000:.0f} ms / {med(d_t, 1) * 1000:.0f} ms"
            line["ratio"] = f"{med(d_t, 0) / med(nb_t, 0):.2f}x wall (target >= 1x)"
        rows.append(line)
        nb_c, d_c = [], []
        for _ in range(reps):
            nb_c.append(cluster(me, "daisy_nb"))
            if ref:
                d_c.append(cluster(ref, "daisy"))
        n = 100 if args.quick else 2000
        nb_l = [spawn_case(me, "daisy_nb", "clientloop", n, 2, {"BENCH_LIB": "daisy_nb"}) for _ in range(reps)]
        d_l = [spawn_case(ref, "daisy", "clientloop", n, 2, {"BENCH_LIB": "daisy"})] if ref else []
        line = {
            "case": f"Client loop in a worker function, {n:,} no-op blocks, 2 workers: blocks/s",
            "daisy_nb": each(lambda r: f"{n / r['secs']:,.0f} blocks/s ({r['secs']:.2f} s)", nb_l),
        }
        if d_l:
            line["daisy 2.0.0"] = f"{n / d_l[0]['secs']:,.0f} blocks/s ({d_l[0]['secs']:.2f} s)"
            line["ratio"] = each(lambda r: f"{d_l[0]['secs'] / r['secs']:.1f}x", nb_l)
        rows.append(line)
        line = {
            "case": "worker program run by a worker function: import + Client() connected / launch -> first block (medians)",
            "daisy_nb": each(lambda r: f"{r[0] * 1000:.0f} ms / {r[1] * 1000:.0f} ms", nb_c),
        }
        if d_c:
            line["daisy 2.0.0"] = each(lambda r: f"{r[0] * 1000:.0f} ms / {r[1] * 1000:.0f} ms", d_c)
            line["ratio"] = each(lambda p: f"{p[1][1] / p[0][1]:.2f}x", zip(nb_c, d_c)) + " to first block"
        rows.append(line)

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load:
        print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    cols = ["case", "daisy_nb", "daisy 2.0.0", "ratio"]
    print(f"\nMachine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; CPU block = {iters} iterations\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(r.get(c, "") for c in cols) + " |")


if __name__ == "__main__":
    main()
