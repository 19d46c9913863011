"""Fixed costs: whole-process small runs, daisy_nb against daisy 2.0.0, and where compiling pays off.

    python benchmarks/bench_small.py --daisy-python /work/venv-daisy2/bin/python [--pairs 7]
        [--sizes 10,1000,100000] [--workers 2] [--modes auto,python,numba] [--calibrate] [--quick]

What a user meets first: ``python script.py`` with one ``run_blockwise`` of N no-op blocks
(1-D, block 1, no conflict, ``max_workers``=2; defaults otherwise: progress bar and
summary, no block tracking) from interpreter start to exit.
Each measurement is a fresh interpreter (this script with ``--worker``); the parent starts it,
waits for it with ``os.wait4`` and reports

* **wall**: the parent's clock around the whole child process (interpreter start-up,
  imports, workers, the run, exit);
* **peak**: ``ru_maxrss`` of that child from ``wait4``, the largest resident set of any one
  process of the tree (the scheduler process or one worker);
* **first block**: from the child's start to the first block starting in a worker (the
  workers stamp a file);
* **scheduler peak** / **worker peak**: ``ru_maxrss`` of the scheduler process alone, and the
  largest worker's ``VmHWM`` at its first block (after its imports; a forked child's
  ``ru_maxrss`` would count its parent's pages);
* **scheduler only** (``sched`` rows): the same N blocks through ``Scheduler.acquire_block`` /
  ``release_block`` in one process, no workers: the scheduler side's own fixed and per-block
  cost, wall and peak memory of that whole process; **CPU per block**: the process's CPU time
  from the built Scheduler to the last release, per block (one acquire and one release).

``--also ROOT`` (repeatable) measures another daisy_nb checkout (e.g. ``main``) in the same pairs,
its rows labelled ``@`` and the directory's name: a before/after under the same load.

Pairs alternate (daisy first in even pairs, daisy_nb first in odd ones); medians over
``--pairs`` pairs. daisy_nb runs in its default mode (``auto``: plain Python kernels for small
runs, compiled above ``kernels/_jit.py`` ``COMPILE_AT``) and, with ``--modes``, forced plain
(``DAISY_NB_JIT=0``) and forced compiled (``DAISY_NB_JIT=1``), so that the crossover shows.
The numba cache must be warm (``python -m daisy_nb warmup``); the script warms it first.

``--calibrate`` prints the two sides of the compile decision: the plain-Python kernel cost per
scheduler block for a few pipelines (with their downstream fan-out, the Scheduler's estimate)
and the cost of importing numba and loading the cached kernels.

Targets (issue 13): 10 blocks at <= 1.0x daisy 2.0.0's wall and <= 2.5x its peak memory;
large runs keep their speed. ``--quick``: 2 pairs of 10 and 300 blocks, daisy side only with
``--daisy-python`` (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _util as U  # noqa: E402

SCRIPT = os.path.abspath(__file__)


def noop(block):
    """The block function: stamps the first block of each worker, then does nothing."""
    global _stamped
    if not _stamped:
        _stamped = True
        path = os.environ.get("BENCH_STAMP_FILE")
        if path:
            hwm = 0
            with open("/proc/self/status") as st:  # this worker's own peak so far (imports done)
                for line in st:
                    if line.startswith("VmHWM:"):
                        hwm = int(line.split()[1]) * 1024
            with open(path, "a") as f:
                f.write(f"{time.time()} {hwm}\n")


_stamped = False


# -- children -----------------------------------------------------------------------
def child_run(lib: str, n: int, workers: int) -> dict:
    import resource

    t0 = time.time()
    if lib == "daisy":
        import daisy
        from funlib.geometry import Roi
    else:
        from funlib.geometry import Roi

        import daisy_nb as daisy
    t_import = time.time() - t0
    task = daisy.Task(
        "small",
        total_roi=Roi((0,), (n,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=noop,
        read_write_conflict=False,
        max_workers=workers,
        max_retries=0,
    )
    ok = daisy.run_blockwise([task])  # defaults, as a user writes it: progress bar and summary (to a file here)
    return {
        "ok": bool(ok),
        "t_start": t0,
        "t_import": t_import,
        "t_run_end": time.time(),
        "sched_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "numba": "numba" in sys.modules,
    }


def child_sched(lib: str, n: int) -> dict:
    import resource

    t0 = time.time()
    if lib == "daisy":
        import daisy
        from funlib.geometry import Roi
    else:
        from funlib.geometry import Roi

        import daisy_nb as daisy
    task = daisy.Task(
        "small",
        total_roi=Roi((0,), (n,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=noop,
        read_write_conflict=False,
        max_retries=0,
    )
    t1 = time.time()
    s = daisy.Scheduler([task]) if lib == "daisy_nb" else daisy.Scheduler(task)
    t_built = time.time()
    c0 = time.process_time()
    done = 0
    first = None
    while True:
        b = s.acquire_block("small")
        if b is None:
            break
        if first is None:
            first = time.time() - t0
        b.status = daisy.BlockStatus.SUCCESS
        s.release_block(b)
        done += 1
    return {
        "done": done,
        "t_first": first,
        "t_setup": t1 - t0,
        # acquire_block + release_block alone (CPU, from the built Scheduler to the last release)
        "cpu_block": (time.process_time() - c0) / max(done, 1),
        "t_loop": time.time() - t_built,
        "t_total": time.time() - t0,
        "sched_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "numba": "numba" in sys.modules,
    }


def child_calibrate(mode: str) -> dict:
    import warnings

    import numpy as np

    from daisy_nb.kernels import _jit

    _jit.set_mode(mode)
    import daisy_nb as daisy
    from daisy_nb import Roi
    from daisy_nb.scheduler import Scheduler

    warnings.simplefilter("ignore")

    def pipeline(nd, k, ntasks, ctx, conflict):
        ts = [
            daisy.Task(
                f"t{i}",
                Roi((0,) * nd, (k * 10 + 2 * ctx,) * nd),
                Roi((0,) * nd, (10 + 2 * ctx,) * nd),
                Roi((ctx,) * nd, (10,) * nd),
                tracking_path=False,
                read_write_conflict=conflict,
            )
            for i in range(ntasks)
        ]
        p = ts[0]
        for t in ts[1:]:
            p = p + t
        return p

    def drain(p):
        s = Scheduler(p)
        n = 0
        while True:
            got = False
            for tid in s.task_ids:
                b = s.acquire_blocks(tid, 16)
                if len(b):
                    got = True
                    n += len(b)
                    s.release_blocks(tid, b.index, np.full(len(b), 2, np.uint8))
            if not got:
                return s, n

    def drain_one(p):
        s = Scheduler(p)
        n = 0
        while True:
            got = False
            for tid in s.task_ids:
                b = s.acquire_block(tid)
                if b is not None:
                    got = True
                    n += 1
                    b.status = daisy.BlockStatus.SUCCESS
                    s.release_block(b)
            if not got:
                return n

    out = []
    for cfg in [
        (1, 3000, 1, 0, False),
        (1, 1500, 2, 1, True),
        (2, 50, 2, 1, True),
        (3, 12, 1, 2, True),
        (3, 10, 2, 2, True),
    ]:
        drain(pipeline(*cfg))
        t = time.perf_counter()
        s, n = drain(pipeline(*cfg))
        dt = time.perf_counter() - t
        t = time.perf_counter()
        drain_one(pipeline(*cfg))
        dt1 = time.perf_counter() - t
        out.append({"cfg": cfg, "n": n, "cap": int(s.geometry.down_cap), "us": dt * 1e6 / n, "us_one": dt1 * 1e6 / n})
    return {"rows": out}


def child_buy() -> dict:
    import numpy as np

    import daisy_nb as daisy
    from daisy_nb import Roi
    from daisy_nb.kernels import _jit
    from daisy_nb.scheduler import Scheduler

    t = time.perf_counter()
    _jit.use_numba()
    t1 = time.perf_counter()
    s = Scheduler([daisy.Task("a", Roi((0,), (4,)), Roi((0,), (1,)), Roi((0,), (1,)), tracking_path=False)])
    b = s.acquire_blocks("a", 2)
    s.release_blocks("a", b.index, np.full(len(b), 2, np.uint8))
    blk = s.acquire_block("a")
    blk.status = daisy.BlockStatus.SUCCESS
    s.release_block(blk)
    return {"import": t1 - t, "load": time.perf_counter() - t1}


# -- parent -------------------------------------------------------------------------
def measure(python: str, args: list[str], env_extra: dict | None = None) -> dict:
    """Run one child to its end: its RESULT, the wall-clock and ru_maxrss of its process tree."""
    with tempfile.NamedTemporaryFile("r", suffix=".stamps", delete=False) as f:
        stamps = f.name
    env = U.child_env({"BENCH_STAMP_FILE": stamps, **(env_extra or {})})
    env["PYTHONPATH"] = HERE + os.pathsep + env["PYTHONPATH"]
    out = tempfile.TemporaryFile("w+")
    cwd = tempfile.TemporaryDirectory(prefix="daisy_nb_bench_")  # the run's worker logs land there
    try:
        t0 = time.time()
        p = subprocess.Popen(
            [python, SCRIPT, "--worker", *map(str, args)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd.name,
        )
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.time() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
        res = next((json.loads(ln[7:]) for ln in reversed(text.splitlines()) if ln.startswith("RESULT ")), None)
        if res is None or p.returncode != 0:
            raise RuntimeError(f"child {args} failed (rc {p.returncode}):\n{text[-3000:]}")
        res.update(wall=wall, peak=ru.ru_maxrss * 1024, t_spawn=t0)
        with open(stamps) as f:
            st = [ln.split() for ln in f.read().splitlines() if ln.strip()]
        res["first_block"] = min(float(x[0]) for x in st) - t0 if st else None
        res["worker_hwm"] = max(int(x[1]) for x in st) if st else None
        return res
    finally:
        out.close()
        cwd.cleanup()
        os.unlink(stamps)


MODE_ENV = {"auto": {}, "python": {"DAISY_NB_JIT": "0"}, "numba": {"DAISY_NB_JIT": "1"}}


def run_pairs(
    daisy_python: str | None,
    kind: str,
    n: int,
    workers: int,
    pairs: int,
    modes: list[str],
    others: list[str] = (),  # type: ignore[assignment]
) -> dict:
    """Alternating pairs: returns {label: [result, ...]}. ``others``: further daisy_nb checkouts
    (their root directories), each run in every mode beside this one (``--also``)."""
    runs = {"daisy": (daisy_python, "daisy", {})} if daisy_python else {}
    for m in modes:
        runs[f"daisy_nb {m}"] = (sys.executable, "daisy_nb", MODE_ENV[m])
        for root in others:
            runs[f"daisy_nb {m} @ {os.path.basename(os.path.normpath(root))}"] = (
                sys.executable,
                "daisy_nb",
                {**MODE_ENV[m], "PYTHONPATH": root},
            )
    labels = list(runs)
    res: dict[str, list] = {lab: [] for lab in labels}
    for i in range(pairs):
        order = labels if i % 2 == 0 else labels[::-1]
        for lab in order:
            py, lib, env = runs[lab]
            args = [kind, lib, n, workers] if kind == "run" else [kind, lib, n]
            res[lab].append(measure(py, args, env))
    return res


def med(rs: list[dict], key: str):
    xs = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def mib(x) -> str:
    return "–" if x is None else f"{x / 2**20:.0f} MiB"


def secs(x) -> str:
    return "–" if x is None else U.fmt_secs(x)


def report(kind: str, n: int, res: dict) -> list[list]:
    rows = []
    base = res.get("daisy")
    for lab, rs in res.items():
        wall, peak = med(rs, "wall"), med(rs, "peak")
        ratio = "–"
        if base and lab != "daisy":
            # per-pair ratios (same pair, same load), then their median
            rw = statistics.median(a["wall"] / b["wall"] for a, b in zip(rs, base))
            rm = statistics.median(a["peak"] / b["peak"] for a, b in zip(rs, base))
            ratio = f"{rw:.2f}x wall, {rm:.2f}x peak"
        spread = f"{min(r['wall'] for r in rs):.2f}-{max(r['wall'] for r in rs):.2f} s"
        if kind == "run":
            rows.append(
                [
                    f"{n:,}",
                    lab,
                    secs(wall),
                    spread,
                    mib(peak),
                    ratio,
                    secs(med(rs, "first_block")),
                    mib(med(rs, "sched_rss")),
                    mib(med(rs, "worker_hwm")),
                    "yes" if any(r["numba"] for r in rs) else "no",
                ]
            )
        else:
            rows.append(
                [
                    f"{n:,}",
                    lab,
                    secs(wall),
                    spread,
                    mib(peak),
                    ratio,
                    secs(med(rs, "t_first")),
                    "–" if med(rs, "cpu_block") is None else f"{med(rs, 'cpu_block') * 1e6:.1f} µs",
                    "–",
                    "yes" if any(r["numba"] for r in rs) else "no",
                ]
            )
    return rows


def calibrate() -> None:
    print("\n### Compile or not: the two sides (kernels/_jit.py COMPILE_AT)\n")
    plain = U.spawn(sys.executable, SCRIPT, ["calibrate", "python"])["rows"]
    comp = U.spawn(sys.executable, SCRIPT, ["calibrate", "numba"])["rows"]
    rows = []
    for p, c in zip(plain, comp):
        nd, k, nt, ctx, conf = p["cfg"]
        est = 50 + 7 * p["cap"]
        rows.append(
            [
                f"{nd}-D, {nt} task(s), context {ctx}, conflict {conf}",
                p["n"],
                p["cap"],
                f"{p['us']:.0f} / {p['us_one']:.0f} µs",
                f"{est} µs",
                f"{c['us']:.1f} / {c['us_one']:.1f} µs",
                f"{600_000 / est:,.0f}",
            ]
        )
    print(
        U.table(
            [
                "pipeline",
                "blocks",
                "downstream cap",
                "plain / block (batch / per-block API)",
                "Scheduler's estimate 50+7*cap",
                "compiled / block (batch / per-block)",
                "compiles from (blocks)",
            ],
            rows,
        )
    )
    buys = [U.spawn(sys.executable, SCRIPT, ["buy"]) for _ in range(5)]
    imp = statistics.median(b["import"] for b in buys)
    load = statistics.median(b["load"] for b in buys)
    print(
        f"\nimport numba: median {imp:.3f} s; first scheduler calls (cached kernels): median {load:.3f} s; "
        f"together {imp + load:.3f} s (COMPILE_AT = 0.600 s of plain-Python kernel work); 5 fresh processes"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daisy-python", help="a Python with daisy==2.0.0")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--sizes", default="10,1000,100000")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="auto,python,numba", help="daisy_nb modes: auto, python (DAISY_NB_JIT=0), numba")
    ap.add_argument("--no-sched", action="store_true", help="skip the scheduler-only rows")
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="ROOT",
        help="another daisy_nb checkout (its root directory) measured in the same pairs (before/after)",
    )
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.worker:
        kind, *rest = a.worker
        if kind == "run":
            U.emit(child_run(rest[0], int(rest[1]), int(rest[2])))
        elif kind == "sched":
            U.emit(child_sched(rest[0], int(rest[1])))
        elif kind == "calibrate":
            U.emit(child_calibrate(rest[0]))
        elif kind == "buy":
            U.emit(child_buy())
        return 0
    if a.quick:
        a.pairs, a.sizes, a.modes = 2, "10,300", "auto"
    sizes = [int(x) for x in a.sizes.split(",")]
    modes = [m for m in a.modes.split(",") if m]
    print(f"# bench_small: whole-process small runs ({U.machine_note()})\n")
    note = U.as_installed()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # the other checkouts as installed too (see as_installed)
        import compileall

        for root in a.also:
            compileall.compile_dir(os.path.join(root, "daisy_nb"), quiet=1)
    if note:
        print(note + "\n")
    subprocess.run([sys.executable, "-m", "daisy_nb", "warmup"], env=U.child_env(), check=True, capture_output=True)
    headers = [
        "blocks",
        "library",
        "wall (median)",
        "range",
        "peak (tree max)",
        "vs daisy (median of pairs)",
        "first block",
        "scheduler peak",
        "worker peak",
        "numba loaded",
    ]
    rows = []
    for n in sizes:
        rows += report("run", n, run_pairs(a.daisy_python, "run", n, a.workers, a.pairs, modes, a.also))
    print(f"### run_blockwise, {a.workers} workers, no-op blocks, {a.pairs} alternating pairs\n")
    print(U.table(headers, rows))
    if not a.no_sched:
        rows = []
        for n in sizes:
            rows += report("sched", n, run_pairs(a.daisy_python, "sched", n, a.workers, a.pairs, modes, a.also))
        print(f"\n### Scheduler only (acquire_block/release_block in one process, no workers), {a.pairs} pairs\n")
        print(
            U.table(headers[:7] + ["CPU per block (acquire + release)", "", "numba loaded"], rows).replace(
                "| first block |", "| first block handed out |"
            )
        )
    if a.calibrate:
        calibrate()
    print(f"\n({U.machine_note()} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
