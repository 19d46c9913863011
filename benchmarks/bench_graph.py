"""Dependency-graph benchmark: daisy_nb ``to_arrays()`` against daisy 2.0.0, and start-up.

    python benchmarks/bench_graph.py --daisy-python /work/venvs/daisy2/bin/python [--quick] [--repeat 3]

Configurations: the four of daisy's own ``bench_dependency_graph.py`` (CORE.md 3.11):
``TR = 0 + total``, ``BR = 0 + (b + 2c)``, ``BW = c + b``, fit "valid".

Every measurement runs in a fresh interpreter (this script with ``--worker``):

* **time** (one child per library and configuration): builds the graph, calls
  daisy 2.0.0's ``enumerate_all_dependencies()`` (the public call, which builds
  Python ``Block`` objects, and the Rust ``_native`` call alone) or daisy_nb's
  ``to_arrays()`` (after ``daisy_nb.warmup.warmup()``) ``--repeat`` times. The
  first call of the process is reported separately (it pays the page faults of
  fresh memory) and its peak RSS above the RSS before the call is the memory
  figure (the kernel's peak mark is reset first, see ``_util.py``). The speedup
  is best daisy / best daisy_nb; the bracket gives best daisy / worst daisy_nb ..
  worst daisy / best daisy_nb. The CPU-time speedup (``time.process_time()``) is
  reported beside it: other jobs on a shared machine disturb it much less.
* **tracemalloc** (daisy_nb only, same child, after the timings): the peak of
  traced allocations during one ``to_arrays()`` (numpy reports its buffers to
  tracemalloc); daisy's buffers live in Rust, invisible to tracemalloc.
* **one-shot** (the headline configuration, ``--first-calls`` more fresh children per
  library, alternating): the first call alone, the figure a user who calls it once sees;
  medians, since a first call's page faults land on transparent huge pages or not
  depending on the machine's memory (see ``one_shot``).
* **start-up**: wall-clock of ``python -c "import daisy_nb; <10-block graph>;
  to_arrays()"`` with an empty numba cache (``NUMBA_CACHE_DIR`` = a fresh temporary
  directory) and with the warm one it left (wall-clock and the child's CPU time);
  the same for ``daisy_nb.warmup.warmup()``; and, for scale, ``python -c "import
  numpy, numba"`` and numba's own floor (its first call of any cached function).

``--quick`` runs tiny grids and warm start-up only (a CI smoke test of a few
seconds); without ``--daisy-python`` the daisy side is skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402

SCRIPT = os.path.abspath(__file__)

# name: (total, block, context, conflict); "full" sizes are CORE.md 3.11's
CONFIGS = {
    "1M no conflict": (1000, 10, 0, False),
    "1M with conflict": (1000, 10, 2, True),
    "125K small": (200, 4, 0, False),
    "1M small context": (500, 5, 1, True),
}
QUICK = {
    "1M no conflict": (100, 10, 0, False),
    "1M with conflict": (124, 10, 2, True),
    "125K small": (40, 4, 0, False),
    "1M small context": (62, 5, 1, True),
}
HEADLINE = "1M with conflict"
SPEEDUP_TARGET = 100.0
BYTES_TARGET = 200.0
WARM_START_TARGET = 1.0

STARTUP_CODE = """
import time
t0 = time.perf_counter()
import daisy_nb
from daisy_nb import Roi
t1 = time.perf_counter()
g = daisy_nb.BlockwiseDependencyGraph("s", Roi((0,), (4,)), Roi((1,), (2,)), True, "valid", total_read_roi=Roi((0,), (22,)))
a = g.to_arrays()
assert len(a.block_id) == 10, len(a.block_id)
t2 = time.perf_counter()
print("INNER", t1 - t0, t2 - t1)
"""
WARMUP_CODE = """
import time
t0 = time.perf_counter()
import daisy_nb.warmup
t1 = time.perf_counter()
daisy_nb.warmup.warmup()
t2 = time.perf_counter()
print("INNER", t1 - t0, t2 - t1)
"""
IMPORT_CODE = "import numpy, numba"
# the headline graph's to_arrays() as a user calls it once: fresh process, no warmup (numba
# is imported and fill_rows loaded from the cache because the work is large)
ONE_SHOT_CODE = """
import time
t0 = time.perf_counter()
import daisy_nb
from daisy_nb import Roi
g = daisy_nb.BlockwiseDependencyGraph("s", Roi((0,) * 3, (14,) * 3), Roi((2,) * 3, (10,) * 3), True, "valid",
                                      total_read_roi=Roi((0,) * 3, (1000,) * 3))
t1 = time.perf_counter()
a = g.to_arrays()
t2 = time.perf_counter()
print("INNER", t1 - t0, t2 - t1)
"""
# numba's fixed cost: its first call of any cached function initialises the CPU target
FIRST_JIT_CODE = """
import time
t0 = time.perf_counter()
import numpy, numba
t1 = time.perf_counter()
import daisy_nb.kernels._jit as j
import daisy_nb.kernels.block_id as b
j.use_numba()  # small work runs as plain Python otherwise
b.cantor(numpy.zeros(1, numpy.int64), 1)
t2 = time.perf_counter()
print("INNER", t1 - t0, t2 - t1)
"""


def _rois(total, b, c):
    from funlib.geometry import Roi

    return Roi((0,) * 3, (total,) * 3), Roi((0,) * 3, (b + 2 * c,) * 3), Roi((c,) * 3, (b,) * 3)


# -- children -----------------------------------------------------------------------
def _graph(lib: str, spec: tuple):
    """The library's graph of one configuration (daisy_nb's kernels warmed first)."""
    total, b, c, conflict = spec
    if lib == "daisy":
        import daisy
    else:
        U.warm_daisy_nb()
        import daisy_nb as daisy
    tr, br, bw = _rois(total, b, c)
    return daisy.BlockwiseDependencyGraph("bench", br, bw, conflict, "valid", total_read_roi=tr)


def worker_time(lib: str, spec: tuple, repeat: int) -> dict:
    g = _graph(lib, spec)
    n = int(g.num_blocks)
    out = {"blocks": n}
    if lib == "daisy":
        call = g.enumerate_all_dependencies
    else:
        call = g.to_arrays
    # first call of the process: time and peak memory
    with U.PeakRss() as m:
        t = time.perf_counter()
        res = call()
        first = time.perf_counter() - t
    out.update(first=first, peak_rss=m.delta, peak_exact=m.exact)
    if lib == "daisy":
        out["edges"] = sum(len(u) for _, u in res)
    else:
        out["edges"] = int(len(res.upstream_indices))
        # bytes the result owns: a broadcast shape (stride 0) owns nothing, and the
        # upstream indices are a slice of a buffer sized by an upper bound
        idx = res.upstream_indices
        owned = [res.block_id, res.level, res.read_offset, res.write_offset, res.upstream_indptr]
        owned += [x for x in (res.read_shape, res.write_shape) if x.strides[0] != 0]
        out["result_bytes"] = int(sum(x.nbytes for x in owned) + (idx.base if idx.base is not None else idx).nbytes)
    del res
    times, cpu = [], []
    for _ in range(repeat):
        t, c0 = time.perf_counter(), time.process_time()
        res = call()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c0)
        del res
    out["times"], out["cpu"] = times, cpu
    if lib == "daisy_nb":
        out["tracemalloc_peak"] = _tracemalloc_peak(call)
    if lib == "daisy":
        native = []
        for _ in range(repeat):
            t = time.perf_counter()
            res = g._native.enumerate_all_dependencies()
            native.append(time.perf_counter() - t)
            del res
        out["native"] = native
    return out


def worker_first(lib: str, spec: tuple) -> dict:
    """The first call of a fresh process alone (kernels warmed for daisy_nb, as in ``worker_time``)."""
    g = _graph(lib, spec)
    call = g.enumerate_all_dependencies if lib == "daisy" else g.to_arrays
    t = time.perf_counter()
    res = call()
    first = time.perf_counter() - t
    t = time.perf_counter()
    res2 = call()
    second = time.perf_counter() - t
    del res, res2
    return {"first": first, "second": second}


def _tracemalloc_peak(call) -> int:
    """Peak of traced allocations during one call (numpy reports its buffers to tracemalloc)."""
    import tracemalloc

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    res = call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del res
    return peak - base


# -- start-up ------------------------------------------------------------------------
def run_code(code: str, cache_dir: str | None) -> tuple[float, float, float, float]:
    """Wall-clock of ``python -c code``, the two INNER figures it prints, and its CPU time."""
    import resource

    env = U.child_env({"NUMBA_CACHE_DIR": cache_dir} if cache_dir else None)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=900
    )
    wall = time.perf_counter() - t
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru2.ru_utime - ru.ru_utime) + (ru2.ru_stime - ru.ru_stime)
    if r.returncode != 0:
        raise RuntimeError(f"start-up child failed:\n{r.stderr[-3000:]}")
    inner = [ln for ln in r.stdout.splitlines() if ln.startswith("INNER")]
    a, b = (float(x) for x in inner[-1].split()[1:3]) if inner else (0.0, 0.0)
    return wall, a, b, cpu


def startup(repeat: int, quick: bool) -> list[list]:
    rows = []
    cases = [("`import daisy_nb`, 10-block graph, `to_arrays()`", STARTUP_CODE, WARM_START_TARGET)]
    if not quick:
        runs = [run_code(IMPORT_CODE, None) for _ in range(repeat)]
        imp = U.stats([x[0] for x in runs])
        rows.append(
            [
                '`python -c "import numpy, numba"` (for scale)',
                "–",
                U.fmt_timing(imp) + f", CPU {min(x[3] for x in runs):.2f} s",
                "–",
                "",
            ]
        )
        runs = [run_code(FIRST_JIT_CODE, None) for _ in range(repeat)]
        fj = U.stats([x[0] for x in runs])
        rows.append(
            [
                "`import numba` + first call of one small cached kernel (`cantor`): numba's own floor",
                "–",
                U.fmt_timing(fj) + f", CPU {min(x[3] for x in runs):.2f} s",
                "–",
                f"in-process: import numba {min(x[1] for x in runs):.2f} s, first call {min(x[2] for x in runs):.2f} s",
            ]
        )
        cases.append(("`daisy_nb.warmup.warmup()` (every kernel)", WARMUP_CODE, None))
        runs = [run_code(ONE_SHOT_CODE, None) for _ in range(repeat)]
        os_ = U.stats([x[0] for x in runs])
        rows.append(
            [
                "fresh process, no warmup: import + 970k-block conflict graph + `to_arrays()` once",
                "–",
                U.fmt_timing(os_) + f", CPU {min(x[3] for x in runs):.2f} s",
                "report",
                f"in-process: import + graph {min(x[1] for x in runs):.2f} s, to_arrays() (numba import, kernel load, "
                f"the call) {min(x[2] for x in runs):.2f} s",
            ]
        )
    for label, code, target in cases:
        if quick:
            warm = [run_code(code, None) for _ in range(repeat)]
            st = U.stats([w[0] for w in warm])
            rows.append(
                [
                    label + " — default cache",
                    "(skipped in --quick)",
                    U.fmt_timing(st) + f", CPU {min(w[3] for w in warm):.2f} s",
                    "(quick: not judged)",
                    f"in-process: import {warm[0][1]:.2f} s, call {warm[0][2]:.2f} s",
                ]
            )
            continue
        cold, warm = [], []
        for _ in range(repeat):
            d = tempfile.mkdtemp(prefix="numba_cache_")
            try:
                cold.append(run_code(code, d))
                warm.extend(run_code(code, d) for _ in range(1))
            finally:
                shutil.rmtree(d, ignore_errors=True)
        cs, ws = U.stats([c[0] for c in cold]), U.stats([w[0] for w in warm])
        bi = min(range(len(warm)), key=lambda i: warm[i][0])
        bc = min(range(len(cold)), key=lambda i: cold[i][0])
        rows.append(
            [
                label,
                U.fmt_timing(cs) + f", CPU {min(c[3] for c in cold):.2f} s",
                U.fmt_timing(ws) + f", CPU {min(w[3] for w in warm):.2f} s",
                f"warm < {target:.0f} s: {U.verdict(ws['best'], target, False)}" if target else "report",
                f"in-process, cold: import {cold[bc][1]:.2f} s + call {cold[bc][2]:.2f} s; warm: import {warm[bi][1]:.2f} s + call {warm[bi][2]:.2f} s",
            ]
        )
    return rows


def one_shot(ref: str | None, k: int, d_time: dict | None, nb_time: dict) -> None:
    """The headline's first call in ``k`` more fresh processes each: the figure a user who calls it once sees.

    A first call pays the page faults of its fresh output memory (~96 B per block); whether
    those land on transparent huge pages (numpy asks for them) depends on how fragmented
    the machine's memory is, so single samples range widely: medians over fresh processes,
    alternating the two libraries, with the range.
    """
    nb_first = [nb_time["first"]]
    d_first = [d_time["first"]] if d_time else []
    nb_second = []
    for i in range(k):
        if ref and i < min(3, k):
            d_first.append(U.spawn(ref, SCRIPT, ["first", "daisy", HEADLINE])["first"])
        r = U.spawn(sys.executable, SCRIPT, ["first", "daisy_nb", HEADLINE])
        nb_first.append(r["first"])
        nb_second.append(r["second"])
    nb = U.stats(nb_first)
    row = [HEADLINE, str(len(nb_first)), U.fmt_timing(nb), U.fmt_timing(U.stats(nb_second))]
    if d_first:
        d = U.stats(d_first)
        med = d["median"] / nb["median"]
        row += [
            str(len(d_first)),
            U.fmt_timing(d),
            U.fmt_ratio(med, d["best"] / nb["worst"], d["worst"] / nb["best"]),
            f">= {SPEEDUP_TARGET:.0f}x (median): {U.verdict(med, SPEEDUP_TARGET, True)}",
        ]
    else:
        row += ["–", "–", "–", ""]
    print("\n## One-shot: the first call of a fresh process (kernels loaded), medians over fresh processes\n")
    print(
        U.table(
            [
                "config",
                "daisy_nb processes",
                "daisy_nb first call",
                "its second call",
                "daisy processes",
                "daisy 2.0.0 first call",
                "speedup, medians [worst .. best]",
                "target",
            ],
            [row],
        )
    )
    print(
        "\nThe daisy_nb processes include the one of the table above. A first call's output memory is fresh: "
        "~96 B/block of page faults, on transparent huge pages when the kernel has them free "
        f"({_thp_note()}); the outliers are the kernel compacting memory for them.",
        flush=True,
    )


def _thp_note() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            enabled = f.read().strip()
        with open("/sys/kernel/mm/transparent_hugepage/defrag") as f:
            defrag = f.read().strip()
        return f"THP enabled {enabled}, defrag {defrag}"
    except OSError:
        return "THP settings unknown"


# -- driver -----------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daisy-python", default=None, help="a python with daisy==2.0.0 installed (omit to skip daisy)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, warm start-up only (CI smoke test)")
    ap.add_argument("--repeat", type=int, default=None, help="timed repeats per measurement (default 3, quick 1)")
    ap.add_argument("--only", default=None, help="comma-separated config names (default: all four)")
    ap.add_argument("--no-startup", action="store_true")
    ap.add_argument(
        "--first-calls",
        type=int,
        default=7,
        help="fresh processes for the headline's one-shot figure (daisy_nb; daisy gets min(3, this); 0: skip)",
    )
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        kind, *rest = args.worker
        if kind == "time":
            lib, repeat, quick, *names = rest
            cfg = QUICK if quick == "1" else CONFIGS
            U.emit({name: worker_time(lib, cfg[name], int(repeat)) for name in names})
        elif kind == "first":
            lib, name = rest
            U.emit(worker_first(lib, CONFIGS[name]))
        return

    repeat = args.repeat or (1 if args.quick else 3)
    configs = QUICK if args.quick else CONFIGS
    names = [n.strip() for n in args.only.split(",")] if args.only else list(configs)
    ref = args.daisy_python
    q = "1" if args.quick else "0"
    print(f"# bench_graph ({'quick' if args.quick else 'full'}; {U.machine_note()}; repeat={repeat})\n", flush=True)

    # one fresh child per library and configuration (its first call is the memory
    # figure); --quick runs all configurations in one child per library
    groups = [names] if args.quick else [[n] for n in names]
    res_d, res_nb = {}, {}
    for group in groups:
        if ref:
            res_d.update(U.spawn(ref, SCRIPT, ["time", "daisy", repeat, q, *group]))
        res_nb.update(U.spawn(sys.executable, SCRIPT, ["time", "daisy_nb", repeat, q, *group]))
        print(f"  measured: {', '.join(group)}", file=sys.stderr, flush=True)

    def judge(x, target, higher=True):
        return "(quick: not judged)" if args.quick else U.verdict(x, target, higher)

    trows, mrows = [], []
    for name in names:
        total, b, c, conflict = configs[name]
        label = f"{name} ({total}³/{b}³/c{c}/{'conflict' if conflict else 'no conflict'})"
        d, nb = res_d.get(name), res_nb[name]
        n = nb["blocks"]
        nbst = U.stats(nb["times"])
        row = [label, f"{n:,}", f"{nb['edges']:,}"]
        if d:
            if d["blocks"] != n or d["edges"] != nb["edges"]:
                raise SystemExit(
                    f"{name}: daisy has {d['blocks']} blocks / {d['edges']} edges, daisy_nb {n} / {nb['edges']}"
                )
            dst, nst = U.stats(d["times"]), U.stats(d["native"])
            sp = dst["best"] / nbst["best"]
            sp_lo, sp_hi = dst["best"] / nbst["worst"], dst["worst"] / nbst["best"]
            sp_first = d["first"] / nb["first"]
            sp_native = nst["best"] / nbst["best"]
            sp_cpu = min(d["cpu"]) / min(nb["cpu"])
            tgt = f">= {SPEEDUP_TARGET:.0f}x: {judge(sp, SPEEDUP_TARGET)}" if name == HEADLINE else ""
            row += [
                U.fmt_timing(dst),
                U.fmt_timing(nst),
                U.fmt_timing(nbst),
                U.fmt_secs(d["first"]) + " / " + U.fmt_secs(nb["first"]),
                U.fmt_ratio(sp, sp_lo, sp_hi),
                U.fmt_ratio(sp_cpu),
                U.fmt_ratio(sp_native),
                U.fmt_ratio(sp_first),
                tgt,
            ]
        else:
            row += ["–", "–", U.fmt_timing(nbst), "– / " + U.fmt_secs(nb["first"]), "–", "–", "–", "–", ""]
        trows.append(row)
        bpb_rss = nb["peak_rss"] / n
        bpb_tm = nb["tracemalloc_peak"] / n
        # RSS moves in pages and allocator arenas: meaningless for a few thousand blocks
        rss_ok = n >= 100_000 and not args.quick
        mrows.append(
            [
                label,
                (f"{bpb_rss:,.0f}" + ("" if nb["peak_exact"] else " (upper bound)")) if rss_ok else "– (too small)",
                f"{bpb_tm:,.0f}",
                f"{nb['result_bytes'] / n:,.0f}",
                (
                    (f"{d['peak_rss'] / n:,.0f}" + ("" if d["peak_exact"] else " (upper bound)"))
                    if rss_ok
                    else "– (too small)"
                )
                if d
                else "–",
                f"< {BYTES_TARGET:.0f}: {judge(max(bpb_rss if rss_ok else 0, bpb_tm), BYTES_TARGET, False)}",
            ]
        )

    print("## Dependency graph: daisy 2.0.0 `enumerate_all_dependencies()` vs daisy_nb `to_arrays()`\n")
    print(
        U.table(
            [
                "config",
                "blocks",
                "upstream edges",
                "daisy 2.0.0 public",
                "daisy 2.0.0 `_native` (Rust only)",
                "daisy_nb `to_arrays()`",
                "first call in fresh process (daisy / daisy_nb)",
                "speedup (best/best) [range]",
                "speedup in CPU time",
                "vs `_native`",
                "speedup, first calls",
                "target",
            ],
            trows,
        )
    )
    print(
        "\nTimes: wall-clock, best of the repeats after the process's first call (med = median, ± = worst/best − 1); "
        "[range] = best daisy / worst daisy_nb .. worst daisy / best daisy_nb. CPU time: `time.process_time()` of the best "
        "repeats (all threads), less disturbed by other jobs on the machine.\n"
    )
    print("## Peak memory per block (first call in a fresh process), bytes/block\n")
    print(
        U.table(
            [
                "config",
                "daisy_nb RSS peak",
                "daisy_nb tracemalloc peak",
                "daisy_nb result arrays (nbytes)",
                "daisy 2.0.0 RSS peak (public call)",
                "target",
            ],
            mrows,
        )
    )
    if args.first_calls and not args.quick and HEADLINE in names:
        one_shot(ref, args.first_calls, res_d.get(HEADLINE), res_nb[HEADLINE])
    if not args.no_startup:
        print("\n## Start-up (wall-clock of a fresh `python -c ...`)\n", flush=True)
        print(
            U.table(
                ["what", "cold (empty NUMBA_CACHE_DIR)", "warm (cache it left)", "target", "detail"],
                startup(repeat, args.quick),
            )
        )
    print()


if __name__ == "__main__":
    main()
